package main_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/browser"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// The people and the fleet of the console's end-to-end test.
const (
	tokAlice = "e2e-alice-operator-token-0001"
	tokBob   = "e2e-bob-operator-token-0002"
	tokRita  = "e2e-rita-reader-token-0003"
	tokFleet = "e2e-fleet-token-0004"
)

// EnvScreenshots names a folder where the end-to-end test saves the
// console's pages as PNGs (docs/console-*.png are made this way).
const envScreenshots = "JOBFENCE_CONSOLE_SCREENSHOTS"

func tokensFile(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, c := range [][3]string{{"alice", "operator", tokAlice}, {"bob", "operator", tokBob},
		{"rita", "reader", tokRita}, {"fleet", "producer,worker,reader", tokFleet}} {
		sum := sha256.Sum256([]byte(c[2]))
		fmt.Fprintf(&b, "%s %s sha256:%s\n", c[0], c[1], hex.EncodeToString(sum[:]))
	}
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConsoleInABrowser_R29 is the console as a person uses it, in a real
// headless Chromium against the coordinator binary on MariaDB: a refund the
// fake provider drove to manual review (the first worker's reply came too
// late, the takeover's reconcile found no record outside the resend window)
// is found by its order id, its late receipt read, and resolved; a second
// operator's stale resolve is told someone acted first; a reader cannot
// act; a POST without the CSRF token changes nothing; a bulk reconcile
// moves exactly the jobs it previewed.
func TestConsoleInABrowser_R29(t *testing.T) {
	t.Parallel()
	coord := proctest.StartCoordinator(t, bin.coordinator, "--mysql-dsn", testdb.MySQL(t), "--tokens-file", tokensFile(t),
		"--console-listen", "127.0.0.1:0", "--provider-key-retention", "acme=1s", "--claim-poll-interval", "50ms")
	rec, ok := coord.WaitRecord(10*time.Second, func(r map[string]any) bool { return r["msg"] == "console serving" })
	if !ok {
		t.Fatalf("no console serving record:\n%s", coord.Logs())
	}
	web := "http://" + rec["listen"].(string)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fleet, err := jobfence.Dial(coord.Addr, jobfence.WithPlaintextTokens(), // loopback
		jobfence.WithBearerToken(func(context.Context) (string, error) { return tokFleet, nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	job := driveToReview(t, ctx, fleet)

	b := browser.Start(t)
	shots := os.Getenv(envScreenshots)
	shot := func(s *browser.Session, name string) {
		if shots != "" {
			s.Screenshot(filepath.Join(shots, name))
		}
	}
	signIn := func(token, name string) *browser.Session {
		s := b.NewSession(t)
		s.Navigate(web + "/reviews")
		if !strings.HasSuffix(s.CurrentURL(), "/signin?next=%2Freviews") {
			t.Fatalf("signed out, /reviews went to %s", s.CurrentURL())
		}
		s.Fill("#token", token)
		s.Submit("#signin")
		if got := s.Text("#who"); got != name {
			t.Fatalf("signed in as %q, want %q", got, name)
		}
		return s
	}
	jobPath := "/jobs/" + strconv.FormatInt(job.ID, 10)

	// Alice finds the refund by its order id and reads its evidence.
	alice := signIn(tokAlice, "alice")
	if !strings.Contains(alice.Text("main"), job.OperationKey) {
		t.Fatalf("the review queue lacks %s:\n%s", job.OperationKey, alice.HTML())
	}
	alice.Fill("header input[name=q]", job.OrderID)
	alice.Submit("header form.search")
	alice.Click(fmt.Sprintf(`a[href="%s"]`, jobPath))
	if got := alice.Text("#state"); got != "manual review" {
		t.Fatalf("job page state %q", got)
	}
	receipts := alice.Text("#observations")
	lateID := job.lateRefundID
	if !strings.Contains(receipts, lateID) || !strings.Contains(receipts, "stale") || !strings.Contains(receipts, "succeeded") {
		t.Fatalf("the late receipt is not shown as stale evidence:\n%s", receipts)
	}
	if w := alice.Text("#resend-window"); !strings.Contains(w, "closed") {
		t.Fatalf("resend window: %q, want closed", w)
	}

	// Bob opens the same review; Rita, a reader, too.
	bob := signIn(tokBob, "bob")
	bob.Navigate(web + jobPath)
	rita := signIn(tokRita, "rita")
	rita.Navigate(web + jobPath)
	if rita.Exists("#mark-refunded") || !rita.Exists("#read-only") {
		t.Fatal("a reader is offered the resolve form")
	}
	form := rita.FormValues("form.who") // her own session's CSRF token
	rita.PostForm(jobPath+"/resolve", url.Values{"csrf": form["csrf"], "attempt": {strconv.FormatInt(job.Attempt, 10)},
		"resolution": {"refunded"}, "provider_refund_id": {lateID}, "note": {"reader tries"}})
	if rita.Status() != http.StatusForbidden {
		t.Fatalf("a reader's crafted resolve answered %d", rita.Status())
	}

	// A resolve without the CSRF token is refused, whoever's cookie it rides on.
	alice.PostForm(jobPath+"/resolve", url.Values{"attempt": {strconv.FormatInt(job.Attempt, 10)},
		"resolution": {"refunded"}, "provider_refund_id": {lateID}, "note": {"no token"}})
	if alice.Status() != http.StatusForbidden {
		t.Fatalf("a POST without the CSRF token answered %d", alice.Status())
	}
	if d := getJob(t, ctx, fleet, job.ID); d.Job.State != jobfence.StateManualReview {
		t.Fatalf("refused POSTs changed the job: %s", d.Job.State)
	}

	// Alice resolves it as refunded, with the refund id the receipt names.
	alice.Navigate(web + jobPath)
	alice.Fill("#refunded-id", lateID)
	alice.Fill("#refunded-note", "late receipt from attempt 1 shows it succeeded")
	alice.Submit("#mark-refunded")
	if f := alice.Text("#flash"); !strings.Contains(f, "recorded in the history under alice") {
		t.Fatalf("after resolving: %q", f)
	}
	if got := alice.Text("#state"); got != "succeeded" {
		t.Fatalf("state after resolving: %q", got)
	}
	if h := alice.Text("#history"); !strings.Contains(h, "resolved") || !strings.Contains(h, "alice") {
		t.Fatalf("history does not name alice's resolution:\n%s", h)
	}

	// Bob's page still shows the review; his resolve is fenced out.
	bob.Fill("#reconcile-note", "ask the provider again")
	bob.Submit("#send-reconcile")
	if f := bob.Text("#flash"); !strings.Contains(f, "Someone acted first") {
		t.Fatalf("bob's stale resolve: %q", f)
	}
	if got := bob.Text("#state"); got != "succeeded" {
		t.Fatalf("bob sees %q, want the job as it is now", got)
	}
	d := getJob(t, ctx, fleet, job.ID)
	last := d.Events[len(d.Events)-1]
	if d.Job.State != jobfence.StateSucceeded || d.Job.ProviderRefundID != lateID || last.WorkerID != "alice" {
		t.Fatalf("after both resolves: %+v, last event %+v", d.Job, last)
	}

	// Bulk: three reviews match the filter at the preview; one more arrives
	// before the confirmation and is not moved.
	var bulk []int64
	for i := range 3 {
		bulk = append(bulk, escalated(t, ctx, fleet, fmt.Sprintf("bulk-e2e-%d", i)))
	}
	alice.Navigate(web + "/bulk?provider=globex")
	alice.Submit("#preview")
	if got := alice.Text("#preview-count"); !strings.HasPrefix(got, "3 job(s)") {
		t.Fatalf("preview: %q", got)
	}
	late := escalated(t, ctx, fleet, "bulk-e2e-late")
	alice.Fill("#reason", "provider outage is over")
	alice.Fill("#confirm", "3")
	alice.Submit("#apply")
	if got := alice.Text("#moved"); got != "3" {
		t.Fatalf("moved %q:\n%s", got, alice.Text("main"))
	}
	for _, id := range bulk {
		d := getJob(t, ctx, fleet, id)
		last := d.Events[len(d.Events)-1]
		if d.Job.State != jobfence.StateReady || last.WorkerID != "alice" || last.Reason != "provider outage is over" {
			t.Fatalf("bulk job %d: %s, last event %+v", id, d.Job.State, last)
		}
	}
	if d := getJob(t, ctx, fleet, late); d.Job.State != jobfence.StateManualReview {
		t.Fatalf("a job not previewed was moved: %s", d.Job.State)
	}
	// The overview shows the takeover and attempt 1's refused write-back.
	alice.Navigate(web + "/")
	id := strconv.FormatInt(job.ID, 10)
	if got := alice.Text("#takeovers"); !strings.Contains(got, id) {
		t.Fatalf("overview's takeovers lack job %s:\n%s", id, got)
	}
	if got := alice.Text("#stale"); !strings.Contains(got, id) || !strings.Contains(got, "Complete") {
		t.Fatalf("overview's stale write-backs lack attempt 1's Complete of job %s:\n%s", id, got)
	}
	shot(alice, "console-overview.png")
}

// reviewJob is the job driveToReview left in manual review.
type reviewJob struct {
	jobfence.Job
	Attempt      int64
	lateRefundID string
}

// driveToReview runs a real worker against the fake provider until a refund
// lands in manual review the way production gets there: attempt 1's refund
// is made but its reply comes 3 s late, after its 1 s lease; the takeover's
// reconcile finds no record (lookups lag) and the resend window (acme: 1 s)
// has closed, so it escalates (R14, R16, R22); attempt 1's late answer is
// then refused as stale and filed as an observation (R15).
func driveToReview(t *testing.T, ctx context.Context, fleet *jobfence.Client) reviewJob {
	t.Helper()
	provider := httptest.NewServer(fakeprovider.New(fakeprovider.Config{}))
	t.Cleanup(provider.Close)
	pay := fakeprovider.NewClient(provider.URL, nil)
	job, _, err := fleet.EnqueueRefund(ctx, jobfence.EnqueueRequest{OperationKey: "console-e2e-1", OrderID: "order-e2e-77",
		PaymentID: "pay-e2e-1", AmountMinor: 4250, Currency: "EUR", Provider: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if err := pay.RegisterPayment(ctx, job.PaymentID, job.AmountMinor, job.Currency); err != nil {
		t.Fatal(err)
	}
	// A 1s lease that is not renewed, and a reply 3s late: the worker's
	// other slot takes the job over (R17 without R27).
	handler := fakeprovider.Handlers(pay, "hang_after=3,lookup_lag=600")
	w, err := jobfence.NewWorker(fleet, handler, jobfence.WorkerOptions{WorkerID: "worker-e2e", Concurrency: 2,
		Lease: time.Second, NoLeaseRenewal: true, ProviderTimeout: 10 * time.Second, PollInterval: 50 * time.Millisecond,
		Provider: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	var d jobfence.JobDetail
	proctest.WaitFor(t, 30*time.Second, "the job in manual review with attempt 1's late receipt", func() bool {
		d = getJob(t, ctx, fleet, job.ID)
		return d.Job.State == jobfence.StateManualReview && len(d.Observations) > 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	obs := d.Observations[0]
	if obs.Outcome != jobfence.OutcomeSucceeded || obs.ReportedAttempt != 1 || d.Job.Attempt != 2 {
		t.Fatalf("not the expected evidence: job %+v, receipt %+v", d.Job, obs)
	}
	return reviewJob{Job: d.Job, Attempt: d.Job.Attempt, lateRefundID: obs.ProviderRefundID}
}

// escalated puts a globex refund in manual review directly: enqueue, claim,
// escalate. Returns its id.
func escalated(t *testing.T, ctx context.Context, fleet *jobfence.Client, key string) int64 {
	t.Helper()
	job, _, err := fleet.EnqueueRefund(ctx, jobfence.EnqueueRequest{OperationKey: key, OrderID: "order-" + key,
		PaymentID: "pay-" + key, AmountMinor: 100, Currency: "EUR", Provider: "globex"})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := fleet.Claim(ctx, jobfence.ClaimRequest{WorkerID: "fleet", MaxJobs: 1, Provider: "globex"})
	if err != nil || len(jobs) != 1 || jobs[0].Job.ID != job.ID {
		t.Fatalf("claim %s: %v %v", key, jobs, err)
	}
	if _, err := fleet.Escalate(ctx, jobfence.EscalateRequest{JobID: job.ID, Attempt: jobs[0].Attempt,
		LeaseToken: jobs[0].LeaseToken, Reason: "amount needs a person"}); err != nil {
		t.Fatal(err)
	}
	return job.ID
}

func getJob(t *testing.T, ctx context.Context, fleet *jobfence.Client, id int64) jobfence.JobDetail {
	t.Helper()
	d, err := fleet.GetJob(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
