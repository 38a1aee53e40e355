package store

import "fmt"

// FromState is the state the fence requires: running for the holder's
// write-backs, manual_review for an operator's resolution.
func (w Writeback) FromState() State {
	if w.Kind == EventResolved {
		return StateManualReview
	}
	return StateRunning
}

// ToState is the state a write-back of this kind moves the job to.
func (w Writeback) ToState() State {
	switch {
	case w.Kind == EventCompleted, w.Kind == EventResolved && w.Resolution == ResolutionRefunded:
		return StateSucceeded
	case w.Kind == EventResolved && w.Resolution == ResolutionCancelled:
		return StateCancelled
	case w.Kind == EventRescheduled, w.Kind == EventResolved:
		return StateReady
	default:
		return StateManualReview
	}
}

// Fenced reports whether job is still where w may write: in w.FromState()
// under w's attempt, and, for a holder's write, under w's grant (R9, R25);
// and never a reschedule to send the refund of a job whose cancel was
// requested (R32, ErrCancelRequested).
func (w Writeback) Fenced(job Job) bool {
	return job.State == w.FromState() && job.Attempt == w.Attempt && w.ofGrant(job) && !w.refusedByCancel(job)
}

// refusedByCancel reports whether w asks to send the refund of a job whose
// cancel was requested (R32).
func (w Writeback) refusedByCancel(job Job) bool {
	return w.Kind == EventRescheduled && w.NextAction == ActionRefund && job.CancelRequested()
}

// ofGrant reports whether w carries the token of job's current grant (R25).
// An operator's resolution is authorised by role, not by a grant.
func (w Writeback) ofGrant(job Job) bool {
	return w.Kind == EventResolved || job.Grant == w.Grant()
}

// Grant is the hash of the token w carries: what the fenced UPDATE compares
// with the row's (R25). Zero for resolutions.
func (w Writeback) Grant() TokenHash {
	if w.Kind == EventResolved {
		return TokenHash{}
	}
	return w.LeaseToken.Hash()
}

// AppliedTo reports whether job shows exactly this write-back, made under its
// attempt and grant: the same kind of transition with the same essential
// payload. Backends use it after a fenced update matched no row, or after a
// COMMIT whose reply was lost, to tell a replay from a conflict (R10, R21).
// The same attempt with another token is another writer, never a replay (R25).
func (w Writeback) AppliedTo(job Job) bool {
	if job.Attempt != w.Attempt || job.State != w.ToState() || !w.ofGrant(job) {
		return false
	}
	switch {
	case w.Kind == EventCompleted, w.Kind == EventResolved && w.Resolution == ResolutionRefunded:
		return job.ProviderRefundID == w.ProviderRefundID
	case w.Kind == EventRescheduled:
		return job.NextAction == w.NextAction
	case w.Kind == EventResolved && w.Resolution == ResolutionCancelled:
		return job.LastReason == w.Reason
	case w.Kind == EventResolved:
		return job.NextAction == ActionReconcile && job.LastReason == w.Reason
	default:
		return true
	}
}

// Settle explains a fenced write-back that matched no row, given the row as
// re-read after the rollback (R10). A matching earlier write is a replay (R21).
// A write that does not carry the job's current grant is ErrStaleAttempt: an
// older attempt (taken over), the current attempt with another or no token
// (R25: knowing the attempt is not holding the grant), or an attempt this
// database never granted (a grant lost in a failover, R26, or a forgery).
// The current grant with another outcome is ErrNotRunning. 0 rows never
// means "refund failed".
func Settle(w Writeback, current Job) (WriteResult, error) {
	switch {
	case w.AppliedTo(current):
		return WriteResult{Job: current, Replayed: true}, nil
	case current.Attempt != w.Attempt, !w.ofGrant(current):
		return WriteResult{}, &FenceError{Err: ErrStaleAttempt, Attempt: w.Attempt, NoToken: w.LeaseToken == "", Current: current}
	case current.State == w.FromState() && w.refusedByCancel(current):
		return WriteResult{}, &FenceError{Err: ErrCancelRequested, Attempt: w.Attempt, Current: current}
	case current.State != w.FromState() && w.Kind == EventResolved:
		return WriteResult{}, &FenceError{Err: ErrNotInReview, Attempt: w.Attempt, Current: current}
	case current.State != w.FromState():
		return WriteResult{}, &FenceError{Err: ErrNotRunning, Attempt: w.Attempt, Current: current}
	default:
		// Fenced under this very grant, yet nothing was written: the row
		// changed between the update and the re-read in a way no transition
		// allows. Report it rather than guess.
		return WriteResult{}, fmt.Errorf("job %d: fenced update matched no row but job is %s under attempt %d",
			current.ID, current.State, current.Attempt)
	}
}
