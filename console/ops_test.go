package console_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/browser"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// enqueue enqueues a refund of provider, never sent.
func (e *env) enqueue(t *testing.T, key, provider string) *pb.Job {
	t.Helper()
	resp, err := e.api.EnqueueRefund(as(t, tokShop), &pb.EnqueueRefundRequest{OperationKey: key, OrderId: "order-" + key,
		PaymentId: "pay-" + key, AmountMinor: 2500, Currency: "EUR", Provider: provider})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetJob()
}

// claim has a worker claim the next job of provider, which must be id.
func (e *env) claim(t *testing.T, provider string, id int64) *pb.ClaimedJob {
	t.Helper()
	got, err := e.api.Claim(as(t, tokWorker), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1, Provider: provider})
	if err != nil || len(got.GetJobs()) != 1 || got.GetJobs()[0].GetJob().GetId() != id {
		t.Fatalf("claim of %s: %v %v, want job %d", provider, got, err, id)
	}
	return got.GetJobs()[0]
}

// sent enqueues refunds of provider that a worker sent and handed back to
// reconcile, due now, in the order of keys: ready, and they may have reached
// the provider. Each is claimed while the ones before are held, so that
// each claim takes its own.
func (e *env) sent(t *testing.T, provider string, keys ...string) []*pb.Job {
	t.Helper()
	var held []*pb.ClaimedJob
	for _, key := range keys {
		job := e.enqueue(t, key, provider)
		held = append(held, e.claim(t, provider, job.GetId()))
	}
	var jobs []*pb.Job
	for _, c := range held {
		resp, err := e.api.Reschedule(as(t, tokWorker), &pb.RescheduleRequest{JobId: c.GetJob().GetId(),
			Attempt: c.GetAttempt(), LeaseToken: c.GetLeaseToken(), NextAction: pb.NextAction_NEXT_ACTION_RECONCILE,
			Reason: "outcome unknown: timeout"})
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, resp.GetJob())
	}
	return jobs
}

// signedInBrowser is a person at a real Chromium, signed in with token, and
// a func that reports what errors the browser logged since (CSP violations
// among them).
func (e *env) signedInBrowser(t *testing.T, b *browser.Browser, token string) (*browser.Session, func() []string) {
	t.Helper()
	s := b.NewSession(t)
	logged := s.WatchLog()
	s.Navigate(e.web.URL + "/signin")
	s.Fill("#token", token)
	s.Submit("#signin")
	return s, func() []string { return pageErrors(logged()) }
}

// shot saves s's page as name in $JOBFENCE_CONSOLE_SCREENSHOTS, when set.
func shot(s *browser.Session, name string) {
	if dir := os.Getenv(envScreenshots); dir != "" {
		s.Screenshot(filepath.Join(dir, name))
	}
}

func noErrors(t *testing.T, logged func() []string) {
	t.Helper()
	if errs := logged(); len(errs) != 0 {
		t.Fatalf("the browser logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// wantText requires the element's text to hold each of want.
func wantText(t *testing.T, s *browser.Session, selector string, want ...string) {
	t.Helper()
	got := s.Text(selector)
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Fatalf("%s reads %q, without %q", selector, got, w)
		}
	}
}

// A refund never sent is cancelled at once from its page: the page says
// nothing reaches the provider, and after the cancel the job is cancelled,
// its history naming alice and her reason. A refund a worker holds gets a
// cancel request instead: the page says the provider may have it, the job
// is taken from its worker (whose completion is then refused as stale) and
// due to reconcile, the page shows when the cancel was requested and offers
// no second cancel (R32).
func TestCancelFromTheJobPageInABrowser_R32(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	never := e.enqueue(t, "cancel-never-sent", "acme")
	b := browser.Start(t)
	s, logged := e.signedInBrowser(t, b, tokAlice)

	s.Navigate(fmt.Sprintf("%s/jobs/%d", e.web.URL, never.GetId()))
	wantText(t, s, "#cancel-consequence", "cancelled at once", "nothing reaches acme")
	s.Fill("#cancel-reason", "customer withdrew the request")
	s.Submit("#cancel-refund")
	wantText(t, s, "#flash", "Cancelled: nothing was sent to acme", "under alice")
	if got := s.Text("#state"); got != "cancelled" {
		t.Fatalf("state %q after the cancel", got)
	}
	d := e.getJob(t, never.GetId())
	last := d.GetEvents()[len(d.GetEvents())-1]
	if d.GetJob().GetState() != pb.JobState_JOB_STATE_CANCELLED || last.GetWorkerId() != "alice" ||
		last.GetReason() != "customer withdrew the request" || last.GetKind() != "cancelled" {
		t.Fatalf("after the cancel: %v, last event %v", d.GetJob(), last)
	}
	if s.Exists("#cancel-form") {
		t.Fatal("a cancelled job still offers the cancel form")
	}

	running := e.enqueue(t, "cancel-running", "acme")
	held := e.claim(t, "acme", running.GetId())
	s.Navigate(fmt.Sprintf("%s/jobs/%d", e.web.URL, running.GetId()))
	wantText(t, s, "#cancel-consequence", "may already have this refund", "the worker now holding it loses it",
		"the job joins the attention list", "a person decides")
	shot(s, "console-cancel.png")
	s.Fill("#cancel-reason", "duplicate refund request")
	s.Submit("#cancel-refund")
	wantText(t, s, "#flash", "Cancel requested", "under alice")
	wantText(t, s, "#cancel-requested", "no worker sends this refund again")
	if s.Exists("#cancel-form") {
		t.Fatal("a job whose cancel was requested still offers the cancel form")
	}
	j := e.getJob(t, running.GetId()).GetJob()
	if j.GetState() != pb.JobState_JOB_STATE_READY || j.GetAttempt() != held.GetAttempt()+1 ||
		j.GetNextAction() != pb.NextAction_NEXT_ACTION_RECONCILE || j.GetCancelRequestedAt() == nil {
		t.Fatalf("after the cancel of a running job: %v", j)
	}
	// The worker that held it finishes its call: its write is refused.
	_, err := e.api.Complete(as(t, tokWorker), &pb.CompleteRequest{JobId: running.GetId(), Attempt: held.GetAttempt(),
		LeaseToken: held.GetLeaseToken(), ProviderRefundId: "re_late"})
	if reason := explainReason(err); status.Code(err) != codes.FailedPrecondition || reason != "STALE_ATTEMPT" {
		t.Fatalf("the former holder's completion: %v (reason %s), want STALE_ATTEMPT", err, reason)
	}
	noErrors(t, logged)
}

// Someone acting between a person's page and their cancel fences it out,
// and the page says so in plain words: a worker that claimed the job
// (STALE_ATTEMPT: "someone acted first"), or another operator whose cancel
// request came first (JOB_NOT_CANCELLABLE). Nothing of hers is written.
func TestStaleCancelSaysWhatHappened_R32(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	job := e.enqueue(t, "cancel-stale", "acme")
	b := browser.Start(t)
	s, logged := e.signedInBrowser(t, b, tokAlice)
	s.Navigate(fmt.Sprintf("%s/jobs/%d", e.web.URL, job.GetId()))
	held := e.claim(t, "acme", job.GetId()) // after alice's page
	s.Fill("#cancel-reason", "customer withdrew")
	s.Submit("#cancel-refund")
	wantText(t, s, "#flash", "Someone acted first: the job changed since this page showed it", "Nothing was changed by you")
	if got := s.Text("#state"); got != "running" {
		t.Fatalf("the page shows the job %q, want it as it is now: running", got)
	}
	if j := e.getJob(t, job.GetId()).GetJob(); j.GetAttempt() != held.GetAttempt() || j.GetCancelRequestedAt() != nil {
		t.Fatalf("a stale cancel changed the job: %v", j)
	}

	sent := e.sent(t, "acme", "cancel-twice")[0]
	s.Navigate(fmt.Sprintf("%s/jobs/%d", e.web.URL, sent.GetId()))
	if _, err := e.api.CancelRefund(as(t, tokBob), &pb.CancelRefundRequest{JobId: sent.GetId(), Attempt: sent.GetAttempt(),
		Reason: "bob's call"}); err != nil {
		t.Fatal(err)
	}
	s.Fill("#cancel-reason", "alice's call")
	s.Submit("#cancel-refund")
	wantText(t, s, "#flash", "can no longer be cancelled", "a cancel of it was requested already")
	d := e.getJob(t, sent.GetId())
	if last := d.GetEvents()[len(d.GetEvents())-1]; last.GetWorkerId() != "bob" {
		t.Fatalf("the last transition is %v, want bob's cancel request", last)
	}
	noErrors(t, logged)
}

// A review whose cancel was requested, the provider showing no refund,
// marks Cancel (no refund happened) as fitting; resolving so cancels it.
func TestReviewResolvedAsCancelledInABrowser_R32(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	job := e.toReview(t, "cancel-review", "acme", "reconcile: no record at the provider")
	if _, err := e.api.CancelRefund(as(t, tokBob), &pb.CancelRefundRequest{JobId: job.GetId(), Attempt: job.GetAttempt(),
		Reason: "order cancelled by the shop"}); err != nil {
		t.Fatal(err)
	}
	b := browser.Start(t)
	s, logged := e.signedInBrowser(t, b, tokAlice)
	s.Navigate(fmt.Sprintf("%s/jobs/%d", e.web.URL, job.GetId()))
	wantText(t, s, "#story-cancel", "a cancel was requested")
	if !s.Exists("#cancel-review-form.fits") || s.Exists("#reconcile-form.fits") || s.Exists("#cancel-form") {
		t.Fatal("Cancel (no refund happened) is not the form marked as fitting, or the page offers a plain cancel")
	}
	s.Fill("#cancel-review-note", "acme's dashboard shows no refund for this payment")
	s.Submit("#cancel-review")
	wantText(t, s, "#flash", "Cancelled: recorded that no refund happened", "under alice")
	if j := e.getJob(t, job.GetId()).GetJob(); j.GetState() != pb.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("after the resolution: %v", j)
	}
	noErrors(t, logged)
}

// Bulk cancel previews the ready refunds a filter matches with the attempt
// each is at; a count typed wrong is refused and changes nothing; confirmed,
// it cancels each at its previewed attempt and reports per job: never sent
// cancelled, sent given a cancel request, claimed since the preview left
// alone. Another provider's job is not touched (R29, R32).
func TestBulkCancelInABrowser_R32(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	sent := e.sent(t, "acme", "bulk-cancel-sent-a", "bulk-cancel-sent-b")
	sentA, sentB := sent[0], sent[1]
	var never []*pb.Job
	for i := range 3 {
		never = append(never, e.enqueue(t, fmt.Sprintf("bulk-cancel-never-%d", i), "acme"))
	}
	globex := e.enqueue(t, "bulk-cancel-globex", "globex")
	b := browser.Start(t)
	s, logged := e.signedInBrowser(t, b, tokAlice)
	s.Navigate(e.web.URL + "/bulk/cancel")
	s.Fill("#bulk-form input[name=provider]", "acme")
	s.Submit("#preview")
	wantText(t, s, "#preview-count", "5 job(s) in ready match the filters")
	claimed := e.claim(t, "acme", sentA.GetId()) // the oldest due, after the preview

	s.Fill("#reason", "the shop reversed these orders")
	s.Fill("#confirm", "4")
	s.Submit("#apply")
	wantText(t, s, "#error", "Type 5 to confirm", "Nothing was changed")
	for _, j := range append([]*pb.Job{sentB, globex}, never...) {
		if got := e.getJob(t, j.GetId()).GetJob(); got.GetState() != pb.JobState_JOB_STATE_READY || got.GetCancelRequestedAt() != nil {
			t.Fatalf("a wrong count changed job %d: %v", j.GetId(), got)
		}
	}
	s.Fill("#reason", "the shop reversed these orders")
	s.Fill("#confirm", "5")
	s.Submit("#apply")
	for sel, want := range map[string]string{"#cancelled": "3", "#requested": "1", "#changed": "1"} {
		if got := s.Text(sel); got != want {
			t.Fatalf("%s = %q, want %s:\n%s", sel, got, want, s.Text("#summary"))
		}
	}
	wantText(t, s, "#summary", fmt.Sprint(sentA.GetId()), fmt.Sprint(sentB.GetId()))
	for _, j := range never {
		d := e.getJob(t, j.GetId())
		last := d.GetEvents()[len(d.GetEvents())-1]
		if d.GetJob().GetState() != pb.JobState_JOB_STATE_CANCELLED || last.GetWorkerId() != "alice" ||
			last.GetReason() != "the shop reversed these orders" {
			t.Fatalf("job %d after the bulk cancel: %v, last event %v", j.GetId(), d.GetJob(), last)
		}
	}
	if j := e.getJob(t, sentB.GetId()).GetJob(); j.GetState() != pb.JobState_JOB_STATE_READY || j.GetCancelRequestedAt() == nil {
		t.Fatalf("the sent job after the bulk cancel: %v, want a cancel request", j)
	}
	if j := e.getJob(t, sentA.GetId()).GetJob(); j.GetAttempt() != claimed.GetAttempt() || j.GetCancelRequestedAt() != nil {
		t.Fatalf("the job claimed after the preview: %v, want it left to its worker", j)
	}
	if j := e.getJob(t, globex.GetId()).GetJob(); j.GetState() != pb.JobState_JOB_STATE_READY || j.GetCancelRequestedAt() != nil {
		t.Fatalf("globex's job: %v", j)
	}
	noErrors(t, logged)
}

// A provider paused from the overview shows there with who, when and why,
// its jobs are granted to nobody, and the pause is among the recent pause
// events; resumed from its row, it is gone from the paused ones and its job
// is granted (R33).
func TestPauseAndResumeOnTheOverviewInABrowser_R33(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	job := e.enqueue(t, "paused-acme", "acme")
	b := browser.Start(t)
	s, logged := e.signedInBrowser(t, b, tokAlice)
	s.Fill("#pause-provider", "acme")
	s.Fill("#pause-reason", "acme reports an incident")
	s.Submit("#pause")
	wantText(t, s, "#flash", "acme is paused", "under alice")
	// The overview is kept for a moment: it shows the pause on a later read.
	proctest.WaitFor(t, 10*time.Second, "the pause on the overview", func() bool {
		s.Navigate(e.web.URL + "/")
		return s.Exists(`#paused tr[data-provider="acme"]`)
	})
	wantText(t, s, `#paused tr[data-provider="acme"]`, "alice", "acme reports an incident")
	wantText(t, s, "#pause-events", "paused", "alice", "acme reports an incident")
	shot(s, "console-providers.png")
	got, err := e.api.Claim(as(t, tokWorker), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1})
	if err != nil || len(got.GetJobs()) != 0 {
		t.Fatalf("a claim while acme is paused: %v, %v; want nothing", got, err)
	}

	s.Fill(`#paused tr[data-provider="acme"] input[name=reason]`, "incident resolved")
	s.Submit(`#paused tr[data-provider="acme"] button`)
	wantText(t, s, "#flash", "acme is resumed")
	proctest.WaitFor(t, 10*time.Second, "the resume on the overview", func() bool {
		s.Navigate(e.web.URL + "/")
		return !s.Exists(`#paused tr[data-provider="acme"]`) && strings.Contains(s.Text("#pause-events"), "resumed")
	})
	e.claim(t, "acme", job.GetId())
	noErrors(t, logged)
}

// A refund whose provider reported it failed after it succeeded is on the
// attention list, counted on the overview; an acknowledgement from a page
// older than a newer receipt is refused and keeps it listed; acknowledged
// from the page as it is now, it leaves the list, the note in its history
// (R34).
func TestAcknowledgeTakesAJobOffTheAttentionListInABrowser_R34(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	job := e.enqueue(t, "attention-1", "acme")
	c := e.claim(t, "acme", job.GetId())
	if _, err := e.api.Complete(as(t, tokWorker), &pb.CompleteRequest{JobId: job.GetId(), Attempt: c.GetAttempt(),
		LeaseToken: c.GetLeaseToken(), ProviderRefundId: "re_1"}); err != nil {
		t.Fatal(err)
	}
	failed := func(event string) {
		t.Helper()
		if _, err := e.api.ReportObservation(as(t, tokWorker), &pb.ReportObservationRequest{
			Job: &pb.ReportObservationRequest_JobId{JobId: job.GetId()}, Source: "webhook",
			Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_FAILED, ProviderRefundId: "re_1", ProviderEventId: event,
			Detail: "refund reversed by the bank"}); err != nil {
			t.Fatal(err)
		}
	}
	failed("evt_1")
	b := browser.Start(t)
	s, logged := e.signedInBrowser(t, b, tokAlice)
	proctest.WaitFor(t, 10*time.Second, "the overview's attention count", func() bool {
		s.Navigate(e.web.URL + "/")
		return s.Text("#attention-jobs") == "1"
	})
	s.Click(`a[href="/attention"]`)
	row := fmt.Sprintf(`#attention-list tr[data-job="%d"]`, job.GetId())
	wantText(t, s, row, "A receipt came after the refund succeeded")
	shot(s, "console-attention.png")

	// The bank's second word comes in while alice reads.
	time.Sleep(10 * time.Millisecond)
	failed("evt_2")
	s.Fill(row+" input[name=note]", "checked with acme: reversed, refunding by hand")
	s.Submit(row + " button")
	wantText(t, s, "#flash", "A newer reason to look", "stays on the attention list")
	if !s.Exists(row) {
		t.Fatal("a refused acknowledgement took the job off the list")
	}
	s.Fill(row+" input[name=note]", "checked with acme: reversed twice, refunding by hand")
	s.Submit(row + " button")
	wantText(t, s, "#flash", "Acknowledged", "under alice")
	if s.Exists(row) {
		t.Fatal("the acknowledged job is still on the list")
	}
	d := e.getJob(t, job.GetId())
	last := d.GetEvents()[len(d.GetEvents())-1]
	if d.GetJob().GetAttentionSince() != nil || last.GetWorkerId() != "alice" ||
		last.GetReason() != "checked with acme: reversed twice, refunding by hand" {
		t.Fatalf("after the acknowledgement: %v, last event %v", d.GetJob(), last)
	}
	noErrors(t, logged)
}

// A reader sees the new pages without their forms, and the console refuses
// her actions before the coordinator would (R29).
func TestReaderSeesPausesAttentionAndCancelsButCannotAct_R29(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	job := e.enqueue(t, "reader-job", "acme")
	rita := e.person(t)
	rita.signIn(tokRita)
	pg := rita.get(fmt.Sprintf("/jobs/%d", job.GetId()))
	if strings.Contains(pg.body, `id="cancel-form"`) {
		t.Fatal("a reader is offered the cancel form")
	}
	if pg := rita.get("/"); strings.Contains(pg.body, `id="pause-form"`) || !strings.Contains(pg.body, `id="paused"`) {
		t.Fatal("a reader is offered the pause form, or does not see the paused providers")
	}
	mustContain(t, rita.get("/attention"), `id="attention-list"`, `id="read-only"`)
	if pg := rita.get("/bulk/cancel"); !strings.Contains(pg.body, `id="read-only"`) || strings.Contains(pg.body, `id="bulk-form"`) {
		t.Fatal("a reader is offered the bulk cancel")
	}
	for path, form := range map[string]map[string][]string{
		fmt.Sprintf("/jobs/%d/cancel", job.GetId()):      {"attempt": {"0"}, "reason": {"x"}},
		fmt.Sprintf("/jobs/%d/acknowledge", job.GetId()): {"attention_since": {time.Now().Format(time.RFC3339Nano)}, "note": {"x"}},
		"/providers/pause":  {"provider": {"acme"}, "reason": {"x"}},
		"/providers/resume": {"provider": {"acme"}, "reason": {"x"}},
		"/bulk/preview":     {"kind": {"cancel"}},
	} {
		if pg := rita.post(path, form); pg.status != 403 {
			t.Fatalf("a reader's POST %s: %d", path, pg.status)
		}
	}
	if j := e.getJob(t, job.GetId()).GetJob(); j.GetState() != pb.JobState_JOB_STATE_READY {
		t.Fatalf("a reader changed the job: %v", j)
	}
}

// explainReason is the ErrorInfo reason of err, as the wire has it.
func explainReason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}
