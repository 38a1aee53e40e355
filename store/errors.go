package store

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors returned by every backend. Match them with errors.Is.
var (
	// ErrNotFound: no job with that id or operation key.
	ErrNotFound = errors.New("job not found")
	// ErrKeyConflict: the operation key is bound to different refund values (R1).
	ErrKeyConflict = errors.New("operation key already used for a different refund")
	// ErrStaleAttempt: the write does not carry the job's current grant — a
	// newer attempt holds the job, or the attempt came with another or no
	// lease token, or this database never granted it (R9, R25, R26); the
	// write changed nothing.
	ErrStaleAttempt = errors.New("stale attempt")
	// ErrNotRunning: this attempt already moved the job out of running with a
	// different write (R21).
	ErrNotRunning = errors.New("job is not running under this attempt")
	// ErrNotInReview: a resolution found the job no longer in manual_review
	// under the attempt the operator looked at, and not resolved this way.
	ErrNotInReview = errors.New("job is not in manual review under this attempt")
	// ErrClaimOutcomeUnknown: the claim's COMMIT failed in a way that leaves its
	// outcome unknown. Nothing is granted; the coordinator never retries the bump
	// (R7). If it did commit, the lease expires and the job is taken over.
	ErrClaimOutcomeUnknown = errors.New("claim outcome unknown")
	// ErrWriteOutcomeUnknown: a write-back's COMMIT was cut off and the row could
	// not be re-read. Repeating the same write is safe: it is fenced and
	// idempotent for its attempt (R20, R21).
	ErrWriteOutcomeUnknown = errors.New("write-back outcome unknown")
	// ErrObservationLimit: the job already has MaxObservationsPerJob receipts
	// on file; this one was not filed. A job that gathers that many is being
	// flooded, and a person should look. Observe no longer returns it (a
	// receipt without room is kept in the unmatched log); the API reason
	// stays for clients of earlier coordinators.
	ErrObservationLimit = errors.New("observation limit reached")
	// ErrReceiptMismatch: a provider's receipt names a job it cannot be
	// about — another provider's, or another amount or currency than the
	// job's. Nothing was filed on the job and nothing moved (R28); the
	// webhook endpoint keeps it in the unmatched log.
	ErrReceiptMismatch = errors.New("receipt does not match its job")
	// ErrUnavailable: the database could not be reached, refused writes for
	// now (read-only, as a demoted primary is; too many connections) or kept
	// failing; nothing was changed, and repeating the call later is safe.
	ErrUnavailable = errors.New("database unavailable")
	// ErrDatabaseFull: the database refused the write for lack of space (a
	// table or the disk is full); nothing was changed. An operator must act;
	// repeating later is safe. Errors matching it match ErrUnavailable too.
	ErrDatabaseFull = errors.New("database full")
	// ErrDatabaseAccessDenied: the database refused the coordinator's own
	// user (a privilege is missing, the account is locked); nothing was
	// changed. An operator must grant it; repeating later is safe. Errors
	// matching it match ErrUnavailable too.
	ErrDatabaseAccessDenied = errors.New("database access denied")
	// ErrCancelRequested: a reschedule asked for ActionRefund on a job whose
	// cancel was requested (R32); nothing was written. Returned as a
	// *FenceError.
	ErrCancelRequested = errors.New("a cancel was requested: the refund may not be sent")
	// ErrNotCancellable: the job succeeded, was cancelled for another
	// reason or by another, already has a cancel request, or was archived
	// (R32). Returned as a *FenceError.
	ErrNotCancellable = errors.New("job cannot be cancelled")
	// ErrNotOnAttentionList: an acknowledgement of a job that is not on
	// the attention list (R34). Returned as a *FenceError.
	ErrNotOnAttentionList = errors.New("job is not on the attention list")
	// ErrAttentionMoved: an acknowledgement of the attention list named
	// another attention_since than the job's: a newer reason to look came
	// since the person looked (R34). It matches ErrStaleAttempt.
	ErrAttentionMoved = fmt.Errorf("%w: a newer reason to look arrived", ErrStaleAttempt)
	// ErrNotEnqueuedByCaller: a producer asked to cancel a job another
	// credential enqueued (R32); nothing was written.
	ErrNotEnqueuedByCaller = errors.New("job was not enqueued by this credential")
)

// FenceError is returned when a write-back matched no row because the job is no
// longer running under the caller's grant. It matches ErrStaleAttempt or
// ErrNotRunning with errors.Is, and carries the job as it is now (R10: re-read
// after the rollback).
type FenceError struct {
	// ErrStaleAttempt, ErrNotRunning, ErrNotInReview, ErrCancelRequested,
	// ErrNotCancellable or ErrNotOnAttentionList.
	Err     error
	Attempt int64 // the caller's attempt
	// NoToken is true when the caller sent no lease token at all (R25).
	NoToken bool
	Current Job
}

func (e *FenceError) Error() string {
	return fmt.Sprintf("%v: job %d attempt %d, current attempt %d state %s",
		e.Err, e.Current.ID, e.Attempt, e.Current.Attempt, e.Current.State)
}

func (e *FenceError) Unwrap() error { return e.Err }

// FieldViolation names one bad request field, by its wire name.
type FieldViolation struct {
	Field       string
	Description string
}

// ValidationError lists what is wrong with a request. Nothing was written.
type ValidationError struct {
	Violations []FieldViolation
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Field + ": " + v.Description
	}
	return "invalid argument: " + strings.Join(parts, "; ")
}

// violations collects field violations; err returns nil when there are none.
type violations []FieldViolation

func (v *violations) add(field, format string, args ...any) {
	*v = append(*v, FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
}

func (v violations) err() error {
	if len(v) == 0 {
		return nil
	}
	return &ValidationError{Violations: v}
}

// Invalid returns a *ValidationError for one field.
func Invalid(field, format string, args ...any) error {
	var v violations
	v.add(field, format, args...)
	return v.err()
}
