package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// testWriteManyEachOnItsOwn: one batch mixes writes that pass the fence,
// stale ones, replays, a repeat of a job already written in the same batch,
// bad input and a missing job. Each is answered exactly as Write would answer
// it alone, in order, and only the fenced ones change anything (R9, R10, R21).
func testWriteManyEachOnItsOwn(t *testing.T, s store.Store) {
	a := enqueue(t, s, refund(t))
	b := enqueue(t, s, refund(t))
	c := enqueue(t, s, refund(t))
	d := enqueue(t, s, refund(t))
	ca := claimOne(t, s, "A", a.ID)
	cb := claimOne(t, s, "A", b.ID)
	expire(t, s, b.ID)
	cb2 := claimOne(t, s, "B", b.ID) // b taken over: A's attempt is stale
	cc := claimOne(t, s, "A", c.ID)
	cd := claimOne(t, s, "A", d.ID)
	write(t, s, escalate(of(cd))) // already written: the batch repeats it

	ws := []store.Writeback{
		complete(of(ca), "re_a"),                              // 0 applied
		complete(of(cb), "re_b_zombie"),                       // 1 stale
		reschedule(of(cc), time.Minute),                       // 2 applied
		complete(of(ca), "re_a"),                              // 3 replay of 0
		escalate(of(ca)),                                      // 4 not running after 0
		escalate(of(cd)),                                      // 5 replay of an earlier call
		{Kind: store.EventEscalated, JobID: c.ID, Attempt: 1}, // 6 invalid: no reason
		complete(grant{id: a.ID + b.ID + c.ID + d.ID + 100, attempt: 1}, "re_x"), // 7 missing
		complete(of(cb2), "re_b"), // 8 applied
	}
	ws[0].Actor = "credential-A" // the writer's identity, from its credential
	out := s.WriteMany(ctxFor(t), ws)
	if len(out) != len(ws) {
		t.Fatalf("%d outcomes for %d writes", len(out), len(ws))
	}
	ok := func(i int, state store.State, replayed bool) {
		t.Helper()
		if out[i].Err != nil || out[i].Result.Replayed != replayed || out[i].Result.Job.State != state {
			t.Fatalf("write %d: %+v err %v; want %s replayed=%v", i, out[i].Result, out[i].Err, state, replayed)
		}
	}
	ok(0, store.StateSucceeded, false)
	wantFence(t, out[1].Err, store.ErrStaleAttempt, cb2.Job.Attempt, store.StateRunning)
	ok(2, store.StateReady, false)
	ok(3, store.StateSucceeded, true)
	wantFence(t, out[4].Err, store.ErrNotRunning, ca.Job.Attempt, store.StateSucceeded)
	ok(5, store.StateManualReview, true)
	wantViolation(t, out[6].Err, "reason")
	if !errors.Is(out[7].Err, store.ErrNotFound) {
		t.Fatalf("write 7: %v, want ErrNotFound", out[7].Err)
	}
	ok(8, store.StateSucceeded, false)

	// The answers are the rows as stored.
	for _, i := range []int{0, 2, 8} {
		got := get(t, s, ws[i].JobID).Job
		if got != out[i].Result.Job {
			t.Fatalf("write %d answered\n %+v\nbut the row is\n %+v", i, out[i].Result.Job, got)
		}
	}
	for _, j := range []struct {
		id   int64
		kind store.EventKind
		n    int
	}{{a.ID, store.EventCompleted, 1}, {a.ID, store.EventEscalated, 0}, {b.ID, store.EventCompleted, 1},
		{c.ID, store.EventRescheduled, 1}, {d.ID, store.EventEscalated, 1}} {
		if n := countKind(get(t, s, j.id).Events, j.kind); n != j.n {
			t.Fatalf("job %d: %d %s events, want %d", j.id, n, j.kind, j.n)
		}
	}
	// The history names the writer and the attempt it wrote under.
	events := get(t, s, a.ID).Events
	if last := events[len(events)-1]; last.Kind != store.EventCompleted || last.WorkerID != "credential-A" ||
		last.Attempt != ca.Job.Attempt {
		t.Fatalf("completion of a recorded as %+v", last)
	}
	if got := get(t, s, b.ID).Job; got.ProviderRefundID != "re_b" || got.Attempt != cb2.Job.Attempt {
		t.Fatalf("job b = %+v, want B's completion", got)
	}
}

// testClaimManyEachOnItsOwn: claims batched into one transaction never share
// a job, keep their own filters, leases and workers, and a bad one does not
// spoil the others (R5, R23).
func testClaimManyEachOnItsOwn(t *testing.T, s store.Store) {
	var acme []int64
	for i := 0; i < 3; i++ {
		acme = append(acme, enqueue(t, s, refund(t)).ID)
	}
	g := refund(t)
	g.Provider = "globex"
	globex := enqueue(t, s, g)
	out := s.ClaimMany(ctxFor(t), []store.ClaimParams{
		{WorkerID: "A", MaxJobs: 2, Lease: time.Minute},
		{WorkerID: "B", MaxJobs: 0, Lease: time.Minute},
		{WorkerID: "C", MaxJobs: 5, Lease: 2 * time.Minute, Provider: "globex"},
		{WorkerID: "D", MaxJobs: 5, Lease: time.Minute},
	})
	if len(out) != 4 {
		t.Fatalf("%d outcomes for 4 claims", len(out))
	}
	if out[0].Err != nil || !slices.Equal(ids(out[0].Jobs), acme[:2]) {
		t.Fatalf("A got %v, %v; want %v", ids(out[0].Jobs), out[0].Err, acme[:2])
	}
	wantViolation(t, out[1].Err, "max_jobs")
	if out[2].Err != nil || !slices.Equal(ids(out[2].Jobs), []int64{globex.ID}) ||
		out[2].Jobs[0].Job.LeaseUntil.Sub(out[2].Jobs[0].Job.UpdatedAt) != 2*time.Minute {
		t.Fatalf("C got %+v, %v; want the globex job with its own lease", out[2].Jobs, out[2].Err)
	}
	if out[3].Err != nil || !slices.Equal(ids(out[3].Jobs), acme[2:]) || out[3].Jobs[0].Job.WorkerID != "D" {
		t.Fatalf("D got %v, %v; want %v", ids(out[3].Jobs), out[3].Err, acme[2:])
	}
	// Consecutive claims share one walk of the candidates: they split them in
	// order, never the same job twice.
	var more []int64
	for i := 0; i < 5; i++ {
		more = append(more, enqueue(t, s, refund(t)).ID)
	}
	split := s.ClaimMany(ctxFor(t), []store.ClaimParams{
		{WorkerID: "E", MaxJobs: 2, Lease: time.Minute},
		{WorkerID: "F", MaxJobs: 2, Lease: 3 * time.Minute},
		{WorkerID: "G", MaxJobs: 2, Lease: time.Minute},
	})
	if !slices.Equal(ids(split[0].Jobs), more[:2]) || !slices.Equal(ids(split[1].Jobs), more[2:4]) ||
		!slices.Equal(ids(split[2].Jobs), more[4:]) {
		t.Fatalf("split %v / %v / %v, want %v", ids(split[0].Jobs), ids(split[1].Jobs), ids(split[2].Jobs), more)
	}
	out = append(out, split...)
	for _, o := range []store.ClaimOutcome{out[0], out[2], out[3], out[4], out[5], out[6]} {
		for _, c := range o.Jobs {
			if d := get(t, s, c.Job.ID); d.Job != c.Job || d.Job.Attempt != 1 {
				t.Fatalf("claim answered\n %+v\nbut the row is\n %+v", c.Job, d.Job)
			}
		}
	}
}
