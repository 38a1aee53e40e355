package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// Retainer is what every backend provides for retention (R30, R31) beside
// store.Store: a fenced lease and the archive's batch.
type Retainer interface {
	TakeLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error)
	RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error)
	Archive(ctx context.Context, p store.ArchiveParams) (store.ArchiveResult, error)
}

func retainer(t *testing.T, s store.Store) Retainer {
	t.Helper()
	r, ok := s.(Retainer)
	if !ok {
		t.Fatalf("%T keeps no retention (TakeLease, RenewLease, Archive)", s)
	}
	return r
}

// archiveAll takes the archiver lease as holder and archives every
// succeeded job completed at least a second ago, in batches of limit; it
// returns how many it moved.
func archiveAll(t *testing.T, s store.Store, holder string, limit int) int {
	t.Helper()
	r := retainer(t, s)
	l, err := r.TakeLease(ctxFor(t), store.ArchiverLease, holder, time.Minute)
	if err != nil {
		t.Fatalf("TakeLease(%s): %v", holder, err)
	}
	moved := 0
	for {
		res, err := r.Archive(ctxFor(t), store.ArchiveParams{Lease: l, RetainSucceeded: time.Second, Limit: limit})
		if err != nil {
			t.Fatalf("Archive: %v", err)
		}
		moved += res.Jobs
		if !res.More {
			return moved
		}
	}
}

// aged waits until the database's clock is a second past job's completion
// (store.MinRetention).
func aged(t *testing.T, s store.Store, job store.Job) {
	t.Helper()
	waitForClock(t, s, job.NextAttemptAt.Add(store.MinRetention))
}

// testArchivedJobStaysKnown_R30_R31: a succeeded job past its retention
// leaves the working tables with its history and receipts, and stays: GetJob
// answers it, archived, with all of them and its ledger row; an enqueue of
// its key with the same refund answers that job (created false), with
// another refund OPERATION_KEY_CONFLICT, never a second job; a late receipt
// is filed with it, once; a replay of its completion is a replay, another
// write JOB_NOT_RUNNING; nothing claims it.
func testArchivedJobStaysKnown_R30_R31(t *testing.T, s store.Store) {
	p := refund(t)
	c := claimOne(t, s, "A", enqueue(t, s, p).ID)
	observe(t, s, store.ObservationParams{Job: store.JobRef{ID: c.Job.ID}, Source: "webhook:acme", Outcome: store.OutcomePending,
		ProviderEventID: "evt_before"}, false)
	done := write(t, s, complete(of(c), "re_archived")).Job
	before := get(t, s, done.ID)
	aged(t, s, done)
	if n := archiveAll(t, s, "archiver-1", 100); n != 1 {
		t.Fatalf("archived %d jobs, want 1", n)
	}
	after := get(t, s, done.ID)
	if after.Job.ArchivedAt.IsZero() || after.Job.ArchivedAt.Before(done.UpdatedAt) {
		t.Fatalf("GetJob after archiving = %+v, want it archived", after.Job)
	}
	was := after.Job
	was.ArchivedAt = time.Time{}
	if was != before.Job || len(after.Events) != len(before.Events) || after.ObservationCount != 1 ||
		after.Ledger == nil || after.Ledger.ProviderRefundID != "re_archived" {
		t.Fatalf("archived job = %+v, %d events, %d receipts, ledger %+v; want it as it was: %+v, %d events, 1 receipt",
			after.Job, len(after.Events), after.ObservationCount, after.Ledger, before.Job, len(before.Events))
	}
	byKey, err := s.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{OperationKey: p.OperationKey}})
	if err != nil || byKey.Job.ID != done.ID {
		t.Fatalf("GetJob by key = %+v, %v", byKey.Job, err)
	}

	again, created, err := s.Enqueue(ctxFor(t), p)
	if err != nil || created || again.ID != done.ID || again.State != store.StateSucceeded || again.ArchivedAt.IsZero() {
		t.Fatalf("Enqueue of the archived key = %+v created %v, %v; want the archived job (R30)", again, created, err)
	}
	other := p
	other.AmountMinor++
	if _, _, err := s.Enqueue(ctxFor(t), other); !errors.Is(err, store.ErrKeyConflict) {
		t.Fatalf("Enqueue of the archived key with another amount: %v, want ErrKeyConflict (R30)", err)
	}
	batch := s.EnqueueMany(ctxFor(t), []store.EnqueueParams{refund(t), p, refund(t)})
	if batch[1].Err != nil || batch[1].Created || batch[1].Job.ID != done.ID || !batch[0].Created || !batch[2].Created {
		t.Fatalf("a batch with the archived key = %+v", batch)
	}
	if got := claim(t, s, "B", 10); len(got) != 2 {
		t.Fatalf("claim = %v, want the batch's two new jobs only", ids(got))
	}

	late := store.ObservationParams{Job: store.JobRef{ID: done.ID}, Source: "webhook:acme", Outcome: store.OutcomeFailed,
		ProviderEventID: "evt_after"}
	o := observe(t, s, late, false)
	if again, dup, err := s.Observe(ctxFor(t), late); err != nil || !dup || again.ID != o.ID {
		t.Fatalf("the late receipt again = %+v dup %v, %v; want its duplicate", again, dup, err)
	}
	if d := get(t, s, done.ID); d.ObservationCount != 2 || d.Observations[1].ID != o.ID {
		t.Fatalf("receipts of the archived job: %+v, want both (R28)", d.Observations)
	}
	if res := write(t, s, complete(of(c), "re_archived")); !res.Replayed {
		t.Fatalf("a replay of the archived job's completion = %+v, want replayed (R21)", res)
	}
	_, err = s.Write(ctxFor(t), reschedule(of(c), time.Minute))
	wantFence(t, err, store.ErrNotRunning, c.Job.Attempt, store.StateSucceeded)
}

// testArchiveKeepsUnfinishedWork_R31: only succeeded jobs past their
// retention leave: jobs in review, running, ready and succeeded a moment
// ago stay, however old.
func testArchiveKeepsUnfinishedWork_R31(t *testing.T, s store.Store) {
	review := claimOne(t, s, "A", enqueue(t, s, refund(t)).ID)
	write(t, s, escalate(of(review)))
	running := claimOne(t, s, "A", enqueue(t, s, refund(t)).ID)
	ready := parked(t, s, refund(t))
	old := completed(t, s, refund(t), "re_old")
	aged(t, s, old)
	young := completed(t, s, refund(t), "re_young")
	r := retainer(t, s)
	l, err := r.TakeLease(ctxFor(t), store.ArchiverLease, "archiver", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Archive(ctxFor(t), store.ArchiveParams{Lease: l, RetainSucceeded: time.Second, Limit: 100})
	if err != nil || res.Jobs != 1 || res.More {
		t.Fatalf("Archive = %+v, %v; want the old completion only", res, err)
	}
	for _, id := range []int64{review.Job.ID, running.Job.ID, ready.ID, young.ID} {
		if d := get(t, s, id); !d.Job.ArchivedAt.IsZero() {
			t.Fatalf("job %d (%s) was archived", id, d.Job.State)
		}
	}
	if d := get(t, s, old.ID); d.Job.ArchivedAt.IsZero() {
		t.Fatalf("the old completion was not archived")
	}
}

// testArchiverLeaseFenced_R31: one archiver at a time. A second holder is
// refused while the lease lives; once it ran out the second takes it (a new
// generation), and the first, resuming as if it had been paused, archives
// nothing and cannot renew: its batch checks the lease, on the database's
// clock, in the transaction that would delete.
func testArchiverLeaseFenced_R31(t *testing.T, s store.Store) {
	r := retainer(t, s)
	done := completed(t, s, refund(t), "re_1")
	aged(t, s, done)
	a, err := r.TakeLease(ctxFor(t), store.ArchiverLease, "a", time.Second)
	if err != nil || a.Generation < 1 {
		t.Fatalf("TakeLease(a) = %+v, %v", a, err)
	}
	if _, err := r.TakeLease(ctxFor(t), store.ArchiverLease, "b", time.Minute); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("TakeLease(b) while a holds it: %v, want ErrLeaseHeld", err)
	}
	waitForClock(t, s, a.Until)
	b, err := r.TakeLease(ctxFor(t), store.ArchiverLease, "b", time.Minute)
	if err != nil || b.Generation <= a.Generation {
		t.Fatalf("TakeLease(b) after a's ran out = %+v, %v; want a later generation than %d", b, err, a.Generation)
	}
	if _, err := r.Archive(ctxFor(t), store.ArchiveParams{Lease: a, RetainSucceeded: time.Second, Limit: 100}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("a's batch after b took the lease: %v, want ErrLeaseLost", err)
	}
	if d := get(t, s, done.ID); !d.Job.ArchivedAt.IsZero() {
		t.Fatal("a's batch archived a job under a lost lease")
	}
	if _, err := r.RenewLease(ctxFor(t), a, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("a's renewal: %v, want ErrLeaseLost", err)
	}
	if res, err := r.Archive(ctxFor(t), store.ArchiveParams{Lease: b, RetainSucceeded: time.Second, Limit: 100}); err != nil ||
		res.Jobs != 1 {
		t.Fatalf("b's batch = %+v, %v", res, err)
	}
	if _, err := r.Archive(ctxFor(t), store.ArchiveParams{Lease: b, RetainSucceeded: 0, Limit: 100}); err == nil {
		t.Fatal("a batch with no retention was accepted")
	}
}

// ArchiveRaceRounds is how many rounds testEnqueueRacesArchive_R30 runs.
var ArchiveRaceRounds = 200

// testEnqueueRacesArchive_R30: each round enqueues the key of the oldest
// succeeded job again, with its refund or another, while an archive batch
// moves that very job, both at once on their own connections. Whatever the
// order, the key never makes a second job: the enqueue answers the one job
// (created false) or OPERATION_KEY_CONFLICT, from the working tables or the
// archive, and an enqueue afterwards answers the same. Both orders must be
// seen.
func testEnqueueRacesArchive_R30(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	r := retainer(t, s)
	l, err := r.TakeLease(ctx, store.ArchiverLease, "racer", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ps := make([]store.EnqueueParams, ArchiveRaceRounds)
	jobs := make([]store.Job, ArchiveRaceRounds)
	for i := range ps {
		ps[i] = refund(t)
		jobs[i] = completed(t, s, ps[i], fmt.Sprintf("re_%d", i)) // oldest first
	}
	aged(t, s, jobs[len(jobs)-1])
	seen := map[string]int{}
	took := time.Millisecond // the last batch's time: the enqueue starts anywhere within twice it
	for round, job := range jobs {
		p := ps[round]
		if round%4 == 3 {
			p.AmountMinor++ // another refund under the key
		}
		var enq store.EnqueueOutcome
		var res store.ArchiveResult
		var aerr error
		var wg sync.WaitGroup
		start := make(chan struct{})
		// One side, either, starts anywhere within twice a batch's time:
		// every order happens, before, during and after the batch.
		delayEnqueue, delay := rand.N(2) == 0, rand.N(2*took)
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			if delayEnqueue {
				time.Sleep(delay)
			}
			out := s.EnqueueMany(ctx, []store.EnqueueParams{p})
			enq = out[0]
		}()
		go func() {
			defer wg.Done()
			<-start
			if !delayEnqueue {
				time.Sleep(delay)
			}
			began := time.Now()
			res, aerr = r.Archive(ctx, store.ArchiveParams{Lease: l, RetainSucceeded: time.Second, Limit: 1})
			took = max(time.Since(began), 100*time.Microsecond)
		}()
		close(start)
		wg.Wait()
		what := fmt.Sprintf("round %d (job %d, same refund %v)", round, job.ID, p == ps[round])
		if aerr != nil || res.Jobs != 1 {
			t.Fatalf("%s: Archive = %+v, %v; want the job moved", what, res, aerr)
		}
		switch {
		case p != ps[round]:
			if !errors.Is(enq.Err, store.ErrKeyConflict) {
				t.Fatalf("%s: Enqueue with another refund = %+v, want ErrKeyConflict", what, enq)
			}
		case enq.Err != nil || enq.Created || enq.Job.ID != job.ID:
			t.Fatalf("%s: Enqueue = %+v; want job %d, not created (R30)", what, enq, job.ID)
		case enq.Job.ArchivedAt.IsZero():
			seen["enqueue before the archive"]++
		default:
			seen["enqueue after the archive"]++
		}
		again, created, err := s.Enqueue(ctx, ps[round])
		if err != nil || created || again.ID != job.ID || again.ArchivedAt.IsZero() {
			t.Fatalf("%s: Enqueue afterwards = %+v created %v, %v; want the archived job", what, again, created, err)
		}
	}
	if got := claim(t, s, "sweeper", 10); len(got) != 0 {
		t.Fatalf("a key made a second job: claim = %v", ids(got))
	}
	t.Logf("%d rounds: %v", ArchiveRaceRounds, seen)
	if seen["enqueue before the archive"] == 0 || seen["enqueue after the archive"] == 0 {
		t.Fatalf("the race saw only %v: want both orders", seen)
	}
}
