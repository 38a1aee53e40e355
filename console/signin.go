package console

import (
	"crypto/subtle"
	"net/http"
	"slices"
	"strings"

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
// session for an operator or a reader.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	ck, err := r.Cookie(signinCookie)
	if err != nil || !sameOrigin(r) ||
		subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(ck.Value)) != 1 {
		c.signinForm(w, r, http.StatusForbidden, "This sign-in form expired or is not from this console: try again.")
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" {
		c.signinForm(w, r, http.StatusBadRequest, "Enter your token.")
		return
	}
	ctx, cancel := c.call(r, token)
	defer cancel()
	me, err := c.api.WhoAmI(ctx, &pb.WhoAmIRequest{})
	if err != nil {
		e := explain(err)
		msg := e.text
		if e.reason == pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED {
			msg = "The coordinator does not know this token."
		}
		c.log.Info("console: sign-in refused", "reason", e.reason.String())
		c.signinForm(w, r, e.httpStatus, msg)
		return
	}
	if !me.GetAuthenticated() {
		c.signinForm(w, r, http.StatusForbidden, "The coordinator runs without credentials, so nobody could be "+
			"named in the history: start it with --tokens-file.")
		return
	}
	canAct := slices.Contains(me.GetRoles(), pb.Role_ROLE_OPERATOR)
	if !canAct && !slices.Contains(me.GetRoles(), pb.Role_ROLE_READER) {
		c.log.Info("console: sign-in refused: no operator or reader role", "credential", me.GetName())
		c.signinForm(w, r, http.StatusForbidden, "The credential "+me.GetName()+
			" has no operator or reader role; the console is for people, not workers.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: "", Path: "/signin", MaxAge: -1})
	s := c.sessions.start(w, token, me.GetName(), canAct)
	c.log.Info("console: signed in", "operator", s.name, "role", s.Role())
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request, s *session) {
	c.sessions.end(w, s)
	c.log.Info("console: signed out", "operator", s.name)
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// safeNext keeps a post-sign-in redirect on this console: a path, never
// another site ("//evil", "https://…", "/\evil").
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") ||
		strings.HasPrefix(next, "/signin") {
		return "/"
	}
	return next
}
