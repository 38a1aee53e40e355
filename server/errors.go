package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/jobfence/jobfence/store"
)

// Domain is the ErrorInfo domain of every error this service returns (R24).
const Domain = "jobfence"

// The ErrorInfo reasons. They are API: clients branch on them, never on
// messages (R24).
const (
	ReasonStaleAttempt        = "STALE_ATTEMPT"
	ReasonJobNotRunning       = "JOB_NOT_RUNNING"
	ReasonJobNotInReview      = "JOB_NOT_IN_REVIEW"
	ReasonKeyConflict         = "OPERATION_KEY_CONFLICT"
	ReasonClaimOutcomeUnknown = "CLAIM_OUTCOME_UNKNOWN"
	ReasonWriteOutcomeUnknown = "WRITE_OUTCOME_UNKNOWN"
	ReasonObservationLimit    = "OBSERVATION_LIMIT"
	ReasonDatabaseUnavailable = "DATABASE_UNAVAILABLE"
	ReasonDatabaseFull        = "DATABASE_FULL"
	ReasonDatabaseDenied      = "DATABASE_ACCESS_DENIED"
	ReasonNotFound            = "NOT_FOUND"
	ReasonInvalidArgument     = "INVALID_ARGUMENT"
	ReasonUnauthenticated     = "UNAUTHENTICATED"
	ReasonPermissionDenied    = "PERMISSION_DENIED"
)

// toStatus turns a store error into the gRPC status the client sees. This is
// the only place that does. Unexpected errors become Internal with a safe
// message; the real error is logged with the job's identity.
func (s *Server) toStatus(ctx context.Context, err error, job jobAttrs) error {
	var ve *store.ValidationError
	var fe *store.FenceError
	switch {
	case errors.As(err, &ve):
		br := &errdetails.BadRequest{}
		for _, v := range ve.Violations {
			br.FieldViolations = append(br.FieldViolations,
				&errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
		}
		return withDetails(codes.InvalidArgument, ve.Error(), info(ReasonInvalidArgument, nil), br)
	case errors.As(err, &fe):
		reason := ReasonStaleAttempt
		msg := fmt.Sprintf("attempt %d with this lease token is not job %d's current grant (current attempt %d, state %s): "+
			"it was taken over, or the token is not the one Claim returned; nothing was written",
			fe.Attempt, fe.Current.ID, fe.Current.Attempt, stateToProto(fe.Current.State))
		switch {
		case errors.Is(err, store.ErrNotRunning):
			reason = ReasonJobNotRunning
			msg = fmt.Sprintf("job %d is no longer running under attempt %d (state %s): this attempt already wrote a different outcome",
				fe.Current.ID, fe.Attempt, stateToProto(fe.Current.State))
		case errors.Is(err, store.ErrNotInReview):
			reason = ReasonJobNotInReview
			msg = fmt.Sprintf("job %d is not in manual review under attempt %d (state %s)",
				fe.Current.ID, fe.Attempt, stateToProto(fe.Current.State))
		}
		meta := map[string]string{
			"job_id":          strconv.FormatInt(fe.Current.ID, 10),
			"attempt":         strconv.FormatInt(fe.Attempt, 10),
			"current_attempt": strconv.FormatInt(fe.Current.Attempt, 10),
			"current_state":   stateToProto(fe.Current.State).String(),
		}
		s.log.LogAttrs(ctx, slog.LevelInfo, "fenced write rejected", append(job.attrs(), slog.String("reason", reason),
			slog.Int64("current_attempt", fe.Current.Attempt), slog.String("current_state", string(fe.Current.State)))...)
		return withDetails(codes.FailedPrecondition, msg, info(reason, meta), &errdetails.PreconditionFailure{
			Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: reason, Subject: "jobs/" + meta["job_id"], Description: msg,
			}},
		})
	case errors.Is(err, store.ErrObservationLimit):
		s.log.LogAttrs(ctx, slog.LevelError, "observation refused: the job has as many as it may keep; "+
			"someone is flooding it, look at its receipts", append(job.attrs(), slog.String("error", err.Error()))...)
		return withDetails(codes.ResourceExhausted, fmt.Sprintf("the job has %d receipts on file, the most it keeps; "+
			"this one was not filed", store.MaxObservationsPerJob), info(ReasonObservationLimit, nil))
	case errors.Is(err, store.ErrNotFound):
		return withDetails(codes.NotFound, "job not found", info(ReasonNotFound, nil))
	case errors.Is(err, store.ErrKeyConflict):
		return withDetails(codes.AlreadyExists,
			"operation_key is already bound to a different refund (order, payment, amount, currency or provider differ)",
			info(ReasonKeyConflict, map[string]string{"operation_key": job.key, "job_id": strconv.FormatInt(job.id, 10)}))
	case errors.Is(err, store.ErrClaimOutcomeUnknown):
		s.log.LogAttrs(ctx, slog.LevelWarn, "claim outcome unknown; nothing granted", slog.String("error", err.Error()))
		return withDetails(codes.Unavailable,
			"the claim's commit outcome is unknown; no job was granted, claim again", info(ReasonClaimOutcomeUnknown, nil))
	case errors.Is(err, store.ErrWriteOutcomeUnknown):
		s.log.LogAttrs(ctx, slog.LevelWarn, "write outcome unknown", append(job.attrs(), slog.String("error", err.Error()))...)
		return withDetails(codes.Unavailable,
			"the write's commit outcome is unknown; repeat the same request, it is idempotent", info(ReasonWriteOutcomeUnknown, nil))
	case errors.Is(err, store.ErrDatabaseFull):
		s.log.LogAttrs(ctx, slog.LevelError, "database full: nothing was changed; free space in the database",
			append(job.attrs(), slog.String("error", err.Error()))...)
		return withDetails(codes.Unavailable, "the coordinator's database is full; nothing was changed, retry later",
			info(ReasonDatabaseFull, nil))
	case errors.Is(err, store.ErrDatabaseAccessDenied):
		s.log.LogAttrs(ctx, slog.LevelError, "database access denied: nothing was changed; grant the coordinator's "+
			"database user what it needs (docs/DEPLOY.md)", append(job.attrs(), slog.String("error", err.Error()))...)
		return withDetails(codes.Unavailable, "the coordinator's database refused its user; nothing was changed, retry later",
			info(ReasonDatabaseDenied, nil))
	case errors.Is(err, store.ErrUnavailable):
		s.log.LogAttrs(ctx, slog.LevelWarn, "database unavailable", append(job.attrs(), slog.String("error", err.Error()))...)
		return withDetails(codes.Unavailable, "database unavailable; nothing was changed, retry", info(ReasonDatabaseUnavailable, nil))
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	default:
		s.log.LogAttrs(ctx, slog.LevelError, "internal error", append(job.attrs(), slog.String("error", err.Error()))...)
		return status.Error(codes.Internal, "internal error")
	}
}

func info(reason string, meta map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: meta}
}

func withDetails(code codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}
