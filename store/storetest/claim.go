package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

func testClaimBumps(t *testing.T, s store.Store) {
	a := enqueue(t, s, refund(t))
	b := enqueue(t, s, refund(t))
	c := enqueue(t, s, refund(t))
	lease := 42 * time.Second
	got, err := s.Claim(ctxFor(t), store.ClaimParams{WorkerID: "w1", MaxJobs: 2, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(got), []int64{a.ID, b.ID}) {
		t.Fatalf("claimed %v, want [%d %d]", ids(got), a.ID, b.ID)
	}
	for _, cj := range got {
		j := cj.Job
		if j.State != store.StateRunning || j.Attempt != 1 || j.NextAction != store.ActionRefund ||
			j.WorkerID != "w1" || cj.Takeover {
			t.Fatalf("claimed job = %+v takeover %v; want running, attempt 1, refund, w1", j, cj.Takeover)
		}
		// R12: lease_until is the database's now plus the lease; updated_at is
		// that same now.
		if d := j.LeaseUntil.Sub(j.UpdatedAt); d < lease-time.Millisecond || d > lease+time.Millisecond {
			t.Fatalf("lease_until - updated_at = %v, want %v", d, lease)
		}
		// R22: the first claim with next_action refund starts the resend window.
		if !j.FirstSentAt.Equal(j.UpdatedAt) {
			t.Fatalf("first_sent_at = %v, want the claim time %v", j.FirstSentAt, j.UpdatedAt)
		}
		d := get(t, s, j.ID)
		if d.Job != j {
			t.Fatalf("Claim answered\n %+v\nbut the row is\n %+v", j, d.Job)
		}
		if !slices.Equal(kinds(d.Events), []store.EventKind{store.EventEnqueued, store.EventClaimed}) {
			t.Fatalf("events = %v", kinds(d.Events))
		}
		ev := d.Events[1]
		if ev.Attempt != 1 || ev.WorkerID != "w1" || ev.FromState != store.StateReady || ev.ToState != store.StateRunning {
			t.Fatalf("claim event = %+v", ev)
		}
	}
	claimOne(t, s, "w2", c.ID)
	if got := claim(t, s, "w3", 5); len(got) != 0 {
		t.Fatalf("claimed %v with nothing ready: running jobs with live leases are not candidates", ids(got))
	}
}

func testClaimOrder(t *testing.T, s store.Store) {
	// Q4: many identical next_attempt_at values order stably by id.
	at := dbNow(t, s).Add(-time.Minute).Truncate(time.Second)
	var want []int64
	for i := 0; i < 7; i++ {
		p := refund(t)
		p.NotBefore = at
		want = append(want, enqueue(t, s, p).ID)
	}
	older := refund(t)
	older.NotBefore = at.Add(-time.Second)
	first := enqueue(t, s, older)
	want = append([]int64{first.ID}, want...)

	var got []int64
	for len(got) < len(want) {
		batch := claim(t, s, "w", 3)
		if len(batch) == 0 || len(batch) > 3 {
			t.Fatalf("batch of %d, want 1..3", len(batch))
		}
		got = append(got, ids(batch)...)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("claim order %v, want %v (next_attempt_at, then id)", got, want)
	}
	if extra := claim(t, s, "w", 3); len(extra) != 0 {
		t.Fatalf("claimed %v twice", ids(extra))
	}
}

func testClaimProvider(t *testing.T, s store.Store) {
	acme := enqueue(t, s, refund(t))
	p := refund(t)
	p.Provider = "globex"
	globex := enqueue(t, s, p)
	got, err := s.Claim(ctxFor(t), store.ClaimParams{WorkerID: "w", MaxJobs: 10, Lease: time.Minute, Provider: "globex"})
	if err != nil || !slices.Equal(ids(got), []int64{globex.ID}) {
		t.Fatalf("Claim(provider=globex) = %v, %v; want [%d]", ids(got), err, globex.ID)
	}
	claimOne(t, s, "w", acme.ID)
}

func testClaimEmpty(t *testing.T, s store.Store) {
	got, err := s.Claim(ctxFor(t), store.ClaimParams{WorkerID: "w", MaxJobs: 100, Lease: time.Minute})
	if err != nil || len(got) != 0 {
		t.Fatalf("Claim on empty store = %v, %v; want nothing, no error", ids(got), err)
	}
}

func testTakeoverForcesReconcile(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := claimOne(t, s, "A", job.ID)
	expire(t, s, job.ID)
	b := claimOne(t, s, "B", job.ID)
	if got := get(t, s, job.ID).Job; got != b.Job {
		t.Fatalf("takeover answered\n %+v\nbut the row is\n %+v", b.Job, got)
	}
	if !b.Takeover || b.Job.Attempt != a.Job.Attempt+1 || b.Job.NextAction != store.ActionReconcile ||
		b.Job.WorkerID != "B" || b.Job.State != store.StateRunning {
		t.Fatalf("takeover = %+v takeover %v; want attempt %d, reconcile, B", b.Job, b.Takeover, a.Job.Attempt+1)
	}
	// R22: the resend window still starts at A's send.
	if !b.Job.FirstSentAt.Equal(a.Job.FirstSentAt) {
		t.Fatalf("first_sent_at moved from %v to %v on takeover", a.Job.FirstSentAt, b.Job.FirstSentAt)
	}
	if b.Job.OperationKey != job.OperationKey {
		t.Fatalf("operation_key changed on takeover: %q", b.Job.OperationKey) // R1
	}
	d := get(t, s, job.ID)
	last := d.Events[len(d.Events)-1]
	if last.Kind != store.EventTakenOver || last.Attempt != 2 || last.WorkerID != "B" ||
		last.FromState != store.StateRunning || last.NextAction != store.ActionReconcile {
		t.Fatalf("takeover event = %+v", last)
	}
	// A reschedule to reconcile and a plain claim is not a takeover.
	write(t, s, reschedule(of(b), 0))
	c := claimOne(t, s, "C", job.ID)
	if c.Takeover || c.Job.NextAction != store.ActionReconcile || c.Job.Attempt != 3 {
		t.Fatalf("claim after reschedule = %+v takeover %v", c.Job, c.Takeover)
	}
}

func testTakeoversFirst(t *testing.T, s store.Store) {
	stuck := enqueue(t, s, refund(t))
	claimOne(t, s, "A", stuck.ID)
	ready := enqueue(t, s, refund(t))
	expire(t, s, stuck.ID)
	got := claim(t, s, "B", 1)
	if len(got) != 1 || got[0].Job.ID != stuck.ID || !got[0].Takeover {
		t.Fatalf("Claim(1) = %v, want the expired lease %d first", ids(got), stuck.ID)
	}
	claimOne(t, s, "B", ready.ID)
}

func testExpireLease(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	if err := Expire(ctxFor(t), s, job.ID); err == nil {
		t.Fatal("ExpireLease on a ready job succeeded")
	}
	if err := Expire(ctxFor(t), s, job.ID+1000); err == nil {
		t.Fatal("ExpireLease on a missing job succeeded")
	}
	claimOne(t, s, "A", job.ID)
	expire(t, s, job.ID)
	if d := get(t, s, job.ID); d.Job.State != store.StateRunning || d.Job.Attempt != 1 {
		t.Fatalf("ExpireLease changed more than the lease: %+v", d.Job)
	}
}

// testStats: M1's queue figures come from the database and leave history out.
func testStats(t *testing.T, s store.Store) {
	st, err := s.Stats(ctxFor(t))
	if err != nil || st.Now.IsZero() || len(st.Jobs) != 0 || !st.OldestUnfinished.IsZero() {
		t.Fatalf("Stats on an empty store = %+v, %v", st, err)
	}
	running := enqueue(t, s, refund(t))
	review := enqueue(t, s, refund(t))
	done := enqueue(t, s, refund(t))
	enqueue(t, s, refund(t))
	claimOne(t, s, "A", running.ID)
	write(t, s, escalate(of(claimOne(t, s, "A", review.ID))))
	write(t, s, complete(of(claimOne(t, s, "A", done.ID)), "re_1"))
	st, err = s.Stats(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	want := map[store.State]int64{store.StateReady: 1, store.StateRunning: 1, store.StateManualReview: 1}
	if len(st.Jobs) != len(want) || st.Jobs[store.StateReady] != 1 || st.Jobs[store.StateRunning] != 1 ||
		st.Jobs[store.StateManualReview] != 1 {
		t.Fatalf("Stats.Jobs = %v, want %v", st.Jobs, want)
	}
	if !st.OldestUnfinished.Equal(running.CreatedAt) || st.Now.Before(running.CreatedAt) {
		t.Fatalf("oldest unfinished %v (now %v), want %v", st.OldestUnfinished, st.Now, running.CreatedAt)
	}
}

// HasWork is one look for idle long polls: true exactly when a claim with
// that filter would find a due job or an expired lease, and it changes
// nothing.
func testHasWorkLooksWithoutClaiming(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	want := func(provider string, work bool) {
		t.Helper()
		got, err := s.HasWork(ctx, provider)
		if err != nil || got != work {
			t.Fatalf("HasWork(%q) = %v, %v; want %v", provider, got, err, work)
		}
	}
	want("", false)
	later := refund(t)
	later.NotBefore = dbNow(t, s).Add(time.Hour)
	enqueue(t, s, later)
	want("", false)
	job := enqueue(t, s, refund(t)) // provider acme, due now
	want("", true)
	want("acme", true)
	want("globex", false)
	if d := get(t, s, job.ID); d.Job.State != store.StateReady || d.Job.Attempt != 0 {
		t.Fatalf("HasWork changed the job: %+v", d.Job)
	}
	claimOne(t, s, "A", job.ID)
	want("acme", false) // running under a live lease
	expire(t, s, job.ID)
	want("acme", true) // a takeover is work
	want("globex", false)
}

// testRunningJobDueAtItsLeaseEnd: a running job's next_attempt_at is its
// lease end (store.Job.NextAttemptAt), through its grant, every renewal and
// an expiry, so that the due index finds its takeover in lease order (R6,
// R23); its completion dates it from then.
func testRunningJobDueAtItsLeaseEnd_R6_R23(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", job.ID)
	due := func(when string, j store.Job) {
		t.Helper()
		if j.State != store.StateRunning || j.LeaseUntil.IsZero() || !j.NextAttemptAt.Equal(j.LeaseUntil) {
			t.Fatalf("%s: state %s next_attempt_at %v lease_until %v, want running and due at its lease end", when,
				j.State, j.NextAttemptAt, j.LeaseUntil)
		}
	}
	due("granted (answer)", c.Job)
	due("granted (stored)", get(t, s, job.ID).Job)
	r := renewed(t, s, renewal(of(c), 10*time.Minute))
	due("renewed (answer)", r.Job)
	due("renewed (stored)", get(t, s, job.ID).Job)
	expire(t, s, job.ID)
	due("expired", get(t, s, job.ID).Job)
	taken := claim(t, s, "B", 1)
	if len(taken) != 1 || taken[0].Job.ID != job.ID || !taken[0].Takeover {
		t.Fatalf("Claim after the expiry = %v, want the takeover of %d", ids(taken), job.ID)
	}
	due("taken over", get(t, s, job.ID).Job)
	res := write(t, s, complete(of(taken[0]), "re_due"))
	if got := get(t, s, job.ID).Job; !got.NextAttemptAt.Equal(got.UpdatedAt) || !res.Job.NextAttemptAt.Equal(got.UpdatedAt) {
		t.Fatalf("completed: next_attempt_at %v (answered %v), want its completion %v", got.NextAttemptAt,
			res.Job.NextAttemptAt, got.UpdatedAt)
	}
}

// TakeoverFindsRowsOfAnEarlierRelease checks the claim against running rows
// as an earlier release grants and renews them, with next_attempt_at still
// the job's due time, before its lease end: antedate runs on s's database
// and moves the next_attempt_at of the running job whose id is its one
// argument to an hour, or two, before its lease end (the second argument is
// the hours). An expired lease among them is taken over, first (R6, R23),
// even when a live lease of that kind comes before it on the walk; the live
// one is not.
func TakeoverFindsRowsOfAnEarlierRelease(t *testing.T, s DBStore, antedate string) {
	t.Helper()
	ctx := ctxFor(t)
	live := enqueue(t, s, refund(t))
	expired := enqueue(t, s, refund(t))
	claimOne(t, s, "old", live.ID)
	claimOne(t, s, "old", expired.ID)
	expire(t, s, expired.ID)
	for _, r := range []struct {
		id    int64
		hours int
	}{{live.ID, 2}, {expired.ID, 1}} {
		if _, err := s.DB().ExecContext(ctx, antedate, r.hours, r.id); err != nil {
			t.Fatal(err)
		}
	}
	ready := enqueue(t, s, refund(t))
	got := claim(t, s, "new", 1)
	if len(got) != 1 || got[0].Job.ID != expired.ID || !got[0].Takeover {
		t.Fatalf("Claim(1) = %v, want the expired lease %d (the live one %d comes first on the walk)", ids(got),
			expired.ID, live.ID)
	}
	if rest := claim(t, s, "new", 10); len(rest) != 1 || rest[0].Job.ID != ready.ID {
		t.Fatalf("Claim(10) = %v, want only the ready job %d: the lease of %d is live", ids(rest), ready.ID, live.ID)
	}
}
