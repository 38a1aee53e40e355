package server

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
)

// Domain → wire. One function per type; nothing else builds these messages.

func jobToProto(j store.Job) *pb.Job {
	return &pb.Job{
		Id:                j.ID,
		OperationKey:      j.OperationKey,
		OrderId:           j.OrderID,
		PaymentId:         j.PaymentID,
		AmountMinor:       j.AmountMinor,
		Currency:          j.Currency,
		Provider:          j.Provider,
		State:             stateToProto(j.State),
		Attempt:           j.Attempt,
		NextAction:        actionToProto(j.NextAction),
		NextAttemptAt:     timeToProto(j.NextAttemptAt),
		LeaseUntil:        timeToProto(j.LeaseUntil),
		ProviderRefundId:  j.ProviderRefundID,
		WorkerId:          j.WorkerID,
		LastReason:        j.LastReason,
		FirstSentAt:       timeToProto(j.FirstSentAt),
		CreatedAt:         timeToProto(j.CreatedAt),
		UpdatedAt:         timeToProto(j.UpdatedAt),
		ArchivedAt:        timeToProto(j.ArchivedAt),
		CancelRequestedAt: timeToProto(j.CancelRequestedAt),
		AttentionSince:    timeToProto(j.AttentionSince),
		AttentionReason:   j.AttentionReason,
		Traceparent:       j.TraceParent,
	}
}

func claimedToProto(c store.ClaimedJob, resendDeadline time.Time) *pb.ClaimedJob {
	obs := make([]*pb.Observation, len(c.Observations))
	for i, o := range c.Observations {
		obs[i] = observationToProto(o)
	}
	return &pb.ClaimedJob{
		Job:              jobToProto(c.Job),
		Attempt:          c.Job.Attempt,
		LeaseUntil:       timeToProto(c.Job.LeaseUntil),
		NextAction:       actionToProto(c.Job.NextAction),
		Takeover:         c.Takeover,
		Observations:     obs,
		ResendDeadline:   timeToProto(resendDeadline),
		ClaimedAt:        timeToProto(c.Job.UpdatedAt),
		LeaseToken:       string(c.LeaseToken),
		ObservationCount: c.ObservationCount,
		CancelRequested:  c.Job.CancelRequested(),
		Traceparent:      c.Job.TraceParent,
		Tracestate:       c.Job.TraceState,
	}
}

func eventToProto(e store.Event) *pb.JobEvent {
	return &pb.JobEvent{
		Id:               e.ID,
		JobId:            e.JobID,
		Attempt:          e.Attempt,
		Kind:             string(e.Kind),
		WorkerId:         e.WorkerID,
		FromState:        stateToProto(e.FromState),
		ToState:          stateToProto(e.ToState),
		NextAction:       actionToProto(e.NextAction),
		ProviderRefundId: e.ProviderRefundID,
		Reason:           e.Reason,
		CreatedAt:        timeToProto(e.CreatedAt),
	}
}

func observationToProto(o store.Observation) *pb.Observation {
	return &pb.Observation{
		Id:               o.ID,
		JobId:            o.JobID,
		OperationKey:     o.OperationKey,
		ReportedAttempt:  o.ReportedAttempt,
		JobAttempt:       o.JobAttempt,
		Source:           o.Source,
		Outcome:          outcomeToProto(o.Outcome),
		ProviderRefundId: o.ProviderRefundID,
		ProviderEventId:  o.ProviderEventID,
		Detail:           o.Detail,
		CreatedAt:        timeToProto(o.CreatedAt),
		AttemptVerified:  o.AttemptVerified,
		Reporter:         o.Reporter,
	}
}

func ledgerToProto(e *store.LedgerEntry) *pb.LedgerEntry {
	if e == nil {
		return nil
	}
	return &pb.LedgerEntry{
		ProviderRefundId: e.ProviderRefundID,
		AmountMinor:      e.AmountMinor,
		Currency:         e.Currency,
		Attempt:          e.Attempt,
		RecordedAt:       timeToProto(e.RecordedAt),
	}
}

func staleRejectionToProto(r staleRejection) *pb.StaleRejection {
	return &pb.StaleRejection{
		At:             timeToProto(r.at),
		JobId:          r.jobID,
		Attempt:        r.attempt,
		CurrentAttempt: r.currentAttempt,
		Rpc:            r.rpc,
		Caller:         r.caller,
	}
}

func unmatchedToProto(e store.UnmatchedEvent) *pb.UnmatchedEvent {
	return &pb.UnmatchedEvent{
		Id:               e.ID,
		Provider:         e.Provider,
		ProviderEventId:  e.ProviderEventID,
		EventType:        e.EventType,
		ProviderRefundId: e.ProviderRefundID,
		OperationKey:     e.OperationKey,
		Outcome:          outcomeToProto(e.Outcome),
		Detail:           e.Detail,
		ReceivedAt:       timeToProto(e.ReceivedAt),
	}
}

func budgetToProto(b store.BudgetLevel) *pb.ProviderBudget {
	return &pb.ProviderBudget{Provider: b.Provider, RatePerSecond: b.Rate, Burst: b.Burst, Available: b.Available}
}

var roles = map[Role]pb.Role{
	RoleProducer: pb.Role_ROLE_PRODUCER,
	RoleWorker:   pb.Role_ROLE_WORKER,
	RoleOperator: pb.Role_ROLE_OPERATOR,
	RoleReader:   pb.Role_ROLE_READER,
}

func rolesToProto(rs []Role) []pb.Role {
	out := make([]pb.Role, len(rs))
	for i, r := range rs {
		out[i] = roles[r]
	}
	return out
}

func timeToProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

var states = map[store.State]pb.JobState{
	store.StateReady:        pb.JobState_JOB_STATE_READY,
	store.StateRunning:      pb.JobState_JOB_STATE_RUNNING,
	store.StateSucceeded:    pb.JobState_JOB_STATE_SUCCEEDED,
	store.StateManualReview: pb.JobState_JOB_STATE_MANUAL_REVIEW,
	store.StateCancelled:    pb.JobState_JOB_STATE_CANCELLED,
}

func stateToProto(s store.State) pb.JobState { return states[s] }

var actions = map[store.NextAction]pb.NextAction{
	store.ActionRefund:    pb.NextAction_NEXT_ACTION_REFUND,
	store.ActionReconcile: pb.NextAction_NEXT_ACTION_RECONCILE,
}

func actionToProto(a store.NextAction) pb.NextAction { return actions[a] }

var outcomes = map[store.Outcome]pb.ObservationOutcome{
	store.OutcomeSucceeded: pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED,
	store.OutcomePending:   pb.ObservationOutcome_OBSERVATION_OUTCOME_PENDING,
	store.OutcomeFailed:    pb.ObservationOutcome_OBSERVATION_OUTCOME_FAILED,
	store.OutcomeNotFound:  pb.ObservationOutcome_OBSERVATION_OUTCOME_NOT_FOUND,
}

func outcomeToProto(o store.Outcome) pb.ObservationOutcome { return outcomes[o] }

// Wire → domain. Enum and well-known-type problems become field violations
// here; the rest is validated by the store's params (one validation layer).

func enqueueFromProto(r *pb.EnqueueRefundRequest) (store.EnqueueParams, error) {
	p := store.EnqueueParams{
		OperationKey: r.GetOperationKey(),
		OrderID:      r.GetOrderId(),
		PaymentID:    r.GetPaymentId(),
		AmountMinor:  r.GetAmountMinor(),
		Currency:     r.GetCurrency(),
		Provider:     r.GetProvider(),
	}
	var err error
	p.NotBefore, err = timeFromProto("not_before", r.GetNotBefore())
	return p, err
}

// claimFromProto returns the claim and how long to long-poll for it.
func claimFromProto(r *pb.ClaimRequest, defaultLease time.Duration) (store.ClaimParams, time.Duration, error) {
	p := store.ClaimParams{
		WorkerID: r.GetWorkerId(),
		MaxJobs:  int(r.GetMaxJobs()),
		Lease:    defaultLease,
		Provider: r.GetProvider(),
	}
	var err error
	if d := r.GetLeaseDuration(); d != nil {
		if p.Lease, err = durationFromProto("lease_duration", d); err != nil {
			return p, 0, err
		}
	}
	var wait time.Duration
	if d := r.GetWait(); d != nil {
		if wait, err = durationFromProto("wait", d); err != nil {
			return p, 0, err
		}
		if wait < 0 || wait > MaxClaimWait {
			return p, 0, store.Invalid("wait", "must be between 0 and %s, got %s", MaxClaimWait, wait)
		}
	}
	return p, wait, nil
}

func completeFromProto(r *pb.CompleteRequest) store.Writeback {
	return store.Writeback{Kind: store.EventCompleted, JobID: r.GetJobId(), Attempt: r.GetAttempt(),
		LeaseToken: store.LeaseToken(r.GetLeaseToken()), ProviderRefundID: r.GetProviderRefundId()}
}

func rescheduleFromProto(r *pb.RescheduleRequest) (store.Writeback, error) {
	w := store.Writeback{Kind: store.EventRescheduled, JobID: r.GetJobId(), Attempt: r.GetAttempt(),
		LeaseToken: store.LeaseToken(r.GetLeaseToken()), NextAction: store.ActionReconcile, Reason: r.GetReason()}
	switch r.GetNextAction() {
	case pb.NextAction_NEXT_ACTION_UNSPECIFIED, pb.NextAction_NEXT_ACTION_RECONCILE:
	case pb.NextAction_NEXT_ACTION_REFUND:
		w.NextAction = store.ActionRefund
	default:
		return w, store.Invalid("next_action", "unknown value %d", r.GetNextAction())
	}
	var err error
	switch when := r.GetWhen().(type) {
	case *pb.RescheduleRequest_Delay:
		w.Delay, err = durationFromProto("delay", when.Delay)
	case *pb.RescheduleRequest_NextAttemptAt:
		w.At, err = timeFromProto("next_attempt_at", when.NextAttemptAt)
		if err == nil && w.At.IsZero() {
			err = store.Invalid("next_attempt_at", "must be set when chosen")
		}
	}
	return w, err
}

func escalateFromProto(r *pb.EscalateRequest) store.Writeback {
	return store.Writeback{Kind: store.EventEscalated, JobID: r.GetJobId(), Attempt: r.GetAttempt(),
		LeaseToken: store.LeaseToken(r.GetLeaseToken()), Reason: r.GetReason()}
}

func observationFromProto(r *pb.ReportObservationRequest) (store.ObservationParams, error) {
	p := store.ObservationParams{
		Job:              store.JobRef{ID: r.GetJobId(), OperationKey: r.GetOperationKey()},
		Attempt:          r.GetAttempt(),
		LeaseToken:       store.LeaseToken(r.GetLeaseToken()),
		Source:           r.GetSource(),
		ProviderRefundID: r.GetProviderRefundId(),
		ProviderEventID:  r.GetProviderEventId(),
		Detail:           r.GetDetail(),
	}
	for o, v := range outcomes {
		if v == r.GetOutcome() {
			p.Outcome = o
		}
	}
	if p.Outcome == "" {
		return p, store.Invalid("outcome", "must be one of SUCCEEDED, PENDING, FAILED, NOT_FOUND, got %s", r.GetOutcome())
	}
	return p, nil
}

func getFromProto(r *pb.GetJobRequest) store.GetParams {
	return store.GetParams{JobRef: store.JobRef{ID: r.GetJobId(), OperationKey: r.GetOperationKey()},
		ObservationsLimit: int(r.GetObservationsPageSize()), ObservationsPageToken: r.GetObservationsPageToken()}
}

func timeFromProto(field string, ts *timestamppb.Timestamp) (time.Time, error) {
	if ts == nil {
		return time.Time{}, nil
	}
	if err := ts.CheckValid(); err != nil {
		return time.Time{}, store.Invalid(field, "%v", err)
	}
	return ts.AsTime(), nil
}

func durationFromProto(field string, d *durationpb.Duration) (time.Duration, error) {
	if err := d.CheckValid(); err != nil {
		return 0, store.Invalid(field, "%v", err)
	}
	return d.AsDuration(), nil
}

func listFromProto(r *pb.ListJobsRequest) (store.ListParams, error) {
	p := store.ListParams{Provider: r.GetProvider(), OrderID: r.GetOrderId(), PaymentID: r.GetPaymentId(),
		ProviderRefundID: r.GetProviderRefundId(), ReasonPrefix: r.GetReasonPrefix(), Limit: int(r.GetPageSize()),
		PageToken: r.GetPageToken(), Attention: r.GetAttention()}
	if p.Limit == 0 {
		p.Limit = 50
	}
	var err error
	if p.CreatedAfter, err = timeFromProto("created_after", r.GetCreatedAfter()); err != nil {
		return p, err
	}
	if p.CreatedBefore, err = timeFromProto("created_before", r.GetCreatedBefore()); err != nil {
		return p, err
	}
	if r.GetState() != pb.JobState_JOB_STATE_UNSPECIFIED {
		for st, v := range states {
			if v == r.GetState() {
				p.State = st
			}
		}
		if p.State == "" {
			return p, store.Invalid("state", "unknown value %d", r.GetState())
		}
	}
	return p, nil
}

// overviewLimitFromProto is how many of each kind GetOverview lists: 10 when
// unset.
func overviewLimitFromProto(r *pb.GetOverviewRequest) (int, error) {
	limit := int(r.GetLimit())
	if limit == 0 {
		limit = 10
	}
	return limit, store.ValidateOverviewLimit(limit)
}

func pauseToProto(p store.Pause) *pb.ProviderPause {
	return &pb.ProviderPause{Provider: p.Provider, PausedBy: p.PausedBy, Reason: p.Reason, PausedAt: timeToProto(p.PausedAt)}
}

func pauseEventToProto(e store.PauseEvent) *pb.ProviderPauseEvent {
	return &pb.ProviderPauseEvent{Id: e.ID, Provider: e.Provider, Action: e.Action, Actor: e.Actor, Reason: e.Reason,
		CreatedAt: timeToProto(e.CreatedAt)}
}

func resolveFromProto(r *pb.ResolveReviewRequest, actor string) store.Writeback {
	w := store.Writeback{Kind: store.EventResolved, JobID: r.GetJobId(), Attempt: r.GetAttempt(),
		ProviderRefundID: r.GetProviderRefundId(), Reason: r.GetNote(), Actor: actor}
	switch r.GetResolution() {
	case pb.ReviewResolution_REVIEW_RESOLUTION_REFUNDED:
		w.Resolution = store.ResolutionRefunded
	case pb.ReviewResolution_REVIEW_RESOLUTION_RECONCILE:
		w.Resolution = store.ResolutionReconcile
	case pb.ReviewResolution_REVIEW_RESOLUTION_CANCELLED:
		w.Resolution = store.ResolutionCancelled
	}
	return w
}
