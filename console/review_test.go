package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/console"
	"github.com/jobfence/jobfence/fakeprovider"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/browser"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
)

// escalation is the reason the Go SDK's decision table gives a worker for
// result r: the words the console reads a review's cause from.
func escalation(t *testing.T, r jobfence.Result, deadline time.Time, p jobfence.ProviderPolicy) string {
	t.Helper()
	d := jobfence.DecideAt(r, jobfence.ClaimedJob{NextAction: jobfence.ActionReconcile, ResendDeadline: deadline}, p,
		time.Now())
	if d.Kind != jobfence.DecideEscalate {
		t.Fatalf("the SDK decides %v for %+v, not to escalate", d.Kind, r)
	}
	return d.Reason
}

// receipt files a provider's answer for job, as a late worker or a webhook
// does (R15, R28).
func (e *env) receipt(t *testing.T, job *pb.Job, outcome pb.ObservationOutcome, refundID, eventID string) {
	t.Helper()
	if _, err := e.api.ReportObservation(as(t, tokWorker), &pb.ReportObservationRequest{
		Job: &pb.ReportObservationRequest_JobId{JobId: job.GetId()}, Attempt: job.GetAttempt() - 1, Source: "webhook",
		Outcome: outcome, ProviderRefundId: refundID, ProviderEventId: eventID, Detail: "from the provider"}); err != nil {
		t.Fatal(err)
	}
}

var (
	tags    = regexp.MustCompile(`(?s)<[^>]*>`)
	ruleIDs = regexp.MustCompile(`\b[RQTM]\d{1,2}\b`)
	fitForm = regexp.MustCompile(`<form [^>]*id="(refunded|reconcile)-form" class="fits"`)
)

// visible is a page's text as a person reads it, without markup.
func visible(body string) string { return tags.ReplaceAllString(body, " ") }

// The job page of a review tells the person deciding what happened, what
// the provider's answers say and which resolution fits them, in plain
// words: refunded with the refund id the provider reported; back to
// reconcile when nothing shows a refund and a same-key resend is still safe
// (R14, R22); a check at the provider when the window has closed (R16).
// It shows no holder, next action or next attempt, and no rule ids.
func TestReviewPageSaysWhichResolutionFits_R14_R16_R22(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	open := time.Now().Add(time.Hour)
	noRecord := escalation(t, jobfence.NoRecord(), open, jobfence.ProviderPolicy{})
	alice := e.person(t)
	alice.signIn(tokAlice)

	for _, c := range []struct {
		name, provider, reason string
		receipts               [][2]string // outcome, refund id
		fit                    string      // the form marked as fitting, if any
		refundID               string      // filled in
		want                   []string
	}{
		{name: "no record, window open", provider: "acme", reason: noRecord, fit: "reconcile",
			want: []string{"acme had no record of the refund", "safe to send again", "your workers are set never to send",
				"Do not make this refund at acme by hand", "No receipts"}},
		{name: "a late receipt shows the refund", provider: "acme", reason: noRecord,
			receipts: [][2]string{{"succeeded", "re_late_1"}}, fit: "refunded", refundID: "re_late_1",
			want: []string{"acme reported the refund made, as", "re_late_1", "Mark refunded with acme's refund id re_late_1"}},
		{name: "no record, window closed", provider: lapsed,
			reason: escalation(t, jobfence.NoRecord(), time.Now().Add(-time.Minute), jobfence.ProviderPolicy{SameKeyResendSafe: true}),
			want: []string{"Check lapsed's dashboard", "No worker will send this refund again",
				"lapsed stopped remembering this refund's operation key", "make the refund at lapsed"}},
		{name: "pending at the provider", provider: "acme", reason: noRecord,
			receipts: [][2]string{{"pending", "re_slow"}}, fit: "reconcile",
			want: []string{"accepted but not finished", "completes the job once acme has"}},
		{name: "rejected by the provider", provider: "acme",
			reason: escalation(t, jobfence.Failed("", "card account closed"), open, jobfence.ProviderPolicy{}),
			want:   []string{"acme rejected the refund", "Settle it with acme", "card account closed"}},
		{name: "two refunds", provider: "acme", reason: noRecord,
			receipts: [][2]string{{"succeeded", "re_one"}, {"succeeded", "re_two"}},
			want:     []string{"more than one refund", "re_one, re_two", "paid twice"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "fit-" + strings.ReplaceAll(c.name, " ", "-")
			job := e.toReview(t, key, c.provider, c.reason)
			for i, r := range c.receipts {
				e.receipt(t, job, pb.ObservationOutcome(pb.ObservationOutcome_value["OBSERVATION_OUTCOME_"+strings.ToUpper(r[0])]),
					r[1], fmt.Sprintf("evt_%s_%d", key, i))
			}
			pg := alice.get(fmt.Sprintf("/jobs/%d", job.GetId()))
			text := strings.Join(strings.Fields(visible(pg.body)), " ")
			for _, w := range c.want {
				if !strings.Contains(text, w) {
					t.Errorf("the page lacks %q:\n%s", w, text)
				}
			}
			fit := ""
			if m := fitForm.FindStringSubmatch(pg.body); m != nil {
				fit = m[1]
			}
			if fit != c.fit {
				t.Errorf("the form marked as fitting is %q, want %q", fit, c.fit)
			}
			if !strings.Contains(pg.body, `id="refunded-id" required maxlength="255" value="`+c.refundID+`"`) {
				t.Errorf("the refund id field is not filled with %q", c.refundID)
			}
			for _, field := range []string{"Held by", "Next action", "Next attempt", "Lease until", "Doing", "Due"} {
				if strings.Contains(text, field) {
					t.Errorf("a job in review shows %q", field)
				}
			}
			if ids := ruleIDs.FindAllString(text, -1); ids != nil {
				t.Errorf("rule ids %v in the page's text:\n%s", ids, text)
			}
			if strings.Contains(text, "deduplicated") {
				t.Errorf("the page still promises deduplication:\n%s", text)
			}
		})
	}
}

// The job page shows the fields that apply to the job's state: a holder and
// a lease only while it runs, a next action and a due time only while it
// waits or runs, none of them once it is finished.
func TestJobPageShowsTheFieldsOfItsState(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	alice := e.person(t)
	alice.signIn(tokAlice)
	fields := func(id int64) map[string]bool {
		text := visible(alice.get(fmt.Sprintf("/jobs/%d", id)).body)
		got := map[string]bool{}
		for _, f := range []string{"Held by", "Lease until", "Next action", "Doing", "Due", "In review since", "Completed"} {
			got[f] = strings.Contains(text, f)
		}
		return got
	}
	want := func(state string, got map[string]bool, shown ...string) {
		t.Helper()
		for f, is := range got {
			if is != strings.Contains(strings.Join(shown, "|"), f) {
				t.Errorf("%s job: %q shown %v", state, f, is)
			}
		}
	}
	enq, err := e.api.EnqueueRefund(as(t, tokShop), &pb.EnqueueRefundRequest{OperationKey: "fields-1", OrderId: "o-1",
		PaymentId: "p-1", AmountMinor: 500, Currency: "EUR", Provider: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	id := enq.GetJob().GetId()
	want("ready", fields(id), "Next action", "Due")
	got, err := e.api.Claim(as(t, tokWorker), &pb.ClaimRequest{WorkerId: "w-7", MaxJobs: 1, Provider: "acme"})
	if err != nil || len(got.GetJobs()) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	want("running", fields(id), "Held by", "Doing", "Lease until")
	c := got.GetJobs()[0]
	if _, err := e.api.Complete(as(t, tokWorker), &pb.CompleteRequest{JobId: id, Attempt: c.GetAttempt(),
		LeaseToken: c.GetLeaseToken(), ProviderRefundId: "re_done"}); err != nil {
		t.Fatal(err)
	}
	want("succeeded", fields(id), "Completed")
	if strings.Contains(alice.get(fmt.Sprintf("/jobs/%d", id)).body, `id="archived"`) {
		t.Fatal("a job in the working tables is shown archived")
	}

	// Archived (R31): the page says so, and a search by its key finds it.
	arch := e.store.(interface {
		TakeLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error)
		Archive(ctx context.Context, p store.ArchiveParams) (store.ArchiveResult, error)
	})
	lease, err := arch.TakeLease(context.Background(), store.ArchiverLease, "console-test", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 10*time.Second, "the job archived", func() bool {
		res, err := arch.Archive(context.Background(), store.ArchiveParams{Lease: lease, RetainSucceeded: time.Second, Limit: 10})
		return err == nil && res.Jobs == 1
	})
	mustContain(t, alice.get(fmt.Sprintf("/jobs/%d", id)), `id="archived"`, "can never make another refund", "re_done")
	if pg := alice.get("/search?by=operation_key&q=fields-1"); !strings.HasSuffix(pg.url, fmt.Sprintf("/jobs/%d", id)) {
		t.Fatalf("a search by the archived job's key led to %s (%d)", pg.url, pg.status)
	}
	job := e.toReview(t, "fields-2", "acme", "amount needs a person")
	want("manual review", fields(job.GetId()), "In review since")
}

// The overview says what its age measures (ready and running jobs only)
// and shows the longest wait for a person beside it; the unmatched
// webhooks panel shows only when webhooks are received or some were kept.
func TestOverviewSaysWhatItMeasures(t *testing.T) {
	for _, webhooks := range []bool{false, true} {
		t.Run(fmt.Sprintf("webhooks=%v", webhooks), func(t *testing.T) {
			e := start(t, testdb.MySQLBackend(), func(o *console.Options) { o.Webhooks = webhooks })
			job := e.toReview(t, "overview-1", "acme", "amount needs a person")
			alice := e.person(t)
			alice.signIn(tokAlice)
			pg := alice.get("/")
			mustContain(t, pg, "oldest job ready or running", "jobs in review not counted", `id="oldest-review"`,
				"longest wait for a person", fmt.Sprintf("since job %d entered review", job.GetId()))
			if strings.Contains(visible(pg.body), "oldest unfinished") {
				t.Fatal("the overview still says oldest unfinished job")
			}
			if got := strings.Contains(pg.body, `id="unmatched"`); got != webhooks {
				t.Fatalf("unmatched webhooks panel shown: %v, webhooks received: %v", got, webhooks)
			}
			if ids := ruleIDs.FindAllString(visible(pg.body), -1); ids != nil {
				t.Fatalf("rule ids %v in the overview's text", ids)
			}
			if webhooks {
				return
			}
			// An event kept in the unmatched log (a replica that receives
			// webhooks filed it) is shown all the same, never hidden (R28).
			if _, _, err := e.store.KeepUnmatched(context.Background(), store.UnmatchedEvent{Provider: "acme",
				ProviderEventID: "evt_orphan", EventType: "refund.updated", ProviderRefundID: "re_orphan",
				Outcome: store.OutcomeSucceeded}); err != nil {
				t.Fatal(err)
			}
			// (The coordinator may answer the overview from a moment ago.)
			proctest.WaitFor(t, 10*time.Second, "the kept event on the overview", func() bool {
				pg := alice.get("/")
				return strings.Contains(pg.body, `id="unmatched"`) && strings.Contains(pg.body, "re_orphan")
			})
		})
	}
}

// screenshots is the folder the browser test saves the console's pages to
// as PNGs, when set (docs/console-queue.png and docs/console-job.png are
// made this way).
const envScreenshots = "JOBFENCE_CONSOLE_SCREENSHOTS"

// The review as the README's quick start makes one, in a real headless
// Chromium: the fake provider refunds and cuts the reply, its lookups lag a
// minute, and workers do not trust same-key resends; the worker asks, finds
// no record and escalates (R14, R16). The queue lists the job; its page
// says that acme had no record, that resending is safe within the window
// but the workers will not, and marks sending back to reconcile as fitting.
func TestReviewInABrowser_R14_R16(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	demo, err := jobfence.Dial(e.addr, jobfence.WithPlaintextTokens(),
		jobfence.WithBearerToken(func(context.Context) (string, error) { return tokDemo, nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer demo.Close()
	provider := httptest.NewServer(fakeprovider.New(fakeprovider.Config{}))
	t.Cleanup(provider.Close)
	pay := fakeprovider.NewClient(provider.URL, nil)
	var ids []int64
	for i := 1; i <= 3; i++ {
		key := fmt.Sprintf("rw-demo-%d", i) // as refundworker --jobs names them
		job, _, err := demo.EnqueueRefund(ctx, jobfence.EnqueueRequest{OperationKey: key, OrderID: "order-" + key,
			PaymentID: "pay-" + key, AmountMinor: 1500, Currency: "EUR", Provider: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if err := pay.RegisterPayment(ctx, job.PaymentID, job.AmountMinor, job.Currency); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, job.ID)
	}
	w, err := jobfence.NewWorker(demo, fakeprovider.Handlers(pay, "cut_reply,lookup_lag=60"), jobfence.WorkerOptions{
		WorkerID: "refundworker-demo", Concurrency: 3, Provider: "acme", NoStream: true, PollInterval: 50 * time.Millisecond,
		Policy: jobfence.ProviderPolicy{SameKeyResendSafe: false, UnknownDelay: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	proctest.WaitFor(t, time.Minute, "the refunds in manual review", func() bool {
		for _, id := range ids {
			if e.getJob(t, id).GetJob().GetState() != pb.JobState_JOB_STATE_MANUAL_REVIEW {
				return false
			}
		}
		return true
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	b := browser.Start(t)
	shots := os.Getenv(envScreenshots)
	s := b.NewSession(t)
	s.Navigate(e.web.URL + "/reviews")
	s.Fill("#token", tokAlice)
	s.Submit("#signin")
	queue := s.Text("main")
	for i := range ids {
		if key := fmt.Sprintf("rw-demo-%d", i+1); !strings.Contains(queue, key) {
			t.Fatalf("the review queue lacks %s:\n%s", key, queue)
		}
	}
	if !strings.Contains(queue, "reconcile: no record at the provider") || ruleIDs.MatchString(queue) {
		t.Fatalf("the queue's reasons:\n%s", queue)
	}
	if shots != "" {
		s.Screenshot(filepath.Join(shots, "console-queue.png"))
	}
	s.Click(fmt.Sprintf(`a[href="/jobs/%d"]`, ids[0]))
	if got := s.Text("#state"); got != "manual review" {
		t.Fatalf("state %q", got)
	}
	happened, advice := s.Text("#happened"), s.Text("#advice")
	for _, want := range []string{"first sent to acme", "acme had no record of the refund", "does not prove"} {
		if !strings.Contains(happened, want) {
			t.Fatalf("what happened lacks %q:\n%s", want, happened)
		}
	}
	for _, want := range []string{"safe to send again", "your workers are set never to send a refund to acme twice"} {
		if !strings.Contains(advice, want) {
			t.Fatalf("the advice lacks %q:\n%s", want, advice)
		}
	}
	if !s.Exists("#reconcile-form.fits") || s.Exists("#refunded-form.fits") {
		t.Fatal("sending back to reconcile is not the form marked as fitting")
	}
	if w := s.Text("#resend-window"); !strings.Contains(w, "open") {
		t.Fatalf("resend window %q, want open", w)
	}
	page := s.Text("body")
	for _, gone := range []string{"Held by", "Next action", "Next attempt at", "Lease until"} {
		if strings.Contains(page, gone) {
			t.Fatalf("a job in review shows %q", gone)
		}
	}
	if ids := ruleIDs.FindAllString(page, -1); ids != nil {
		t.Fatalf("rule ids %v on the job page:\n%s", ids, page)
	}
	if shots != "" {
		s.Screenshot(filepath.Join(shots, "console-job.png"))
	}

	// Alice follows the advice: the job is back to reconcile, in her name.
	s.Fill("#reconcile-note", "acme lookups lag; asking again")
	s.Submit("#send-reconcile")
	if f := s.Text("#flash"); !strings.Contains(f, "recorded in the history under alice") {
		t.Fatalf("after sending back: %q", f)
	}
	d := e.getJob(t, ids[0])
	if d.GetJob().GetState() != pb.JobState_JOB_STATE_READY || d.GetJob().GetNextAction() != pb.NextAction_NEXT_ACTION_RECONCILE {
		t.Fatalf("after alice's resolution: %v", d.GetJob())
	}
	if got := s.Text("#next-action"); got != "reconcile" {
		t.Fatalf("the ready job's next action reads %q", got)
	}
}

// A person past the readers' share (R29's pages are reads like any
// client's) is told to wait, with how long, and that nothing changed: 429,
// not an error page.
func TestSearchesPastTheReadersShareSayWait(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	alice := e.person(t)
	alice.signIn(tokAlice)
	var limited page
	for i := 0; limited.status == 0; i++ {
		if i == 50 {
			t.Fatal("50 filtered searches in a row were all answered: no readers' share")
		}
		if pg := alice.get("/reviews?reason=no+reason+starts+so"); pg.status == http.StatusTooManyRequests {
			limited = pg
		} else if pg.status != http.StatusOK {
			t.Fatalf("search %d: %d\n%s", i, pg.status, pg.body)
		}
	}
	mustContain(t, limited, "Nothing was changed; try again in")
}
