package browser

import (
	"bytes"
	"html/template"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// csrfToken is the sign-in page's one token; a POST without it is refused.
const csrfToken = "token-1234"

var signInPage = template.Must(template.New("page").Parse(`<!doctype html>
<html><head><title>sign in</title></head><body>
<p id="who">{{if .}}Signed in as {{.}}{{else}}Not signed in{{end}}</p>
<form id="sign-in" method="post" action="/sign-in">
<input type="hidden" name="csrf" value="` + csrfToken + `">
<label>Name <input id="name" name="name" required></label>
<button id="go" type="submit" name="op" value="sign-in">Sign in</button>
</form>
</body></html>`))

// newSite serves a sign-in page: GET / shows who the "who" cookie names and
// a form; POST /sign-in checks the CSRF token, sets the cookie (HttpOnly,
// SameSite=Strict) and redirects to / with 303.
func newSite(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		var who string
		if c, err := r.Cookie("who"); err == nil {
			who = c.Value
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := signInPage.Execute(w, who); err != nil {
			t.Errorf("render: %v", err)
		}
	})
	mux.HandleFunc("POST /sign-in", func(w http.ResponseWriter, r *http.Request) {
		if r.PostFormValue("csrf") != csrfToken {
			http.Error(w, "forbidden: missing or wrong CSRF token", http.StatusForbidden)
			return
		}
		if r.PostFormValue("op") != "sign-in" {
			http.Error(w, "no submitter", http.StatusBadRequest)
			return
		}
		http.SetCookie(w, &http.Cookie{Name: "who", Value: r.PostFormValue("name"), Path: "/",
			HttpOnly: true, SameSite: http.SameSiteStrictMode})
		http.Redirect(w, r, "/", http.StatusSeeOther)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestSession shares one browser between its subtests, as a package's
// end-to-end tests do; each subtest has Sessions of its own.
func TestSession(t *testing.T) {
	t.Parallel()
	site := newSite(t)
	b := Start(t)
	t.Run("FillsSubmitsAndReadsTheResult", func(t *testing.T) { fillsSubmitsAndReadsTheResult(t, b, site.URL) })
	t.Run("DoNotShareCookies", func(t *testing.T) { sessionsDoNotShareCookies(t, b, site.URL) })
	t.Run("PostFormWithoutCSRFTokenIsRefused", func(t *testing.T) { postFormWithoutCSRFTokenIsRefused(t, b, site.URL) })
	t.Run("RunErrorNamesTheAction", func(t *testing.T) { runErrorNamesTheAction(t, b, site.URL) })
}

func fillsSubmitsAndReadsTheResult(t *testing.T, b *Browser, siteURL string) {
	s := b.NewSession(t)

	s.Navigate(siteURL)
	if got := s.Status(); got != http.StatusOK {
		t.Fatalf("Status after Navigate = %d, want 200", got)
	}
	if got := s.Text("#who"); got != "Not signed in" {
		t.Fatalf("before sign-in #who = %q", got)
	}
	if !s.Exists("#sign-in") || s.Exists("#nothing-here") {
		t.Fatal("Exists: want the form and nothing else")
	}

	s.Fill("#name", "alice")
	if got := s.Value("#name"); got != "alice" {
		t.Fatalf("Value(#name) = %q after Fill", got)
	}
	s.Click("#go") // POST, 303, GET /

	if got := s.Status(); got != http.StatusOK {
		t.Fatalf("Status after the redirect = %d, want the final 200", got)
	}
	if got, want := s.CurrentURL(), siteURL+"/"; got != want {
		t.Fatalf("CurrentURL = %q, want %q", got, want)
	}
	if got := s.Text("#who"); got != "Signed in as alice" {
		t.Fatalf("after sign-in #who = %q", got)
	}
	if html := s.HTML(); !strings.Contains(html, `<p id="who">Signed in as alice</p>`) {
		t.Fatalf("HTML lacks the greeting:\n%s", html)
	}
	c := cookie(s.Cookies(), "who")
	if c == nil || c.Value != "alice" || !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict {
		t.Fatalf("cookie who = %+v, want alice, HttpOnly, SameSite=Strict", c)
	}

	shot := filepath.Join(t.TempDir(), "signed-in.png")
	s.Screenshot(shot)
	png, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("screenshot is not a PNG (%d bytes)", len(png))
	}
}

func sessionsDoNotShareCookies(t *testing.T, b *Browser, siteURL string) {
	alice, bob := b.NewSession(t), b.NewSession(t)

	signIn(t, alice, siteURL, "alice")
	bob.Navigate(siteURL)
	if got := bob.Text("#who"); got != "Not signed in" {
		t.Fatalf("bob sees %q after alice signed in in her own session", got)
	}
	if c := cookie(bob.Cookies(), "who"); c != nil {
		t.Fatalf("bob's session has alice's cookie: %+v", c)
	}

	signIn(t, bob, siteURL, "bob")
	alice.Navigate(siteURL)
	if got := alice.Text("#who"); got != "Signed in as alice" {
		t.Fatalf("alice sees %q after bob signed in", got)
	}
}

func postFormWithoutCSRFTokenIsRefused(t *testing.T, b *Browser, siteURL string) {
	s := b.NewSession(t)
	s.Navigate(siteURL)

	form := s.FormValues("#sign-in")
	if got := form.Get("csrf"); got != csrfToken {
		t.Fatalf("FormValues lacks the hidden token: %v", form)
	}
	form.Set("name", "mallory")
	form.Set("op", "sign-in")
	form.Del("csrf")
	s.PostForm("/sign-in", form)
	if got := s.Status(); got != http.StatusForbidden {
		t.Fatalf("Status of a POST without the token = %d, want 403", got)
	}
	if got := s.Text("body"); !strings.Contains(got, "CSRF") {
		t.Fatalf("refusal page says %q", got)
	}

	form.Set("csrf", csrfToken)
	s.Navigate(siteURL)
	s.PostForm("/sign-in", form)
	if got, who := s.Status(), s.Text("#who"); got != http.StatusOK || who != "Signed in as mallory" {
		t.Fatalf("with the token: status %d, #who %q", got, who)
	}
}

func runErrorNamesTheAction(t *testing.T, b *Browser, siteURL string) {
	s := b.NewSession(t)
	s.Navigate(siteURL)

	err := s.Run(chromedp.Evaluate[chromedp.Void](`throw new Error("boom")`))
	if err == nil {
		t.Fatal("Run of a throwing script: no error")
	}
	for _, want := range []string{"run actions", siteURL, "boom"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestBrowserLeavesNoProcessesBehind(t *testing.T) {
	t.Parallel()
	site := newSite(t)
	var dir string
	t.Run("browse", func(t *testing.T) {
		b := Start(t)
		dir = b.dir
		s := b.NewSession(t)
		s.Navigate(site.URL)
		if len(processesUsing(dir)) == 0 {
			t.Fatalf("found no process with the profile %s while the browser runs", dir)
		}
	})
	if pids := processesUsing(dir); len(pids) != 0 {
		t.Fatalf("processes %v still use the profile %s after the test ended", pids, dir)
	}
}

// signIn signs name in through the page's form, submitting with Enter's
// path (requestSubmit) rather than a click.
func signIn(t *testing.T, s *Session, siteURL, name string) {
	t.Helper()
	s.Navigate(siteURL)
	s.Fill("#name", name)
	s.Submit("#go")
	if got, want := s.Text("#who"), "Signed in as "+name; got != want {
		t.Fatalf("after signing in %s: #who = %q (status %d)", name, got, s.Status())
	}
}

func cookie(cs []*network.Cookie, name string) *network.Cookie {
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	return nil
}
