package console

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// apiError is an API error as a person reads it: what happened and whether
// anything changed. The console branches on the ErrorInfo reason, never on
// the message (R24).
type apiError struct {
	reason     pb.ErrorReason
	httpStatus int
	text       string
	// fields maps each invalid request field to what is wrong with it.
	fields map[string]string
	// metadata of a fence refusal: current_attempt, current_state.
	metadata map[string]string
}

// explain decodes err, a gRPC error from the coordinator.
func explain(err error) apiError {
	st, _ := status.FromError(err)
	e := apiError{httpStatus: http.StatusBadGateway, fields: map[string]string{}, metadata: map[string]string{}}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == "jobfence" {
				e.reason = pb.ErrorReason(pb.ErrorReason_value["ERROR_REASON_"+d.GetReason()])
				e.metadata = d.GetMetadata()
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.fields[v.GetField()] = v.GetDescription()
			}
		}
	}
	switch e.reason {
	case pb.ErrorReason_ERROR_REASON_STALE_ATTEMPT, pb.ErrorReason_ERROR_REASON_JOB_NOT_IN_REVIEW:
		e.httpStatus, e.text = http.StatusConflict, "Someone acted first: the job is no longer in manual review under "+
			"the attempt this page showed. Nothing was changed by you; here is its state now."
	case pb.ErrorReason_ERROR_REASON_JOB_NOT_CANCELLABLE:
		e.httpStatus, e.text = http.StatusConflict, "This refund can no longer be cancelled: "+
			notCancellable(e.metadata["current_state"])+". Nothing was changed."
	case pb.ErrorReason_ERROR_REASON_NOT_ON_ATTENTION_LIST:
		e.httpStatus, e.text = http.StatusConflict, "This job is not on the attention list any more: someone "+
			"acknowledged it first. Nothing was changed by you."
	case pb.ErrorReason_ERROR_REASON_CANCEL_REQUESTED:
		e.httpStatus, e.text = http.StatusConflict, "A cancel was requested for this refund: it is only "+
			"reconciled from now on. Nothing was changed."
	case pb.ErrorReason_ERROR_REASON_NOT_FOUND:
		e.httpStatus, e.text = http.StatusNotFound, "No such job."
	case pb.ErrorReason_ERROR_REASON_INVALID_ARGUMENT:
		var parts []string
		for f, d := range e.fields {
			parts = append(parts, f+": "+d)
		}
		e.httpStatus, e.text = http.StatusBadRequest, "The coordinator refused the request: "+strings.Join(parts, "; ")
	case pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED:
		e.httpStatus, e.text = http.StatusUnauthorized, "The coordinator no longer accepts your token: sign in again."
	case pb.ErrorReason_ERROR_REASON_PERMISSION_DENIED:
		e.httpStatus, e.text = http.StatusForbidden, "Your credential may not do this. Nothing was changed."
	case pb.ErrorReason_ERROR_REASON_TOO_MANY_CALLS:
		wait := "a moment"
		for _, d := range st.Details() {
			if r, ok := d.(*errdetails.RetryInfo); ok && r.GetRetryDelay().AsDuration() > 0 {
				wait = r.GetRetryDelay().AsDuration().Round(100 * time.Millisecond).String()
			}
		}
		e.httpStatus, e.text = http.StatusTooManyRequests, "The coordinator is answering as many searches as it "+
			"lets one person (or everyone) run at once, to keep refunds flowing. Nothing was changed; try again in "+wait+"."
	case pb.ErrorReason_ERROR_REASON_WRITE_OUTCOME_UNKNOWN:
		e.httpStatus, e.text = http.StatusServiceUnavailable, "The coordinator could not confirm whether this was "+
			"recorded. Open the job again: if it did not change, repeat the action (it is safe to repeat)."
	default:
		switch {
		case errors.Is(err, context.DeadlineExceeded) || st.Code() == codes.DeadlineExceeded:
			e.httpStatus, e.text = http.StatusGatewayTimeout, "The coordinator did not answer in time. "+
				"Open the job again before repeating an action."
		case st.Code() == codes.Unavailable:
			e.httpStatus, e.text = http.StatusServiceUnavailable, "The coordinator or its database is unavailable "+
				"for now; nothing was changed. Try again in a moment."
		default:
			e.text = "The coordinator answered with an error (" + st.Code().String() + ")."
		}
	}
	return e
}

// conflict reports whether err says someone else changed the job first.
func conflict(err error) bool {
	r := explain(err).reason
	return r == pb.ErrorReason_ERROR_REASON_STALE_ATTEMPT || r == pb.ErrorReason_ERROR_REASON_JOB_NOT_IN_REVIEW
}

// notCancellable says why a job in state (the refusal's current_state)
// cannot be cancelled.
func notCancellable(state string) string {
	switch strings.TrimPrefix(strings.ToLower(state), "job_state_") {
	case "succeeded":
		return "it succeeded: the provider made the refund"
	case "cancelled":
		return "it is cancelled already"
	}
	return "a cancel of it was requested already, and the provider's answer decides"
}
