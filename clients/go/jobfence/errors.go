package jobfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every error the
// coordinator returns.
const ErrorDomain = "jobfence"

// The ErrorInfo reasons the coordinator sends: the names of the proto's
// ErrorReason values without their ERROR_REASON_ prefix, the one list of
// them. They are API (R24): this package decodes them into the errors below,
// and callers branch with errors.Is and errors.As, never on message text.
var (
	ReasonStaleAttempt        = reasonName(pb.ErrorReason_ERROR_REASON_STALE_ATTEMPT)
	ReasonJobNotRunning       = reasonName(pb.ErrorReason_ERROR_REASON_JOB_NOT_RUNNING)
	ReasonKeyConflict         = reasonName(pb.ErrorReason_ERROR_REASON_OPERATION_KEY_CONFLICT)
	ReasonClaimOutcomeUnknown = reasonName(pb.ErrorReason_ERROR_REASON_CLAIM_OUTCOME_UNKNOWN)
	ReasonWriteOutcomeUnknown = reasonName(pb.ErrorReason_ERROR_REASON_WRITE_OUTCOME_UNKNOWN)
	ReasonDatabaseUnavailable = reasonName(pb.ErrorReason_ERROR_REASON_DATABASE_UNAVAILABLE)
	ReasonDatabaseFull        = reasonName(pb.ErrorReason_ERROR_REASON_DATABASE_FULL)
	ReasonDatabaseDenied      = reasonName(pb.ErrorReason_ERROR_REASON_DATABASE_ACCESS_DENIED)
	ReasonObservationLimit    = reasonName(pb.ErrorReason_ERROR_REASON_OBSERVATION_LIMIT)
	ReasonJobNotInReview      = reasonName(pb.ErrorReason_ERROR_REASON_JOB_NOT_IN_REVIEW)
	ReasonNotFound            = reasonName(pb.ErrorReason_ERROR_REASON_NOT_FOUND)
	ReasonInvalidArgument     = reasonName(pb.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
	ReasonUnauthenticated     = reasonName(pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED)
	ReasonPermissionDenied    = reasonName(pb.ErrorReason_ERROR_REASON_PERMISSION_DENIED)
	ReasonGrantTooOld         = reasonName(pb.ErrorReason_ERROR_REASON_GRANT_TOO_OLD)
	ReasonTooManyCalls        = reasonName(pb.ErrorReason_ERROR_REASON_TOO_MANY_CALLS)
	ReasonJobNotCancellable   = reasonName(pb.ErrorReason_ERROR_REASON_JOB_NOT_CANCELLABLE)
	ReasonCancelRequested     = reasonName(pb.ErrorReason_ERROR_REASON_CANCEL_REQUESTED)
	ReasonNotOnAttentionList  = reasonName(pb.ErrorReason_ERROR_REASON_NOT_ON_ATTENTION_LIST)
)

func reasonName(r pb.ErrorReason) string { return strings.TrimPrefix(r.String(), "ERROR_REASON_") }

// Sentinel errors. Every error returned by a Client method matches at most
// one reason sentinel (plus ErrFenced and ErrUnavailable where noted) with
// errors.Is; *Error carries the status code, reason and metadata.
var (
	// ErrStaleAttempt: the job was taken over; the write carried an older
	// attempt and changed nothing (R9). Never repeat it: file what the provider
	// said with ReportObservation instead (R15). The error is a
	// *StaleAttemptError.
	ErrStaleAttempt = errors.New("jobfence: stale attempt")
	// ErrJobNotRunning: this attempt already wrote a different outcome, so the
	// job left running; nothing was written (R21). The error is a
	// *JobNotRunningError.
	ErrJobNotRunning = errors.New("jobfence: job not running")
	// ErrFenced matches both ErrStaleAttempt and ErrJobNotRunning: the fence
	// rejected the write and repeating it cannot change that.
	ErrFenced = errors.New("jobfence: write rejected by the fence")
	// ErrKeyConflict: the operation key is already bound to a refund with
	// different order, payment, amount, currency or provider (R1).
	ErrKeyConflict = errors.New("jobfence: operation key conflict")
	// ErrClaimOutcomeUnknown: the claim may or may not have committed. Nothing
	// was granted: act on nothing and claim again (R7). A job it did commit
	// returns through a takeover once its lease expires.
	ErrClaimOutcomeUnknown = errors.New("jobfence: claim outcome unknown")
	// ErrWriteOutcomeUnknown: a write-back's commit was cut off. Repeating the
	// same write is safe (R21); Client repeats write-backs itself.
	ErrWriteOutcomeUnknown = errors.New("jobfence: write outcome unknown")
	// ErrDatabaseUnavailable: the coordinator could not reach its database,
	// or the database refused writes for now (read-only during a failover,
	// too many connections); nothing was changed.
	ErrDatabaseUnavailable = errors.New("jobfence: database unavailable")
	// ErrDatabaseFull: the coordinator's database is out of space; nothing
	// was changed, and it will be once an operator frees some.
	ErrDatabaseFull = errors.New("jobfence: database full")
	// ErrDatabaseAccessDenied: the coordinator's database user lacks a
	// privilege; nothing was changed, and it will be once an operator grants
	// it.
	ErrDatabaseAccessDenied = errors.New("jobfence: database access denied")
	// ErrJobNotInReview: an operator's resolution named a job that is no
	// longer in manual review under that attempt.
	ErrJobNotInReview = errors.New("jobfence: job not in manual review")
	// ErrNotFound: no such job.
	ErrNotFound = errors.New("jobfence: job not found")
	// ErrInvalidArgument: the request was rejected before anything happened.
	// The error is an *InvalidArgumentError naming each bad field.
	ErrInvalidArgument = errors.New("jobfence: invalid argument")
	// ErrUnauthenticated: the call carried no valid credential (bearer token
	// or client certificate).
	ErrUnauthenticated = errors.New("jobfence: unauthenticated")
	// ErrObservationLimit: the job has as many receipts as it keeps (1,000);
	// this one was not filed. Someone is flooding the job: a person should
	// look.
	ErrObservationLimit = errors.New("jobfence: observation limit reached")
	// ErrPermissionDenied: the credential's roles do not allow this call.
	ErrPermissionDenied = errors.New("jobfence: permission denied")
	// ErrGrantTooOld: a renewal refused because the grant has lived as long
	// as the coordinator lets one grant live (--max-grant-age, R27). Renew
	// no more; the holder may still write back until its lease runs out and
	// the job is taken over.
	ErrGrantTooOld = errors.New("jobfence: grant too old to renew")
	// ErrTooManyCalls: the credential, or the coordinator, has as many calls
	// of this kind in flight as it allows (expensive reads, worker
	// streams); nothing was done. Try again after the RetryInfo's delay.
	ErrTooManyCalls = errors.New("jobfence: too many calls in flight")
	// ErrCancelRequested: a Reschedule asked to send the refund (next action
	// refund) of a job whose cancel was requested (R32); nothing was
	// written. Do not repeat it: only a reconcile may follow, so reschedule
	// to reconcile, or complete or escalate. The Worker never asks for it
	// (ClaimedJob.CancelRequested).
	ErrCancelRequested = errors.New("jobfence: cancel requested: the refund may not be sent")
	// ErrJobNotCancellable: an operator's CancelRefund named a job that
	// cannot be cancelled: it succeeded, was cancelled for another reason,
	// or was archived (R32). Not to be repeated.
	ErrJobNotCancellable = errors.New("jobfence: job not cancellable")
	// ErrNotOnAttentionList: an operator's AcknowledgeAttention named a job
	// that is not on the attention list (R34). Not to be repeated.
	ErrNotOnAttentionList = errors.New("jobfence: job not on the attention list")
	// ErrUnavailable matches every error with gRPC code UNAVAILABLE: the
	// coordinator or its database could not be reached, or a commit was cut
	// off (ErrClaimOutcomeUnknown, ErrWriteOutcomeUnknown,
	// ErrDatabaseUnavailable, ErrDatabaseFull and ErrDatabaseAccessDenied
	// match it too). Client repeats the calls that are safe to repeat.
	ErrUnavailable = errors.New("jobfence: coordinator unavailable")
)

var reasonSentinels = map[string]error{
	ReasonStaleAttempt:        ErrStaleAttempt,
	ReasonJobNotRunning:       ErrJobNotRunning,
	ReasonKeyConflict:         ErrKeyConflict,
	ReasonClaimOutcomeUnknown: ErrClaimOutcomeUnknown,
	ReasonWriteOutcomeUnknown: ErrWriteOutcomeUnknown,
	ReasonDatabaseUnavailable: ErrDatabaseUnavailable,
	ReasonDatabaseFull:        ErrDatabaseFull,
	ReasonDatabaseDenied:      ErrDatabaseAccessDenied,
	ReasonObservationLimit:    ErrObservationLimit,
	ReasonJobNotInReview:      ErrJobNotInReview,
	ReasonNotFound:            ErrNotFound,
	ReasonInvalidArgument:     ErrInvalidArgument,
	ReasonUnauthenticated:     ErrUnauthenticated,
	ReasonPermissionDenied:    ErrPermissionDenied,
	ReasonGrantTooOld:         ErrGrantTooOld,
	ReasonTooManyCalls:        ErrTooManyCalls,
	ReasonJobNotCancellable:   ErrJobNotCancellable,
	ReasonCancelRequested:     ErrCancelRequested,
	ReasonNotOnAttentionList:  ErrNotOnAttentionList,
}

// Error is an error answered by the coordinator (or by the gRPC transport on
// its behalf). Reason and Metadata come from the status's ErrorInfo of domain
// "jobfence"; both are empty for transport failures, which carry none.
//
// It matches, with errors.Is, the sentinel of its reason; ErrUnavailable,
// ErrUnauthenticated and ErrPermissionDenied by code, whatever the reason;
// and context.Canceled / context.DeadlineExceeded for codes CANCELED /
// DEADLINE_EXCEEDED.
type Error struct {
	Code     codes.Code
	Reason   string
	Message  string
	Metadata map[string]string
	status   *status.Status
}

// Error returns the code, reason and message.
func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("jobfence: %s (%s): %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("jobfence: %s: %s", e.Code, e.Message)
}

// Is reports whether e is the kind of failure target names.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrUnavailable:
		return e.Code == codes.Unavailable
	case ErrFenced:
		return e.Reason == ReasonStaleAttempt || e.Reason == ReasonJobNotRunning
	case context.Canceled:
		return e.Code == codes.Canceled
	case context.DeadlineExceeded:
		return e.Code == codes.DeadlineExceeded
	case ErrUnauthenticated:
		return e.Code == codes.Unauthenticated
	case ErrPermissionDenied:
		return e.Code == codes.PermissionDenied
	}
	s, ok := reasonSentinels[e.Reason]
	return ok && s == target
}

// GRPCStatus returns the status the error was decoded from, so that
// status.FromError and status.Code keep working.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// FenceError is the detail of a write-back rejected by the fence (R9):
// nothing was written. Attempt is what the write carried; CurrentAttempt and
// CurrentState are what the job holds now.
type FenceError struct {
	JobID          int64
	Attempt        int64
	CurrentAttempt int64
	CurrentState   JobState
	Err            *Error
}

func (e FenceError) fields() string {
	return fmt.Sprintf("job %d, attempt %d; current attempt %d, state %s", e.JobID, e.Attempt, e.CurrentAttempt, e.CurrentState)
}

// StaleAttemptError (reason STALE_ATTEMPT, code FAILED_PRECONDITION): the
// write does not carry the job's current grant. Usually the job was taken
// over and now runs, or ended, under CurrentAttempt; when CurrentAttempt is
// the attempt sent, the lease token was missing or another grant's (the
// coordinator's message says which). It matches ErrStaleAttempt and
// ErrFenced; errors.As also finds its *Error.
type StaleAttemptError struct{ FenceError }

// Error describes the rejected write: a takeover when the job moved on to
// a later attempt, else the coordinator's own words on the token.
func (e *StaleAttemptError) Error() string {
	if e.CurrentAttempt > e.Attempt || e.Err == nil {
		return "jobfence: stale attempt, the job was taken over (" + e.fields() + ")"
	}
	return "jobfence: stale attempt: " + e.Err.Message + " (" + e.fields() + ")"
}

// Is matches ErrStaleAttempt and ErrFenced.
func (e *StaleAttemptError) Is(target error) bool {
	return target == ErrStaleAttempt || target == ErrFenced
}

// Unwrap returns the underlying *Error.
func (e *StaleAttemptError) Unwrap() error { return unwrapped(e.Err) }

// JobNotRunningError (reason JOB_NOT_RUNNING, code FAILED_PRECONDITION): this
// attempt already moved the job to CurrentState with a different write. It
// matches ErrJobNotRunning and ErrFenced; errors.As also finds its *Error.
type JobNotRunningError struct{ FenceError }

// Error describes the rejected write.
func (e *JobNotRunningError) Error() string {
	return "jobfence: job no longer running under this attempt (" + e.fields() + ")"
}

// Is matches ErrJobNotRunning and ErrFenced.
func (e *JobNotRunningError) Is(target error) bool {
	return target == ErrJobNotRunning || target == ErrFenced
}

// Unwrap returns the underlying *Error.
func (e *JobNotRunningError) Unwrap() error { return unwrapped(e.Err) }

// FieldViolation names one bad request field.
type FieldViolation struct {
	Field       string // the proto field name, e.g. "max_jobs"
	Description string
}

// InvalidArgumentError (reason INVALID_ARGUMENT): the request was rejected
// before anything happened. It matches ErrInvalidArgument; errors.As also
// finds its *Error.
type InvalidArgumentError struct {
	Violations []FieldViolation
	Err        *Error
}

// Error lists the violations.
func (e *InvalidArgumentError) Error() string {
	s := "jobfence: invalid argument"
	for i, v := range e.Violations {
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		s += sep + v.Field + " " + v.Description
	}
	if len(e.Violations) == 0 && e.Err != nil {
		s += ": " + e.Err.Message
	}
	return s
}

// Is matches ErrInvalidArgument.
func (e *InvalidArgumentError) Is(target error) bool { return target == ErrInvalidArgument }

// Unwrap returns the underlying *Error.
func (e *InvalidArgumentError) Unwrap() error { return unwrapped(e.Err) }

// unwrapped keeps a nil *Error from becoming a non-nil error.
func unwrapped(e *Error) error {
	if e == nil {
		return nil
	}
	return e
}

// Field returns the violation of the named field, if any.
func (e *InvalidArgumentError) Field(name string) (FieldViolation, bool) {
	for _, v := range e.Violations {
		if v.Field == name {
			return v, true
		}
	}
	return FieldViolation{}, false
}

// decodeError turns an error from a gRPC call into this package's errors. A
// nil error stays nil; an error that is not a gRPC status is returned as is.
func decodeError(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message(), Metadata: map[string]string{}, status: st}
	var br *errdetails.BadRequest
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain && e.Reason == "" {
				e.Reason = d.GetReason()
				for k, v := range d.GetMetadata() {
					e.Metadata[k] = v
				}
			}
		case *errdetails.BadRequest:
			br = d
		}
	}
	switch {
	case e.Reason == ReasonStaleAttempt:
		return &StaleAttemptError{fenceOf(e)}
	case e.Reason == ReasonJobNotRunning:
		return &JobNotRunningError{fenceOf(e)}
	case e.Reason == ReasonInvalidArgument || (e.Code == codes.InvalidArgument && br != nil):
		ia := &InvalidArgumentError{Err: e}
		for _, v := range br.GetFieldViolations() {
			ia.Violations = append(ia.Violations, FieldViolation{Field: v.GetField(), Description: v.GetDescription()})
		}
		return ia
	}
	return e
}

func fenceOf(e *Error) FenceError {
	num := func(k string) int64 {
		n, _ := strconv.ParseInt(e.Metadata[k], 10, 64)
		return n
	}
	return FenceError{
		JobID:          num("job_id"),
		Attempt:        num("attempt"),
		CurrentAttempt: num("current_attempt"),
		CurrentState:   stateFromName(e.Metadata["current_state"]),
		Err:            e,
	}
}

// BudgetExhaustedError is returned by Claim when jobs are due but their
// providers' outbound budgets allow none now (R19): nothing was granted; come
// back after RetryAfter. It matches ErrBudgetExhausted.
type BudgetExhaustedError struct {
	RetryAfter time.Duration
}

// ErrBudgetExhausted matches a *BudgetExhaustedError.
var ErrBudgetExhausted = errors.New("jobfence: provider budget exhausted")

func (e *BudgetExhaustedError) Error() string {
	return fmt.Sprintf("jobfence: provider budget exhausted; retry after %s", e.RetryAfter)
}

// Is reports whether target is ErrBudgetExhausted.
func (e *BudgetExhaustedError) Is(target error) bool { return target == ErrBudgetExhausted }
