package server

import (
	"context"
	"log/slog"
	"slices"
	"time"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
)

// People in control (R32-R34): cancel a refund, pause a provider, and the
// attention list. Each action is the caller's, by its credential, recorded
// with its reason.

// actorOf names the caller for the history: its credential, or "operator"
// on an open coordinator (loopback, no credentials), as ResolveReview does.
func actorOf(ctx context.Context) string {
	if id, ok := IdentityFrom(ctx); ok {
		return id.Name
	}
	return "operator"
}

// CancelRefund implements jobfence.v1.Coordinator (R32). An operator may
// cancel any job; a producer (without the operator role) only the jobs its
// credential enqueued.
func (s *Server) CancelRefund(ctx context.Context, req *pb.CancelRefundRequest) (*pb.CancelRefundResponse, error) {
	p := store.CancelParams{JobID: req.GetJobId(), Attempt: req.GetAttempt(), Reason: req.GetReason(), Actor: actorOf(ctx)}
	if id, ok := IdentityFrom(ctx); ok && !slices.Contains(id.Roles, RoleOperator) {
		p.EnqueuedBy = id.Name
	}
	attrs := jobAttrs{id: p.JobID, attempt: p.Attempt}
	res, err := s.store.Cancel(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err, attrs)
	}
	if !res.Replayed {
		outcome := "requested"
		if res.Cancelled {
			outcome = "cancelled"
		}
		s.metrics.cancels.WithLabelValues(outcome).Inc()
		msg := "refund cancelled: it was never sent"
		if !res.Cancelled {
			msg = "cancel requested: the refund may have been sent, the provider decides (R32)"
		}
		s.log.LogAttrs(ctx, slog.LevelWarn, msg, append(attrsOf(res.Job).attrs(), slog.String("by", p.Actor),
			slog.String("reason", p.Reason), slog.String("state", string(res.Job.State)))...)
	}
	return &pb.CancelRefundResponse{Job: jobToProto(res.Job), Cancelled: res.Cancelled, Replayed: res.Replayed}, nil
}

// PauseProvider implements jobfence.v1.Coordinator (R33).
func (s *Server) PauseProvider(ctx context.Context, req *pb.PauseProviderRequest) (*pb.PauseProviderResponse, error) {
	p := store.PauseParams{Provider: req.GetProvider(), Reason: req.GetReason(), Actor: actorOf(ctx)}
	pause, changed, err := s.store.PauseProvider(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	if changed {
		s.log.LogAttrs(ctx, slog.LevelWarn, "provider paused: its jobs are granted to nobody until it is resumed",
			slog.String("provider", p.Provider), slog.String("by", p.Actor), slog.String("reason", p.Reason))
		if known, err := s.store.List(ctx, store.ListParams{Provider: p.Provider, Limit: 1}); err == nil && len(known.Jobs) == 0 {
			s.log.LogAttrs(ctx, slog.LevelWarn, "the paused provider has no jobs on file: is its name right?",
				slog.String("provider", p.Provider))
		}
	}
	return &pb.PauseProviderResponse{Pause: pauseToProto(pause), Changed: changed}, nil
}

// ResumeProvider implements jobfence.v1.Coordinator (R33).
func (s *Server) ResumeProvider(ctx context.Context, req *pb.ResumeProviderRequest) (*pb.ResumeProviderResponse, error) {
	p := store.PauseParams{Provider: req.GetProvider(), Reason: req.GetReason(), Actor: actorOf(ctx)}
	changed, err := s.store.ResumeProvider(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	if changed {
		s.log.LogAttrs(ctx, slog.LevelWarn, "provider resumed", slog.String("provider", p.Provider),
			slog.String("by", p.Actor), slog.String("reason", p.Reason))
	}
	return &pb.ResumeProviderResponse{Changed: changed}, nil
}

// AcknowledgeAttention implements jobfence.v1.Coordinator (R34).
func (s *Server) AcknowledgeAttention(ctx context.Context, req *pb.AcknowledgeAttentionRequest) (*pb.AcknowledgeAttentionResponse, error) {
	p := store.AcknowledgeParams{JobID: req.GetJobId(), Note: req.GetNote(), Actor: actorOf(ctx)}
	if req.GetAttentionSince() != nil {
		var err error
		if p.Since, err = timeFromProto("attention_since", req.GetAttentionSince()); err != nil {
			return nil, s.toStatus(ctx, err, jobAttrs{id: p.JobID})
		}
	}
	job, replayed, err := s.store.Acknowledge(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{id: p.JobID})
	}
	if !replayed {
		s.log.LogAttrs(ctx, slog.LevelInfo, "attention acknowledged", append(attrsOf(job).attrs(),
			slog.String("by", p.Actor), slog.String("note", p.Note))...)
	}
	return &pb.AcknowledgeAttentionResponse{Job: jobToProto(job), Replayed: replayed}, nil
}

// watchPauses keeps the store's claims' paused providers in step with the
// database (R33): at once, then every claim poll interval, until ctx ends.
// Every coordinator on the database stops granting a paused provider's
// jobs within one poll interval of its pause.
func (s *Server) watchPauses(ctx context.Context) {
	t := time.NewTicker(s.opts.ClaimPollInterval)
	defer t.Stop()
	var failing bool
	var paused []string
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		pauses, err := s.store.RefreshPauses(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			s.log.Warn("could not read the paused providers; claims keep the last ones read", "error", err.Error())
		case err == nil:
			now := make([]string, len(pauses))
			for i, p := range pauses {
				now[i] = p.Provider
			}
			if !slices.Equal(now, paused) {
				s.log.Info("paused providers", "providers", now)
				paused = now
			}
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tooLate logs and counts when a write-back put a job on the attention
// list: the cancel came too late (R32, R34).
func (s *Server) tooLate(ctx context.Context, w store.Writeback, res store.WriteResult) {
	if w.Kind != store.EventCompleted || res.Replayed || !res.Job.CancelRequested() {
		return
	}
	s.metrics.cancelsTooLate.Inc()
	s.log.LogAttrs(ctx, slog.LevelWarn, "cancel came too late: the provider had the refund; the job succeeded and is on the attention list",
		append(attrsOf(res.Job).attrs(), slog.String("provider_refund_id", res.Job.ProviderRefundID))...)
}
