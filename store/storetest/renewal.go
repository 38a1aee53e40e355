package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// RenewRaceRounds is how many rounds testRenewalRacesTakeover_R27 runs.
var RenewRaceRounds = 100

// renewal asks to renew g's lease for lease.
func renewal(g grant, lease time.Duration) store.Renewal {
	return store.Renewal{JobID: g.id, Attempt: g.attempt, LeaseToken: g.token, Lease: lease}
}

// renew renews rs and returns their outcomes.
func renew(t *testing.T, s store.Store, rs ...store.Renewal) []store.RenewOutcome {
	t.Helper()
	out := s.RenewMany(ctxFor(t), rs)
	if len(out) != len(rs) {
		t.Fatalf("RenewMany answered %d of %d renewals", len(out), len(rs))
	}
	return out
}

// renewed requires r renewed, its lease ending lease after the database's
// time of the renewal (between before and after), and returns the outcome.
func renewed(t *testing.T, s store.Store, r store.Renewal) store.RenewOutcome {
	t.Helper()
	before := dbNow(t, s)
	o := renew(t, s, r)[0]
	after := dbNow(t, s)
	if o.Err != nil {
		t.Fatalf("renew job %d attempt %d: %v", r.JobID, r.Attempt, o.Err)
	}
	if o.Job.LeaseUntil.Before(before.Add(r.Lease).Truncate(time.Microsecond)) || o.Job.LeaseUntil.After(after.Add(r.Lease)) {
		t.Fatalf("renewed lease ends %v, want %s after the renewal (between %v and %v)", o.Job.LeaseUntil, r.Lease,
			before, after)
	}
	return o
}

// testRenewalExtendsTheSameGrant_R27: a renewal sets the lease to the
// database's now plus the duration asked, as the row and the answer show; it
// keeps the attempt, the token, the holder and updated_at (the grant's
// time), writes no history (no transition, R3), and the holder writes back
// with the grant it had.
func testRenewalExtendsTheSameGrant_R27(t *testing.T, s store.Store) {
	c := claimOne(t, s, "A", enqueue(t, s, refund(t)).ID)
	before := get(t, s, c.Job.ID)
	o := renewed(t, s, renewal(of(c), 10*time.Minute))
	after := get(t, s, c.Job.ID)
	if !after.Job.LeaseUntil.Equal(o.Job.LeaseUntil) || o.Job != after.Job {
		t.Fatalf("renewal answered %+v, the row is %+v", o.Job, after.Job)
	}
	want := before.Job
	want.LeaseUntil = after.Job.LeaseUntil
	want.NextAttemptAt = after.Job.LeaseUntil // due at its lease end (store.Job.NextAttemptAt)
	if after.Job != want || len(after.Events) != len(before.Events) {
		t.Fatalf("a renewal changed more than the lease:\n before %+v %v\n after  %+v %v", before.Job,
			kinds(before.Events), after.Job, kinds(after.Events))
	}
	if !o.GrantExpiresAt.Equal(c.Job.UpdatedAt.Add(store.DefaultMaxGrantAge)) {
		t.Fatalf("grant expires at %v, want its claim's time %v + %s", o.GrantExpiresAt, c.Job.UpdatedAt,
			store.DefaultMaxGrantAge)
	}
	// Shorter again: the lease is now plus what was asked, not the longest.
	renewed(t, s, renewal(of(c), 2*time.Second))
	if res := write(t, s, complete(of(c), "re_renewed")); res.Job.State != store.StateSucceeded || res.Job.Attempt != 1 {
		t.Fatalf("complete after renewals = %+v", res.Job)
	}
}

// testRenewalAfterExpiryBeforeTakeover_R8_R27: expiry only opens the
// competition. A renewal after the lease ran out but before any takeover
// committed renews it, and then nobody can take the job over.
func testRenewalAfterExpiryBeforeTakeover_R8_R27(t *testing.T, s store.Store) {
	c := claimOne(t, s, "A", enqueue(t, s, refund(t)).ID)
	expire(t, s, c.Job.ID)
	renewed(t, s, renewal(of(c), time.Minute))
	if got := claim(t, s, "B", 10); len(got) != 0 {
		t.Fatalf("B took over %v after A renewed", ids(got))
	}
}

// testRenewalRefusedWithoutTheGrant_R25_R27: a renewal is fenced exactly like
// a write-back. After a takeover the old grant is STALE_ATTEMPT and the new
// holder's lease is untouched; the current attempt with another or no token
// is STALE_ATTEMPT; a grant that already wrote its outcome is
// JOB_NOT_RUNNING; an unknown job is NOT_FOUND. None changes a row.
func testRenewalRefusedWithoutTheGrant_R25_R27(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := claimOne(t, s, "A", job.ID)
	expire(t, s, job.ID)
	b := claimOne(t, s, "B", job.ID)
	before := get(t, s, job.ID).Job

	forged := of(b)
	forged.token = store.NewLeaseToken()
	untokened := of(b)
	untokened.token = ""
	for _, g := range []grant{of(a), forged, untokened} {
		o := renew(t, s, renewal(g, 10*time.Minute))[0]
		wantFence(t, o.Err, store.ErrStaleAttempt, 2, store.StateRunning)
		if !o.GrantExpiresAt.IsZero() {
			t.Fatalf("a refused renewal named its grant's end %v", o.GrantExpiresAt)
		}
	}
	if after := get(t, s, job.ID).Job; after != before {
		t.Fatalf("refused renewals changed the job:\n before %+v\n after  %+v", before, after)
	}

	write(t, s, complete(of(b), "re_B"))
	wantFence(t, renew(t, s, renewal(of(b), time.Minute))[0].Err, store.ErrNotRunning, 2, store.StateSucceeded)
	missing := of(b)
	missing.id += 1000
	if o := renew(t, s, renewal(missing, time.Minute))[0]; !errors.Is(o.Err, store.ErrNotFound) {
		t.Fatalf("renewing a missing job: %v", o.Err)
	}
	var ve *store.ValidationError
	if o := renew(t, s, store.Renewal{JobID: job.ID, Attempt: 2, Lease: 0})[0]; !errors.As(o.Err, &ve) {
		t.Fatalf("renewing for no time: %v, want a validation error", o.Err)
	}
}

// testRenewManyAnswersEachOnItsOwn_R27: one batch renews, refuses and
// misses, each answered as alone; a job renewed twice in a batch ends with
// the later lease, and both are answered with it.
func testRenewManyAnswersEachOnItsOwn_R27(t *testing.T, s store.Store) {
	x := claimOne(t, s, "A", enqueue(t, s, refund(t)).ID)
	y := claimOne(t, s, "A", enqueue(t, s, refund(t)).ID)
	stale := of(y)
	stale.attempt = 0 // invalid: answered on its own, the batch goes on
	forged := of(y)
	forged.token = store.NewLeaseToken()
	out := renew(t, s, renewal(of(x), time.Minute), renewal(forged, time.Minute), renewal(stale, time.Minute),
		renewal(of(y), 5*time.Minute), renewal(of(x), 3*time.Minute))
	var ve *store.ValidationError
	switch {
	case out[0].Err != nil || out[3].Err != nil || out[4].Err != nil:
		t.Fatalf("renewals of held grants: %v, %v, %v", out[0].Err, out[3].Err, out[4].Err)
	case !errors.Is(out[1].Err, store.ErrStaleAttempt):
		t.Fatalf("forged renewal in a batch: %v", out[1].Err)
	case !errors.As(out[2].Err, &ve):
		t.Fatalf("invalid renewal in a batch: %v", out[2].Err)
	}
	jx, jy := get(t, s, x.Job.ID).Job, get(t, s, y.Job.ID).Job
	if !out[0].Job.LeaseUntil.Equal(jx.LeaseUntil) || !out[4].Job.LeaseUntil.Equal(jx.LeaseUntil) ||
		!out[3].Job.LeaseUntil.Equal(jy.LeaseUntil) {
		t.Fatalf("answered leases %v, %v and %v; rows %v and %v", out[0].Job.LeaseUntil, out[4].Job.LeaseUntil,
			out[3].Job.LeaseUntil, jx.LeaseUntil, jy.LeaseUntil)
	}
	if d := jy.LeaseUntil.Sub(jx.LeaseUntil); d < 90*time.Second || d > 2*time.Minute+time.Second {
		t.Fatalf("x's lease %v, y's %v: want x's the later of its two renewals (3 min), y's 5 min", jx.LeaseUntil, jy.LeaseUntil)
	}
}

// testRenewalBoundedByGrantAge_R27: no renewal extends a lease past the
// grant's claim time plus MaxAge; once the grant is that old, renewal is
// refused with ErrGrantTooOld and nothing changes, and the job is taken over
// as usual when its lease runs out. The holder may still write back until
// then (R8).
func testRenewalBoundedByGrantAge_R27(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", job.ID)
	r := renewal(of(c), 10*time.Minute)
	r.MaxAge = 1500 * time.Millisecond
	o := renew(t, s, r)[0]
	end := c.Job.UpdatedAt.Add(r.MaxAge)
	if o.Err != nil || !o.Job.LeaseUntil.Equal(end) || !o.GrantExpiresAt.Equal(end) {
		t.Fatalf("renewal near the age bound = lease %v, grant end %v, %v; want both %v", o.Job.LeaseUntil,
			o.GrantExpiresAt, o.Err, end)
	}
	waitForClock(t, s, end)
	before := get(t, s, job.ID).Job
	o = renew(t, s, r)[0]
	if !errors.Is(o.Err, store.ErrGrantTooOld) || !o.GrantExpiresAt.Equal(end) {
		t.Fatalf("renewal past the age bound: %v (grant end %v), want ErrGrantTooOld", o.Err, o.GrantExpiresAt)
	}
	if after := get(t, s, job.ID).Job; after != before {
		t.Fatalf("a refused renewal changed the job:\n before %+v\n after  %+v", before, after)
	}
	if b := claimOne(t, s, "B", job.ID); !b.Takeover || b.Job.Attempt != 2 {
		t.Fatalf("after the grant's life ran out: %+v, want B's takeover under attempt 2", b)
	}
}

// testRenewalRacesTakeover_R27: each round, A's lease has run out, and A
// renews while B claims, at once on their own connections. Exactly one wins:
// A renewed and B got nothing, or B took the job over (attempt 2) and A's
// renewal is STALE_ATTEMPT. A renewal never resurrects a taken-over grant,
// and no takeover follows a renewal that committed first. The row agrees
// with the winner.
func testRenewalRacesTakeover_R27(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	wins := map[string]int{}
	for round := range RenewRaceRounds {
		job := enqueue(t, s, refund(t))
		a := claimOne(t, s, "A", job.ID)
		expire(t, s, job.ID)
		var (
			ro      store.RenewOutcome
			claimed []store.ClaimedJob
			err     error
			wg      sync.WaitGroup
		)
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(rand.N(time.Millisecond))
			ro = s.RenewMany(ctx, []store.Renewal{renewal(of(a), time.Minute)})[0]
		}()
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(rand.N(time.Millisecond))
			claimed, err = s.Claim(ctx, store.ClaimParams{WorkerID: "B", MaxJobs: 1, Lease: time.Minute})
		}()
		close(start)
		wg.Wait()
		if err != nil {
			t.Fatalf("round %d: B's claim: %v", round, err)
		}
		row := get(t, s, job.ID).Job
		took := len(claimed) == 1 && claimed[0].Job.ID == job.ID
		switch {
		case ro.Err == nil && !took:
			wins["renewal"]++
			if row.Attempt != 1 || !row.LeaseUntil.Equal(ro.Job.LeaseUntil) || row.Grant != a.Job.Grant {
				t.Fatalf("round %d: A renewed, but the row is %+v", round, row)
			}
		case took && errors.Is(ro.Err, store.ErrStaleAttempt):
			wins["takeover"]++
			if row.Attempt != 2 || row.Grant != claimed[0].Job.Grant || !row.LeaseUntil.Equal(claimed[0].Job.LeaseUntil) {
				t.Fatalf("round %d: B took over, but the row is %+v", round, row)
			}
		default:
			t.Fatalf("round %d: renewal %v and takeover %v (claimed %v): exactly one must win", round, ro.Err, took,
				ids(claimed))
		}
		if len(claimed) > 1 || (len(claimed) == 1 && !took) {
			t.Fatalf("round %d: B claimed %v, only job %d was there", round, ids(claimed), job.ID)
		}
		// Close the round's job so the next round's claim sees only its own.
		g := of(a)
		if took {
			g = of(claimed[0])
		}
		write(t, s, complete(g, fmt.Sprintf("re_%d", round)))
	}
	t.Logf("renewal vs takeover over %d rounds: %v", RenewRaceRounds, wins)
}

// testReceiptDuringGrantExpeditesReschedule_R28: a receipt of success filed
// while the job runs moves nothing then (R15); the holder's reschedule to
// reconcile is then due at once, answered Expedited, with an expedited entry
// after the reschedule in the history. A receipt from before the grant (the
// holder was handed it with the claim), or a reschedule to send the refund
// again, keeps the time asked for. A replay of the expedited reschedule is a
// replay (R21).
func testReceiptDuringGrantExpeditesReschedule_R28(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", job.ID)
	o := observe(t, s, store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "webhook:acme",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_hook", ProviderEventID: "evt_during"}, false)
	if ro := renewed(t, s, renewal(of(c), time.Minute)); !ro.ReceiptDuringGrant().Equal(o.CreatedAt) {
		t.Fatalf("renewal names receipt %v during the grant, want %v", ro.ReceiptDuringGrant(), o.CreatedAt)
	}
	w := reschedule(of(c), time.Hour)
	res := write(t, s, w)
	if !res.Expedited || !res.Job.NextAttemptAt.Equal(res.Job.UpdatedAt) || res.Job.NextAction != store.ActionReconcile {
		t.Fatalf("reschedule after a receipt during the grant = %+v expedited %v, want due now", res.Job, res.Expedited)
	}
	d := get(t, s, job.ID)
	if d.Job != res.Job {
		t.Fatalf("answered %+v, the row is %+v", res.Job, d.Job)
	}
	last := d.Events[len(d.Events)-2:]
	if last[0].Kind != store.EventRescheduled || last[1].Kind != store.EventExpedited || last[1].Attempt != 1 ||
		last[1].FromState != store.StateReady || last[1].ToState != store.StateReady || !last[1].Grant.IsZero() ||
		!last[1].CreatedAt.Equal(last[0].CreatedAt) {
		t.Fatalf("history ends %+v, want the reschedule then an expedite under attempt 1 without a grant", last)
	}
	if again := write(t, s, w); !again.Replayed {
		t.Fatalf("the expedited reschedule repeated = %+v, want a replay", again)
	}

	// The next holder was handed the receipt with its claim: its own
	// reschedule keeps its time.
	c2 := claimOne(t, s, "B", job.ID)
	if c2.ObservationCount != 1 {
		t.Fatalf("the claim carried %d receipts, want 1", c2.ObservationCount)
	}
	if res := write(t, s, reschedule(of(c2), time.Hour)); res.Expedited || !res.Job.NextAttemptAt.After(res.Job.UpdatedAt) {
		t.Fatalf("reschedule after a receipt from before the grant = %+v expedited %v, want an hour from now",
			res.Job, res.Expedited)
	}

	// A receipt during the grant and a reschedule to send again: the time
	// asked for stands.
	other := enqueue(t, s, refund(t))
	c3 := claimOne(t, s, "A", other.ID)
	observe(t, s, store.ObservationParams{Job: store.JobRef{ID: other.ID}, Source: "webhook:acme",
		Outcome: store.OutcomeFailed, ProviderEventID: "evt_failed"}, false)
	again := reschedule(of(c3), time.Hour)
	again.NextAction = store.ActionRefund
	if res := write(t, s, again); res.Expedited || !res.Job.NextAttemptAt.After(res.Job.UpdatedAt) {
		t.Fatalf("reschedule to refund after a receipt = %+v expedited %v, want an hour from now", res.Job, res.Expedited)
	}
}
