package console

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Cookie names. The session cookie holds only a random id: the person's
// token stays in this process's memory and is never sent back to the
// browser, put in a URL or logged.
const (
	sessionCookie = "jobfence_session"
	signinCookie  = "jobfence_signin" // the sign-in form's CSRF token (double submit)
)

// The session bounds when Options leave them zero.
const (
	// DefaultSessionsPerCredential is how many sessions one credential keeps:
	// a person with a few browsers, or a small team sharing a reader token.
	// The next sign-in ends that credential's own oldest session.
	DefaultSessionsPerCredential = 20
	// DefaultMaxSessions bounds the sessions of all credentials together, so
	// that sign-ins cannot grow memory without end.
	DefaultMaxSessions = 10_000
)

// errSessionsFull: the console keeps as many sessions as it may, all live
// and none of the signing-in credential's own.
var errSessionsFull = errors.New("console: every session is taken by other credentials")

// session is one signed-in person.
type session struct {
	id     string
	token  string // the person's bearer token, sent with their calls only
	name   string // the credential's name: what histories record
	canAct bool   // operator: may resolve; a reader only reads (R29)
	csrf   string // every POST of this session must carry it

	created time.Time

	mu       sync.Mutex
	lastUsed time.Time
	flash    *flash
	previews map[string]*bulkPreview // bulk reconciles previewed, by id
}

// flash is a one-time notice shown on the page after an action.
type flash struct {
	Kind string // "ok", "conflict" or "error"
	Text string
}

func (s *session) setFlash(kind, text string) {
	s.mu.Lock()
	s.flash = &flash{Kind: kind, Text: text}
	s.mu.Unlock()
}

func (s *session) takeFlash() *flash {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flash
	s.flash = nil
	return f
}

// Name is the signed-in credential's name, for the page header.
func (s *session) Name() string { return s.name }

// CanAct reports whether the person may resolve reviews.
func (s *session) CanAct() bool { return s.canAct }

// CSRF is the token every form of this session posts.
func (s *session) CSRF() string { return s.csrf }

// Role names the session's highest console role.
func (s *session) Role() string {
	if s.canAct {
		return "operator"
	}
	return "reader"
}

// sessions keeps the signed-in people of one console process. A restart
// signs everyone out: sessions are deliberately not stored anywhere else,
// because each holds a credential.
//
// One credential's sign-ins never end another credential's sessions: each
// credential keeps at most perCredential, its own oldest ended first, and
// when all max are taken by others' live sessions a sign-in is refused
// rather than signing someone else out.
type sessions struct {
	lifetime, idle     time.Duration
	secure             bool
	perCredential, max int

	mu     sync.Mutex
	byID   map[string]*session
	byName map[string][]*session // each credential's sessions, oldest first
}

func newSessions(lifetime, idle time.Duration, secure bool, perCredential, max int) *sessions {
	return &sessions{lifetime: lifetime, idle: idle, secure: secure, perCredential: perCredential, max: max,
		byID: map[string]*session{}, byName: map[string][]*session{}}
}

// randomID returns 32 bytes from crypto/rand, base64url.
func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// start signs a person in: a new session (a new id on every sign-in, so an
// id planted before it is worthless), its cookie set on w. Past the
// credential's bound its own oldest session ends. Errors: errSessionsFull
// when every session is another credential's and live.
func (ss *sessions) start(w http.ResponseWriter, token, name string, canAct bool) (*session, error) {
	now := time.Now()
	s := &session{id: randomID(), token: token, name: name, canAct: canAct, csrf: randomID(),
		created: now, lastUsed: now, previews: map[string]*bulkPreview{}}
	ss.mu.Lock()
	for _, old := range ss.byID {
		if ss.expired(old, now) {
			ss.remove(old)
		}
	}
	// Make room from the credential's own sessions, oldest first: past its
	// bound, or when the table is full. Never from another credential's.
	for {
		mine := ss.byName[name]
		if len(mine) == 0 || len(mine) < ss.perCredential && len(ss.byID) < ss.max {
			break
		}
		ss.remove(mine[0])
	}
	if len(ss.byID) >= ss.max {
		ss.mu.Unlock()
		return nil, errSessionsFull
	}
	ss.byID[s.id] = s
	ss.byName[name] = append(ss.byName[name], s)
	ss.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.id, Path: "/", HttpOnly: true, Secure: ss.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: int(ss.lifetime / time.Second)})
	return s, nil
}

// remove forgets s; the caller holds ss.mu.
func (ss *sessions) remove(s *session) {
	delete(ss.byID, s.id)
	mine := slices.DeleteFunc(ss.byName[s.name], func(o *session) bool { return o == s })
	if len(mine) == 0 {
		delete(ss.byName, s.name)
	} else {
		ss.byName[s.name] = mine
	}
}

// get returns the request's live session, or nil.
func (ss *sessions) get(r *http.Request) *session {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	now := time.Now()
	ss.mu.Lock()
	s := ss.byID[ck.Value]
	if s != nil && ss.expired(s, now) {
		ss.remove(s)
		s = nil
	}
	ss.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		s.lastUsed = now
		s.mu.Unlock()
	}
	return s
}

func (ss *sessions) expired(s *session, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now.Sub(s.created) > ss.lifetime || now.Sub(s.lastUsed) > ss.idle
}

// end signs s out and clears its cookie.
func (ss *sessions) end(w http.ResponseWriter, s *session) {
	if s == nil {
		return
	}
	ss.mu.Lock()
	if ss.byID[s.id] == s {
		ss.remove(s)
	}
	ss.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", HttpOnly: true, Secure: ss.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
}
