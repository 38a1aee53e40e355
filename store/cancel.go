package store

import (
	"fmt"
	"time"
)

// People in control (R32-R34): cancel a refund, pause a provider, and the
// attention list of finished jobs a person must look at again.

// The reasons a job joins the attention list (R34), the head of
// Job.AttentionReason.
const (
	// CancelTooLate: a cancel was requested, and the provider had the
	// refund: the job succeeded all the same (R32).
	CancelTooLate = "cancel_too_late: the provider had the refund when the cancel was requested"
	// receiptAfterSuccess heads the reason of a receipt of failure, or of
	// another refund id, for a job that succeeded.
	receiptAfterSuccess = "receipt_after_success"
	// receiptAfterCancel heads the reason of a receipt of success or
	// pending for a job that was cancelled.
	receiptAfterCancel = "receipt_after_cancel"
)

// AttentionEvent is the history entry of job joining the attention list
// (R34) for reason, under its attempt; it changes no state.
func AttentionEvent(job Job, reason string) Event {
	return Event{JobID: job.ID, Attempt: job.Attempt, Kind: EventAttention, WorkerID: job.WorkerID,
		FromState: job.State, ToState: job.State, NextAction: job.NextAction,
		ProviderRefundID: job.ProviderRefundID, Reason: reason, CreatedAt: job.AttentionSince}
}

// ReceiptAttention reports whether filing o on job puts the job on the
// attention list (R34), and why: a receipt of failure, or one naming
// another refund id, for a job that succeeded (a provider's refund can fail
// after it succeeded); and a receipt of success or pending for a job that
// was cancelled (R32: the cancel never pretends; money may have moved).
// Nothing else about the job changes (R28).
func ReceiptAttention(job Job, o Observation) (string, bool) {
	if job.State == StateCancelled && (o.Outcome == OutcomeSucceeded || o.Outcome == OutcomePending) {
		return fmt.Sprintf("%s: %s reported the refund %s (%s) after it was cancelled", receiptAfterCancel, o.Source,
			o.Outcome, orNone(o.ProviderRefundID)), true
	}
	if job.State != StateSucceeded {
		return "", false
	}
	switch {
	case o.Outcome == OutcomeFailed:
		return fmt.Sprintf("%s: %s reported the refund failed (%s)", receiptAfterSuccess, o.Source,
			orNone(o.ProviderRefundID)), true
	case o.ProviderRefundID != "" && o.ProviderRefundID != job.ProviderRefundID:
		return fmt.Sprintf("%s: %s reported %s refund %s, the job completed with %s", receiptAfterSuccess, o.Source,
			o.Outcome, o.ProviderRefundID, job.ProviderRefundID), true
	}
	return "", false
}

func orNone(s string) string {
	if s == "" {
		return "no refund id"
	}
	return s
}

// CancelParams asks to cancel a refund (R32).
type CancelParams struct {
	JobID int64
	// Attempt is the attempt the caller saw: a job that moved on since is
	// ErrStaleAttempt.
	Attempt int64
	Reason  string
	// Actor is who asks, from the caller's credential ("operator" on an
	// open coordinator).
	Actor string
	// EnqueuedBy, when set, allows the cancel only of a job whose enqueue
	// this credential made (a producer's own, ErrNotEnqueuedByCaller).
	EnqueuedBy string
}

// Validate reports what is wrong with p.
func (p CancelParams) Validate() error {
	var v violations
	if p.JobID <= 0 {
		v.add("job_id", "must be a job id, got %d", p.JobID)
	}
	if p.Attempt < 0 {
		v.add("attempt", "must not be negative, got %d", p.Attempt)
	}
	checkNote(&v, "reason", p.Reason)
	return v.err()
}

// checkNote checks a required reason or note, kept in the history.
func checkNote(v *violations, field, s string) { v.text(field, s, 1, MaxReasonLen) }

// CancelResult is the job after a cancel.
type CancelResult struct {
	Job Job
	// Cancelled: the job is cancelled now (never sent). Otherwise a cancel
	// request stands (Job.CancelRequestedAt) and the provider decides.
	Cancelled bool
	// Replayed: this same cancel had already been applied; nothing was
	// written now.
	Replayed bool
}

// Cancel decides p against job as it stands, locked, at the database's
// time now. last is the job's newest cancel entry in its history (nil when
// none): a repeat of it is a replay (R21). It returns the job as the cancel
// leaves it and the history entry to append (nil for a replay).
//
//   - Never sent (no FirstSentAt, not running): cancelled at once, from
//     ready or manual_review.
//   - Running: a cancel request that takes the job over at once: attempt +
//     1, a grant nobody holds, ready and due now to reconcile. The holder's
//     renewal or write-back is ErrStaleAttempt from then on (R9, R25).
//   - Ready, sent before: a cancel request, due now to reconcile.
//   - Manual review, sent before: a cancel request; the job waits for its
//     person, who may resolve it as cancelled.
func (p CancelParams) Cancel(job Job, last *Event, now time.Time) (CancelResult, *Event, error) {
	if last != nil && last.Reason == p.Reason && last.WorkerID == p.Actor &&
		(last.Attempt == p.Attempt || last.Kind == EventCancelRequested && last.FromState == StateRunning && last.Attempt == p.Attempt+1) {
		return CancelResult{Job: job, Cancelled: job.State == StateCancelled, Replayed: true}, nil, nil
	}
	switch {
	case job.Attempt != p.Attempt:
		return CancelResult{}, nil, &FenceError{Err: ErrStaleAttempt, Attempt: p.Attempt, Current: job}
	case !job.ArchivedAt.IsZero(), job.State == StateSucceeded, job.State == StateCancelled, job.CancelRequested():
		return CancelResult{}, nil, &FenceError{Err: ErrNotCancellable, Attempt: p.Attempt, Current: job}
	}
	from := job.State
	job.UpdatedAt = now
	kind := EventCancelRequested
	switch {
	case from != StateRunning && job.FirstSentAt.IsZero():
		kind = EventCancelled
		job.State = StateCancelled
		job.NextAttemptAt = now // final from now: the archive's walk (R31)
		job.LastReason = p.Reason
	case from == StateRunning:
		job.Attempt++
		job.Grant = NewLeaseToken().Hash() // a grant nobody holds
		job.State = StateReady
		job.LeaseUntil = time.Time{}
		fallthrough
	case from == StateReady:
		job.NextAction = ActionReconcile
		if job.NextAttemptAt.After(now) || from == StateRunning {
			job.NextAttemptAt = now
		}
		job.CancelRequestedAt = now
	default: // manual_review, maybe sent: its person decides
		job.CancelRequestedAt = now
	}
	e := Event{JobID: job.ID, Attempt: job.Attempt, Kind: kind, WorkerID: p.Actor, FromState: from,
		ToState: job.State, NextAction: job.NextAction, Reason: p.Reason, CreatedAt: now}
	return CancelResult{Job: job, Cancelled: kind == EventCancelled}, &e, nil
}

// AcknowledgeParams takes a job off the attention list (R34).
type AcknowledgeParams struct {
	JobID int64
	// Since is the job's AttentionSince the person saw: a newer reason to
	// look keeps the job on the list (ErrStaleAttempt).
	Since time.Time
	Note  string
	Actor string
}

// Validate reports what is wrong with p.
func (p AcknowledgeParams) Validate() error {
	var v violations
	if p.JobID <= 0 {
		v.add("job_id", "must be a job id, got %d", p.JobID)
	}
	if p.Since.IsZero() {
		v.add("attention_since", "is required: the job's attention_since you looked at")
	}
	checkNote(&v, "note", p.Note)
	return v.err()
}

// Acknowledge decides p against job as it stands, locked, at now; last is
// the job's newest acknowledgement in its history (nil when none). It
// returns the job after it and the history entry (nil for a replay).
func (p AcknowledgeParams) Acknowledge(job Job, last *Event, now time.Time) (Job, *Event, bool, error) {
	if job.AttentionSince.IsZero() {
		if last != nil && last.Reason == p.Note && last.WorkerID == p.Actor {
			return job, nil, true, nil
		}
		return Job{}, nil, false, &FenceError{Err: ErrNotOnAttentionList, Current: job}
	}
	if !job.AttentionSince.Equal(p.Since.UTC().Truncate(time.Microsecond)) {
		return Job{}, nil, false, &FenceError{Err: ErrAttentionMoved, Attempt: job.Attempt, Current: job}
	}
	job.AttentionSince = time.Time{}
	job.AttentionReason = ""
	e := Event{JobID: job.ID, Attempt: job.Attempt, Kind: EventAcknowledged, WorkerID: p.Actor, FromState: job.State,
		ToState: job.State, NextAction: job.NextAction, ProviderRefundID: job.ProviderRefundID, Reason: p.Note,
		CreatedAt: now}
	return job, &e, false, nil
}

// PauseParams pauses or resumes a provider (R33).
type PauseParams struct {
	Provider string
	Actor    string
	Reason   string
}

// Validate reports what is wrong with p.
func (p PauseParams) Validate() error {
	var v violations
	v.provider("provider", p.Provider, true)
	checkNote(&v, "reason", p.Reason)
	return v.err()
}

// Pause is a provider whose jobs are not granted (R33).
type Pause struct {
	Provider string
	PausedBy string
	Reason   string
	PausedAt time.Time
}

// PauseEvent is one pause or resume, kept for good.
type PauseEvent struct {
	ID       int64
	Provider string
	// Action is "paused" or "resumed".
	Action    string
	Actor     string
	Reason    string
	CreatedAt time.Time
}

// The actions of a PauseEvent.
const (
	PauseActionPaused  = "paused"
	PauseActionResumed = "resumed"
)
