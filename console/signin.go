package console

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// signinView is the sign-in form.
type signinView struct {
	CSRF  string
	Next  string
	Error string
}

// signinPage shows the sign-in form with a fresh form token in a cookie of
// its own: the POST must bring both (a foreign page cannot sign a browser
// in under someone else's credential).
func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	c.signinForm(w, r, http.StatusOK, "")
}

func (c *Console) signinForm(w http.ResponseWriter, r *http.Request, status int, msg string) {
	token := randomID()
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: token, Path: "/signin", HttpOnly: true,
		Secure: c.opts.Secure, SameSite: http.SameSiteStrictMode, MaxAge: 3600})
	c.render(w, status, "signin", view{Title: "Sign in", Path: r.URL.Path,
		Data: signinView{CSRF: token, Next: safeNext(r.FormValue("next")), Error: msg}})
}

// signin checks the token with the coordinator (WhoAmI) and starts a
// session for an operator or a reader. Attempts are limited per client
// address before anything else, and sign-ins per credential once the
// coordinator named it; refusals are counted for the log, not logged one by
// one.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	addr := clientAddress(r)
	if ok, wait := c.byAddress.take(addr); !ok {
		c.refused.add(addr, refusedRateLimited)
		c.tooMany(w, r, wait, "Too many sign-in attempts from your address.")
		return
	}
	ck, err := r.Cookie(signinCookie)
	if err != nil || !sameOrigin(r) ||
		subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(ck.Value)) != 1 {
		c.refused.add(addr, refusedFormExpired)
		c.signinForm(w, r, http.StatusForbidden, "This sign-in form expired or is not from this console: try again.")
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" {
		c.refused.add(addr, refusedNoToken)
		c.signinForm(w, r, http.StatusBadRequest, "Enter your token.")
		return
	}
	ctx, cancel := c.call(r, token)
	defer cancel()
	me, err := c.api.WhoAmI(ctx, &pb.WhoAmIRequest{})
	if err != nil {
		e := explain(err)
		msg, why := e.text, refusedError
		if e.reason == pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED {
			msg, why = "The coordinator does not know this token.", refusedUnknownToken
		}
		c.refused.add(addr, why)
		c.signinForm(w, r, e.httpStatus, msg)
		return
	}
	if !me.GetAuthenticated() {
		c.refused.add(addr, refusedNoAuth)
		c.signinForm(w, r, http.StatusForbidden, "The coordinator runs without credentials, so nobody could be "+
			"named in the history: start it with --tokens-file.")
		return
	}
	canAct := slices.Contains(me.GetRoles(), pb.Role_ROLE_OPERATOR)
	if !canAct && !slices.Contains(me.GetRoles(), pb.Role_ROLE_READER) {
		c.refused.add(addr, refusedNoRole)
		c.signinForm(w, r, http.StatusForbidden, "The credential "+me.GetName()+
			" has no operator or reader role; the console is for people, not workers.")
		return
	}
	if ok, wait := c.byCredential.take(me.GetName()); !ok {
		c.refused.add(addr, refusedRateLimited)
		c.tooMany(w, r, wait, "Too many sign-ins with this credential.")
		return
	}
	s, err := c.sessions.start(w, token, me.GetName(), canAct)
	if err != nil {
		c.refused.add(addr, refusedSessionsFull)
		c.signinForm(w, r, http.StatusServiceUnavailable, fmt.Sprintf("The console keeps at most %d sessions and "+
			"other people hold all of them now. Try again later: a session ends after %s unused.",
			c.opts.MaxSessions, c.opts.IdleTimeout))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: "", Path: "/signin", MaxAge: -1})
	c.log.Info("console: signed in", "operator", s.name, "role", s.Role())
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

// tooMany answers 429 with the sign-in form, saying when to try again, in
// whole seconds (Retry-After).
func (c *Console) tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration, what string) {
	secs := max(1, int((wait+time.Second-1)/time.Second))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	c.signinForm(w, r, http.StatusTooManyRequests, fmt.Sprintf("%s Wait %d second(s), then sign in again.", what, secs))
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request, s *session) {
	c.sessions.end(w, s)
	c.log.Info("console: signed out", "operator", s.name)
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// safeNext keeps a post-sign-in redirect on this console: next is used only
// when it is a path of this site — it starts with exactly one "/", has no
// scheme and no host, and neither it nor its decoded form holds a control
// character (which browsers drop: "/\t/evil" becomes "//evil") or a
// backslash (which browsers read as "/"). Anything else, and the sign-in page
// itself, gives "/".
func safeNext(next string) string {
	const home = "/"
	if len(next) > 2048 || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") ||
		strings.HasPrefix(next, "/signin") {
		return home
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return home
	}
	// Each decoding in turn, so that no layer of percent-encoding hides
	// what a browser or a proxy may decode.
	for s := next; ; {
		if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '\\' }) ||
			strings.HasPrefix(s, "//") {
			return home
		}
		d, err := url.PathUnescape(s)
		if err != nil || d == s { // nothing left to decode
			return next
		}
		s = d
	}
}
