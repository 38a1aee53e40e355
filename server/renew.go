package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
)

// RenewLeases implements jobfence.v1.Coordinator (R27): the call's grants
// go to the dispatcher's shared renewal transactions, each answered on its
// own. A refusal is part of the answer, with the reason and metadata a
// write-back's error would carry; only a bad request, or a database that
// could not decide one of the renewals, fails the call.
func (s *Server) RenewLeases(ctx context.Context, req *pb.RenewLeasesRequest) (*pb.RenewLeasesResponse, error) {
	rs, err := renewalsFromProto(req, s.opts.Lease, s.opts.MaxGrantAge)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	outs, err := s.dispatch.Renew(ctx, rs)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	var undecided error
	for _, o := range outs {
		s.metrics.renewals.WithLabelValues(renewalResult(o.Err)).Inc()
		switch {
		case errors.Is(o.Err, store.ErrUnavailable), errors.Is(o.Err, store.ErrWriteOutcomeUnknown):
			undecided = o.Err
		case errors.Is(o.Err, store.ErrStaleAttempt):
			s.metrics.stale.WithLabelValues("RenewLeases").Inc()
		}
	}
	if undecided != nil {
		// Some renewal was not decided (its shared transaction failed): the
		// caller repeats the whole call, which is safe, rather than read
		// "unavailable" as a refusal of its grant.
		return nil, s.toStatus(ctx, undecided, jobAttrs{})
	}
	resp := &pb.RenewLeasesResponse{Renewals: make([]*pb.LeaseRenewal, len(rs))}
	for i, o := range outs {
		r := rs[i]
		lr := &pb.LeaseRenewal{JobId: r.JobID, Attempt: r.Attempt, GrantExpiresAt: timeToProto(o.GrantExpiresAt),
			ReceiptFiledAt: timeToProto(o.ReceiptDuringGrant())}
		resp.Renewals[i] = lr
		if o.Err == nil {
			lr.LeaseUntil = timeToProto(o.Job.LeaseUntil)
			continue
		}
		st, _ := statusOf(o.Err, jobAttrs{id: r.JobID, attempt: r.Attempt})
		lr.Message = st.Message()
		for _, d := range st.Details() {
			if ei, ok := d.(*errdetails.ErrorInfo); ok {
				lr.Refused = pb.ErrorReason(pb.ErrorReason_value["ERROR_REASON_"+ei.GetReason()])
				lr.Metadata = ei.GetMetadata()
			}
		}
		if s.log.Enabled(ctx, slog.LevelInfo) {
			s.log.LogAttrs(ctx, slog.LevelInfo, "lease renewal refused", append(jobAttrs{id: r.JobID, attempt: r.Attempt}.attrs(),
				slog.String("reason", strings.TrimPrefix(lr.Refused.String(), "ERROR_REASON_")), slog.String("error", o.Err.Error()))...)
		}
	}
	return resp, nil
}

// renewalsFromProto returns the call's renewals under the coordinator's
// default lease and grant age bound (R27).
func renewalsFromProto(r *pb.RenewLeasesRequest, defaultLease, maxAge time.Duration) ([]store.Renewal, error) {
	lease := defaultLease
	if d := r.GetLeaseDuration(); d != nil {
		var err error
		if lease, err = durationFromProto("lease_duration", d); err != nil {
			return nil, err
		}
	}
	rs := make([]store.Renewal, len(r.GetGrants()))
	for i, g := range r.GetGrants() {
		rs[i] = store.Renewal{JobID: g.GetJobId(), Attempt: g.GetAttempt(), LeaseToken: store.LeaseToken(g.GetLeaseToken()),
			Lease: lease, MaxAge: maxAge}
	}
	return rs, store.ValidateRenewals(rs)
}

// renewalResult labels a renewal's outcome for jobfence_lease_renewals_total.
func renewalResult(err error) string {
	switch {
	case err == nil:
		return "renewed"
	case errors.Is(err, store.ErrStaleAttempt):
		return "stale_attempt"
	case errors.Is(err, store.ErrNotRunning):
		return "not_running"
	case errors.Is(err, store.ErrGrantTooOld):
		return "grant_too_old"
	case errors.Is(err, store.ErrNotFound):
		return "not_found"
	default:
		return "unavailable"
	}
}
