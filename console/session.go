package console

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
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

// maxSessions bounds the sessions kept: past it the oldest is dropped
// (its person signs in again), so sign-ins cannot grow memory without end.
const maxSessions = 10_000

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
type sessions struct {
	lifetime, idle time.Duration
	secure         bool

	mu   sync.Mutex
	byID map[string]*session
}

func newSessions(lifetime, idle time.Duration, secure bool) *sessions {
	return &sessions{lifetime: lifetime, idle: idle, secure: secure, byID: map[string]*session{}}
}

// randomID returns 32 bytes from crypto/rand, base64url.
func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// start signs a person in: a new session (a new id on every sign-in, so an
// id planted before it is worthless), its cookie set on w.
func (ss *sessions) start(w http.ResponseWriter, token, name string, canAct bool) *session {
	now := time.Now()
	s := &session{id: randomID(), token: token, name: name, canAct: canAct, csrf: randomID(),
		created: now, lastUsed: now, previews: map[string]*bulkPreview{}}
	ss.mu.Lock()
	for id, old := range ss.byID {
		if ss.expired(old, now) {
			delete(ss.byID, id)
		}
	}
	for len(ss.byID) >= maxSessions {
		var oldest *session
		for _, o := range ss.byID {
			if oldest == nil || o.created.Before(oldest.created) {
				oldest = o
			}
		}
		delete(ss.byID, oldest.id)
	}
	ss.byID[s.id] = s
	ss.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.id, Path: "/", HttpOnly: true, Secure: ss.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: int(ss.lifetime / time.Second)})
	return s
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
		delete(ss.byID, s.id)
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
	delete(ss.byID, s.id)
	ss.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", HttpOnly: true, Secure: ss.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
}
