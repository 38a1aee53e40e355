package storetest

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

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

// testHistoryAppendedOnce: a transaction of several steps appends their
// history in one statement (a round trip less per step): an enqueue with
// the hand-off of its jobs, and claims of two provider filters, each send
// one INSERT into the history, seen as the statement spans of a traced
// transaction; and the history is whole (enqueued, then claimed).
func testHistoryAppendedOnce(t *testing.T, s store.Store) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	inserts := func(run func(ctx context.Context)) int {
		ctx, span := tp.Tracer("storetest").Start(ctxFor(t), "jobfence.batch test")
		before := len(rec.Ended())
		run(ctx)
		span.End()
		n := 0
		for _, s := range rec.Ended()[before:] {
			if s.Name() == "INSERT refund_job_events" {
				n++
			}
		}
		return n
	}
	a, b := refund(t), refund(t)
	a.Provider, b.Provider = "hist-1-"+runID, "hist-2-"+runID
	var out []store.EnqueueOutcome
	var cout []store.ClaimOutcome
	n := inserts(func(ctx context.Context) {
		out, cout = s.EnqueueAndClaim(ctx, []store.EnqueueParams{a, b}, []store.ClaimParams{
			{WorkerID: "w1", MaxJobs: 1, Lease: time.Minute, Provider: a.Provider},
			{WorkerID: "w2", MaxJobs: 1, Lease: time.Minute, Provider: b.Provider}})
	})
	for i := range 2 {
		if out[i].Err != nil || cout[i].Err != nil || len(cout[i].Jobs) != 1 {
			t.Fatalf("enqueue %+v, claim %v %v", out[i], ids(cout[i].Jobs), cout[i].Err)
		}
		if k := kinds(get(t, s, cout[i].Jobs[0].Job.ID).Events); len(k) != 2 || k[0] != store.EventEnqueued || k[1] != store.EventClaimed {
			t.Fatalf("history %v, want enqueued then claimed", k)
		}
	}
	if n != 1 {
		t.Errorf("an enqueue of 2 jobs handed to 2 claims sent %d history INSERTs, want 1", n)
	}

	c, d := refund(t), refund(t)
	c.Provider, d.Provider = "hist-a-"+runID, "hist-b-"+runID
	enqueue(t, s, c)
	enqueue(t, s, d)
	var claimed []store.ClaimOutcome
	n = inserts(func(ctx context.Context) {
		claimed = s.ClaimMany(ctx, []store.ClaimParams{
			{WorkerID: "w3", MaxJobs: 1, Lease: time.Minute, Provider: c.Provider},
			{WorkerID: "w4", MaxJobs: 1, Lease: time.Minute, Provider: d.Provider}})
	})
	for _, o := range claimed {
		if o.Err != nil || len(o.Jobs) != 1 {
			t.Fatalf("claim %v %v", ids(o.Jobs), o.Err)
		}
	}
	if n != 1 {
		t.Errorf("claims of two provider filters sent %d history INSERTs, want 1", n)
	}
}
