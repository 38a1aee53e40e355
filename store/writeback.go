package store

import "fmt"

// ToState is the state a write-back of this kind moves a running job to.
func (w Writeback) ToState() State {
	switch w.Kind {
	case EventCompleted:
		return StateSucceeded
	case EventRescheduled:
		return StateReady
	default:
		return StateManualReview
	}
}

// AppliedTo reports whether job shows exactly this write-back, made under its
// attempt: the same kind of transition with the same essential payload. Backends
// use it after a fenced update matched no row, or after a COMMIT whose reply was
// lost, to tell a replay from a conflict (R10, R21).
func (w Writeback) AppliedTo(job Job) bool {
	if job.Attempt != w.Attempt || job.State != w.ToState() {
		return false
	}
	switch w.Kind {
	case EventCompleted:
		return job.ProviderRefundID == w.ProviderRefundID
	case EventRescheduled:
		return job.NextAction == w.NextAction
	default:
		return true
	}
}

// Settle explains a fenced write-back that matched no row, given the row as
// re-read after the rollback (R10). A matching earlier write is a replay (R21);
// a newer attempt is ErrStaleAttempt; the same attempt with another outcome is
// ErrNotRunning. 0 rows never means "refund failed".
func Settle(w Writeback, current Job) (WriteResult, error) {
	switch {
	case w.AppliedTo(current):
		return WriteResult{Job: current, Replayed: true}, nil
	case current.Attempt > w.Attempt:
		return WriteResult{}, &FenceError{Err: ErrStaleAttempt, Attempt: w.Attempt, Current: current}
	case current.Attempt < w.Attempt:
		// Claims hand out attempts; this one was never granted.
		return WriteResult{}, Invalid("attempt", "attempt %d was never granted for job %d (current attempt is %d)",
			w.Attempt, current.ID, current.Attempt)
	case current.State != StateRunning:
		return WriteResult{}, &FenceError{Err: ErrNotRunning, Attempt: w.Attempt, Current: current}
	default:
		// Running under this very attempt, yet the fenced update matched nothing:
		// the row changed between the update and the re-read in a way no
		// transition allows. Report it rather than guess.
		return WriteResult{}, fmt.Errorf("job %d: fenced update matched no row but job is running under attempt %d",
			current.ID, current.Attempt)
	}
}
