package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
)

// Domain is the ErrorInfo domain of every error this service returns (R24).
const Domain = "jobfence"

// reason is the ErrorInfo reason of r: its name without the ERROR_REASON_
// prefix. The proto's ErrorReason is the one list of reasons (R24).
func reason(r pb.ErrorReason) string { return strings.TrimPrefix(r.String(), "ERROR_REASON_") }

// The ErrorInfo reasons this service sends. They are API: clients branch on
// them, never on messages (R24).
var (
	ReasonStaleAttempt        = reason(pb.ErrorReason_ERROR_REASON_STALE_ATTEMPT)
	ReasonJobNotRunning       = reason(pb.ErrorReason_ERROR_REASON_JOB_NOT_RUNNING)
	ReasonJobNotInReview      = reason(pb.ErrorReason_ERROR_REASON_JOB_NOT_IN_REVIEW)
	ReasonKeyConflict         = reason(pb.ErrorReason_ERROR_REASON_OPERATION_KEY_CONFLICT)
	ReasonClaimOutcomeUnknown = reason(pb.ErrorReason_ERROR_REASON_CLAIM_OUTCOME_UNKNOWN)
	ReasonWriteOutcomeUnknown = reason(pb.ErrorReason_ERROR_REASON_WRITE_OUTCOME_UNKNOWN)
	ReasonObservationLimit    = reason(pb.ErrorReason_ERROR_REASON_OBSERVATION_LIMIT)
	ReasonDatabaseUnavailable = reason(pb.ErrorReason_ERROR_REASON_DATABASE_UNAVAILABLE)
	ReasonDatabaseFull        = reason(pb.ErrorReason_ERROR_REASON_DATABASE_FULL)
	ReasonDatabaseDenied      = reason(pb.ErrorReason_ERROR_REASON_DATABASE_ACCESS_DENIED)
	ReasonNotFound            = reason(pb.ErrorReason_ERROR_REASON_NOT_FOUND)
	ReasonInvalidArgument     = reason(pb.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
	ReasonUnauthenticated     = reason(pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED)
	ReasonPermissionDenied    = reason(pb.ErrorReason_ERROR_REASON_PERMISSION_DENIED)
	ReasonGrantTooOld         = reason(pb.ErrorReason_ERROR_REASON_GRANT_TOO_OLD)
	ReasonJobNotCancellable   = reason(pb.ErrorReason_ERROR_REASON_JOB_NOT_CANCELLABLE)
	ReasonCancelRequested     = reason(pb.ErrorReason_ERROR_REASON_CANCEL_REQUESTED)
	ReasonNotOnAttentionList  = reason(pb.ErrorReason_ERROR_REASON_NOT_ON_ATTENTION_LIST)
)

// toStatus turns a store error into the gRPC status the client sees (this is
// the only place that does) and logs what statusOf says an operator should
// see, with the job's identity.
func (s *Server) toStatus(ctx context.Context, err error, job jobAttrs) error {
	st, l := statusOf(err, job)
	if l.msg != "" {
		s.log.LogAttrs(ctx, l.level, l.msg, append(job.attrs(), l.attrs...)...)
	}
	return st.Err()
}

// logLine is what statusOf asks to be logged about an error; none when msg
// is empty.
type logLine struct {
	level slog.Level
	msg   string
	attrs []slog.Attr
}

// statusOf maps an error to its status: one table, no side effects.
// Unexpected errors become INTERNAL with a safe message; the real error goes
// to the log line.
func statusOf(err error, job jobAttrs) (*status.Status, logLine) {
	cause := func(level slog.Level, msg string) logLine {
		return logLine{level: level, msg: msg, attrs: []slog.Attr{slog.String("error", err.Error())}}
	}
	var ve *store.ValidationError
	var fe *store.FenceError
	switch {
	case errors.As(err, &ve):
		br := &errdetails.BadRequest{}
		for _, v := range ve.Violations {
			br.FieldViolations = append(br.FieldViolations,
				&errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
		}
		return withDetails(codes.InvalidArgument, ve.Error(), info(ReasonInvalidArgument, nil), br), logLine{}
	case errors.As(err, &fe):
		return fenceStatus(err, fe)
	case errors.Is(err, store.ErrGrantTooOld):
		return withDetails(codes.FailedPrecondition, err.Error()+"; the lease runs out and the job is taken over (R27)",
			info(ReasonGrantTooOld, map[string]string{"job_id": strconv.FormatInt(job.id, 10),
				"attempt": strconv.FormatInt(job.attempt, 10)})), logLine{}
	case errors.Is(err, store.ErrObservationLimit):
		return withDetails(codes.ResourceExhausted, fmt.Sprintf("the job has %d receipts on file, the most it keeps; "+
				"this one was not filed", store.MaxObservationsPerJob), info(ReasonObservationLimit, nil)),
			cause(slog.LevelError, "observation refused: the job has as many as it may keep; someone is flooding it, "+
				"look at its receipts")
	case errors.Is(err, store.ErrNotFound):
		return withDetails(codes.NotFound, "job not found", info(ReasonNotFound, nil)), logLine{}
	case errors.Is(err, store.ErrNotEnqueuedByCaller):
		return withDetails(codes.PermissionDenied, "a producer may cancel only the refunds it enqueued; "+
			"an operator may cancel any", info(ReasonPermissionDenied, nil)), logLine{}
	case errors.Is(err, store.ErrKeyConflict):
		meta := map[string]string{"operation_key": job.key}
		if job.id != 0 { // named only to callers who may read it (EnqueueRefund)
			meta["job_id"] = strconv.FormatInt(job.id, 10)
		}
		return withDetails(codes.AlreadyExists,
			"operation_key is already bound to a different refund (order, payment, amount, currency or provider differ)",
			info(ReasonKeyConflict, meta)), logLine{}
	case errors.Is(err, store.ErrClaimOutcomeUnknown):
		return withDetails(codes.Unavailable, "the claim's commit outcome is unknown; no job was granted, claim again",
			info(ReasonClaimOutcomeUnknown, nil)), cause(slog.LevelWarn, "claim outcome unknown; nothing granted")
	case errors.Is(err, store.ErrWriteOutcomeUnknown):
		return withDetails(codes.Unavailable, "the write's commit outcome is unknown; repeat the same request, it is idempotent",
			info(ReasonWriteOutcomeUnknown, nil)), cause(slog.LevelWarn, "write outcome unknown")
	case errors.Is(err, store.ErrDatabaseFull):
		return withDetails(codes.Unavailable, "the coordinator's database is full; nothing was changed, retry later",
			info(ReasonDatabaseFull, nil)), cause(slog.LevelError, "database full: nothing was changed; free space in the database")
	case errors.Is(err, store.ErrDatabaseAccessDenied):
		return withDetails(codes.Unavailable, "the coordinator's database refused its user; nothing was changed, retry later",
				info(ReasonDatabaseDenied, nil)),
			cause(slog.LevelError, "database access denied: nothing was changed; grant the coordinator's database user "+
				"what it needs (docs/DEPLOY.md)")
	case errors.Is(err, store.ErrUnavailable):
		return withDetails(codes.Unavailable, "database unavailable; nothing was changed, retry", info(ReasonDatabaseUnavailable, nil)),
			cause(slog.LevelWarn, "database unavailable")
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, "request canceled"), logLine{}
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, "deadline exceeded"), logLine{}
	default:
		return status.New(codes.Internal, "internal error"), cause(slog.LevelError, "internal error")
	}
}

// fenceStatus is the status of a write the fence refused (R9, R21, R25):
// FAILED_PRECONDITION with the reason, the caller's and the current attempt
// and state in the metadata, and a PreconditionFailure naming the job. Its
// message says which of the stale writes it was (R24 keeps clients on the
// reason; the message is for the person reading it).
func fenceStatus(err error, fe *store.FenceError) (*status.Status, logLine) {
	r := ReasonStaleAttempt
	job, state := fe.Current.ID, stateToProto(fe.Current.State)
	var badToken *errdetails.BadRequest
	var msg string
	switch {
	case errors.Is(err, store.ErrNotRunning):
		r = ReasonJobNotRunning
		msg = fmt.Sprintf("job %d is no longer running under attempt %d (state %s): this attempt already wrote a different outcome",
			job, fe.Attempt, state)
	case errors.Is(err, store.ErrNotInReview):
		r = ReasonJobNotInReview
		msg = fmt.Sprintf("job %d is not in manual review under attempt %d (state %s)", job, fe.Attempt, state)
	case errors.Is(err, store.ErrCancelRequested):
		r = ReasonCancelRequested
		msg = fmt.Sprintf("job %d: a cancel was requested (R32), so the refund may not be sent again: reschedule "+
			"to RECONCILE, or complete or escalate; nothing was written", job)
	case errors.Is(err, store.ErrNotCancellable):
		r = ReasonJobNotCancellable
		msg = fmt.Sprintf("job %d cannot be cancelled (state %s%s); nothing was written", job, state, notCancellableWhy(fe.Current))
	case errors.Is(err, store.ErrNotOnAttentionList):
		r = ReasonNotOnAttentionList
		msg = fmt.Sprintf("job %d is not on the attention list; nothing was written", job)
	case errors.Is(err, store.ErrAttentionMoved):
		msg = fmt.Sprintf("job %d has a newer reason to look since you did (attention since %s: %s); look again; "+
			"nothing was written", job, fe.Current.AttentionSince.Format(time.RFC3339Nano), fe.Current.AttentionReason)
	case fe.Attempt < fe.Current.Attempt:
		msg = fmt.Sprintf("job %d was taken over: attempt %d is no longer its grant (current attempt %d, state %s); "+
			"nothing was written. Do not write again: file what the provider said with ReportObservation",
			job, fe.Attempt, fe.Current.Attempt, state)
	case fe.Attempt > fe.Current.Attempt:
		msg = fmt.Sprintf("attempt %d of job %d was never granted (current attempt %d, state %s): send the attempt "+
			"the Claim or WorkGrant returned; nothing was written", fe.Attempt, job, fe.Current.Attempt, state)
	case fe.Current.Grant.IsZero():
		// R25: a grant made before lease tokens existed is written back with
		// its attempt alone, so the token sent was one it never had.
		msg = fmt.Sprintf("attempt %d of job %d was granted before lease tokens existed and has none: send it "+
			"with lease_token empty; nothing was written", fe.Attempt, job)
		badToken = tokenViolation("this grant has no lease token: send none")
	default:
		// The attempt sent is the job's current (or last) grant: what the
		// fence refused is the token, missing or another grant's. Nothing
		// was taken over.
		what := "lease_token is not attempt %d's"
		if fe.NoToken {
			what = "lease_token is empty: attempt %d's is required"
		}
		msg = fmt.Sprintf(what+": job %d is still under attempt %d (state %s), and a write-back must carry the "+
			"lease_token the Claim or WorkGrant returned with this attempt; nothing was written", fe.Attempt, job,
			fe.Attempt, state)
		badToken = tokenViolation(fmt.Sprintf(strings.TrimPrefix(what, "lease_token is ")+": send the lease_token "+
			"the Claim or WorkGrant returned with this attempt", fe.Attempt))
	}
	meta := map[string]string{
		"job_id":          strconv.FormatInt(job, 10),
		"attempt":         strconv.FormatInt(fe.Attempt, 10),
		"current_attempt": strconv.FormatInt(fe.Current.Attempt, 10),
		"current_state":   state.String(),
	}
	details := []protoadapt.MessageV1{info(r, meta), &errdetails.PreconditionFailure{
		Violations: []*errdetails.PreconditionFailure_Violation{{Type: r, Subject: "jobs/" + meta["job_id"], Description: msg}},
	}}
	if badToken != nil {
		details = append(details, badToken)
	}
	return withDetails(codes.FailedPrecondition, msg, details...), logLine{level: slog.LevelInfo, msg: "fenced write rejected",
		attrs: []slog.Attr{slog.String("reason", r), slog.Int64("current_attempt", fe.Current.Attempt),
			slog.String("current_state", string(fe.Current.State))}}
}

// notCancellableWhy says why a job cannot be cancelled, beyond its state.
func notCancellableWhy(j store.Job) string {
	switch {
	case !j.ArchivedAt.IsZero():
		return ", archived"
	case j.CancelRequested():
		return ", a cancel was already requested at " + j.CancelRequestedAt.Format(time.RFC3339Nano)
	case j.State == store.StateCancelled:
		return ", cancelled by another request"
	}
	return ""
}

// tokenViolation names the lease_token field of a refused write-back whose
// attempt is the job's current one: the token is what was wrong.
func tokenViolation(description string) *errdetails.BadRequest {
	return &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: "lease_token", Description: description}}}
}

func info(reason string, meta map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: meta}
}

func withDetails(code codes.Code, msg string, details ...protoadapt.MessageV1) *status.Status {
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil {
		return status.New(code, msg)
	}
	return st
}
