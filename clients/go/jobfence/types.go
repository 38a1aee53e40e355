package jobfence

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// JobState is where a job stands.
type JobState string

// The job states. Only StateRunning may be written to, and only by the holder
// of the current attempt (R9).
const (
	StateUnspecified  JobState = ""
	StateReady        JobState = "ready"         // waiting for NextAttemptAt
	StateRunning      JobState = "running"       // held under a lease
	StateSucceeded    JobState = "succeeded"     // the provider confirmed the refund (never for pending, R4)
	StateManualReview JobState = "manual_review" // a person must decide (R14, R16)

	// StateCancelled: stopped before anything could reach the provider, or
	// by a person's decision on a maybe-sent refund (R32).
	StateCancelled JobState = "cancelled"
)

// Final reports whether no worker will act on a job in state s again.
func (s JobState) Final() bool {
	return s == StateSucceeded || s == StateManualReview || s == StateCancelled
}

// NextAction tells the holder of a job what to do first.
type NextAction string

// The next actions. A first claim sends the refund; a takeover, or any job
// whose sent request has an unknown outcome, asks the provider first (R6, R14).
const (
	ActionUnspecified NextAction = ""
	ActionRefund      NextAction = "refund"
	ActionReconcile   NextAction = "reconcile"
)

// Outcome is what the provider said about a refund, as filed in an
// observation (R15).
type Outcome string

// The observation outcomes. Pending is not success (R4); not found does not
// prove that nothing happened (R14).
const (
	OutcomeUnspecified Outcome = ""
	OutcomeSucceeded   Outcome = "succeeded"
	OutcomePending     Outcome = "pending"
	OutcomeFailed      Outcome = "failed"
	OutcomeNotFound    Outcome = "not_found"
)

// Job is one refund and its scheduling state. Every time comes from the
// coordinator's database clock (R12), never from this machine; a zero time
// means "not set".
type Job struct {
	ID int64
	// OperationKey is the business idempotency key of the refund: send it to
	// the provider as the Idempotency-Key, whoever holds the job (R1).
	OperationKey string
	OrderID      string
	PaymentID    string
	AmountMinor  int64  // in the currency's minor unit
	Currency     string // ISO 4217, upper case
	Provider     string

	State JobState
	// Attempt counts claims and takeovers (R2, R3). It is internal: never send
	// it to the provider.
	Attempt          int64
	NextAction       NextAction
	NextAttemptAt    time.Time
	LeaseUntil       time.Time // set only while running; expiry only opens the job to takeover (R8)
	ProviderRefundID string
	WorkerID         string // the holder of the current (or last) attempt
	LastReason       string
	// FirstSentAt is when OperationKey could first have reached the provider:
	// its first claim with NextAction refund (R22).
	FirstSentAt time.Time
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// ArchivedAt is when the job, final, left the coordinator's working
	// tables for its archive (R31); zero while it is in them. It stays
	// readable, and its key known for ever (R30).
	ArchivedAt time.Time
	// CancelRequestedAt is when an operator (or the producer) asked to
	// cancel the refund after it may have been sent (R32); zero when nobody
	// did, and for a job cancelled at once (StateCancelled). From then on
	// the job is only ever reconciled, never sent.
	CancelRequestedAt time.Time
	// TraceParent is the W3C trace context of the job's enqueue (R35),
	// "00-<trace id>-<span id>-<flags>"; empty when the enqueue carried
	// none.
	TraceParent string
}

// ClaimedJob is a job granted by Claim. Every write-back for it carries its
// grant: Attempt and LeaseToken (R9, R25); the Worker does that for you.
type ClaimedJob struct {
	Job     Job
	Attempt int64
	// LeaseToken proves this process holds the grant (R25). Pass it with
	// Attempt to Complete, Reschedule, Escalate and ReportObservation; the
	// coordinator refuses the attempt without it. It prints redacted.
	LeaseToken LeaseToken
	LeaseUntil time.Time
	NextAction NextAction
	// Takeover is true when the job was taken over from an expired lease; its
	// NextAction is then always reconcile (R6, R14).
	Takeover bool
	// Observations are the newest receipts filed for the job, at most 5,
	// oldest first (R15): evidence to verify with the provider before acting.
	// ObservationCount counts them all; GetJob reads the rest.
	Observations     []Observation
	ObservationCount int64
	// ResendDeadline is until when (database clock) a same-key resend is inside
	// the provider's idempotency-key retention window, counted from
	// Job.FirstSentAt (R22). Zero when nothing was sent yet.
	ResendDeadline time.Time
	// ClaimedAt is the database's time when the claim committed (R12).
	ClaimedAt time.Time
	// CancelRequested: a cancel was requested of the job after it may have
	// been sent (R32; the grant's cancel_requested, or Job.CancelRequestedAt
	// set). The Worker then never calls Handler.Refund for it, whatever its
	// NextAction says, and never writes back a reschedule that would send
	// it: the provider has the refund → Complete (the coordinator records
	// that the cancel came too late); pending or no answer → Reschedule to
	// reconcile; no record, or the refund failed → Escalate, since only a
	// person may close a maybe-sent refund as cancelled. A handler may read
	// it, e.g. to log it or to skip what only a send needs.
	CancelRequested bool
	// TraceParent and TraceState are the W3C trace context of the job's
	// enqueue (R35), handed to every grant; empty when the enqueue carried
	// none. The Worker's attempt span links to it (WorkerOptions.TracerProvider).
	TraceParent, TraceState string

	// received is this machine's time (with its monotonic reading) when the
	// claim's reply arrived; see CoordinatorNow.
	received time.Time
}

// CoordinatorNow estimates the coordinator's database clock now (R12), for
// comparing with ResendDeadline. It is the database time of the claim
// (ClaimedAt) plus the time elapsed on this machine's monotonic clock since
// the claim's reply arrived. The wall clock of this machine is never
// consulted, so a skewed or jumping worker clock does not move the estimate;
// the estimate runs late by the claim reply's transit time, which errs on
// the safe side (a resend looks later, never earlier, than it is).
//
// For a ClaimedJob not obtained from Claim it returns ClaimedAt, or the local
// time when that is zero.
func (c ClaimedJob) CoordinatorNow() time.Time {
	base := c.claimTime()
	if base.IsZero() {
		return time.Now()
	}
	if c.received.IsZero() {
		return base
	}
	return base.Add(max(0, time.Since(c.received)))
}

// SendsAgain reports whether a refund sent under this claim would be a
// same-key resend: the operation key was first sent under an earlier claim
// (Job.FirstSentAt precedes ClaimedAt). A first send, whose claim itself set
// FirstSentAt, is not a resend.
func (c ClaimedJob) SendsAgain() bool {
	return !c.Job.FirstSentAt.IsZero() && c.Job.FirstSentAt.Before(c.claimTime())
}

// claimTime is ClaimedAt; for coordinators that do not send it, the claiming
// transaction's write time, Job.UpdatedAt.
func (c ClaimedJob) claimTime() time.Time {
	if !c.ClaimedAt.IsZero() {
		return c.ClaimedAt
	}
	return c.Job.UpdatedAt
}

// Event is one entry of a job's append-only history (R3).
type Event struct {
	ID               int64
	JobID            int64
	Attempt          int64  // the attempt the transition was made under
	Kind             string // enqueued, claimed, taken_over, completed, rescheduled, escalated
	WorkerID         string
	FromState        JobState
	ToState          JobState
	NextAction       NextAction
	ProviderRefundID string
	Reason           string
	CreatedAt        time.Time
}

// The history event kinds.
const (
	EventEnqueued    = "enqueued"
	EventClaimed     = "claimed"
	EventTakenOver   = "taken_over"
	EventCompleted   = "completed"
	EventRescheduled = "rescheduled"
	EventEscalated   = "escalated"
	// EventResolved: an operator closed a manual review (the worker id is
	// the operator's credential name).
	EventResolved = "resolved"
	// EventExpedited: a receipt of success or failure made a waiting job due
	// now, to reconcile (R28); the worker id is the receipt's source.
	EventExpedited = "expedited"
)

// Observation is one receipt in a job's observation log (R15).
type Observation struct {
	ID               int64
	JobID            int64
	OperationKey     string
	ReportedAttempt  int64 // the attempt the reporter held; 0 for webhooks and reconcilers
	JobAttempt       int64 // the job's attempt when the receipt was filed
	Source           string
	Outcome          Outcome
	ProviderRefundID string
	ProviderEventID  string
	Detail           string
	CreatedAt        time.Time
	// AttemptVerified is true when the report carried the lease token of
	// ReportedAttempt's grant (R25).
	AttemptVerified bool
	// Reporter is who filed it, from the caller's credential (empty on a
	// coordinator without credentials, "webhook:<provider>" for a webhook).
	Reporter string
	// KeptAsideID is set by ReportObservation when the job had no room for
	// the receipt (R28: 1,000 on file, or the share of receipts without a
	// lease token, or this credential's share, taken): it was kept in the
	// coordinator's unmatched log as this entry, where a person sees it,
	// and moved nothing; ID is 0. It is not lost: do not file it again.
	KeptAsideID int64
}

// JobDetail is a job with its history and the first page of its
// observations (100), oldest first; ObservationCount counts them all.
type JobDetail struct {
	Job              Job
	Events           []Event
	Observations     []Observation
	ObservationCount int64
}

// WriteResult is the job after a write-back.
type WriteResult struct {
	Job Job
	// Replayed is true when this same write had already been applied under
	// the same attempt by a call whose reply was lost (R21); nothing was
	// written now. It is a success.
	Replayed bool
}

// Wire → Go. One function per type; nothing else reads these messages.

func jobFromProto(j *pb.Job) Job {
	if j == nil {
		return Job{}
	}
	return Job{
		ID:               j.GetId(),
		OperationKey:     j.GetOperationKey(),
		OrderID:          j.GetOrderId(),
		PaymentID:        j.GetPaymentId(),
		AmountMinor:      j.GetAmountMinor(),
		Currency:         j.GetCurrency(),
		Provider:         j.GetProvider(),
		State:            stateFromProto(j.GetState()),
		Attempt:          j.GetAttempt(),
		NextAction:       actionFromProto(j.GetNextAction()),
		NextAttemptAt:    timeFromProto(j.GetNextAttemptAt()),
		LeaseUntil:       timeFromProto(j.GetLeaseUntil()),
		ProviderRefundID: j.GetProviderRefundId(),
		WorkerID:         j.GetWorkerId(),
		LastReason:       j.GetLastReason(),
		FirstSentAt:      timeFromProto(j.GetFirstSentAt()),
		CreatedAt:        timeFromProto(j.GetCreatedAt()),
		UpdatedAt:        timeFromProto(j.GetUpdatedAt()),
		ArchivedAt:       timeFromProto(j.GetArchivedAt()),

		CancelRequestedAt: timeFromProto(j.GetCancelRequestedAt()),
		TraceParent:       j.GetTraceparent(),
	}
}

func claimedFromProto(c *pb.ClaimedJob, received time.Time) ClaimedJob {
	obs := make([]Observation, len(c.GetObservations()))
	for i, o := range c.GetObservations() {
		obs[i] = observationFromProto(o)
	}
	return ClaimedJob{
		Job:              jobFromProto(c.GetJob()),
		Attempt:          c.GetAttempt(),
		LeaseToken:       LeaseToken(c.GetLeaseToken()),
		LeaseUntil:       timeFromProto(c.GetLeaseUntil()),
		NextAction:       actionFromProto(c.GetNextAction()),
		Takeover:         c.GetTakeover(),
		Observations:     obs,
		ObservationCount: c.GetObservationCount(),
		ResendDeadline:   timeFromProto(c.GetResendDeadline()),
		ClaimedAt:        timeFromProto(c.GetClaimedAt()),
		received:         received,

		// Either says it (R32): a grant from a coordinator that sets only
		// one of them is never sent either.
		CancelRequested: c.GetCancelRequested() || c.GetJob().GetCancelRequestedAt() != nil,

		TraceParent: c.GetTraceparent(),
		TraceState:  c.GetTracestate(),
	}
}

func eventFromProto(e *pb.JobEvent) Event {
	return Event{
		ID:               e.GetId(),
		JobID:            e.GetJobId(),
		Attempt:          e.GetAttempt(),
		Kind:             e.GetKind(),
		WorkerID:         e.GetWorkerId(),
		FromState:        stateFromProto(e.GetFromState()),
		ToState:          stateFromProto(e.GetToState()),
		NextAction:       actionFromProto(e.GetNextAction()),
		ProviderRefundID: e.GetProviderRefundId(),
		Reason:           e.GetReason(),
		CreatedAt:        timeFromProto(e.GetCreatedAt()),
	}
}

func observationFromProto(o *pb.Observation) Observation {
	return Observation{
		ID:               o.GetId(),
		JobID:            o.GetJobId(),
		OperationKey:     o.GetOperationKey(),
		ReportedAttempt:  o.GetReportedAttempt(),
		JobAttempt:       o.GetJobAttempt(),
		Source:           o.GetSource(),
		Outcome:          outcomeFromProto(o.GetOutcome()),
		ProviderRefundID: o.GetProviderRefundId(),
		ProviderEventID:  o.GetProviderEventId(),
		Detail:           o.GetDetail(),
		CreatedAt:        timeFromProto(o.GetCreatedAt()),
		AttemptVerified:  o.GetAttemptVerified(),
		Reporter:         o.GetReporter(),
	}
}

func timeFromProto(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func timeToProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

var states = map[pb.JobState]JobState{
	pb.JobState_JOB_STATE_READY:         StateReady,
	pb.JobState_JOB_STATE_RUNNING:       StateRunning,
	pb.JobState_JOB_STATE_SUCCEEDED:     StateSucceeded,
	pb.JobState_JOB_STATE_MANUAL_REVIEW: StateManualReview,
	pb.JobState_JOB_STATE_CANCELLED:     StateCancelled,
}

func stateFromProto(s pb.JobState) JobState { return states[s] }

// stateFromName reads a state as the coordinator names it in error metadata
// ("JOB_STATE_SUCCEEDED").
func stateFromName(name string) JobState { return states[pb.JobState(pb.JobState_value[name])] }

func actionFromProto(a pb.NextAction) NextAction {
	switch a {
	case pb.NextAction_NEXT_ACTION_REFUND:
		return ActionRefund
	case pb.NextAction_NEXT_ACTION_RECONCILE:
		return ActionReconcile
	}
	return ActionUnspecified
}

func actionToProto(a NextAction) pb.NextAction {
	switch a {
	case ActionRefund:
		return pb.NextAction_NEXT_ACTION_REFUND
	case ActionReconcile:
		return pb.NextAction_NEXT_ACTION_RECONCILE
	}
	return pb.NextAction_NEXT_ACTION_UNSPECIFIED
}

var outcomes = map[pb.ObservationOutcome]Outcome{
	pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED: OutcomeSucceeded,
	pb.ObservationOutcome_OBSERVATION_OUTCOME_PENDING:   OutcomePending,
	pb.ObservationOutcome_OBSERVATION_OUTCOME_FAILED:    OutcomeFailed,
	pb.ObservationOutcome_OBSERVATION_OUTCOME_NOT_FOUND: OutcomeNotFound,
}

func outcomeFromProto(o pb.ObservationOutcome) Outcome { return outcomes[o] }

func outcomeToProto(o Outcome) pb.ObservationOutcome {
	for p, v := range outcomes {
		if v == o {
			return p
		}
	}
	return pb.ObservationOutcome_OBSERVATION_OUTCOME_UNSPECIFIED
}

// LeaseToken is the secret of one grant (R25): the coordinator mints it with
// every claim or takeover and accepts a write-back of the grant only with it.
// The attempt is disclosed in errors and logs; the token never is, so knowing
// the attempt never lets a stale worker write. It prints as "[redacted]" (fmt
// slog and encoding/json alike); Fingerprint names the grant without
// revealing it.
type LeaseToken string

// String keeps the token out of formatted output.
func (LeaseToken) String() string { return "[redacted]" }

// GoString keeps the token out of %#v.
func (LeaseToken) GoString() string { return "[redacted]" }

// LogValue keeps the token out of slog output.
func (LeaseToken) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// MarshalText keeps the token out of JSON and other text encodings of a
// ClaimedJob (a logged struct, a debugging dump). Send it with string(t).
func (LeaseToken) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// Fingerprint is a short, non-secret name of the grant for logs: the first 6
// bytes of the token's SHA-256 in hex, as the coordinator's history keeps it;
// "" for no token.
func (t LeaseToken) Fingerprint() string {
	if t == "" {
		return ""
	}
	h := sha256.Sum256([]byte(t))
	return hex.EncodeToString(h[:6])
}
