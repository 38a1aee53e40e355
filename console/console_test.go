package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/jobfence/jobfence/console"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
)

// The credentials of the tests' coordinator.
const (
	tokAlice  = "tok-alice-operator-0123456789"
	tokBob    = "tok-bob-operator-0123456789"
	tokCarol  = "tok-carol-operator-0123456789"
	tokRita   = "tok-rita-reader-0123456789"
	tokDemo   = "tok-demo-fleet-0123456789"
	tokWorker = "tok-worker-0123456789"
	tokShop   = "tok-shop-producer-0123456789"
)

func tokenLine(name, roles, token string) string {
	sum := sha256.Sum256([]byte(token))
	return fmt.Sprintf("%s %s sha256:%s\n", name, roles, hex.EncodeToString(sum[:]))
}

// env is a real coordinator on a real store and gRPC socket, and the console
// on a real HTTP socket calling it.
type env struct {
	api   pb.CoordinatorClient
	store store.Store // the coordinator's
	addr  string      // the coordinator's gRPC address
	web   *httptest.Server
	logs  *proctest.Buffer // the coordinator's and the console's
}

// lapsed is a provider that keeps an idempotency key for a millisecond:
// the resend window of its jobs has closed by the time anyone looks (R22).
const lapsed = "lapsed"

// start starts the coordinator and the console, with the console's options
// as each of with changes them.
func start(t *testing.T, b testdb.Backend, with ...func(*console.Options)) *env {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	lines := tokenLine("alice", "operator", tokAlice) + tokenLine("bob", "operator", tokBob) +
		tokenLine("carol", "operator", tokCarol) + tokenLine("rita", "reader", tokRita) + tokenLine("worker-1", "worker", tokWorker) +
		tokenLine("shop", "producer", tokShop) + tokenLine("demo", "producer,worker,reader", tokDemo)
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	authn, err := server.LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &proctest.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st := b.Open(t)
	srv := server.New(st, server.Options{Auth: authn, Logger: log, ClaimPollInterval: time.Minute,
		ProviderKeyRetention: map[string]time.Duration{lapsed: time.Millisecond}})
	t.Cleanup(srv.Close)
	gs, _ := srv.NewGRPCServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis) //nolint:errcheck
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	o := console.Options{Coordinator: conn, Logger: log}
	for _, f := range with {
		f(&o)
	}
	h, err := console.New(o)
	if err != nil {
		t.Fatal(err)
	}
	web := httptest.NewServer(h)
	t.Cleanup(web.Close)
	return &env{api: pb.NewCoordinatorClient(conn), store: st, addr: lis.Addr().String(), web: web, logs: logs}
}

func as(t *testing.T, token string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// toReview enqueues a refund, claims it and escalates it: a job in manual
// review, as a worker leaves one (R14, R16).
func (e *env) toReview(t *testing.T, key, provider, reason string) *pb.Job {
	t.Helper()
	_, err := e.api.EnqueueRefund(as(t, tokShop), &pb.EnqueueRefundRequest{OperationKey: key, OrderId: "order-" + key,
		PaymentId: "pay-" + key, AmountMinor: 1999, Currency: "EUR", Provider: provider})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.api.Claim(as(t, tokWorker), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1, Provider: provider})
	if err != nil || len(got.GetJobs()) != 1 {
		t.Fatalf("claim %s: %v %v", key, got, err)
	}
	c := got.GetJobs()[0]
	if c.GetJob().GetOperationKey() != key {
		t.Fatalf("claimed %s, want %s", c.GetJob().GetOperationKey(), key)
	}
	esc, err := e.api.Escalate(as(t, tokWorker), &pb.EscalateRequest{JobId: c.GetJob().GetId(), Attempt: c.GetAttempt(),
		LeaseToken: c.GetLeaseToken(), Reason: reason})
	if err != nil {
		t.Fatal(err)
	}
	return esc.GetJob()
}

func (e *env) getJob(t *testing.T, id int64) *pb.GetJobResponse {
	t.Helper()
	d, err := e.api.GetJob(as(t, tokAlice), &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: id}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// person is one browser: a cookie jar, no redirects followed unless asked.
type person struct {
	t    *testing.T
	e    *env
	http *http.Client
	csrf string // the last page's form token
}

func (e *env) person(t *testing.T) *person {
	jar, _ := cookiejar.New(nil)
	return &person{t: t, e: e, http: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// page is one answer: its status, its body and where it ended after
// redirects.
type page struct {
	status int
	body   string
	url    string
	header http.Header
}

func (p *person) do(req *http.Request) page {
	p.t.Helper()
	resp, err := p.http.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if m := csrfField.FindStringSubmatch(string(b)); m != nil {
		p.csrf = html.UnescapeString(m[1])
	}
	return page{status: resp.StatusCode, body: string(b), url: resp.Request.URL.Path, header: resp.Header}
}

func (p *person) get(path string) page {
	req, _ := http.NewRequest(http.MethodGet, p.e.web.URL+path, nil)
	return p.do(req)
}

// post sends a form as the console's own page would: with the session's
// CSRF token unless form names one, and the console's origin.
func (p *person) post(path string, form url.Values) page {
	if _, set := form["csrf"]; !set {
		form.Set("csrf", p.csrf)
	}
	req, _ := http.NewRequest(http.MethodPost, p.e.web.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", p.e.web.URL)
	return p.do(req)
}

func (p *person) signIn(token string) page {
	p.t.Helper()
	p.get("/signin")
	return p.post("/signin", url.Values{"token": {token}})
}

func mustContain(t *testing.T, pg page, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(pg.body, w) {
			t.Fatalf("page %s (%d) lacks %q:\n%s", pg.url, pg.status, w, pg.body)
		}
	}
}

func TestSignInChecksTheTokenWithTheCoordinator_R29(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	p := e.person(t)
	if pg := p.get("/reviews"); pg.url != "/signin" {
		t.Fatalf("signed out, /reviews ended at %s, want the sign-in page", pg.url)
	}
	if pg := p.signIn("not-a-token"); pg.status != http.StatusUnauthorized || !strings.Contains(pg.body, "does not know this token") {
		t.Fatalf("unknown token: %d\n%s", pg.status, pg.body)
	}
	if pg := p.signIn(tokWorker); pg.status != http.StatusForbidden || !strings.Contains(pg.body, "no operator or reader role") {
		t.Fatalf("worker token: %d\n%s", pg.status, pg.body)
	}
	// A sign-in form posted without its own form token (login CSRF).
	if pg := p.post("/signin", url.Values{"token": {tokAlice}, "csrf": {"forged"}}); pg.status != http.StatusForbidden {
		t.Fatalf("sign-in without the form's token: %d", pg.status)
	}
	pg := p.signIn(tokAlice)
	if pg.status != http.StatusOK || pg.url != "/" {
		t.Fatalf("alice signed in: %d at %s", pg.status, pg.url)
	}
	mustContain(t, pg, `<span id="who">alice</span>`, "operator", "Overview")
	u, _ := url.Parse(e.web.URL)
	var session *http.Cookie
	for _, c := range p.http.Jar.Cookies(u) {
		if c.Name == "jobfence_session" {
			session = c
		}
	}
	if session == nil || strings.Contains(session.Value, tokAlice) {
		t.Fatalf("session cookie %v: want a random id, never the token", session)
	}
	// The Set-Cookie attributes the jar does not keep.
	p2 := e.person(t)
	p2.get("/signin")
	form := url.Values{"token": {tokRita}, "csrf": {p2.csrf}}
	req, _ := http.NewRequest(http.MethodPost, e.web.URL+"/signin", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	p2.http.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := p2.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var sc string
	for _, v := range resp.Header.Values("Set-Cookie") {
		if strings.HasPrefix(v, "jobfence_session=") {
			sc = v
		}
	}
	for _, attr := range []string{"jobfence_session=", "HttpOnly", "SameSite=Strict", "Max-Age="} {
		if !strings.Contains(sc, attr) {
			t.Fatalf("Set-Cookie %q lacks %s", sc, attr)
		}
	}

	// Sign-out ends the session on the server, not only in the browser.
	old := session.Value
	if pg := p.post("/signout", url.Values{}); pg.url != "/signin" {
		t.Fatalf("sign-out ended at %s", pg.url)
	}
	replay := e.person(t)
	replay.http.Jar.SetCookies(u, []*http.Cookie{{Name: "jobfence_session", Value: old, Path: "/"}})
	if pg := replay.get("/"); pg.url != "/signin" {
		t.Fatalf("a signed-out session id still opens %s", pg.url)
	}
	for _, tok := range []string{tokAlice, tokRita, tokWorker} {
		if strings.Contains(e.logs.String(), tok) {
			t.Fatalf("a token is in the logs:\n%s", e.logs.String())
		}
	}
}

func TestResolveFromTheJobPageIsRecordedUnderTheOperator_R29(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	job := e.toReview(t, "refund-r29-a", "acme", "reconcile: no record, outside the resend window")
	alice := e.person(t)
	alice.signIn(tokAlice)
	q := alice.get("/reviews")
	mustContain(t, q, fmt.Sprintf(`href="/jobs/%d"`, job.GetId()), "refund-r29-a", "19.99 EUR",
		"reconcile: no record, outside the resend window")
	pg := alice.get(fmt.Sprintf("/jobs/%d", job.GetId()))
	mustContain(t, pg, `id="mark-refunded"`, `id="send-reconcile"`, fmt.Sprintf(`name="attempt" value="%d"`, job.GetAttempt()))

	// The reason is required: nothing is written without one.
	pg = alice.post(fmt.Sprintf("/jobs/%d/resolve", job.GetId()), url.Values{"attempt": {strconv.FormatInt(job.GetAttempt(), 10)},
		"resolution": {"refunded"}, "provider_refund_id": {"re_123"}})
	mustContain(t, pg, "A reason is required")
	if st := e.getJob(t, job.GetId()).GetJob().GetState(); st != pb.JobState_JOB_STATE_MANUAL_REVIEW {
		t.Fatalf("resolved without a reason: %v", st)
	}

	pg = alice.post(fmt.Sprintf("/jobs/%d/resolve", job.GetId()), url.Values{"attempt": {strconv.FormatInt(job.GetAttempt(), 10)},
		"resolution": {"refunded"}, "provider_refund_id": {"re_123"}, "note": {"provider dashboard shows re_123 succeeded"}})
	mustContain(t, pg, "Marked refunded", "recorded in the history under alice", `id="state">succeeded`, "re_123",
		"refunded as re_123")
	d := e.getJob(t, job.GetId())
	last := d.GetEvents()[len(d.GetEvents())-1]
	if d.GetJob().GetState() != pb.JobState_JOB_STATE_SUCCEEDED || last.GetWorkerId() != "alice" ||
		last.GetReason() != "provider dashboard shows re_123 succeeded" || d.GetLedger().GetProviderRefundId() != "re_123" {
		t.Fatalf("after alice's resolve: job %v, last event %v, ledger %v", d.GetJob(), last, d.GetLedger())
	}
	if strings.Contains(pg.body, `id="mark-refunded"`) {
		t.Fatal("a succeeded job still offers the resolve forms")
	}
}

func TestSecondOperatorsStaleResolveSaysSomeoneActedFirst_R29(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	job := e.toReview(t, "refund-r29-b", "acme", "escalated")
	alice, bob := e.person(t), e.person(t)
	alice.signIn(tokAlice)
	bob.signIn(tokBob)
	alice.get(fmt.Sprintf("/jobs/%d", job.GetId()))
	bob.get(fmt.Sprintf("/jobs/%d", job.GetId())) // both see attempt job.Attempt
	attempt := strconv.FormatInt(job.GetAttempt(), 10)
	alice.post(fmt.Sprintf("/jobs/%d/resolve", job.GetId()), url.Values{"attempt": {attempt},
		"resolution": {"reconcile"}, "note": {"ask the provider again"}})
	pg := bob.post(fmt.Sprintf("/jobs/%d/resolve", job.GetId()), url.Values{"attempt": {attempt},
		"resolution": {"refunded"}, "provider_refund_id": {"re_999"}, "note": {"I think it went through"}})
	mustContain(t, pg, "Someone acted first", `id="state">ready`)
	d := e.getJob(t, job.GetId())
	if d.GetJob().GetState() != pb.JobState_JOB_STATE_READY || d.GetJob().GetProviderRefundId() != "" {
		t.Fatalf("bob's stale resolve changed the job: %v", d.GetJob())
	}
	if last := d.GetEvents()[len(d.GetEvents())-1]; last.GetWorkerId() != "alice" {
		t.Fatalf("the last transition is %v, want alice's", last)
	}

	// The job comes back to review under a new attempt (a worker reconciled
	// and escalated again): a page still showing the old attempt is fenced
	// out although the job is in review again — its evidence is old.
	got, err := e.api.Claim(as(t, tokWorker), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1, Provider: "acme"})
	if err != nil || len(got.GetJobs()) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	c := got.GetJobs()[0]
	if _, err := e.api.Escalate(as(t, tokWorker), &pb.EscalateRequest{JobId: job.GetId(), Attempt: c.GetAttempt(),
		LeaseToken: c.GetLeaseToken(), Reason: "still no record"}); err != nil {
		t.Fatal(err)
	}
	pg = bob.post(fmt.Sprintf("/jobs/%d/resolve", job.GetId()), url.Values{"attempt": {attempt},
		"resolution": {"refunded"}, "provider_refund_id": {"re_999"}, "note": {"from the page I opened before"}})
	mustContain(t, pg, "Someone acted first", `id="state">manual review`)
	if d := e.getJob(t, job.GetId()); d.GetJob().GetState() != pb.JobState_JOB_STATE_MANUAL_REVIEW ||
		d.GetJob().GetAttempt() != c.GetAttempt() {
		t.Fatalf("a resolve from an old page applied to the new review: %v", d.GetJob())
	}
}

func TestReaderSeesButCannotAct_R29(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	job := e.toReview(t, "refund-r29-c", "acme", "escalated")
	rita := e.person(t)
	rita.signIn(tokRita)
	pg := rita.get(fmt.Sprintf("/jobs/%d", job.GetId()))
	mustContain(t, pg, `id="read-only"`, "refund-r29-c")
	if strings.Contains(pg.body, `id="mark-refunded"`) || strings.Contains(pg.body, "Reconcile all matching") {
		t.Fatal("a reader is shown action controls")
	}
	// Crafted by hand with her own valid session and CSRF token.
	pg = rita.post(fmt.Sprintf("/jobs/%d/resolve", job.GetId()), url.Values{"attempt": {strconv.FormatInt(job.GetAttempt(), 10)},
		"resolution": {"refunded"}, "provider_refund_id": {"re_1"}, "note": {"x"}})
	if pg.status != http.StatusForbidden {
		t.Fatalf("reader's resolve: %d", pg.status)
	}
	if pg := rita.post("/bulk/preview", url.Values{}); pg.status != http.StatusForbidden {
		t.Fatalf("reader's bulk preview: %d", pg.status)
	}
	if st := e.getJob(t, job.GetId()).GetJob().GetState(); st != pb.JobState_JOB_STATE_MANUAL_REVIEW {
		t.Fatalf("a reader resolved the job: %v", st)
	}
	// And the coordinator refuses her anyway: the role is its own.
	_, err := e.api.ResolveReview(as(t, tokRita), &pb.ResolveReviewRequest{JobId: job.GetId(), Attempt: job.GetAttempt(),
		Resolution: pb.ReviewResolution_REVIEW_RESOLUTION_RECONCILE, Note: "x"})
	if err == nil {
		t.Fatal("the coordinator let a reader resolve")
	}
}

func TestPostsWithoutTheSessionsCSRFTokenAreRefused(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	job := e.toReview(t, "refund-csrf", "acme", "escalated")
	alice := e.person(t)
	alice.signIn(tokAlice)
	path := fmt.Sprintf("/jobs/%d/resolve", job.GetId())
	form := func() url.Values {
		return url.Values{"attempt": {strconv.FormatInt(job.GetAttempt(), 10)}, "resolution": {"reconcile"}, "note": {"x"}}
	}
	noToken := form()
	noToken.Set("csrf", "")
	if pg := alice.post(path, noToken); pg.status != http.StatusForbidden || !strings.Contains(pg.body, "CSRF") {
		t.Fatalf("no CSRF token: %d", pg.status)
	}
	// Another session's token is no good either.
	bob := e.person(t)
	bob.signIn(tokBob)
	other := form()
	other.Set("csrf", bob.csrf)
	if pg := alice.post(path, other); pg.status != http.StatusForbidden {
		t.Fatalf("bob's CSRF token in alice's session: %d", pg.status)
	}
	// The right token from a foreign page.
	f := form()
	f.Set("csrf", alice.csrf)
	req, _ := http.NewRequest(http.MethodPost, e.web.URL+path, strings.NewReader(f.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	if pg := alice.do(req); pg.status != http.StatusForbidden {
		t.Fatalf("POST from a foreign origin: %d", pg.status)
	}
	if st := e.getJob(t, job.GetId()).GetJob().GetState(); st != pb.JobState_JOB_STATE_MANUAL_REVIEW {
		t.Fatalf("a refused POST changed the job: %v", st)
	}
}

var previewCount = regexp.MustCompile(`id="preview-count"><strong>(\d+)</strong>`)

func TestBulkReconcileMovesExactlyThePreviewedJobs_R29(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	var acme []*pb.Job
	for i := range 5 {
		acme = append(acme, e.toReview(t, fmt.Sprintf("bulk-acme-%d", i), "acme", "reconcile: no record"))
	}
	globex := e.toReview(t, "bulk-globex", "globex", "reconcile: no record")
	other := e.toReview(t, "bulk-acme-other", "acme", "amount mismatch")
	alice := e.person(t)
	alice.signIn(tokAlice)
	alice.get("/bulk")
	pg := alice.post("/bulk/preview", url.Values{"provider": {"acme"}, "reason": {"reconcile: no"}})
	m := previewCount.FindStringSubmatch(pg.body)
	if m == nil || m[1] != "5" {
		t.Fatalf("preview: %v\n%s", m, pg.body)
	}
	// Between the preview and the confirmation: bob resolves one, and a new
	// job matching the filter arrives. Neither is moved by alice's action.
	if _, err := e.api.ResolveReview(as(t, tokBob), &pb.ResolveReviewRequest{JobId: acme[0].GetId(),
		Attempt: acme[0].GetAttempt(), Resolution: pb.ReviewResolution_REVIEW_RESOLUTION_REFUNDED,
		ProviderRefundId: "re_bob", Note: "bob checked"}); err != nil {
		t.Fatal(err)
	}
	late := e.toReview(t, "bulk-acme-late", "acme", "reconcile: no record")

	preview := regexp.MustCompile(`name="preview" value="([^"]+)"`).FindStringSubmatch(pg.body)[1]
	pg = alice.post("/bulk/apply", url.Values{"preview": {preview}, "confirm": {"4"}, "reason": {"retry after outage"}})
	if pg.status != http.StatusBadRequest || !strings.Contains(pg.body, "Type 5 to confirm") {
		t.Fatalf("wrong confirmation: %d\n%s", pg.status, pg.body)
	}
	pg = alice.post("/bulk/apply", url.Values{"preview": {preview}, "confirm": {"5"}, "reason": {"retry after outage"}})
	mustContain(t, pg, `<strong id="moved">4</strong> of 5`, `<strong id="changed">1</strong>`)
	for _, j := range acme[1:] {
		d := e.getJob(t, j.GetId())
		last := d.GetEvents()[len(d.GetEvents())-1]
		if d.GetJob().GetState() != pb.JobState_JOB_STATE_READY || last.GetWorkerId() != "alice" ||
			last.GetReason() != "retry after outage" {
			t.Fatalf("job %d after the bulk action: %v, last event %v", j.GetId(), d.GetJob(), last)
		}
	}
	for _, j := range []*pb.Job{globex, other, late} {
		if st := e.getJob(t, j.GetId()).GetJob().GetState(); st != pb.JobState_JOB_STATE_MANUAL_REVIEW {
			t.Fatalf("job %s was not previewed but is now %v", j.GetOperationKey(), st)
		}
	}
	if st := e.getJob(t, acme[0].GetId()).GetJob().GetState(); st != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("bob's resolution was overwritten: %v", st)
	}
	// A confirmation is used once.
	if pg := alice.post("/bulk/apply", url.Values{"preview": {preview}, "confirm": {"5"}, "reason": {"again"}}); pg.status != http.StatusConflict {
		t.Fatalf("a used preview applied again: %d", pg.status)
	}
}

func TestSearchByBusinessIDs(t *testing.T) {
	for _, b := range testdb.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := start(t, b)
			job := e.toReview(t, "refund-search", "acme", "escalated")
			if _, err := e.api.ReportObservation(as(t, tokWorker), &pb.ReportObservationRequest{
				Job: &pb.ReportObservationRequest_JobId{JobId: job.GetId()}, Source: "webhook",
				Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED, ProviderRefundId: "re_found_by_receipt",
				ProviderEventId: "evt_1", Detail: "late receipt"}); err != nil {
				t.Fatal(err)
			}
			alice := e.person(t)
			alice.signIn(tokAlice)
			want := fmt.Sprintf(`href="/jobs/%d"`, job.GetId())
			for by, q := range map[string]string{"order_id": "order-refund-search", "payment_id": "pay-refund-search",
				"provider_refund_id": "re_found_by_receipt"} {
				mustContain(t, alice.get("/search?by="+by+"&q="+url.QueryEscape(q)), want)
				if pg := alice.get("/search?by=" + by + "&q=nothing-like-it"); strings.Contains(pg.body, want) {
					t.Fatalf("search by %s for another value found the job", by)
				}
			}
			if pg := alice.get("/search?by=operation_key&q=refund-search"); pg.url != fmt.Sprintf("/jobs/%d", job.GetId()) {
				t.Fatalf("search by operation key ended at %s", pg.url)
			}
			// The job page shows the receipt as evidence.
			mustContain(t, alice.get(fmt.Sprintf("/jobs/%d", job.GetId())), "re_found_by_receipt", "evt_1", "late receipt",
				"succeeded")
		})
	}
}
