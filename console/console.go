// Package console is the operator console: server-rendered pages for the
// people who resolve manual reviews (R14, R16) and watch the queue (M1).
//
// The console is a client of the public API, nothing more (R29). A person
// signs in with their own bearer token (an operator or reader credential of
// the coordinator's --tokens-file); the console keeps the token in memory,
// server side, behind a session cookie, and sends it with every call it
// makes for that person. Roles, fencing and the history are therefore the
// coordinator's, decided in one place: a reader's resolve is refused by the
// coordinator even if it got past the console, every resolution is fenced by
// the attempt the page showed, and the history names the person. Nothing the
// console does is impossible with grpcurl.
//
// Mount a Console anywhere as an http.Handler; the coordinator serves one on
// --console-listen, calling itself over an in-memory connection.
package console

import (
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Options configure a Console.
type Options struct {
	// Coordinator is the connection the console calls the API on. Required.
	Coordinator grpc.ClientConnInterface
	// Secure marks the cookies Secure: set it when the console is served
	// over TLS (browsers then send them over TLS only).
	Secure bool
	// SessionLifetime bounds a sign-in (8h when zero); IdleTimeout ends a
	// session nobody used for that long (30m when zero).
	SessionLifetime time.Duration
	IdleTimeout     time.Duration
	// CallTimeout bounds each API call (10s when zero).
	CallTimeout time.Duration
	// TraceLinkTemplate, when set, links a job's trace id (the enqueue's,
	// R35) to a trace viewer: an http or https URL in which {trace_id} is
	// replaced, e.g. https://jaeger.example/trace/{trace_id}.
	TraceLinkTemplate string
	// Logger receives one line per sign-in, sign-out and action (never a
	// credential), and the refused sign-ins counted once an interval;
	// slog.Default() when nil.
	Logger *slog.Logger

	// SessionsPerCredential bounds the sessions one credential keeps
	// (DefaultSessionsPerCredential when zero): its next sign-in ends its
	// own oldest session, never another credential's.
	SessionsPerCredential int
	// MaxSessions bounds all sessions together (DefaultMaxSessions when
	// zero). When other credentials' live sessions fill it, a sign-in is
	// refused (503) instead of ending one of theirs.
	MaxSessions int
	// SignInsPerAddress limits the sign-in attempts from one client address
	// (an IPv6 /64 counts as one), SignInsPerCredential the sign-ins of one
	// credential, each a token bucket (DefaultSignInsPerAddress and
	// DefaultSignInsPerCredential when zero). Past a limit the answer is 429
	// with Retry-After.
	SignInsPerAddress    Rate
	SignInsPerCredential Rate
	// RefusalLogInterval is how often refused sign-ins are logged: one line
	// per client address with the count of each reason (10s when zero).
	RefusalLogInterval time.Duration

	// Webhooks says that the coordinators receive provider webhooks
	// (--webhook-listen). The overview then shows the webhook events that
	// matched no job; without it, only when some were kept (by another
	// replica, or an earlier run).
	Webhooks bool
}

// Console serves the operator console. It is an http.Handler.
type Console struct {
	api      pb.CoordinatorClient
	opts     Options
	log      *slog.Logger
	sessions *sessions
	pages    map[string]*template.Template
	mux      *http.ServeMux

	// Sign-in attempts by client address and by credential, and the
	// refused ones, counted for the log.
	byAddress, byCredential *limiter
	refused                 *refusals
}

// New returns a Console calling the coordinator on o.Coordinator. Errors: a
// missing connection, a negative bound or rate (naming the field), or
// templates that do not parse.
func New(o Options) (*Console, error) {
	if o.Coordinator == nil {
		return nil, errors.New("console: Options.Coordinator is required")
	}
	for _, f := range []struct {
		field string
		bad   bool
	}{
		{"SessionLifetime", o.SessionLifetime < 0}, {"IdleTimeout", o.IdleTimeout < 0},
		{"CallTimeout", o.CallTimeout < 0}, {"SessionsPerCredential", o.SessionsPerCredential < 0},
		{"MaxSessions", o.MaxSessions < 0}, {"RefusalLogInterval", o.RefusalLogInterval < 0},
	} {
		if f.bad {
			return nil, fmt.Errorf("console: Options.%s must not be negative", f.field)
		}
	}
	for field, r := range map[string]Rate{"SignInsPerAddress": o.SignInsPerAddress,
		"SignInsPerCredential": o.SignInsPerCredential} {
		if r != (Rate{}) && (r.PerSecond <= 0 || r.Burst <= 0) {
			return nil, fmt.Errorf("console: Options.%s needs PerSecond and Burst above zero (or both zero for "+
				"the default), got %+v", field, r)
		}
	}
	if err := CheckTraceLinkTemplate(o.TraceLinkTemplate); err != nil {
		return nil, fmt.Errorf("console: Options.TraceLinkTemplate: %w", err)
	}
	if o.SessionLifetime == 0 {
		o.SessionLifetime = 8 * time.Hour
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 30 * time.Minute
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.SessionsPerCredential == 0 {
		o.SessionsPerCredential = DefaultSessionsPerCredential
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.SignInsPerAddress == (Rate{}) {
		o.SignInsPerAddress = DefaultSignInsPerAddress
	}
	if o.SignInsPerCredential == (Rate{}) {
		o.SignInsPerCredential = DefaultSignInsPerCredential
	}
	if o.RefusalLogInterval == 0 {
		o.RefusalLogInterval = 10 * time.Second
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c := &Console{api: pb.NewCoordinatorClient(o.Coordinator), opts: o, log: o.Logger, pages: pages,
		sessions:  newSessions(o.SessionLifetime, o.IdleTimeout, o.Secure, o.SessionsPerCredential, o.MaxSessions),
		byAddress: newLimiter(o.SignInsPerAddress), byCredential: newLimiter(o.SignInsPerCredential),
		refused: &refusals{log: o.Logger, every: o.RefusalLogInterval}}
	static, _ := fs.Sub(assets, "static")
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /signin", c.signinPage)
	m.HandleFunc("POST /signin", c.signin)
	m.HandleFunc("POST /signout", c.signedIn(c.signout))
	m.HandleFunc("GET /{$}", c.signedIn(c.overview))
	m.HandleFunc("GET /reviews", c.signedIn(c.reviews))
	m.HandleFunc("GET /search", c.signedIn(c.search))
	m.HandleFunc("GET /jobs/{id}", c.signedIn(c.job))
	m.HandleFunc("POST /jobs/{id}/resolve", c.signedIn(c.operator(c.resolve)))
	m.HandleFunc("POST /jobs/{id}/cancel", c.signedIn(c.operator(c.cancel)))
	m.HandleFunc("POST /jobs/{id}/acknowledge", c.signedIn(c.operator(c.acknowledge)))
	m.HandleFunc("GET /attention", c.signedIn(c.attention))
	m.HandleFunc("POST /providers/pause", c.signedIn(c.operator(c.pause)))
	m.HandleFunc("POST /providers/resume", c.signedIn(c.operator(c.resume)))
	m.HandleFunc("GET /bulk", c.signedIn(c.bulkReconcileForm))
	m.HandleFunc("GET /bulk/cancel", c.signedIn(c.bulkCancelForm))
	m.HandleFunc("POST /bulk/preview", c.signedIn(c.operator(c.bulkPreview)))
	m.HandleFunc("POST /bulk/apply", c.signedIn(c.operator(c.bulkApply)))
	c.mux = m
	return c, nil
}

// ServeHTTP implements http.Handler.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No script runs on these pages, no page may frame them, and forms post
	// only here: a stored value that looks like markup stays text, and a
	// foreign page cannot overlay a resolve button.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "+
		"frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: with no-referrer browsers send "Origin:
	// null" on POST, and sameOrigin could not tell our forms from others.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store") // pages show refunds; no shared cache keeps them
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	c.mux.ServeHTTP(w, r)
}

// maxForm bounds a request body: the largest form (a reason and a refund
// id) is a few KiB.
const maxForm = 64 << 10

// handler is a page or action for a signed-in person.
type handler func(w http.ResponseWriter, r *http.Request, s *session)

// signedIn passes the request on with its session, or sends the browser to
// the sign-in page. Every POST must carry the session's CSRF token and, when
// the browser names one, come from the console's own origin.
func (c *Console) signedIn(next handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := c.sessions.get(r)
		if s == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			c.fail(w, r, nil, http.StatusForbidden, "Your session has ended. Sign in again; nothing was changed.")
			return
		}
		if r.Method == http.MethodPost {
			if !sameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(s.csrf)) != 1 {
				c.log.Warn("console: refused a POST without this session's CSRF token", "path", r.URL.Path,
					"operator", s.name)
				c.fail(w, r, s, http.StatusForbidden,
					"This form is not from this console session (missing or wrong CSRF token). Nothing was changed.")
				return
			}
		}
		next(w, r, s)
	}
}

// operator refuses an action to a reader before it reaches the coordinator
// (which would refuse it too: the roles are its own, R29).
func (c *Console) operator(next handler) handler {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		if !s.canAct {
			c.fail(w, r, s, http.StatusForbidden, "Your credential "+s.name+" may read, not act. Nothing was changed.")
			return
		}
		next(w, r, s)
	}
}

// sameOrigin reports whether a POST came from a page of this console, as far
// as the browser says: by Origin (browsers send it on every POST; "null"
// comes from sandboxed frames and files, never from our pages), else by
// Referer. A client that sends neither is judged by the CSRF token alone.
func sameOrigin(r *http.Request) bool {
	from := r.Header.Get("Origin")
	if from == "null" {
		return false
	}
	if from == "" {
		from = r.Header.Get("Referer")
	}
	if from == "" {
		return true
	}
	u, err := url.Parse(from)
	return err == nil && u.Host == r.Host
}

// call returns a context for one API call on behalf of the person whose
// token it is (a session's, or the one being signed in with), bounded by
// CallTimeout.
func (c *Console) call(r *http.Request, token string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(r.Context(), c.opts.CallTimeout)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), cancel
}

// render writes page with data; a template error is logged and answered 500.
func (c *Console) render(w http.ResponseWriter, status int, page string, data any) {
	t, ok := c.pages[page]
	if !ok {
		panic("console: no page " + page)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := t.ExecuteTemplate(w, "layout", data); err != nil {
		c.log.Error("console: render", "page", page, "error", err)
	}
}

// fail answers with the error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, msg string) {
	c.render(w, status, "error", view{Session: s, Title: http.StatusText(status), Message: msg, Path: r.URL.Path})
}

// failAPI answers an API error: a person reads what happened and whether
// anything changed; an ended credential signs them out.
func (c *Console) failAPI(w http.ResponseWriter, r *http.Request, s *session, err error) {
	e := explain(err)
	if e.reason == pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED {
		c.sessions.end(w, s)
	}
	c.fail(w, r, s, e.httpStatus, e.text)
}

// view is what every page shows around its own data.
type view struct {
	Session *session
	Title   string
	Path    string
	// Flash is a notice from the action that led here (post, redirect,
	// get), shown once.
	Flash   *flash
	Message string
	Data    any
}

func (c *Console) view(r *http.Request, s *session, title string, data any) view {
	return view{Session: s, Title: title, Path: r.URL.Path, Flash: s.takeFlash(), Data: data}
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"signin", "error", "overview", "reviews", "job", "search", "bulk", "bulk_preview",
		"bulk_done", "attention"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}
