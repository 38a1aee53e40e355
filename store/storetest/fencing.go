package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// takeOverTo claims job as worker until its attempt is n: the first claim and
// then takeovers of expired leases.
func takeOverTo(t *testing.T, s store.Store, id, n int64, worker string) store.ClaimedJob {
	t.Helper()
	var c store.ClaimedJob
	for {
		c = claimOne(t, s, worker, id)
		if c.Job.Attempt == n {
			return c
		}
		expire(t, s, id)
	}
}

// T1: A claims (attempt 7) and pauses after its provider call; its lease
// expires in the data; B takes over (8), reconciles and completes. A's late
// complete, reschedule and escalate each affect nothing.
func testZombieT1(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := takeOverTo(t, s, job.ID, 7, "A")
	expire(t, s, job.ID)
	b := claimOne(t, s, "B", job.ID)
	if b.Job.Attempt != 8 || b.Job.NextAction != store.ActionReconcile {
		t.Fatalf("B got attempt %d next_action %s, want 8 reconcile", b.Job.Attempt, b.Job.NextAction)
	}
	// A wakes while B still holds the job: nothing A writes may land.
	_, err := s.Write(ctxFor(t), reschedule(of(a), 0))
	wantFence(t, err, store.ErrStaleAttempt, 8, store.StateRunning)
	done := write(t, s, complete(of(b), "re_B"))
	if done.Job.State != store.StateSucceeded || done.Replayed {
		t.Fatalf("B's complete = %+v", done)
	}

	for _, w := range []store.Writeback{
		complete(of(a), "re_A"),
		reschedule(of(a), time.Second),
		escalate(of(a)),
	} {
		_, err := s.Write(ctxFor(t), w)
		wantFence(t, err, store.ErrStaleAttempt, 8, store.StateSucceeded)
	}
	d := get(t, s, job.ID)
	if d.Job.State != store.StateSucceeded || d.Job.Attempt != 8 || d.Job.ProviderRefundID != "re_B" ||
		!d.Job.UpdatedAt.Equal(done.Job.UpdatedAt) {
		t.Fatalf("job after A's late writes = %+v, want B's completion untouched", d.Job)
	}
	if n := countKind(d.Events, store.EventCompleted); n != 1 {
		t.Fatalf("%d completed events, want 1", n)
	}
	for _, e := range d.Events {
		if e.FromState == store.StateRunning && e.Kind != store.EventTakenOver && e.Attempt != 8 {
			t.Fatalf("a write under attempt %d landed: %+v", e.Attempt, e)
		}
	}
}

// T2: A's lease expires and nobody takes over; A's complete still lands (R8),
// and B's later takeover finds the job closed.
func testLeaseExpiredNoTakeoverT2(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := claimOne(t, s, "A", job.ID)
	expire(t, s, job.ID)
	res := write(t, s, complete(of(a), "re_A"))
	if res.Job.State != store.StateSucceeded || res.Job.Attempt != 1 || res.Replayed {
		t.Fatalf("late complete = %+v", res)
	}
	if got := claim(t, s, "B", 10); len(got) != 0 {
		t.Fatalf("B took over %v, a closed job", ids(got))
	}
	if d := get(t, s, job.ID); d.Job.Attempt != 1 || d.Job.State != store.StateSucceeded {
		t.Fatalf("job = %+v", d.Job)
	}
}

// T4: the completion committed and its reply was lost; the retry's 0-row
// update re-reads the row, sees its own success and answers replayed (R10,
// R21). The history shows the first write only.
func testLostReplyReplayT4(t *testing.T, s store.Store) {
	cases := []struct {
		name string
		w    func(grant) store.Writeback
		want store.State
	}{
		{"complete", func(g grant) store.Writeback { return complete(g, "re_1") }, store.StateSucceeded},
		{"reschedule", func(g grant) store.Writeback { return reschedule(g, time.Hour) }, store.StateReady},
		{"escalate", escalate, store.StateManualReview},
	}
	for _, c := range cases {
		job := enqueue(t, s, refund(t))
		a := claimOne(t, s, "A", job.ID)
		first := write(t, s, c.w(of(a)))
		if first.Replayed || first.Job.State != c.want {
			t.Fatalf("%s: first write = %+v", c.name, first)
		}
		again := write(t, s, c.w(of(a)))
		if !again.Replayed || again.Job.State != c.want || !again.Job.UpdatedAt.Equal(first.Job.UpdatedAt) {
			t.Fatalf("%s: repeated write = replayed %v job %+v, want replayed with the first write's row",
				c.name, again.Replayed, again.Job)
		}
		// R25: the same write under the same attempt from another grant (a
		// forged or guessed token, or none) is another writer, not a replay.
		for _, token := range []store.LeaseToken{store.NewLeaseToken(), ""} {
			other := of(a)
			other.token = token
			_, err := s.Write(ctxFor(t), c.w(other))
			wantFence(t, err, store.ErrStaleAttempt, a.Job.Attempt, c.want)
		}
		d := get(t, s, job.ID)
		if n := countKind(d.Events, c.w(grant{}).Kind); n != 1 {
			t.Fatalf("%s: %d %s events after a replay, want 1", c.name, n, c.w(grant{}).Kind)
		}
	}
}

func testDifferentWriteNotRunning(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := claimOne(t, s, "A", job.ID)
	write(t, s, complete(of(a), "re_1"))
	for _, w := range []store.Writeback{
		complete(of(a), "re_OTHER"),
		reschedule(of(a), 0),
		escalate(of(a)),
	} {
		_, err := s.Write(ctxFor(t), w)
		wantFence(t, err, store.ErrNotRunning, 1, store.StateSucceeded)
	}
	if d := get(t, s, job.ID); d.Job.ProviderRefundID != "re_1" {
		t.Fatalf("provider_refund_id = %q, want re_1", d.Job.ProviderRefundID)
	}
}

func testReschedule(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := claimOne(t, s, "A", job.ID)
	res := write(t, s, reschedule(of(a), time.Hour))
	j := res.Job
	if j.State != store.StateReady || j.NextAction != store.ActionReconcile || j.LeaseUntil != (time.Time{}) ||
		j.LastReason != "provider pending" || j.Attempt != 1 {
		t.Fatalf("rescheduled job = %+v", j)
	}
	if d := j.NextAttemptAt.Sub(j.UpdatedAt); d < time.Hour-time.Millisecond || d > time.Hour+time.Millisecond {
		t.Fatalf("next_attempt_at - updated_at = %v, want 1h by the database clock", d)
	}
	if got := claim(t, s, "B", 5); len(got) != 0 {
		t.Fatalf("claimed %v before its next_attempt_at", ids(got))
	}

	// An absolute time, in the past: due at once, with the attempt bumped again.
	job2 := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", job2.ID)
	at := dbNow(t, s).Add(-time.Minute).Truncate(time.Millisecond)
	w := store.Writeback{Kind: store.EventRescheduled, JobID: job2.ID, Attempt: c.Job.Attempt,
		LeaseToken: c.LeaseToken, NextAction: store.ActionRefund, At: at, Reason: "provider rejected: rate limited"}
	res = write(t, s, w)
	if !res.Job.NextAttemptAt.Equal(at) || res.Job.NextAction != store.ActionRefund {
		t.Fatalf("rescheduled at %v to %s, want %v refund", res.Job.NextAttemptAt, res.Job.NextAction, at)
	}
	again := claimOne(t, s, "B", job2.ID)
	if again.Job.Attempt != 2 || again.Takeover || !again.Job.FirstSentAt.Equal(c.Job.FirstSentAt) {
		t.Fatalf("re-claim = %+v takeover %v; want attempt 2, first_sent_at kept", again.Job, again.Takeover)
	}
	d := get(t, s, job2.ID)
	ev := d.Events[2]
	if ev.Kind != store.EventRescheduled || ev.Reason != w.Reason || ev.WorkerID != "A" || ev.Attempt != 1 {
		t.Fatalf("reschedule event = %+v", ev)
	}
}

func testEscalate(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := claimOne(t, s, "A", job.ID)
	res := write(t, s, escalate(of(a)))
	if res.Job.State != store.StateManualReview || res.Job.LeaseUntil != (time.Time{}) ||
		res.Job.LastReason != "no record outside window" {
		t.Fatalf("escalated job = %+v", res.Job)
	}
	if got := claim(t, s, "B", 5); len(got) != 0 {
		t.Fatalf("claimed %v from manual_review", ids(got))
	}
	// next_attempt_at is when the job entered review, by the database's
	// clock (R12), as written and as answered.
	if !res.Job.NextAttemptAt.Equal(res.Job.UpdatedAt) {
		t.Fatalf("escalated job's next_attempt_at = %v, want its updated_at %v", res.Job.NextAttemptAt, res.Job.UpdatedAt)
	}
	if d := get(t, s, job.ID); d.Job != res.Job {
		t.Fatalf("Escalate answered\n %+v\nbut the row is\n %+v", res.Job, d.Job)
	}
	// A replay later changes nothing, the time in review included (R21).
	waitForClock(t, s, res.Job.UpdatedAt)
	if again := write(t, s, escalate(of(a))); !again.Replayed || again.Job != res.Job {
		t.Fatalf("repeated escalation = %+v, want a replay of %+v", again, res.Job)
	}

	// The reviews by state: the one waiting longest first, whatever the
	// jobs' ids.
	older := enqueue(t, s, refund(t))
	newer := enqueue(t, s, refund(t))
	first := claimOne(t, s, "A", older.ID)
	second := claimOne(t, s, "A", newer.ID)
	inReview := write(t, s, escalate(of(second)))
	waitForClock(t, s, inReview.Job.UpdatedAt)
	write(t, s, escalate(of(first)))
	want := []int64{job.ID, newer.ID, older.ID}
	if got := listAll(t, s, store.ListParams{State: store.StateManualReview, Limit: 2}); !slices.Equal(got, want) {
		t.Fatalf("manual_review = %v, want %v (longest in review first)", got, want)
	}
}

// waitForClock waits until the database's clock is past t (R12: never this
// process's clock).
func waitForClock(t *testing.T, s store.Store, after time.Time) {
	t.Helper()
	for dbNow(t, s).Compare(after) <= 0 {
		time.Sleep(time.Millisecond)
	}
}

func testWriteUnknown(t *testing.T, s store.Store) {
	_, err := s.Write(ctxFor(t), complete(grant{id: 987654, attempt: 1}, "re_1"))
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Write on a missing job: %v, want ErrNotFound", err)
	}
	job := enqueue(t, s, refund(t))
	// Never claimed: attempt 1 was never granted by this database. A grant
	// lost in a failover looks exactly like this (R26): the writer does not
	// hold the job and must stop, as after a takeover.
	_, err = s.Write(ctxFor(t), complete(grant{id: job.ID, attempt: 1, token: store.NewLeaseToken()}, "re_1"))
	wantFence(t, err, store.ErrStaleAttempt, 0, store.StateReady)
	a := claimOne(t, s, "A", job.ID)
	ahead := of(a)
	ahead.attempt++
	_, err = s.Write(ctxFor(t), complete(ahead, "re_1"))
	wantFence(t, err, store.ErrStaleAttempt, 1, store.StateRunning)
	if d := get(t, s, job.ID); d.Job.State != store.StateRunning {
		t.Fatalf("job = %+v", d.Job)
	}
}

func testObservations(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := takeOverTo(t, s, job.ID, 2, "A")
	before := get(t, s, job.ID).Job

	p := store.ObservationParams{Job: store.JobRef{ID: job.ID}, Attempt: 1, Source: "worker:A",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_late", Detail: "late reply at 12:00:01"}
	o1, dup, err := s.Observe(ctxFor(t), p)
	if err != nil || dup {
		t.Fatalf("Observe = %+v dup %v err %v", o1, dup, err)
	}
	if o1.JobID != job.ID || o1.OperationKey != job.OperationKey || o1.ReportedAttempt != 1 ||
		o1.JobAttempt != a.Job.Attempt || o1.Outcome != store.OutcomeSucceeded || o1.CreatedAt.IsZero() {
		t.Fatalf("observation = %+v", o1)
	}
	// The same receipt again, with another detail: deduplicated.
	p.Detail = "late reply at 12:00:02"
	o2, dup, err := s.Observe(ctxFor(t), p)
	if err != nil || !dup || o2.ID != o1.ID {
		t.Fatalf("repeat Observe = id %d dup %v err %v, want id %d dup", o2.ID, dup, err, o1.ID)
	}
	// By operation key and provider event id: the event id alone dedupes.
	hook := store.ObservationParams{Job: store.JobRef{OperationKey: job.OperationKey}, Source: "webhook",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_late", ProviderEventID: "evt_1"}
	o3, dup, err := s.Observe(ctxFor(t), hook)
	if err != nil || dup || o3.ID == o1.ID {
		t.Fatalf("webhook Observe = %+v dup %v err %v", o3, dup, err)
	}
	hook.Source = "webhook-retry"
	if o4, dup, err := s.Observe(ctxFor(t), hook); err != nil || !dup || o4.ID != o3.ID {
		t.Fatalf("webhook redelivery = id %d dup %v err %v, want %d", o4.ID, dup, err, o3.ID)
	}
	_, _, err = s.Observe(ctxFor(t), store.ObservationParams{Job: store.JobRef{ID: job.ID + 1000},
		Source: "x", Outcome: store.OutcomePending})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Observe on a missing job: %v", err)
	}

	d := get(t, s, job.ID)
	// R28: the job keeps when its newest receipt of success came, and
	// nothing else changes.
	if !d.Job.EvidenceAt.Equal(o3.CreatedAt) {
		t.Fatalf("evidence_at = %v, want the newest receipt of success's time %v", d.Job.EvidenceAt, o3.CreatedAt)
	}
	before.EvidenceAt = d.Job.EvidenceAt
	if d.Job != before {
		t.Fatalf("observations changed the job:\n before %+v\n after  %+v", before, d.Job)
	}
	if got := []int64{d.Observations[0].ID, d.Observations[1].ID}; len(d.Observations) != 2 ||
		!slices.Equal(got, []int64{o1.ID, o3.ID}) {
		t.Fatalf("observations = %+v", d.Observations)
	}
	// The holder verifies and closes through the fenced path.
	write(t, s, complete(of(a), "re_late"))
}

func testClaimCarriesObservations(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := claimOne(t, s, "A", job.ID)
	if len(a.Observations) != 0 {
		t.Fatalf("fresh claim carries %d observations", len(a.Observations))
	}
	if _, _, err := s.Observe(ctxFor(t), store.ObservationParams{Job: store.JobRef{ID: job.ID},
		Source: "webhook", Outcome: store.OutcomePending, ProviderEventID: "evt_9"}); err != nil {
		t.Fatal(err)
	}
	other := enqueue(t, s, refund(t))
	expire(t, s, job.ID)
	got := claim(t, s, "B", 2)
	if len(got) != 2 || got[0].Job.ID != job.ID || got[1].Job.ID != other.ID {
		t.Fatalf("claimed %v", ids(got))
	}
	if len(got[0].Observations) != 1 || got[0].Observations[0].ProviderEventID != "evt_9" ||
		len(got[1].Observations) != 0 {
		t.Fatalf("observations on claim = %+v / %+v", got[0].Observations, got[1].Observations)
	}
}
