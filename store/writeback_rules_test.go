package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// Fixtures shared by the unit tests of the store package's pure decisions.
// Every time is explicit: nothing here reads a clock.
var (
	// rulesNow stands for the database's clock (R12); it has nanoseconds so
	// the microsecond truncation the backends store is visible.
	rulesNow = time.Date(2025, 3, 14, 9, 26, 53, 589793238, time.UTC)

	rulesHolderTok store.LeaseToken = "hOLDER-token_000000000" // the current grant's token
	rulesOtherTok  store.LeaseToken = "0therW0rker-token_1234" // someone else's token
	rulesNewTok    store.LeaseToken = "takeover-token_9876543" // a later grant's token
)

// rulesHeld is a job running under attempt 3 of worker-a's grant.
func rulesHeld() store.Job {
	return store.Job{
		ID: 7, OperationKey: "refund-op-7", OrderID: "order-1", PaymentID: "pay-1",
		AmountMinor: 1250, Currency: "EUR", Provider: "acme",
		State: store.StateRunning, Attempt: 3, NextAction: store.ActionRefund,
		NextAttemptAt: rulesNow.Add(-time.Minute), LeaseUntil: rulesNow.Add(20 * time.Second),
		WorkerID: "worker-a", FirstSentAt: rulesNow.Add(-time.Hour),
		CreatedAt: rulesNow.Add(-2 * time.Hour), UpdatedAt: rulesNow.Add(-10 * time.Second),
		Grant: rulesHolderTok.Hash(),
	}
}

// rulesWith returns j changed by f.
func rulesWith(j store.Job, f func(*store.Job)) store.Job {
	f(&j)
	return j
}

func rulesComplete(attempt int64, tok store.LeaseToken, refundID string) store.Writeback {
	return store.Writeback{Kind: store.EventCompleted, JobID: 7, Attempt: attempt, LeaseToken: tok,
		ProviderRefundID: refundID}
}

func rulesReschedule(attempt int64, tok store.LeaseToken, next store.NextAction) store.Writeback {
	return store.Writeback{Kind: store.EventRescheduled, JobID: 7, Attempt: attempt, LeaseToken: tok,
		NextAction: next, Delay: 30 * time.Second, Reason: "provider pending"}
}

func rulesEscalate(attempt int64, tok store.LeaseToken) store.Writeback {
	return store.Writeback{Kind: store.EventEscalated, JobID: 7, Attempt: attempt, LeaseToken: tok,
		Reason: "provider has no record and the key is out of its window"}
}

func rulesResolve(attempt int64, res store.Resolution, refundID, note string) store.Writeback {
	return store.Writeback{Kind: store.EventResolved, JobID: 7, Attempt: attempt, Resolution: res,
		ProviderRefundID: refundID, Reason: note, Actor: "alice@ops"}
}

// Job states after the holder's writes under attempt 3.
func rulesCompleted(refundID string) store.Job {
	return rulesWith(rulesHeld(), func(j *store.Job) {
		j.State, j.LeaseUntil, j.ProviderRefundID = store.StateSucceeded, time.Time{}, refundID
	})
}

func rulesRescheduled(next store.NextAction) store.Job {
	return rulesWith(rulesHeld(), func(j *store.Job) {
		j.State, j.LeaseUntil, j.NextAction = store.StateReady, time.Time{}, next
	})
}

func rulesEscalated() store.Job {
	return rulesWith(rulesHeld(), func(j *store.Job) {
		j.State, j.LeaseUntil, j.LastReason = store.StateManualReview, time.Time{}, "no record"
	})
}

// rulesTakenOver is the job after worker-b's takeover: attempt 4, a new
// grant, next action reconcile (R6).
func rulesTakenOver() store.Job {
	return rulesWith(rulesHeld(), func(j *store.Job) {
		j.Attempt, j.Grant, j.WorkerID, j.NextAction = 4, rulesNewTok.Hash(), "worker-b", store.ActionReconcile
	})
}

// R9, R25, R8: the fence admits exactly the holder's write: state running,
// the holder's attempt and the holder's token; never a lease-clock test.
func TestFencedAdmitsOnlyTheHoldersGrant_R8_R9_R25(t *testing.T) {
	held := rulesHeld()
	cases := []struct {
		name string
		w    store.Writeback
		job  store.Job
		want bool
	}{
		{"holder completes", rulesComplete(3, rulesHolderTok, "re_1"), held, true},
		{"holder reschedules", rulesReschedule(3, rulesHolderTok, store.ActionReconcile), held, true},
		{"holder escalates", rulesEscalate(3, rulesHolderTok), held, true},
		{"holder after its lease expired, nobody took over (R8)", rulesComplete(3, rulesHolderTok, "re_1"),
			rulesWith(held, func(j *store.Job) { j.LeaseUntil = rulesNow.Add(-time.Hour) }), true},
		{"current attempt with another token", rulesComplete(3, rulesOtherTok, "re_1"), held, false},
		{"current attempt with no token", rulesComplete(3, "", "re_1"), held, false},
		{"older attempt after a takeover", rulesComplete(3, rulesHolderTok, "re_1"), rulesTakenOver(), false},
		{"older attempt with the new grant's token", rulesComplete(3, rulesNewTok, "re_1"), rulesTakenOver(), false},
		{"attempt never granted", rulesComplete(4, rulesHolderTok, "re_1"), held, false},
		{"holder after its own completion", rulesComplete(3, rulesHolderTok, "re_1"), rulesCompleted("re_1"), false},
		{"holder after its own reschedule", rulesEscalate(3, rulesHolderTok), rulesRescheduled(store.ActionReconcile), false},
		{"holder's write on a job in review", rulesComplete(3, rulesHolderTok, "re_1"), rulesEscalated(), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.w.Fenced(c.job); got != c.want {
				t.Fatalf("Fenced = %v, want %v", got, c.want)
			}
			if c.want && c.w.Grant() != c.job.Grant {
				t.Fatalf("a fenced write's Grant() %x is not the job's %x: the UPDATE would not match",
					c.w.Grant(), c.job.Grant)
			}
		})
	}
}

// R10, R21, R25: a fenced write-back that matched no row is explained from
// the re-read row: a replay, a stale writer, or the same grant's other write.
func TestSettleExplainsAZeroRowWrite_R10_R21_R25(t *testing.T) {
	cases := []struct {
		name    string
		w       store.Writeback
		current store.Job
		wantErr error // nil: a replay
	}{
		// R25: the attempt is disclosed; knowing it is not holding the grant.
		{"current attempt with another token", rulesComplete(3, rulesOtherTok, "re_1"), rulesHeld(), store.ErrStaleAttempt},
		{"current attempt with no token", rulesComplete(3, "", "re_1"), rulesHeld(), store.ErrStaleAttempt},
		{"reschedule with another token", rulesReschedule(3, rulesOtherTok, store.ActionReconcile), rulesHeld(), store.ErrStaleAttempt},
		{"escalate with no token", rulesEscalate(3, ""), rulesHeld(), store.ErrStaleAttempt},
		// R9, T1: the zombie after a takeover.
		{"older attempt while the new holder runs", rulesComplete(3, rulesHolderTok, "re_1"), rulesTakenOver(), store.ErrStaleAttempt},
		{"older attempt's identical completion after the new holder's",
			rulesComplete(3, rulesHolderTok, "re_1"),
			rulesWith(rulesTakenOver(), func(j *store.Job) { j.State, j.ProviderRefundID = store.StateSucceeded, "re_1" }),
			store.ErrStaleAttempt},
		{"older attempt after a reschedule and a new claim", rulesReschedule(3, rulesHolderTok, store.ActionReconcile),
			rulesWith(rulesTakenOver(), func(j *store.Job) { j.NextAction = store.ActionReconcile }), store.ErrStaleAttempt},
		// R26: a grant lost in a failover, or a forgery.
		{"attempt never granted", rulesComplete(4, rulesHolderTok, "re_1"), rulesHeld(), store.ErrStaleAttempt},
		{"attempt never granted on a finished job", rulesComplete(9, rulesHolderTok, "re_1"), rulesCompleted("re_1"), store.ErrStaleAttempt},
		// R21: the same grant, another write after the job left running.
		{"reschedule after the grant's completion", rulesReschedule(3, rulesHolderTok, store.ActionReconcile), rulesCompleted("re_1"), store.ErrNotRunning},
		{"completion with another refund id", rulesComplete(3, rulesHolderTok, "re_2"), rulesCompleted("re_1"), store.ErrNotRunning},
		{"escalate after the grant's completion", rulesEscalate(3, rulesHolderTok), rulesCompleted("re_1"), store.ErrNotRunning},
		{"complete after the grant's reschedule", rulesComplete(3, rulesHolderTok, "re_1"), rulesRescheduled(store.ActionReconcile), store.ErrNotRunning},
		{"reschedule with another next action", rulesReschedule(3, rulesHolderTok, store.ActionRefund), rulesRescheduled(store.ActionReconcile), store.ErrNotRunning},
		{"complete after the grant's escalation", rulesComplete(3, rulesHolderTok, "re_1"), rulesEscalated(), store.ErrNotRunning},
		// R21: the same attempt, token and write is a replay...
		{"completion replayed", rulesComplete(3, rulesHolderTok, "re_1"), rulesCompleted("re_1"), nil},
		{"reschedule replayed", rulesReschedule(3, rulesHolderTok, store.ActionReconcile), rulesRescheduled(store.ActionReconcile), nil},
		{"escalation replayed", rulesEscalate(3, rulesHolderTok), rulesEscalated(), nil},
		// ...and the same write under another token is not (R25).
		{"completion 'replayed' with another token", rulesComplete(3, rulesOtherTok, "re_1"), rulesCompleted("re_1"), store.ErrStaleAttempt},
		{"completion 'replayed' with no token", rulesComplete(3, "", "re_1"), rulesCompleted("re_1"), store.ErrStaleAttempt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := store.Settle(c.w, c.current)
			if c.wantErr == nil {
				if err != nil || !res.Replayed || res.Job != c.current {
					t.Fatalf("Settle = %+v, %v; want a replay answering the row as it stands", res, err)
				}
				return
			}
			rulesWantFence(t, res, err, c.wantErr, c.w, c.current)
		})
	}
}

// rulesWantFence checks err is a *FenceError matching want that carries the
// caller's attempt and the job as re-read, and that nothing else is answered.
func rulesWantFence(t *testing.T, res store.WriteResult, err, want error, w store.Writeback, current store.Job) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("Settle error = %v, want %v", err, want)
	}
	var fe *store.FenceError
	if !errors.As(err, &fe) {
		t.Fatalf("Settle error %T is not a *FenceError", err)
	}
	if fe.Attempt != w.Attempt || fe.Current != current {
		t.Fatalf("FenceError carries attempt %d and job %+v, want %d and the job as re-read", fe.Attempt, fe.Current, w.Attempt)
	}
	for _, other := range []error{store.ErrStaleAttempt, store.ErrNotRunning, store.ErrNotInReview} {
		if other != want && errors.Is(err, other) {
			t.Fatalf("Settle error %v also matches %v", err, other)
		}
	}
	if res != (store.WriteResult{}) {
		t.Fatalf("Settle answered %+v beside its error", res)
	}
}

// R10: 0 rows under the very grant that is still fenced is no transition the
// rules allow; Settle reports it plainly, never as a fence or a replay.
func TestSettleOfAStillFencedWriteIsNeitherFenceNorReplay_R10(t *testing.T) {
	for _, w := range []store.Writeback{
		rulesComplete(3, rulesHolderTok, "re_1"),
		rulesReschedule(3, rulesHolderTok, store.ActionRefund),
		rulesEscalate(3, rulesHolderTok),
	} {
		res, err := store.Settle(w, rulesHeld())
		var fe *store.FenceError
		if err == nil || errors.As(err, &fe) || res.Replayed {
			t.Fatalf("Settle(%s) on the row it is fenced by = %+v, %v; want a plain error", w.Kind, res, err)
		}
	}
}

// R29, R25: an operator's resolution carries no token; the attempt the
// operator saw and state manual_review fence it, and a lost race answers
// ErrNotInReview.
func TestResolutionIsFencedByAttemptAndReviewOnly_R25_R29(t *testing.T) {
	review := rulesEscalated() // under attempt 3 of a grant with a token
	refunded := rulesResolve(3, store.ResolutionRefunded, "re_9", "confirmed in the provider dashboard")
	reconcile := rulesResolve(3, store.ResolutionReconcile, "", "try again")
	if !refunded.Fenced(review) || !reconcile.Fenced(review) {
		t.Fatal("a resolution under the attempt the operator saw is not fenced")
	}
	if refunded.Grant() != (store.TokenHash{}) {
		t.Fatalf("a resolution's Grant() = %x, want zero: operators hold no grant", refunded.Grant())
	}
	if refunded.Fenced(rulesWith(review, func(j *store.Job) { j.Attempt = 2 })) {
		t.Fatal("a resolution under an older attempt is fenced")
	}
	if refunded.Fenced(rulesHeld()) {
		t.Fatal("a resolution of a running job is fenced")
	}

	cases := []struct {
		name    string
		w       store.Writeback
		current store.Job
		wantErr error // nil: a replay
	}{
		{"the job left review and is running again", refunded, rulesHeld(), store.ErrNotInReview},
		{"another operator resolved it as refunded", reconcile,
			rulesWith(review, func(j *store.Job) { j.State, j.ProviderRefundID = store.StateSucceeded, "re_other" }), store.ErrNotInReview},
		{"another operator sent it back with another note", reconcile,
			rulesWith(review, func(j *store.Job) {
				j.State, j.NextAction, j.LastReason = store.StateReady, store.ActionReconcile, "someone else's note"
			}), store.ErrNotInReview},
		{"the operator saw an older attempt", rulesResolve(2, store.ResolutionRefunded, "re_9", "n"), review, store.ErrStaleAttempt},
		{"the job was claimed again since", reconcile, rulesTakenOver(), store.ErrStaleAttempt},
		{"resolution as refunded replayed", refunded,
			rulesWith(review, func(j *store.Job) { j.State, j.ProviderRefundID = store.StateSucceeded, "re_9" }), nil},
		{"resolution to reconcile replayed", reconcile,
			rulesWith(review, func(j *store.Job) {
				j.State, j.NextAction, j.LastReason = store.StateReady, store.ActionReconcile, "try again"
			}), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := store.Settle(c.w, c.current)
			if c.wantErr == nil {
				if err != nil || !res.Replayed || res.Job != c.current {
					t.Fatalf("Settle = %+v, %v; want a replay", res, err)
				}
				return
			}
			rulesWantFence(t, res, err, c.wantErr, c.w, c.current)
		})
	}
}

// R25: a grant made before tokens existed (zero hash on the row) is written
// back with its attempt alone, and a token offered for it is stale.
func TestPreTokenGrantIsFencedByAttemptAlone_R25(t *testing.T) {
	legacy := rulesWith(rulesHeld(), func(j *store.Job) { j.Grant = store.TokenHash{} })
	if !rulesComplete(3, "", "re_1").Fenced(legacy) {
		t.Fatal("the tokenless write of a pre-token grant is not fenced")
	}
	if rulesComplete(2, "", "re_1").Fenced(legacy) {
		t.Fatal("an older tokenless attempt is fenced")
	}
	for _, tok := range []store.LeaseToken{rulesHolderTok, rulesOtherTok, store.NewLeaseToken()} {
		w := rulesComplete(3, tok, "re_1")
		if w.Fenced(legacy) {
			t.Fatalf("token %q offered for a pre-token grant is fenced", tok)
		}
		res, err := store.Settle(w, legacy)
		rulesWantFence(t, res, err, store.ErrStaleAttempt, w, legacy)
	}

	done := rulesWith(legacy, func(j *store.Job) { j.State, j.ProviderRefundID = store.StateSucceeded, "re_1" })
	if res, err := store.Settle(rulesComplete(3, "", "re_1"), done); err != nil || !res.Replayed {
		t.Fatalf("tokenless replay of a pre-token grant = %+v, %v; want replayed", res, err)
	}
	w := rulesComplete(3, rulesHolderTok, "re_1")
	res, err := store.Settle(w, done)
	rulesWantFence(t, res, err, store.ErrStaleAttempt, w, done)

	// The next claim mints a token; from then on the tokenless writer is out.
	ready := rulesWith(legacy, func(j *store.Job) { j.State, j.LeaseUntil = store.StateReady, time.Time{} })
	c, _ := store.ClaimParams{WorkerID: "worker-b", MaxJobs: 1, Lease: 30 * time.Second}.Grant(ready, rulesNow)
	tokenless := rulesComplete(c.Job.Attempt, "", "re_1")
	if tokenless.Fenced(c.Job) {
		t.Fatal("after a claim minted a token, the tokenless write of its attempt is fenced")
	}
	res, err = store.Settle(tokenless, c.Job)
	rulesWantFence(t, res, err, store.ErrStaleAttempt, tokenless, c.Job)
}

// R21: AppliedTo tells a replay by the essential payload of each kind.
func TestAppliedToMatchesTheEssentialPayload_R21(t *testing.T) {
	review := rulesEscalated()
	cases := []struct {
		name string
		w    store.Writeback
		job  store.Job
		want bool
	}{
		{"completion, same refund id", rulesComplete(3, rulesHolderTok, "re_1"), rulesCompleted("re_1"), true},
		{"completion, other refund id", rulesComplete(3, rulesHolderTok, "re_2"), rulesCompleted("re_1"), false},
		{"completion, job still running", rulesComplete(3, rulesHolderTok, "re_1"), rulesHeld(), false},
		{"completion, other attempt", rulesComplete(4, rulesHolderTok, "re_1"), rulesCompleted("re_1"), false},
		{"completion, other token", rulesComplete(3, rulesOtherTok, "re_1"), rulesCompleted("re_1"), false},
		{"reschedule, same next action", rulesReschedule(3, rulesHolderTok, store.ActionReconcile), rulesRescheduled(store.ActionReconcile), true},
		{"reschedule, same next action and another delay",
			rulesWith2(rulesReschedule(3, rulesHolderTok, store.ActionReconcile), func(w *store.Writeback) { w.Delay = time.Hour }),
			rulesRescheduled(store.ActionReconcile), true},
		{"reschedule, other next action", rulesReschedule(3, rulesHolderTok, store.ActionRefund), rulesRescheduled(store.ActionReconcile), false},
		{"reschedule, job completed", rulesReschedule(3, rulesHolderTok, store.ActionReconcile), rulesCompleted("re_1"), false},
		{"escalation, job in review", rulesEscalate(3, rulesHolderTok), review, true},
		{"escalation, job completed", rulesEscalate(3, rulesHolderTok), rulesCompleted("re_1"), false},
		{"resolution refunded, same id", rulesResolve(3, store.ResolutionRefunded, "re_9", "n"),
			rulesWith(review, func(j *store.Job) { j.State, j.ProviderRefundID = store.StateSucceeded, "re_9" }), true},
		{"resolution refunded, other id", rulesResolve(3, store.ResolutionRefunded, "re_9", "n"),
			rulesWith(review, func(j *store.Job) { j.State, j.ProviderRefundID = store.StateSucceeded, "re_8" }), false},
		{"resolution to reconcile, same note", rulesResolve(3, store.ResolutionReconcile, "", "again"),
			rulesWith(review, func(j *store.Job) {
				j.State, j.NextAction, j.LastReason = store.StateReady, store.ActionReconcile, "again"
			}), true},
		{"resolution to reconcile, other note", rulesResolve(3, store.ResolutionReconcile, "", "again"),
			rulesWith(review, func(j *store.Job) {
				j.State, j.NextAction, j.LastReason = store.StateReady, store.ActionReconcile, "other"
			}), false},
		{"resolution to reconcile, next action refund", rulesResolve(3, store.ResolutionReconcile, "", "again"),
			rulesWith(review, func(j *store.Job) {
				j.State, j.NextAction, j.LastReason = store.StateReady, store.ActionRefund, "again"
			}), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.w.AppliedTo(c.job); got != c.want {
				t.Fatalf("AppliedTo = %v, want %v", got, c.want)
			}
		})
	}
}

func rulesWith2(w store.Writeback, f func(*store.Writeback)) store.Writeback {
	f(&w)
	return w
}

// R4, R9, R10: where each write-back may start, where it leaves the job, and
// which ones record a refund in the ledger.
func TestToStateFromStateAndLedgered_R4_R9_R10(t *testing.T) {
	cases := []struct {
		w        store.Writeback
		from, to store.State
		ledgered bool
	}{
		{rulesComplete(3, rulesHolderTok, "re_1"), store.StateRunning, store.StateSucceeded, true},
		{rulesReschedule(3, rulesHolderTok, store.ActionReconcile), store.StateRunning, store.StateReady, false},
		{rulesEscalate(3, rulesHolderTok), store.StateRunning, store.StateManualReview, false},
		{rulesResolve(3, store.ResolutionRefunded, "re_9", "n"), store.StateManualReview, store.StateSucceeded, true},
		{rulesResolve(3, store.ResolutionReconcile, "", "n"), store.StateManualReview, store.StateReady, false},
	}
	for _, c := range cases {
		name := string(c.w.Kind) + "/" + string(c.w.Resolution)
		if got := c.w.FromState(); got != c.from {
			t.Errorf("%s: FromState = %s, want %s", name, got, c.from)
		}
		if got := c.w.ToState(); got != c.to {
			t.Errorf("%s: ToState = %s, want %s", name, got, c.to)
		}
		if got := c.w.Ledgered(); got != c.ledgered {
			t.Errorf("%s: Ledgered = %v, want %v", name, got, c.ledgered)
		}
	}
}

// R9, R10, R12: Apply leaves the job exactly as the fenced UPDATE writes it at
// the database's now; it never touches the generation or the grant.
func TestApplyLeavesTheJobAsTheFencedUpdateWrites_R9_R10_R12(t *testing.T) {
	held := rulesHeld()
	review := rulesEscalated()
	at := time.Date(2025, 3, 15, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name   string
		w      store.Writeback
		before store.Job
		want   store.Job
	}{
		// Completed: next_attempt_at is when, no longer the lease end.
		{"complete", rulesComplete(3, rulesHolderTok, "re_1"), held, rulesWith(held, func(j *store.Job) {
			j.State, j.LeaseUntil, j.UpdatedAt, j.ProviderRefundID = store.StateSucceeded, time.Time{}, rulesNow, "re_1"
			j.NextAttemptAt = rulesNow
		})},
		{"reschedule by delay", rulesReschedule(3, rulesHolderTok, store.ActionReconcile), held, rulesWith(held, func(j *store.Job) {
			j.State, j.LeaseUntil, j.UpdatedAt = store.StateReady, time.Time{}, rulesNow
			j.NextAction, j.LastReason = store.ActionReconcile, "provider pending"
			j.NextAttemptAt = rulesNow.Add(30 * time.Second).Truncate(time.Microsecond)
		})},
		{"reschedule at a time", rulesWith2(rulesReschedule(3, rulesHolderTok, store.ActionRefund), func(w *store.Writeback) { w.At = at }),
			held, rulesWith(held, func(j *store.Job) {
				j.State, j.LeaseUntil, j.UpdatedAt = store.StateReady, time.Time{}, rulesNow
				j.NextAction, j.LastReason, j.NextAttemptAt = store.ActionRefund, "provider pending", at
			})},
		// In review from now: next_attempt_at is when it entered review.
		{"escalate", rulesEscalate(3, rulesHolderTok), held, rulesWith(held, func(j *store.Job) {
			j.State, j.LeaseUntil, j.UpdatedAt, j.NextAttemptAt = store.StateManualReview, time.Time{}, rulesNow, rulesNow
			j.LastReason = "provider has no record and the key is out of its window"
		})},
		{"resolve as refunded", rulesResolve(3, store.ResolutionRefunded, "re_9", "seen in dashboard"), review,
			rulesWith(review, func(j *store.Job) {
				j.State, j.UpdatedAt, j.ProviderRefundID, j.LastReason = store.StateSucceeded, rulesNow, "re_9", "seen in dashboard"
				j.NextAttemptAt = rulesNow // completed now: the archive's retention counts from it (R31)
			})},
		{"resolve to reconcile", rulesResolve(3, store.ResolutionReconcile, "", "again"), review,
			rulesWith(review, func(j *store.Job) {
				j.State, j.UpdatedAt, j.LastReason = store.StateReady, rulesNow, "again"
				j.NextAction, j.NextAttemptAt = store.ActionReconcile, rulesNow
			})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.w.Apply(c.before, rulesNow)
			if got != c.want {
				t.Fatalf("Apply =\n %+v\nwant\n %+v", got, c.want)
			}
			if !c.w.AppliedTo(got) {
				t.Fatal("the write does not recognise the row it leaves: its replay would not be one (R21)")
			}
		})
	}
}

// R12: a rescheduled job is due by the database's clock plus the delay, or at
// the absolute time given, at the microsecond resolution both backends keep.
func TestNextAttemptAtIsOnTheDatabaseClock_R12(t *testing.T) {
	tokyo := time.FixedZone("JST", 9*3600)
	cases := []struct {
		name string
		w    store.Writeback
		want time.Time
	}{
		{"delay from now", store.Writeback{Delay: 90 * time.Second}, time.Date(2025, 3, 14, 9, 28, 23, 589793000, time.UTC)},
		{"no delay is now", store.Writeback{}, time.Date(2025, 3, 14, 9, 26, 53, 589793000, time.UTC)},
		{"at wins over delay, in UTC", store.Writeback{Delay: time.Hour, At: time.Date(2025, 3, 20, 18, 0, 0, 123456789, tokyo)},
			time.Date(2025, 3, 20, 9, 0, 0, 123456000, time.UTC)},
	}
	for _, c := range cases {
		got := c.w.NextAttemptAt(rulesNow)
		if !got.Equal(c.want) || got.Location() != time.UTC {
			t.Errorf("%s: NextAttemptAt = %v, want %v", c.name, got, c.want)
		}
	}
}

// R3, R25: a write-back's history entry names the writer (its attempt, its
// actor or the holder) and the grant it carried; an operator's names none.
func TestEventNamesTheWriterAndItsGrant_R3_R25(t *testing.T) {
	held := rulesHeld()
	e := rulesComplete(3, rulesHolderTok, "re_1").Event(held, rulesNow)
	want := store.Event{JobID: 7, Attempt: 3, Kind: store.EventCompleted, WorkerID: "worker-a",
		FromState: store.StateRunning, ToState: store.StateSucceeded, NextAction: store.ActionRefund,
		ProviderRefundID: "re_1", CreatedAt: rulesNow, Grant: rulesHolderTok.Hash()}
	if e != want {
		t.Fatalf("Event =\n %+v\nwant\n %+v", e, want)
	}

	w := rulesReschedule(3, rulesHolderTok, store.ActionReconcile)
	w.Actor = "svc-refunds"
	if e := w.Event(held, rulesNow); e.WorkerID != "svc-refunds" || e.Reason != "provider pending" ||
		e.ToState != store.StateReady || e.NextAction != store.ActionReconcile {
		t.Fatalf("Event of an identified writer = %+v, want worker svc-refunds, ready, reconcile", e)
	}

	// A write that slipped past the fence would be recorded as its writer's,
	// under its own attempt and grant, not passed off as the holder's.
	stale := rulesComplete(2, rulesOtherTok, "re_x")
	if e := stale.Event(held, rulesNow); e.Attempt != 2 || e.Grant != rulesOtherTok.Hash() {
		t.Fatalf("Event of another writer = attempt %d grant %s, want 2 and its own grant", e.Attempt, e.Grant.Fingerprint())
	}

	r := rulesResolve(3, store.ResolutionReconcile, "", "again").Event(rulesEscalated(), rulesNow)
	if r.WorkerID != "alice@ops" || !r.Grant.IsZero() || r.FromState != store.StateManualReview ||
		r.ToState != store.StateReady || r.NextAction != store.ActionReconcile || r.Reason != "again" {
		t.Fatalf("Event of a resolution = %+v, want alice@ops, no grant, manual_review → ready, reconcile", r)
	}
}
