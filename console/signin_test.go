package console_test

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/jobfence/jobfence/console"
	"github.com/jobfence/jobfence/internal/browser"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// unlimited lifts the sign-in rate limits, for tests of something else.
func unlimited(o *console.Options) {
	o.SignInsPerAddress = console.Rate{PerSecond: 1e6, Burst: 1_000_000}
	o.SignInsPerCredential = console.Rate{PerSecond: 1e6, Burst: 1_000_000}
}

// from makes p's requests leave from the loopback address ip, another client
// address to the console than 127.0.0.1.
func (p *person) from(ip string) *person {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	p.http.Transport = &http.Transport{DialContext: d.DialContext}
	return p
}

// signedIn reports whether p's session still opens the overview.
func (p *person) signedIn() bool {
	p.t.Helper()
	pg := p.get("/")
	return pg.status == http.StatusOK && pg.url == "/" && strings.Contains(pg.body, `<span id="who">`)
}

// A reader who signs in over and over (a script with a leaked reader token)
// ends only her own oldest sessions, never an operator's; when the console
// is full of other credentials' live sessions, a new credential's sign-in is
// refused, and nobody is signed out for it.
func TestOneCredentialCannotSignAnotherOut(t *testing.T) {
	e := start(t, testdb.MySQLBackend(), unlimited, func(o *console.Options) {
		o.SessionsPerCredential, o.MaxSessions = 3, 8
	})
	alice, bob := e.person(t), e.person(t)
	alice.signIn(tokAlice)
	bob.signIn(tokBob)

	var rita []*person
	for i := range 20 {
		p := e.person(t)
		if pg := p.signIn(tokRita); pg.status != http.StatusOK || pg.url != "/" {
			t.Fatalf("rita's sign-in %d: %d at %s\n%s", i, pg.status, pg.url, pg.body)
		}
		rita = append(rita, p)
	}
	if !alice.signedIn() || !bob.signedIn() {
		t.Fatalf("20 sign-ins of rita signed out alice (%v) or bob (%v)", alice.signedIn(), bob.signedIn())
	}
	for i, p := range rita {
		if want := i >= 17; p.signedIn() != want {
			t.Fatalf("rita's session %d of 20 signed in: %v, want %v (her 3 newest)", i, !want, want)
		}
	}

	// Fill the table: alice 3, bob 2, rita 3.
	others := []*person{alice, bob}
	for _, tok := range []string{tokAlice, tokAlice, tokBob} {
		p := e.person(t)
		if pg := p.signIn(tok); pg.url != "/" {
			t.Fatalf("sign-in: %d at %s", pg.status, pg.url)
		}
		others = append(others, p)
	}
	carol := e.person(t)
	pg := carol.signIn(tokCarol)
	if pg.status != http.StatusServiceUnavailable || !strings.Contains(pg.body, "other people hold all of them") {
		t.Fatalf("carol's sign-in into a full console: %d\n%s", pg.status, pg.body)
	}
	for i, p := range others {
		if !p.signedIn() {
			t.Fatalf("carol's refused sign-in signed out session %d", i)
		}
	}
	// Rita, who has sessions, still signs in: her own oldest makes room.
	if pg := e.person(t).signIn(tokRita); pg.url != "/" {
		t.Fatalf("rita's sign-in into a full console: %d\n%s", pg.status, pg.body)
	}
	if rita[17].signedIn() || !rita[18].signedIn() {
		t.Fatal("rita's sign-in into a full console did not end her own oldest session")
	}
	for i, p := range others {
		if !p.signedIn() {
			t.Fatalf("rita's sign-in signed out session %d of another credential", i)
		}
	}
}

// Sign-in attempts are limited per client address: past the burst the
// console answers 429 with Retry-After and says so, without asking the
// coordinator; another address is not held back, and the address may try
// again once its bucket refills.
func TestSignInAttemptsAreLimitedPerAddress(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	guesser := e.person(t)
	guesser.get("/signin")
	refusedBy := map[int]int{}
	var limited page
	for i := 0; limited.status == 0; i++ {
		if i == 200 {
			t.Fatalf("200 wrong tokens in a row were not limited: %v", refusedBy)
		}
		pg := guesser.post("/signin", url.Values{"token": {fmt.Sprintf("guess-%d", i)}})
		refusedBy[pg.status]++
		if pg.status == http.StatusTooManyRequests {
			limited = pg
		}
	}
	if b := console.DefaultSignInsPerAddress.Burst; refusedBy[http.StatusUnauthorized] < b {
		t.Fatalf("limited after %d attempts, before the burst of %d", refusedBy[http.StatusUnauthorized], b)
	}
	mustContain(t, limited, "Too many sign-in attempts from your address", "then sign in again")
	if s, err := strconv.Atoi(limited.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("429 with Retry-After %q", limited.header.Get("Retry-After"))
	}
	// Refused at the console: the coordinator saw at most the attempts that
	// got through.
	asked := 0
	for _, line := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(line, `msg="finished call"`) && strings.Contains(line, "unknown bearer token") {
			asked++
		}
	}
	if n := asked; n > refusedBy[http.StatusUnauthorized] {
		t.Fatalf("the coordinator was asked %d times for %d attempts let through", n, refusedBy[http.StatusUnauthorized])
	}

	// Another address signs in at once.
	if pg := e.person(t).from("127.0.0.2").signIn(tokAlice); pg.status != http.StatusOK || pg.url != "/" {
		t.Fatalf("alice from another address: %d at %s\n%s", pg.status, pg.url, pg.body)
	}
	// The limited address gets in again once its bucket refills.
	alice := e.person(t)
	proctest.WaitFor(t, 10*time.Second, "a sign-in from the limited address", func() bool {
		return alice.signIn(tokAlice).url == "/"
	})
}

// Sign-ins of one credential are limited whatever address they come from;
// another credential from the same address is not held back.
func TestSignInsAreLimitedPerCredential(t *testing.T) {
	e := start(t, testdb.MySQLBackend(), func(o *console.Options) {
		o.SignInsPerAddress = console.Rate{PerSecond: 1e6, Burst: 1_000_000}
	})
	var limited page
	for i := 0; limited.status == 0; i++ {
		if i == 200 {
			t.Fatal("200 sign-ins of one credential in a row were not limited")
		}
		pg := e.person(t).signIn(tokRita)
		if pg.status == http.StatusTooManyRequests {
			limited = pg
		} else if pg.url != "/" {
			t.Fatalf("rita's sign-in %d: %d at %s", i, pg.status, pg.url)
		}
	}
	mustContain(t, limited, "Too many sign-ins with this credential")
	if limited.header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	if pg := e.person(t).signIn(tokAlice); pg.url != "/" {
		t.Fatalf("alice, from the address rita was limited at: %d\n%s", pg.status, pg.body)
	}
}

var refusedLine = regexp.MustCompile(`msg="console: sign-ins refused" address=(\S+) count=(\d+)`)

// Refused sign-ins are logged in aggregate: one line per address and
// interval with the count, not one per attempt, so wrong tokens at a
// thousand a second cannot flood the log.
func TestRefusedSignInsAreLoggedOncePerAddressAndInterval(t *testing.T) {
	const interval = 500 * time.Millisecond
	e := start(t, testdb.MySQLBackend(), func(o *console.Options) { o.RefusalLogInterval = interval })
	guesser := e.person(t)
	guesser.get("/signin")
	const attempts = 60
	began := time.Now()
	for i := range attempts {
		guesser.post("/signin", url.Values{"token": {fmt.Sprintf("guess-%d", i)}})
	}
	elapsed := time.Since(began)
	other := e.person(t).from("127.0.0.2")
	other.signIn("a-wrong-token")

	counted := func(address string) (lines, total int) {
		for _, m := range refusedLine.FindAllStringSubmatch(e.logs.String(), -1) {
			if m[1] == address {
				n, _ := strconv.Atoi(m[2])
				lines, total = lines+1, total+n
			}
		}
		return lines, total
	}
	proctest.WaitFor(t, 10*time.Second, "the refused sign-ins logged", func() bool {
		_, a := counted("127.0.0.1")
		_, b := counted("127.0.0.2")
		return a == attempts && b == 1
	})
	if lines, _ := counted("127.0.0.1"); lines > int(elapsed/interval)+1 {
		t.Fatalf("%d log lines for %d refused sign-ins in %s, want one per %s", lines, attempts, elapsed, interval)
	}
	logs := e.logs.String()
	for _, reason := range []string{"unknown_token", "rate_limited"} {
		if !regexp.MustCompile(`address=127\.0\.0\.1 count=\d+ interval=500ms .*` + reason + `=\d+`).MatchString(logs) {
			t.Fatalf("no line counts the sign-ins refused as %s:\n%s", reason, logs)
		}
	}
	if strings.Contains(logs, "sign-in refused") || strings.Contains(logs, "guess-") {
		t.Fatalf("a refused sign-in was logged on its own, or a token was logged:\n%s", logs)
	}
}

// signInNext signs in with tokAlice through a form that carries next, and
// returns the answer's status and Location as sent, without following or
// even parsing it.
func signInNext(t *testing.T, e *env, next string) (int, string) {
	t.Helper()
	p := e.person(t)
	p.get("/signin?next=" + url.QueryEscape(next))
	form := url.Values{"token": {tokAlice}, "next": {next}, "csrf": {p.csrf}}
	req, _ := http.NewRequest(http.MethodPost, e.web.URL+"/signin", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range p.http.Jar.Cookies(req.URL) {
		req.AddCookie(c)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil { // a header no HTTP client can read, e.g. "Location: /\x00"
		return 0, err.Error()
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}

// After sign-in the console sends the browser on to next only when it is a
// path of the console itself: no scheme, no host, no control character or
// backslash in it or its decoded form, exactly one leading slash.
func TestSignInRedirectsOnlyWithinTheConsole(t *testing.T) {
	e := start(t, testdb.MySQLBackend(), unlimited)
	hostile := []string{
		"/\t/evil.example", "/%09/evil.example", "/\n/evil.example", "/%0a/evil.example", "/%0D%0A/evil.example",
		"/\r/evil.example", "/\x00/evil.example", "/%00/evil.example", "/\x7f/evil.example", "/%7F/evil.example",
		"/\\evil.example", "/\\/evil.example", "\\/evil.example", "/%5Cevil.example", "/%5c/evil.example",
		"/%255C/evil.example", "/%2509/evil.example",
		"//evil.example", "///evil.example", "/%2F/evil.example", "/%2f%2fevil.example", "/%252F%252Fevil.example",
		"https://evil.example/", "https:evil.example", "https:/evil.example", "http://127.0.0.1@evil.example/",
		"javascript:alert(1)", "evil.example", " /evil.example", "./evil.example", "",
		"/signin?next=//evil.example",
	}
	for _, next := range hostile {
		status, loc := signInNext(t, e, next)
		if status != http.StatusSeeOther || loc != "/" {
			t.Errorf("next %q: %d to %q, want 303 to /", next, status, loc)
		}
	}
	for _, next := range []string{"/reviews?provider=acme&reason=reconcile%3A+no", "/jobs/12",
		"/search?by=order_id&q=a%2Fb", "/bulk?provider=acme"} {
		if status, loc := signInNext(t, e, next); status != http.StatusSeeOther || loc != next {
			t.Errorf("next %q: %d to %q, want it kept", next, status, loc)
		}
	}
}

// The open redirect a browser would follow: next "/<tab>/evil.example",
// which browsers read as "//evil.example". Chromium, signing in through the
// form, stays on the console.
func TestSignInWithAHostileNextStaysOnTheConsoleInABrowser(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	b := browser.Start(t)
	s := b.NewSession(t)
	s.Navigate(e.web.URL + "/signin?next=/%09/evil.example")
	s.Fill("#token", tokAlice)
	s.Submit("#signin")
	web, _ := url.Parse(e.web.URL)
	got, err := url.Parse(s.CurrentURL())
	if err != nil || got.Host != web.Host || got.Path != "/" {
		t.Fatalf("after sign-in the browser is at %s, want %s/", s.CurrentURL(), e.web.URL)
	}
	if who := s.Text("#who"); who != "alice" {
		t.Fatalf("signed in as %q", who)
	}
}

// Bounds and rates that cannot work are refused by New, naming the option.
func TestNewRefusesBoundsThatCannotWork(t *testing.T) {
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials())) // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for field, o := range map[string]console.Options{
		"MaxSessions":           {MaxSessions: -1},
		"SessionsPerCredential": {SessionsPerCredential: -5},
		"RefusalLogInterval":    {RefusalLogInterval: -time.Second},
		"SignInsPerAddress":     {SignInsPerAddress: console.Rate{PerSecond: 2}},
		"SignInsPerCredential":  {SignInsPerCredential: console.Rate{PerSecond: -1, Burst: 3}},
	} {
		o.Coordinator = conn
		if _, err := console.New(o); err == nil || !strings.Contains(err.Error(), "Options."+field) {
			t.Errorf("%s: New answered %v", field, err)
		}
	}
	if _, err := console.New(console.Options{Coordinator: conn}); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
}
