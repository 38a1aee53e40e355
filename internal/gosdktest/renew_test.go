package jobfence_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/internal/proctest"
)

// R27: with a 2 s lease and a provider call of 6 s, a renewing worker
// finishes the job under its first grant while another worker claims all
// along: no takeover, the history shows one claim and one completion.
func TestWorkerRenewsLongCallWithoutTakeover_R27(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	slow := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		select {
		case <-time.After(6 * time.Second):
			return jobfence.Succeeded("re_slow")
		case <-ctx.Done():
			return jobfence.Unknown(context.Cause(ctx))
		}
	}}
	a := newWorker(t, c, slow, jobfence.WorkerOptions{WorkerID: "A", Lease: 2 * time.Second})
	runWorker(t, a)
	proctest.WaitFor(t, 10*time.Second, "A's claim", func() bool { return a.Stats().Claimed == 1 })
	rival := &recorder{}
	runWorker(t, newWorker(t, c, rival, jobfence.WorkerOptions{WorkerID: "B", Lease: 2 * time.Second,
		PollInterval: 100 * time.Millisecond}))

	d := waitState(t, c, job.ID, jobfence.StateSucceeded)
	if got, want := kinds(d), []string{"enqueued@0", "claimed@1", "completed@1"}; !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v: a live worker was taken over", got, want)
	}
	if got := rival.log(); len(got) != 0 {
		t.Fatalf("the rival ran %+v", got)
	}
	// The database moves before A's counter does: A counts its completion
	// when the write-back's answer comes back.
	proctest.WaitFor(t, 10*time.Second, "A's completion counted", func() bool { return a.Stats().Completed == 1 })
	if s := a.Stats(); s.Renewals < 4 || s.GrantsLost != 0 || s.Completed != 1 {
		t.Fatalf("A's stats %+v, want at least 4 renewals (6 s at a third of 2 s) and the completion", s)
	}
}

// R27: a grant taken over while its handler runs: the next renewal is
// refused, the handler's context ends with ErrGrantLost well within a lease,
// nothing the old holder writes lands, and the answer its handler still
// returns is filed as an observation (R15).
func TestWorkerCancelsHandlerWhenGrantLost_R27(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	started := make(chan struct{})
	var cause atomic.Value
	var cancelledAt atomic.Int64 // UnixNano
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		close(started)
		<-ctx.Done()
		cancelledAt.Store(time.Now().UnixNano())
		cause.Store(context.Cause(ctx))
		return jobfence.Succeeded("re_A") // the provider had answered meanwhile
	}}
	a := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "A", Lease: 3 * time.Second, ProviderTimeout: time.Minute})
	runWorker(t, a)
	<-started
	c.expire(t, job.ID)
	b := c.claimOne(t, "B", job)
	lost := time.Now() // B's takeover committed before its claim answered
	var d jobfence.JobDetail
	proctest.WaitFor(t, 10*time.Second, "A's receipt", func() bool {
		d = c.get(t, job.ID)
		return len(d.Observations) == 1
	})
	if err, _ := cause.Load().(error); !errors.Is(err, jobfence.ErrGrantLost) || !errors.Is(err, jobfence.ErrStaleAttempt) {
		t.Fatalf("the handler's context ended with %v, want ErrGrantLost (stale attempt)", err)
	}
	// Measured from the takeover, not from the handler's start: setting the
	// takeover up may take a loaded machine a while.
	if after := time.Unix(0, cancelledAt.Load()).Sub(lost); after > 3*time.Second {
		t.Fatalf("the handler was cancelled %s after the grant was taken over, want within a lease (3s)", after)
	}
	o := d.Observations[0]
	if o.Source != "worker:A" || o.ReportedAttempt != 1 || o.Outcome != jobfence.OutcomeSucceeded || o.ProviderRefundID != "re_A" {
		t.Fatalf("observation %+v", o)
	}
	if got, want := kinds(d), []string{"enqueued@0", "claimed@1", "taken_over@2"}; !slices.Equal(got, want) ||
		d.Job.State != jobfence.StateRunning || d.Job.Attempt != b.Attempt {
		t.Fatalf("history %v (job %+v), want %v: nothing of A's may land", got, d.Job, want)
	}
	if s := a.Stats(); s.GrantsLost != 1 || s.StaleRejected != 1 || s.Completed != 0 {
		t.Fatalf("A's stats %+v", s)
	}
}

// R27: a worker renews all the jobs it holds that are due in one call.
func TestWorkerRenewsItsJobsTogether_R27(t *testing.T) {
	c := startCoordinator(t)
	const n = 5
	for range n {
		c.enqueue(t, "acme")
	}
	release := make(chan struct{})
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		<-release
		return jobfence.Succeeded("re_together")
	}}
	w := newWorker(t, c, h, jobfence.WorkerOptions{Concurrency: n, Lease: 3 * time.Second, RenewInterval: 300 * time.Millisecond})
	runWorker(t, w)
	proctest.WaitFor(t, 10*time.Second, "all jobs held", func() bool { return w.Stats().Claimed == n })
	proctest.WaitFor(t, 10*time.Second, "renewals", func() bool { return w.Stats().Renewals >= 6*n })
	close(release)
	if calls, renewed := c.callCount("RenewLeases"), int(w.Stats().Renewals); calls*2 > renewed {
		t.Fatalf("%d RenewLeases calls for %d renewals of %d jobs held together: want them batched", calls, renewed, n)
	}
}

// R27, R24: RenewLeases answers each grant on its own, refusals decoded by
// reason as a write-back's would be; a bad call fails whole, naming the field.
func TestClientRenewLeases_R27(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	a := c.claimOne(t, "A", job)
	c.expire(t, job.ID)
	b := c.claimOne(t, "B", job)
	out, err := c.client.RenewLeases(ctxFor(t), []jobfence.Grant{jobfence.GrantOf(b)}, 10*time.Second)
	if err != nil || len(out) != 1 {
		t.Fatalf("RenewLeases(B) = %+v, %v", out, err)
	}
	old, err := c.client.RenewLeases(ctxFor(t), []jobfence.Grant{jobfence.GrantOf(a)}, 10*time.Second)
	if err != nil || len(old) != 1 {
		t.Fatalf("RenewLeases(A) = %+v, %v", old, err)
	}
	out = append(out, old...)
	if out[0].Refused != nil || !out[0].LeaseUntil.After(b.LeaseUntil.Add(-30*time.Second)) || out[0].GrantExpiresAt.IsZero() {
		t.Fatalf("the holder's renewal = %+v", out[0])
	}
	var stale *jobfence.StaleAttemptError
	if !errors.As(out[1].Refused, &stale) || stale.CurrentAttempt != 2 || !out[1].LeaseUntil.IsZero() {
		t.Fatalf("the taken-over grant's renewal = %+v, want a *StaleAttemptError naming attempt 2", out[1])
	}
	_, err = c.client.RenewLeases(ctxFor(t), nil, 0)
	var ia *jobfence.InvalidArgumentError
	if !errors.As(err, &ia) || len(ia.Violations) != 1 || ia.Violations[0].Field != "grants" {
		t.Fatalf("RenewLeases(no grants) = %v, want INVALID_ARGUMENT naming grants", err)
	}
}
