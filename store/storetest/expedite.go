package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// observe files p and requires it new, expedited or not as want says.
func observe(t *testing.T, s store.Store, p store.ObservationParams, expedited bool) store.Observation {
	t.Helper()
	o, dup, err := s.Observe(ctxFor(t), p)
	if err != nil || dup || o.Expedited != expedited {
		t.Fatalf("Observe(%s %s) = %+v dup %v, %v; want new, expedited %v", p.Source, p.Outcome, o, dup, err, expedited)
	}
	return o
}

// wantExpedited requires job id, which was before, moved by receipt o only
// in what an expedite moves (R28): due at the database time of the move,
// next action reconcile, updated then; state, attempt, lease, grant, holder
// and reason as they were. Its history ends in o's expedited event under the
// unchanged attempt, without a grant. It returns the job as it is now.
func wantExpedited(t *testing.T, s store.Store, before store.Job, o store.Observation) store.Job {
	t.Helper()
	d := get(t, s, before.ID)
	j := d.Job
	if j.NextAction != store.ActionReconcile || j.NextAttemptAt.After(d.Now) || !j.NextAttemptAt.Equal(j.UpdatedAt) ||
		j.UpdatedAt.Before(o.CreatedAt) {
		t.Fatalf("expedited job = %+v (now %v, receipt filed %v), want due now to reconcile", j, d.Now, o.CreatedAt)
	}
	if !j.EvidenceAt.Equal(o.CreatedAt) {
		t.Fatalf("expedited job's evidence_at = %v, want the receipt's time %v", j.EvidenceAt, o.CreatedAt)
	}
	moved := before
	moved.NextAction, moved.NextAttemptAt, moved.UpdatedAt, moved.EvidenceAt = j.NextAction, j.NextAttemptAt, j.UpdatedAt,
		j.EvidenceAt
	if j != moved {
		t.Fatalf("an expedite changed more than the schedule:\n before %+v\n after  %+v", before, j)
	}
	ev := d.Events[len(d.Events)-1]
	want := store.Event{ID: ev.ID, JobID: j.ID, Attempt: before.Attempt, Kind: store.EventExpedited, WorkerID: o.Source,
		FromState: store.StateReady, ToState: store.StateReady, NextAction: store.ActionReconcile,
		Reason: fmt.Sprintf("receipt %d from %s: %s", o.ID, o.Source, o.Outcome), CreatedAt: j.UpdatedAt}
	if ev != want || countKind(d.Events, store.EventExpedited) != 1 {
		t.Fatalf("history %+v\nwant it to end, once, in %+v", d.Events, want)
	}
	return j
}

// sentAndWaiting enqueues p, claims it to send its refund (its first send
// recorded, R22) and has its holder hand it back to send again after d: a
// job that may already have been sent, waiting.
func sentAndWaiting(t *testing.T, s store.Store, p store.EnqueueParams, d time.Duration) store.Job {
	t.Helper()
	w := reschedule(of(claimOne(t, s, "sender", enqueue(t, s, p).ID)), d)
	w.NextAction = store.ActionRefund
	return get(t, s, write(t, s, w).Job.ID).Job
}

// testReceiptExpeditesReadyJob_R28: a new receipt of success or failure for
// a ready job that may already have been sent makes it due now with next
// action reconcile, even one that was to send its refund again (R14: the
// provider says the refund exists or failed; a reconcile is always safe),
// with an expedited event in its history; its state, attempt, lease and
// grant stay. A redelivery, or a receipt for a job already due to
// reconcile, moves nothing.
func testReceiptExpeditesReadyJob_R28(t *testing.T, s store.Store) {
	// Sent once, waiting an hour to send its refund again.
	waiting := sentAndWaiting(t, s, refund(t), time.Hour)
	hook := store.ObservationParams{Job: store.JobRef{ID: waiting.ID}, Source: "webhook:stripe",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_hook", ProviderEventID: "evt_succeeded"}
	o := observe(t, s, hook, true)
	moved := wantExpedited(t, s, waiting, o)

	hook.Detail = "redelivered"
	if again, dup, err := s.Observe(ctxFor(t), hook); err != nil || !dup || again.ID != o.ID || again.Expedited {
		t.Fatalf("redelivery = %+v dup %v, %v; want the receipt on file, not expedited", again, dup, err)
	}
	failed := hook
	failed.Outcome, failed.ProviderEventID = store.OutcomeFailed, "evt_failed"
	second := observe(t, s, failed, false) // already due to reconcile: nothing to move
	moved.EvidenceAt = second.CreatedAt    // but it is the newest receipt (R28)
	if d := get(t, s, waiting.ID); d.Job != moved || len(d.Events) != 4 {
		t.Fatalf("after a redelivery and a receipt for a job due to reconcile: %+v, %d events; want %+v, 4",
			d.Job, len(d.Events), moved)
	}
	c := claimOne(t, s, "A", waiting.ID)
	if c.Takeover || c.Job.Attempt != 2 || c.Job.NextAction != store.ActionReconcile || c.ObservationCount != 2 {
		t.Fatalf("claim after the receipts = %+v, want a second claim that reconciles with both receipts", c)
	}

	// Rescheduled by its holder to send the refund in an hour: a failure
	// from a reporter without a grant moves it under the holder's attempt,
	// keeping the grant, holder and reason on the row.
	held := claimOne(t, s, "B", enqueue(t, s, refund(t)).ID)
	w := reschedule(of(held), time.Hour)
	w.NextAction = store.ActionRefund
	before := get(t, s, write(t, s, w).Job.ID).Job
	o = observe(t, s, store.ObservationParams{Job: store.JobRef{OperationKey: before.OperationKey}, Source: "reconciler",
		Outcome: store.OutcomeFailed}, true)
	wantExpedited(t, s, before, o)
	write(t, s, complete(of(claimOne(t, s, "B", before.ID)), "re_held")) // nothing else due below

	// Sent, and due already to send again: it is to reconcile now, and due
	// from the database's now.
	due := sentAndWaiting(t, s, refund(t), 0)
	o = observe(t, s, store.ObservationParams{Job: store.JobRef{ID: due.ID}, Source: "worker:C", Outcome: store.OutcomeSucceeded,
		ProviderRefundID: "re_due"}, true)
	wantExpedited(t, s, due, o)
}

// testReceiptNeverSendsEarly_R28: nothing a receipt does can make a refund
// be sent earlier than without it. A refund never sent — due next year by
// its producer's not_before, or due now — stays as it was whatever receipts
// of success or failure come, from any reporter, with or without a matching
// provider and amount: no expedite, the same time and action, and no claim
// before its time. A receipt that names a job of another provider than the
// webhook's, or another amount or currency than the job's, is refused
// (ErrReceiptMismatch): nothing filed, nothing moved, even for a job that
// was sent; one that matches moves that job toward reconcile.
func testReceiptNeverSendsEarly_R28(t *testing.T, s store.Store) {
	future := refund(t)
	future.NotBefore = dbNow(t, s).Add(365 * 24 * time.Hour)
	scheduled := get(t, s, enqueue(t, s, future).ID).Job
	dueNow := get(t, s, enqueue(t, s, refund(t)).ID).Job
	for _, job := range []store.Job{scheduled, dueNow} {
		for i, p := range []store.ObservationParams{
			{Source: "webhook:" + job.Provider, Reporter: "webhook:" + job.Provider, Provider: job.Provider,
				AmountMinor: job.AmountMinor, Currency: job.Currency, Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_1",
				ProviderEventID: fmt.Sprintf("evt_early_%d", job.ID)},
			{Source: "worker:w", Reporter: "w", Outcome: store.OutcomeFailed},
			{Source: "worker:w", Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_2"},
		} {
			p.Job = store.JobRef{ID: job.ID}
			if i%2 == 1 {
				p.Job = store.JobRef{OperationKey: job.OperationKey}
			}
			observe(t, s, p, false)
		}
		d := get(t, s, job.ID)
		if d.Job.NextAction != store.ActionRefund || !d.Job.NextAttemptAt.Equal(job.NextAttemptAt) ||
			d.Job.State != store.StateReady || countKind(d.Events, store.EventExpedited) != 0 || d.ObservationCount != 3 {
			t.Fatalf("a never-sent job after receipts of success and failure: %+v %v (%d receipts), want it as it was: %+v",
				d.Job, kinds(d.Events), d.ObservationCount, job)
		}
	}
	if got := claim(t, s, "early", 10); len(got) != 1 || got[0].Job.ID != dueNow.ID ||
		got[0].Job.NextAction != store.ActionRefund {
		t.Fatalf("claim = %+v, want only the job due now, to send its refund", got)
	}

	sent := sentAndWaiting(t, s, refund(t), time.Hour)
	for _, p := range []store.ObservationParams{
		{Provider: "globex", Outcome: store.OutcomeSucceeded, ProviderEventID: "evt_other_provider"},
		{Provider: sent.Provider, AmountMinor: 1, Currency: sent.Currency, Outcome: store.OutcomeSucceeded,
			ProviderEventID: "evt_other_amount"},
		{Provider: sent.Provider, AmountMinor: sent.AmountMinor, Currency: "JPY", Outcome: store.OutcomeFailed,
			ProviderEventID: "evt_other_currency"},
	} {
		p.Job, p.Source, p.Reporter = store.JobRef{ID: sent.ID}, "webhook:"+p.Provider, "webhook:"+p.Provider
		if o, _, err := s.Observe(ctxFor(t), p); !errors.Is(err, store.ErrReceiptMismatch) {
			t.Fatalf("Observe(%s) = %+v, %v; want ErrReceiptMismatch", p.ProviderEventID, o, err)
		}
	}
	if d := get(t, s, sent.ID); d.Job != sent || d.ObservationCount != 0 {
		t.Fatalf("mismatched receipts left %+v with %d receipts, want %+v with none", d.Job, d.ObservationCount, sent)
	}
	o := observe(t, s, store.ObservationParams{Job: store.JobRef{ID: sent.ID}, Source: "webhook:" + sent.Provider,
		Reporter: "webhook:" + sent.Provider, Provider: sent.Provider, AmountMinor: sent.AmountMinor,
		Currency: sent.Currency, Outcome: store.OutcomeSucceeded, ProviderEventID: "evt_matching"}, true)
	wantExpedited(t, s, sent, o)
}

// testReceiptLeavesOtherStatesAlone_R28: receipts of every outcome leave
// running, manual_review and succeeded jobs as they are, history included,
// and pending or not found leave a ready job waiting: only a worker's fenced
// write changes state (R15, R28).
func testReceiptLeavesOtherStatesAlone_R28(t *testing.T, s store.Store) {
	running := claimOne(t, s, "A", enqueue(t, s, refund(t)).ID)
	review := claimOne(t, s, "A", enqueue(t, s, refund(t)).ID)
	write(t, s, escalate(of(review)))
	done := completed(t, s, refund(t), "re_done")
	waiting := parked(t, s, refund(t))
	untouched := func(id int64, outcomes ...store.Outcome) {
		t.Helper()
		before := get(t, s, id)
		for _, outcome := range outcomes {
			observe(t, s, store.ObservationParams{Job: store.JobRef{ID: id}, Source: "webhook", Outcome: outcome,
				ProviderEventID: fmt.Sprintf("evt_%d_%s", id, outcome)}, false)
		}
		after := get(t, s, id)
		// R28: an unfinished job keeps when its newest receipt of
		// success or failure came, and nothing else changes; a finished
		// one keeps nothing.
		evidence := before.Job.State != store.StateSucceeded &&
			slices.ContainsFunc(outcomes, store.Outcome.Expedites)
		if !after.Job.EvidenceAt.IsZero() != evidence || (evidence && !after.Job.EvidenceAt.After(before.Job.UpdatedAt)) {
			t.Fatalf("job %d (%s) evidence_at = %v after receipts %v, want set: %v", id, before.Job.State,
				after.Job.EvidenceAt, outcomes, evidence)
		}
		before.Job.EvidenceAt = after.Job.EvidenceAt
		if after.Job != before.Job || !slices.Equal(after.Events, before.Events) {
			t.Fatalf("receipts %v changed job %d:\n before %+v %v\n after  %+v %v", outcomes, id, before.Job,
				kinds(before.Events), after.Job, kinds(after.Events))
		}
	}
	all := []store.Outcome{store.OutcomeSucceeded, store.OutcomeFailed, store.OutcomePending, store.OutcomeNotFound}
	untouched(running.Job.ID, all...)
	untouched(review.Job.ID, all...)
	// R34: a receipt of failure after success puts the job on the attention
	// list, and changes nothing else (testReceiptAfterSuccessRaisesAttention_R34).
	untouched(done.ID, store.OutcomeSucceeded, store.OutcomePending, store.OutcomeNotFound)
	untouched(waiting.ID, store.OutcomePending, store.OutcomeNotFound)
	// The holder of the running job closes it through the fenced path.
	write(t, s, complete(of(running), "re_running"))
}

// ExpediteRaceRounds is how many rounds testReceiptRacesClaim_R28 runs.
var ExpediteRaceRounds = 150

// testReceiptRacesClaim_R28: each round files receipts of success for a job
// due in an hour and for a due one while a claim runs, all at once on their
// own connections. Whatever the order: a claim never returns a job that a
// receipt then changes (the row is as the claim answered it); a claim that
// follows an expedite reconciles, one that precedes it leaves the receipt
// nothing to move; the job due in an hour is claimed only after its
// expedite, and the due one is left unclaimed only when its expedite held
// it; each history is in order; no error escapes (deadlocks run again
// whole, R20).
func testReceiptRacesClaim_R28(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	var orders = map[string]int{}
	for round := 0; round < ExpediteRaceRounds; round++ {
		later := sentAndWaiting(t, s, refund(t), time.Hour)
		due := sentAndWaiting(t, s, refund(t), 0)
		jobs := []store.Job{later, due}
		obs := make([]store.Observation, len(jobs))
		errs := make([]error, len(jobs)+1)
		var claimed []store.ClaimedJob
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				var dup bool
				obs[i], dup, errs[i] = s.Observe(ctx, store.ObservationParams{Job: store.JobRef{ID: j.ID},
					Source: "webhook", Outcome: store.OutcomeSucceeded, ProviderEventID: fmt.Sprintf("evt_%d", j.ID)})
				if errs[i] == nil && dup {
					errs[i] = fmt.Errorf("a new receipt answered as a duplicate")
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// A receipt takes a few statements, a claim one transaction:
			// starting the claim a random moment later lets every order
			// happen, the claim first, between and last.
			time.Sleep(rand.N(2 * time.Millisecond))
			claimed, errs[len(jobs)] = s.Claim(ctx, store.ClaimParams{WorkerID: "racer", MaxJobs: 2, Lease: time.Minute})
		}()
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: call %d (receipts for %d and %d, then the claim): %v", round, i, later.ID, due.ID, err)
			}
		}
		for i, j := range jobs {
			d := get(t, s, j.ID)
			// After its first send: enqueued, claimed, rescheduled.
			raced := d.Events[3:]
			expedited := slices.IndexFunc(raced, func(e store.Event) bool { return e.Kind == store.EventExpedited })
			claim := slices.IndexFunc(raced, func(e store.Event) bool { return e.Kind == store.EventClaimed })
			c := slices.IndexFunc(claimed, func(c store.ClaimedJob) bool { return c.Job.ID == j.ID })
			what := fmt.Sprintf("round %d, job %d (due in an hour: %v)", round, j.ID, i == 0)
			if obs[i].Expedited != (expedited >= 0) || countKind(d.Events, store.EventExpedited) > 1 {
				t.Fatalf("%s: receipt says expedited %v, history %v", what, obs[i].Expedited, kinds(d.Events))
			}
			wantInOrder(t, what, d.Events)
			switch {
			case c >= 0:
				got := claimed[c].Job
				if now := d.Job; now.State != store.StateRunning || now.Attempt != got.Attempt ||
					now.NextAction != got.NextAction || !now.NextAttemptAt.Equal(got.NextAttemptAt) ||
					!now.LeaseUntil.Equal(got.LeaseUntil) || !now.UpdatedAt.Equal(got.UpdatedAt) || now.Grant != got.Grant {
					t.Fatalf("%s: the claim answered %+v, the row is %+v: changed after the claim", what, got, now)
				}
				if claim < 0 || expedited > claim {
					t.Fatalf("%s: the receipt moved the job after its claim: %v", what, kinds(d.Events))
				}
				if (expedited >= 0) != (got.NextAction == store.ActionReconcile) {
					t.Fatalf("%s: claimed to %s, history %v", what, got.NextAction, kinds(d.Events))
				}
				if i == 0 && expedited < 0 {
					t.Fatalf("%s: claimed before it was due", what)
				}
				if expedited >= 0 {
					orders[fmt.Sprintf("job %d: expedited, then claimed", i)]++
				} else {
					orders[fmt.Sprintf("job %d: claimed first", i)]++
				}
			case i == 1 && expedited < 0:
				t.Fatalf("%s: due, not expedited, and not claimed: %+v %v", what, d.Job, kinds(d.Events))
			case expedited >= 0:
				if d.Job.State != store.StateReady || d.Job.NextAction != store.ActionReconcile || d.Job.NextAttemptAt.After(d.Now) {
					t.Fatalf("%s: expedited, not claimed, and now %+v", what, d.Job)
				}
				orders[fmt.Sprintf("job %d: expedited, not claimed", i)]++
			default:
				orders[fmt.Sprintf("job %d: neither", i)]++
			}
		}
		// Leave nothing due for the next round's claim.
		for _, c := range append(claimed, claim(t, s, "sweeper", 2)...) {
			write(t, s, complete(of(c), fmt.Sprintf("re_%d", c.Job.ID)))
		}
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rounds: %v; %d transactions run again (R20)", ExpediteRaceRounds, orders, st.TxRetries)
}

// wantInOrder requires a job's history, by id, to be one chain: each
// transition from the state the one before left, at or after its time,
// under an attempt never lower (R2, R3).
func wantInOrder(t *testing.T, what string, events []store.Event) {
	t.Helper()
	for i := 1; i < len(events); i++ {
		prev, e := events[i-1], events[i]
		if e.ID <= prev.ID || e.FromState != prev.ToState || e.CreatedAt.Before(prev.CreatedAt) || e.Attempt < prev.Attempt {
			t.Fatalf("%s: history out of order at event %d: %+v after %+v", what, i, e, prev)
		}
	}
}
