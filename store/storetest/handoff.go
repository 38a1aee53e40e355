package storetest

import (
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// testEnqueueAndClaim: claims run in an enqueue's transaction take what a
// claim would take one call later: the oldest due job first (Q1), then the
// new ones, never a job not yet due; each grant is a real claim (R5: attempt
// 1, running, history enqueued then claimed), and bad input on either side
// is answered on its own.
func testEnqueueAndClaim(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	older := enqueue(t, s, refund(t))
	fresh, later, bad := refund(t), refund(t), refund(t)
	later.NotBefore = dbNow(t, s).Add(time.Hour)
	bad.AmountMinor = -1
	claims := []store.ClaimParams{
		{WorkerID: "w1", MaxJobs: 1, Lease: time.Minute},
		{WorkerID: "w2", MaxJobs: 5, Lease: time.Minute},
		{WorkerID: "w3", MaxJobs: 0, Lease: time.Minute},
	}
	out, cout := s.EnqueueAndClaim(ctx, []store.EnqueueParams{fresh, later, bad}, claims)
	if len(out) != 3 || len(cout) != 3 {
		t.Fatalf("%d enqueue and %d claim outcomes, want 3 and 3", len(out), len(cout))
	}
	if out[0].Err != nil || !out[0].Created || out[1].Err != nil || !out[1].Created {
		t.Fatalf("enqueues: %+v, %+v", out[0], out[1])
	}
	wantViolation(t, out[2].Err, "amount_minor")
	wantViolation(t, cout[2].Err, "max_jobs")
	if cout[0].Err != nil || len(cout[0].Jobs) != 1 || cout[0].Jobs[0].Job.ID != older.ID {
		t.Fatalf("first claim = %v, %v; want the older due job %d (Q1)", ids(cout[0].Jobs), cout[0].Err, older.ID)
	}
	if cout[1].Err != nil || len(cout[1].Jobs) != 1 || cout[1].Jobs[0].Job.ID != out[0].Job.ID {
		t.Fatalf("second claim = %v, %v; want only the new due job %d", ids(cout[1].Jobs), cout[1].Err, out[0].Job.ID)
	}
	for i, c := range []store.ClaimedJob{cout[0].Jobs[0], cout[1].Jobs[0]} {
		d := get(t, s, c.Job.ID)
		if d.Job != c.Job || d.Job.State != store.StateRunning || d.Job.Attempt != 1 || d.Job.WorkerID != claims[i].WorkerID {
			t.Fatalf("granted\n %+v\nstored\n %+v", c.Job, d.Job)
		}
		if k := kinds(d.Events); len(k) != 2 || k[0] != store.EventEnqueued || k[1] != store.EventClaimed {
			t.Fatalf("job %d history %v, want enqueued then claimed", c.Job.ID, k)
		}
	}
	if d := get(t, s, out[1].Job.ID); d.Job.State != store.StateReady || d.Job.Attempt != 0 {
		t.Fatalf("job not yet due was touched: %+v", d.Job)
	}

	// No valid enqueue: nothing new, the claims are answered empty.
	out, cout = s.EnqueueAndClaim(ctx, []store.EnqueueParams{bad}, claims[:1])
	wantViolation(t, out[0].Err, "amount_minor")
	if cout[0].Err != nil || len(cout[0].Jobs) != 0 {
		t.Fatalf("claim beside an invalid enqueue = %v, %v; want empty", ids(cout[0].Jobs), cout[0].Err)
	}
}
