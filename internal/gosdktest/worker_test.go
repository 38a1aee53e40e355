package jobfence_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// call is one handler invocation.
type call struct {
	method   string // "refund" or "reconcile"
	jobID    int64
	attempt  int64
	takeover bool
}

// recorder is a Handler whose answers the test scripts.
type recorder struct {
	mu        sync.Mutex
	calls     []call
	refund    func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result
	reconcile func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result
}

func (r *recorder) record(method string, j jobfence.ClaimedJob) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{method, j.Job.ID, j.Attempt, j.Takeover})
}

func (r *recorder) Refund(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
	r.record("refund", j)
	if r.refund == nil {
		return jobfence.Succeeded(fmt.Sprintf("re_%d", j.Job.ID))
	}
	return r.refund(ctx, j)
}

func (r *recorder) Reconcile(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
	r.record("reconcile", j)
	if r.reconcile == nil {
		return jobfence.NoRecord()
	}
	return r.reconcile(ctx, j)
}

func (r *recorder) log() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func newWorker(t *testing.T, c *coordinator, h jobfence.Handler, o jobfence.WorkerOptions) *jobfence.Worker {
	t.Helper()
	if o.WorkerID == "" {
		o.WorkerID = "w"
	}
	if o.PollInterval == 0 {
		o.PollInterval = 50 * time.Millisecond
	}
	if o.ClaimBackoff == 0 {
		o.ClaimBackoff = 50 * time.Millisecond
	}
	if o.ReceiptSpool == "" {
		o.ReceiptSpool = filepath.Join(t.TempDir(), "receipts.jsonl")
	}
	w, err := jobfence.NewWorker(c.client, h, o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func waitState(t *testing.T, c *coordinator, id int64, want jobfence.JobState) jobfence.JobDetail {
	t.Helper()
	var d jobfence.JobDetail
	proctest.WaitFor(t, 20*time.Second, fmt.Sprintf("job %d in state %s", id, want), func() bool {
		d = c.get(t, id)
		return d.Job.State == want
	})
	return d
}

func TestWorkerRefundsAndCompletes(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	h := &recorder{}
	w := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "w-1"})
	r := runWorker(t, w)
	d := waitState(t, c, job.ID, jobfence.StateSucceeded)
	if d.Job.ProviderRefundID != fmt.Sprintf("re_%d", job.ID) || d.Job.WorkerID != "w-1" {
		t.Fatalf("job %+v", d.Job)
	}
	if got := h.log(); len(got) != 1 || got[0].method != "refund" || got[0].attempt != 1 {
		t.Fatalf("handler calls %+v, want one refund under attempt 1", got)
	}
	r.cancel()
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := w.Stats(); s.Claimed != 1 || s.Completed != 1 || s.StaleRejected != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestWorkerClaimsOnlyWhatItCanStart_R18(t *testing.T) {
	c := startCoordinator(t)
	var ids []int64
	for range 5 {
		ids = append(ids, c.enqueue(t, "acme").ID)
	}
	release := make(chan struct{})
	var running, peak atomic.Int32
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		running.Add(-1)
		return jobfence.Succeeded(fmt.Sprintf("re_%d", j.Job.ID))
	}}
	w := newWorker(t, c, h, jobfence.WorkerOptions{Concurrency: 2})
	runWorker(t, w)
	proctest.WaitFor(t, 10*time.Second, "two handlers running", func() bool { return running.Load() == 2 })
	time.Sleep(300 * time.Millisecond) // room for a wrong claim to happen
	held := 0
	for _, id := range ids {
		if c.get(t, id).Job.State == jobfence.StateRunning {
			held++
		}
	}
	if held != 2 {
		t.Fatalf("%d jobs held while 2 slots are busy; the worker must claim only what it can start", held)
	}
	close(release)
	for _, id := range ids {
		waitState(t, c, id, jobfence.StateSucceeded)
	}
	if peak.Load() > 2 {
		t.Fatalf("%d handlers ran at once with concurrency 2", peak.Load())
	}
}

// TestWorkerFilesObservationWhenStale_R15_T3: A's refund goes through but
// its answer arrives after B took the job over and completed it; A's write is
// rejected and its receipt lands in the observation log.
func TestWorkerFilesObservationWhenStale_R15_T3(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	sent, answer := make(chan struct{}), make(chan struct{})
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		close(sent)
		<-answer // the provider made the refund; its reply is late
		return jobfence.Succeeded("re_late")
	}}
	a := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "A"})
	runWorker(t, a)
	<-sent
	c.expire(t, job.ID)
	b := c.claimOne(t, "B", job)
	if !b.Takeover || b.NextAction != jobfence.ActionReconcile || b.Attempt != 2 {
		t.Fatalf("B's claim %+v, want a takeover under attempt 2 with reconcile", b)
	}
	// B reconciles with the same operation key and completes.
	if _, err := c.client.Complete(ctxFor(t), jobfence.CompleteRequest{JobID: job.ID, Attempt: b.Attempt, LeaseToken: b.LeaseToken, ProviderRefundID: "re_late"}); err != nil {
		t.Fatal(err)
	}
	close(answer)
	var d jobfence.JobDetail
	proctest.WaitFor(t, 10*time.Second, "A's observation", func() bool {
		d = c.get(t, job.ID)
		return len(d.Observations) > 0
	})
	o := d.Observations[0]
	if len(d.Observations) != 1 || o.Source != "worker:A" || o.ReportedAttempt != 1 || o.JobAttempt != 2 ||
		o.Outcome != jobfence.OutcomeSucceeded || o.ProviderRefundID != "re_late" {
		t.Fatalf("observations %+v", d.Observations)
	}
	if d.Job.State != jobfence.StateSucceeded || d.Job.Attempt != 2 || d.Job.WorkerID != "B" {
		t.Fatalf("job %+v, want succeeded by B under attempt 2", d.Job)
	}
	want := []string{"enqueued@0", "claimed@1", "taken_over@2", "completed@2"}
	if got := kinds(d); !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v (A wrote nothing)", got, want)
	}
	proctest.WaitFor(t, 5*time.Second, "A's stats", func() bool { return a.Stats().Observations == 1 })
	if s := a.Stats(); s.StaleRejected != 1 || s.Completed != 0 {
		t.Fatalf("A's stats %+v", s)
	}
}

func TestWorkerNeverActsOnFailedClaim_R7(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	c.dropAfterCommit("Claim", 1) // the claim commits attempt 1, the worker hears CLAIM_OUTCOME_UNKNOWN
	var failed []error
	var mu sync.Mutex
	h := &recorder{reconcile: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		return jobfence.Succeeded("re_recovered")
	}}
	// Claim calls: the worker stream's grants are R7's other case
	// (TestWorkerStreamCutGrantsNothingToActOn_R7).
	w := newWorker(t, c, h, jobfence.WorkerOptions{Lease: time.Second, NoStream: true, OnEvent: func(e jobfence.WorkerEvent) {
		if e.Kind == jobfence.WorkerClaimFailed {
			mu.Lock()
			failed = append(failed, e.Err)
			mu.Unlock()
		}
	}})
	runWorker(t, w)
	d := waitState(t, c, job.ID, jobfence.StateSucceeded)
	// Nothing was done under attempt 1; the grant came back as a takeover
	// once its lease expired, and the takeover reconciled first.
	want := []call{{"reconcile", job.ID, 2, true}}
	if got := h.log(); !slices.Equal(got, want) {
		t.Fatalf("handler calls %+v, want %+v", got, want)
	}
	if got, want := kinds(d), []string{"enqueued@0", "claimed@1", "taken_over@2", "completed@2"}; !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failed) != 1 || !errors.Is(failed[0], jobfence.ErrClaimOutcomeUnknown) {
		t.Fatalf("claim failures %v, want one ErrClaimOutcomeUnknown", failed)
	}
}

func TestWorkerDrainsOnShutdownSignal(t *testing.T) {
	c := startCoordinator(t)
	first := c.enqueue(t, "acme")
	started, release := make(chan struct{}), make(chan struct{})
	var handlerCtxErr atomic.Value
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		close(started)
		<-release
		handlerCtxErr.Store(fmt.Sprint(ctx.Err()))
		return jobfence.Succeeded("re_drained")
	}}
	w := newWorker(t, c, h, jobfence.WorkerOptions{Concurrency: 4, DrainTimeout: 20 * time.Second})
	r := runWorker(t, w)
	<-started
	r.cancel() // SIGTERM: stop claiming, finish what is in flight
	second := c.enqueue(t, "acme")
	time.Sleep(300 * time.Millisecond)
	if r.returned() {
		t.Fatal("Run returned with a job in flight")
	}
	close(release)
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run after drain: %v", err)
	}
	if got := handlerCtxErr.Load(); got != "<nil>" {
		t.Fatalf("the in-flight provider call's context was cancelled by shutdown: %v", got)
	}
	if d := c.get(t, first.ID); d.Job.State != jobfence.StateSucceeded {
		t.Fatalf("in-flight job after drain: %+v", d.Job)
	}
	// A claim the coordinator still held for the worker when its shutdown
	// began may take the job in the enqueue's own transaction; the worker,
	// gone, never sees it, and the coordinator hands it back under its own
	// attempt (R7): ready again, never handled. Anything else is a job the
	// draining worker took. The coordinator hands a claim back after the
	// worker left, on its own time: wait for the job to leave running.
	var d jobfence.JobDetail
	proctest.WaitFor(t, 10*time.Second, "the job enqueued after shutdown not running", func() bool {
		d = c.get(t, second.ID)
		return d.Job.State != jobfence.StateRunning
	})
	handedBack := d.Job.Attempt == 1 && strings.HasPrefix(d.Job.LastReason, "claim abandoned by its caller")
	if d.Job.State != jobfence.StateReady || d.Job.Attempt != 0 && !handedBack {
		t.Fatalf("job enqueued after shutdown: %+v, want untouched or handed back", d.Job)
	}
	for _, call := range h.log() {
		if call.jobID == second.ID {
			t.Fatalf("the draining worker handled the job enqueued after shutdown: %+v", h.log())
		}
	}
}

func TestWorkerDrainTimeoutCutsOff(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	started := make(chan struct{})
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		close(started)
		<-ctx.Done()
		return jobfence.Unknown(ctx.Err())
	}}
	w := newWorker(t, c, h, jobfence.WorkerOptions{DrainTimeout: 300 * time.Millisecond, ProviderTimeout: time.Minute})
	r := runWorker(t, w)
	<-started
	if err := w.Shutdown(ctxFor(t)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := r.wait(t, 10*time.Second); !errors.Is(err, jobfence.ErrDrainTimeout) {
		t.Fatalf("Run: %v, want ErrDrainTimeout", err)
	}
	// The cut-off job keeps its lease; a takeover will reconcile it (R6).
	if d := c.get(t, job.ID); d.Job.State != jobfence.StateRunning || d.Job.Attempt != 1 {
		t.Fatalf("job %+v, want still running under attempt 1", d.Job)
	}
}

func TestWorkerReconcileDecisions_R14_R16(t *testing.T) {
	t.Run("pending reschedules a reconcile R4", func(t *testing.T) {
		c := startCoordinator(t)
		job := c.enqueue(t, "acme")
		h := &recorder{refund: func(context.Context, jobfence.ClaimedJob) jobfence.Result {
			return jobfence.Pending("re_p", time.Hour)
		}}
		runWorker(t, newWorker(t, c, h, jobfence.WorkerOptions{}))
		var d jobfence.JobDetail
		proctest.WaitFor(t, 10*time.Second, "the reschedule", func() bool {
			d = c.get(t, job.ID)
			return d.Job.State == jobfence.StateReady && d.Job.Attempt == 1
		})
		if d.Job.NextAction != jobfence.ActionReconcile || d.Job.NextAttemptAt.Sub(d.Job.UpdatedAt) < 59*time.Minute {
			t.Fatalf("job after pending %+v, want reconcile in an hour", d.Job)
		}
	})

	t.Run("no record inside the window resends with the same key", func(t *testing.T) {
		c := startCoordinator(t)
		job := c.enqueue(t, "acme") // 24h window
		var sends atomic.Int32
		h := &recorder{
			refund: func(_ context.Context, j jobfence.ClaimedJob) jobfence.Result {
				if sends.Add(1) == 1 {
					return jobfence.Unknown(errors.New("reply cut"))
				}
				return jobfence.Succeeded("re_same_key") // the provider replays the first refund
			},
		}
		runWorker(t, newWorker(t, c, h, jobfence.WorkerOptions{
			Policy: jobfence.ProviderPolicy{SameKeyResendSafe: true, UnknownDelay: time.Millisecond},
		}))
		d := waitState(t, c, job.ID, jobfence.StateSucceeded)
		want := []call{{"refund", job.ID, 1, false}, {"reconcile", job.ID, 2, false}, {"refund", job.ID, 3, false}}
		if got := h.log(); !slices.Equal(got, want) {
			t.Fatalf("handler calls %+v, want %+v", got, want)
		}
		if d.Job.ProviderRefundID != "re_same_key" {
			t.Fatalf("job %+v", d.Job)
		}
	})

	t.Run("no record without the guarantee escalates R16", func(t *testing.T) {
		c := startCoordinator(t)
		job := c.enqueue(t, "acme")
		h := &recorder{refund: func(context.Context, jobfence.ClaimedJob) jobfence.Result {
			return jobfence.Unknown(errors.New("reply cut"))
		}}
		runWorker(t, newWorker(t, c, h, jobfence.WorkerOptions{Policy: jobfence.ProviderPolicy{UnknownDelay: time.Millisecond}}))
		d := waitState(t, c, job.ID, jobfence.StateManualReview)
		if got := len(h.log()); got != 2 {
			t.Fatalf("handler calls %+v, want refund then reconcile", h.log())
		}
		if d.Job.LastReason == "" {
			t.Fatal("escalation without a reason")
		}
	})

	t.Run("no record past the window escalates R22", func(t *testing.T) {
		t.Parallel()
		c := startCoordinator(t)
		job := c.enqueue(t, "shortwindow") // the coordinator keeps its keys 2s
		a := c.claimOne(t, "A", job)       // the key goes out
		if _, err := c.client.Reschedule(ctxFor(t), jobfence.RescheduleRequest{JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken,
			Delay: 2 * time.Second, Reason: "reply lost"}); err != nil {
			t.Fatal(err)
		}
		h := &recorder{}
		runWorker(t, newWorker(t, c, h, jobfence.WorkerOptions{
			Policy: jobfence.ProviderPolicy{SameKeyResendSafe: true, ResendMargin: 500 * time.Millisecond},
		}))
		d := waitState(t, c, job.ID, jobfence.StateManualReview)
		if got := h.log(); len(got) != 1 || got[0].method != "reconcile" {
			t.Fatalf("handler calls %+v, want one reconcile and no resend", got)
		}
		t.Logf("escalated: %s", d.Job.LastReason)
	})

	t.Run("a resend is refused before sending when the window closed", func(t *testing.T) {
		t.Parallel()
		c := startCoordinator(t)
		job := c.enqueue(t, "shortwindow")
		a := c.claimOne(t, "A", job)
		// A decided a same-key resend; it is picked up only after the window.
		if _, err := c.client.Reschedule(ctxFor(t), jobfence.RescheduleRequest{JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken,
			NextAction: jobfence.ActionRefund, Delay: 2 * time.Second, Reason: "no record; resend"}); err != nil {
			t.Fatal(err)
		}
		h := &recorder{}
		var refused atomic.Int32
		runWorker(t, newWorker(t, c, h, jobfence.WorkerOptions{
			Policy: jobfence.ProviderPolicy{SameKeyResendSafe: true, ResendMargin: 500 * time.Millisecond},
			OnEvent: func(e jobfence.WorkerEvent) {
				if e.Kind == jobfence.WorkerResendRefused {
					refused.Add(1)
				}
			},
		}))
		waitState(t, c, job.ID, jobfence.StateManualReview)
		if got := h.log(); len(got) != 0 || refused.Load() != 1 {
			t.Fatalf("handler calls %+v, refusals %d; want no provider call", got, refused.Load())
		}
	})
}

// TestWorkerLateAnswerBecomesObservation_R15: an answer after the deadline
// never writes: the job is rescheduled to reconcile (outcome unknown) and the
// answer is filed as a receipt, which makes the waiting job due at once
// (R28); the reconcile then completes it.
func TestWorkerLateAnswerBecomesObservation_R15(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	h := &recorder{
		refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
			time.Sleep(700 * time.Millisecond) // ignores its context, like async I/O without an abort
			return jobfence.Succeeded("re_slow")
		},
		reconcile: func(context.Context, jobfence.ClaimedJob) jobfence.Result { return jobfence.Succeeded("re_slow") },
	}
	w := newWorker(t, c, h, jobfence.WorkerOptions{ProviderTimeout: 100 * time.Millisecond, LateAnswerGrace: 100 * time.Millisecond,
		Policy: jobfence.ProviderPolicy{UnknownDelay: time.Hour}})
	runWorker(t, w)
	d := waitState(t, c, job.ID, jobfence.StateSucceeded)
	history := kinds(d)
	if !slices.Contains(history, "rescheduled@1") || !slices.Contains(history, "expedited@1") ||
		history[len(history)-1] != "completed@2" {
		t.Fatalf("history %v: want the reschedule to reconcile under attempt 1 (outcome unknown at the deadline), "+
			"the receipt's expedite, and the reconcile's completion under attempt 2", history)
	}
	if len(d.Observations) != 1 {
		t.Fatalf("observations %+v, want the late answer's", d.Observations)
	}
	if o := d.Observations[0]; o.Outcome != jobfence.OutcomeSucceeded || o.ProviderRefundID != "re_slow" || o.ReportedAttempt != 1 {
		t.Fatalf("observation %+v", o)
	}
	// The database moves before the worker's counter does: it counts the
	// completion when the write-back's answer comes back. With one slot, the
	// reschedule was counted before the reconcile's claim.
	proctest.WaitFor(t, 10*time.Second, "the completion counted", func() bool { return w.Stats().Completed >= 1 })
	if s := w.Stats(); s.LateAnswers != 1 || s.Rescheduled != 1 || s.Completed != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestWorkerHandlerPanicIsUnknownOutcome(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	h := &recorder{refund: func(context.Context, jobfence.ClaimedJob) jobfence.Result { panic("boom") }}
	runWorker(t, newWorker(t, c, h, jobfence.WorkerOptions{Policy: jobfence.ProviderPolicy{UnknownDelay: time.Hour}}))
	var d jobfence.JobDetail
	proctest.WaitFor(t, 10*time.Second, "the reschedule", func() bool {
		d = c.get(t, job.ID)
		return d.Job.State == jobfence.StateReady && d.Job.Attempt == 1
	})
	if d.Job.NextAction != jobfence.ActionReconcile {
		t.Fatalf("job %+v, want a reconcile next", d.Job)
	}
}

func TestNewWorkerRejectsBadOptions(t *testing.T) {
	c := startCoordinatorOn(t, testdb.SQLiteBackend(), nil)
	for _, o := range []jobfence.WorkerOptions{
		{},
		{WorkerID: "w", Concurrency: 101},
		{WorkerID: "w", ClaimWait: 2 * time.Minute},
		{WorkerID: "w", Lease: -time.Second},
	} {
		if _, err := jobfence.NewWorker(c.client, &recorder{}, o); err == nil {
			t.Errorf("NewWorker(%+v) accepted", o)
		}
	}
}

// TestWorkerKeepsFilingReceiptWhileUnavailable_R15: a stale worker's receipt
// may be the only trace of a refund; while the coordinator does not answer,
// a worker without a receipt spool keeps filing it past the client's own
// retries.
func TestWorkerKeepsFilingReceiptWhileUnavailable_R15(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	sent, answer := make(chan struct{}), make(chan struct{})
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		close(sent)
		<-answer
		return jobfence.Succeeded("re_late")
	}}
	var mu sync.Mutex
	var observed, failed int
	a := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "A", ReceiptSpool: jobfence.ReceiptSpoolOff, OnEvent: func(e jobfence.WorkerEvent) {
		mu.Lock()
		defer mu.Unlock()
		switch e.Kind {
		case jobfence.WorkerObserved:
			observed++
		case jobfence.WorkerObserveFailed:
			failed++
		}
	}})
	runWorker(t, a)
	<-sent
	c.expire(t, job.ID)
	b := c.claimOne(t, "B", job)
	if _, err := c.client.Complete(ctxFor(t), jobfence.CompleteRequest{JobID: job.ID, Attempt: b.Attempt, LeaseToken: b.LeaseToken, ProviderRefundID: "re_late"}); err != nil {
		t.Fatal(err)
	}
	// More lost replies than the client retries on its own.
	c.dropAfterCommit("ReportObservation", 9)
	close(answer)
	proctest.WaitFor(t, 30*time.Second, "A's receipt filed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return observed+failed > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if observed != 1 || failed != 0 {
		t.Fatalf("observed %d, failed %d: want the receipt filed in the end", observed, failed)
	}
	if d := c.get(t, job.ID); len(d.Observations) != 1 || d.Observations[0].ProviderRefundID != "re_late" {
		t.Fatalf("observations %+v, want the one receipt", d.Observations)
	}
}
