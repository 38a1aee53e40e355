package jobfence

import (
	"context"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// MaxRenewBatch is the most grants one RenewLeases call renews.
const MaxRenewBatch = 100

// Grant names a grant to renew: the job, the attempt Claim granted and its
// lease token (R25).
type Grant struct {
	JobID      int64
	Attempt    int64
	LeaseToken LeaseToken
}

// GrantOf is the grant c holds.
func GrantOf(c ClaimedJob) Grant {
	return Grant{JobID: c.Job.ID, Attempt: c.Attempt, LeaseToken: c.LeaseToken}
}

// Renewal answers the renewal of one grant (R27).
type Renewal struct {
	JobID   int64
	Attempt int64
	// LeaseUntil is the lease's new end (database clock); zero when refused.
	LeaseUntil time.Time
	// Refused is why the grant was not renewed, nil when it was: an *Error
	// matching ErrStaleAttempt (taken over, or not this grant: stop before
	// sending anything new to the provider, and file any answer already
	// received as an observation, R15), ErrJobNotRunning (this grant
	// already wrote its outcome), ErrGrantTooOld (renew no more; the lease
	// runs out and the job is taken over) or ErrNotFound.
	Refused error
	// GrantExpiresAt is the end of the grant's life: no renewal extends its
	// lease past it. Zero unless the job runs under this grant.
	GrantExpiresAt time.Time
	// ReceiptFiledAt is when the newest receipt of success or failure was
	// filed for the job during this grant, if one was (R28): what the
	// provider told someone else while this holder worked.
	ReceiptFiledAt time.Time
}

// RenewLeases extends the leases of grants this process holds, up to
// MaxRenewBatch in one call, each to lease from the coordinator's now (zero:
// the coordinator's default lease), never past its grant's life (R27). Each
// grant is fenced like a write-back and answered on its own, in order. It is
// safe to repeat and is retried after UNAVAILABLE. Errors (the whole call):
// ErrInvalidArgument (the field named: grants, grants[i].job_id,
// lease_duration), ErrUnavailable, ErrPermissionDenied, ErrUnauthenticated.
func (c *Client) RenewLeases(ctx context.Context, grants []Grant, lease time.Duration) ([]Renewal, error) {
	req := &pb.RenewLeasesRequest{Grants: make([]*pb.GrantRef, len(grants))}
	for i, g := range grants {
		req.Grants[i] = &pb.GrantRef{JobId: g.JobID, Attempt: g.Attempt, LeaseToken: string(g.LeaseToken)}
	}
	if lease != 0 {
		req.LeaseDuration = durationpb.New(lease)
	}
	var resp *pb.RenewLeasesResponse
	err := c.retrySafe(ctx, "RenewLeases", func(ctx context.Context) (err error) {
		resp, err = c.rpc.RenewLeases(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]Renewal, len(resp.GetRenewals()))
	for i, r := range resp.GetRenewals() {
		out[i] = Renewal{JobID: r.GetJobId(), Attempt: r.GetAttempt(), LeaseUntil: timeFromProto(r.GetLeaseUntil()),
			GrantExpiresAt: timeFromProto(r.GetGrantExpiresAt()), ReceiptFiledAt: timeFromProto(r.GetReceiptFiledAt())}
		if r.GetRefused() != pb.ErrorReason_ERROR_REASON_UNSPECIFIED {
			out[i].Refused = refusal(r)
		}
	}
	return out, nil
}

// refusal decodes a grant's refusal exactly as the same refusal of a
// write-back would decode (R24: by reason, never by message): a
// *StaleAttemptError for STALE_ATTEMPT, and so on.
func refusal(r *pb.LeaseRenewal) error {
	code := codes.FailedPrecondition
	if r.GetRefused() == pb.ErrorReason_ERROR_REASON_NOT_FOUND {
		code = codes.NotFound
	}
	st, err := status.New(code, r.GetMessage()).WithDetails(&errdetails.ErrorInfo{Domain: ErrorDomain,
		Reason: reasonName(r.GetRefused()), Metadata: r.GetMetadata()})
	if err != nil {
		return decodeError(status.Error(code, r.GetMessage()))
	}
	return decodeError(st.Err())
}
