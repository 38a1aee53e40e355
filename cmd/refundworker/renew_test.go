package main_test

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/proctest"
)

// R27: with 2 s leases and a provider call of 6 s, the renewing worker
// finishes the refund under its first grant while a second worker polls
// every 100 ms for work: no takeover, one refund at the provider.
func TestRenewingWorkerKeepsSlowCall_R27(t *testing.T) {
	t.Parallel()
	e := setup(t, fakeprovider.Config{})
	if _, err := e.pay.SetFaults(ctxFor(t), fakeprovider.Faults{HangAfter: 6 * time.Second, Key: "renew-slow", Times: 1}); err != nil {
		t.Fatal(err)
	}
	job := e.enqueue(t, "renew-slow")
	a := e.worker(t, "a", "--lease", "2s", "--provider-timeout", "15s", "--concurrency", "1")
	proctest.WaitFor(t, 20*time.Second, "the refund at the provider", func() bool {
		_, ok := e.provider.Oracle().Operation("renew-slow")
		return ok
	})
	b := e.worker(t, "b", "--lease", "2s", "--provider-timeout", "15s")
	d := e.waitJob(t, job.ID, "succeeded", func(d jobfence.JobDetail) bool { return d.Job.State == jobfence.StateSucceeded })
	if got, want := history(d), []string{"enqueued@0:", "claimed@1:a", "completed@1:a"}; !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v: a live worker was taken over", got, want)
	}
	if op, _ := e.operation(t, "renew-slow"); op.Refunds != 1 {
		t.Fatalf("provider: %+v, want one refund", op)
	}
	stop(t, a)
	stop(t, b)
}

// R27: a worker frozen (SIGSTOP) in the middle of a provider call stops
// renewing; its job is taken over within about a lease, and reconciled and
// completed by the other worker. Resumed (SIGCONT), its first renewal is
// refused: its handler is cancelled, the request already in flight still
// gets its answer, which is filed as an observation (R15), and nothing it
// writes lands.
func TestFrozenWorkerTakenOverAfterOneLease_R27(t *testing.T) {
	t.Parallel()
	e := setup(t, fakeprovider.Config{})
	if _, err := e.pay.SetFaults(ctxFor(t), fakeprovider.Faults{HangAfter: 10 * time.Second, Key: "renew-frozen", Times: 1}); err != nil {
		t.Fatal(err)
	}
	job := e.enqueue(t, "renew-frozen")
	frozen := e.worker(t, "frozen", "--lease", "2s", "--provider-timeout", "30s", "--concurrency", "1")
	proctest.WaitFor(t, 20*time.Second, "the refund at the provider", func() bool {
		_, ok := e.provider.Oracle().Operation("renew-frozen")
		return ok
	})
	time.Sleep(time.Second) // a renewal or two while it runs
	if err := frozen.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	rescuer := e.worker(t, "rescuer", "--lease", "2s")
	d := e.waitJob(t, job.ID, "taken over", func(d jobfence.JobDetail) bool { return d.Job.Attempt == 2 })
	// The last renewal ran at most a third of a lease before the stop: the
	// lease ran out within 2 s of it; the rescuer then needed one poll.
	if took := time.Since(stoppedAt); took > 4*time.Second {
		t.Fatalf("taken over %s after the stop, want within a lease (2s) plus a poll and start-up", took)
	}
	d = e.waitJob(t, job.ID, "succeeded", func(d jobfence.JobDetail) bool { return d.Job.State == jobfence.StateSucceeded })

	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	d = e.waitJob(t, job.ID, "the frozen worker's receipt", func(d jobfence.JobDetail) bool { return len(d.Observations) == 1 })
	if got, want := history(d), []string{"enqueued@0:", "claimed@1:frozen", "taken_over@2:rescuer", "completed@2:rescuer"}; !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v", got, want)
	}
	op, oracle := e.operation(t, "renew-frozen")
	if o := d.Observations[0]; o.Source != "worker:frozen" || o.ReportedAttempt != 1 || o.Outcome != jobfence.OutcomeSucceeded ||
		o.ProviderRefundID != op.RefundIDs[0] {
		t.Fatalf("observation %+v, want the frozen worker's answer for %s", o, op.RefundIDs[0])
	}
	if op.Refunds != 1 || oracle.DoubleRefunds != 0 {
		t.Fatalf("provider: %+v (%d double refunds), want one refund", op, oracle.DoubleRefunds)
	}
	if !hasRecord(frozen, "grant lost; cancelling the handler before it sends anything new (R27)") {
		t.Fatalf("the resumed worker did not learn of its lost grant from a renewal\n%s", frozen.Logs())
	}
	stop(t, frozen)
	stop(t, rescuer)
}
