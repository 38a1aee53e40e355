// Package store holds jobfence's domain: refund jobs, their fencing token
// (attempt), the write-backs that must carry it, and the errors a backend
// returns. Backends live in subpackages (store/mysql, store/sqlite) and must all
// pass the one conformance suite in store/storetest.
package store

import (
	"context"
	"time"
)

// State is where a job stands.
type State string

// The job states of DESIGN.md (Columns).
const (
	StateReady        State = "ready"
	StateRunning      State = "running"
	StateSucceeded    State = "succeeded"
	StateManualReview State = "manual_review"
	// StateCancelled: stopped before anything could reach the provider, or
	// by a person's decision on a maybe-sent refund (R32). Final.
	StateCancelled State = "cancelled"
)

// NextAction tells the holder of a job what to do first.
type NextAction string

// The next actions: a first claim sends the refund; a takeover, or any job whose
// sent request has an unknown outcome, reconciles first (R6, R14).
const (
	ActionRefund    NextAction = "refund"
	ActionReconcile NextAction = "reconcile"
)

// Outcome is what the provider said about a refund in an observation.
type Outcome string

// The observation outcomes (R15). Pending is not success (R4); not found does not
// prove nothing happened (R14).
const (
	OutcomeSucceeded Outcome = "succeeded"
	OutcomePending   Outcome = "pending"
	OutcomeFailed    Outcome = "failed"
	OutcomeNotFound  Outcome = "not_found"
)

// EventKind names one transition in a job's history.
type EventKind string

// The transitions recorded in the append-only history (R3).
const (
	EventEnqueued    EventKind = "enqueued"
	EventClaimed     EventKind = "claimed"
	EventTakenOver   EventKind = "taken_over"
	EventCompleted   EventKind = "completed"
	EventRescheduled EventKind = "rescheduled"
	EventEscalated   EventKind = "escalated"
	EventResolved    EventKind = "resolved" // an operator closed a manual review
	// EventExpedited: a receipt of success or failure made a ready job due
	// now, to reconcile (R28). The job stays ready under its attempt; no
	// grant is made or carried.
	EventExpedited EventKind = "expedited"
	// EventCancelled: the job was cancelled at once, never sent (R32);
	// WorkerID is who asked, Reason why.
	EventCancelled EventKind = "cancelled"
	// EventCancelRequested: a cancel was requested of a job that may have
	// been sent (R32). A running job was taken over by it: the entry is
	// made under the new attempt, from running to ready.
	EventCancelRequested EventKind = "cancel_requested"
	// EventAttention: the job joined the attention list (R34); Reason says
	// why.
	EventAttention EventKind = "attention"
	// EventAcknowledged: a person took the job off the attention list;
	// Reason is their note.
	EventAcknowledged EventKind = "acknowledged"
)

// Resolution is an operator's decision on a job in manual_review.
type Resolution string

// The resolutions of a manual review.
const (
	// ResolutionRefunded: the operator confirmed the refund at the provider.
	ResolutionRefunded Resolution = "refunded"
	// ResolutionReconcile: back to ready, to reconcile again now.
	ResolutionReconcile Resolution = "reconcile"
	// ResolutionCancelled: no refund happened and none will: the job is
	// cancelled (R32). Only a person decides this of a maybe-sent refund.
	ResolutionCancelled Resolution = "cancelled"
)

// Job is one row of refund_jobs. Times come from the database's UTC clock (R12);
// a zero time means NULL.
type Job struct {
	ID           int64
	OperationKey string // R1: the business key, sent to the provider, never changes
	OrderID      string
	PaymentID    string
	AmountMinor  int64
	Currency     string
	Provider     string

	State      State
	Attempt    int64 // R2: the fencing token, bumped by every claim and takeover
	NextAction NextAction
	// NextAttemptAt is when the job's next attempt may start: for a ready
	// job when it is due, for a running one its lease end, when a takeover
	// may start (R6). Every grant and renewal moves it with LeaseUntil, so
	// that one index, (state, next_attempt_at, id), finds due jobs (Q1, Q2)
	// and expired leases alike, in lease order (R23), and a claim or a
	// completion rewrites one entry of it rather than one in a lease index
	// besides. Takeovers still test LeaseUntil itself (R6): a row an earlier
	// release granted or renewed holds an earlier NextAttemptAt than its
	// lease end, never a later one, so the walk passes it early, never misses
	// it. A succeeded job's is when it completed; a job in review's, when it
	// entered review.
	NextAttemptAt    time.Time
	LeaseUntil       time.Time // zero unless running
	ProviderRefundID string
	WorkerID         string // the holder of the current (or last) attempt
	LastReason       string
	FirstSentAt      time.Time // R22: first claim with next_action=refund
	CreatedAt        time.Time
	UpdatedAt        time.Time
	// Grant is the hash of the lease token of the current (or last) grant
	// (R25); zero for a grant made before tokens existed. Never shown to
	// clients.
	Grant TokenHash
	// EvidenceAt is when the newest receipt of success or failure was filed
	// for the job (R28); zero when none was. While the job runs, one at or
	// after UpdatedAt (the grant's time: nothing but a claim or takeover
	// writes updated_at into a running row) arrived during the grant.
	EvidenceAt time.Time
	// ArchivedAt is when the job left the working tables for the archive
	// (R31), by the database's clock; zero for a job in them. An archived
	// job is final, and stays readable.
	ArchivedAt time.Time
	// CancelRequestedAt is when a cancel was requested of the job while it
	// may have been sent (R32); zero when none was. No grant of it carries
	// ActionRefund from then on.
	CancelRequestedAt time.Time
	// AttentionSince is when the newest reason to look at the job arrived
	// while it is on the attention list (R34), AttentionReason what it is;
	// zero once a person acknowledged it.
	AttentionSince  time.Time
	AttentionReason string
	// TraceParent and TraceState are the enqueue's W3C trace context (R35),
	// handed to every grant; empty when the enqueue carried none.
	TraceParent, TraceState string
}

// CancelRequested reports whether a cancel was requested of the job (R32).
func (j Job) CancelRequested() bool { return !j.CancelRequestedAt.IsZero() }

// ClaimedJob is a job granted by Claim. Job.Attempt and LeaseToken are what
// every write-back of the grant carries (R9, R25).
type ClaimedJob struct {
	Job        Job
	LeaseToken LeaseToken // the grant's secret, handed to the claimer only (R25)
	Takeover   bool       // taken over from an expired lease (R6)
	// Observations are the newest MaxClaimObservations receipts on file for
	// the job, oldest first (R15); ObservationCount counts them all.
	Observations     []Observation
	ObservationCount int64
}

// Event is one entry of a job's transition history.
type Event struct {
	ID               int64
	JobID            int64
	Attempt          int64
	Kind             EventKind
	WorkerID         string
	FromState        State // empty for EventEnqueued
	ToState          State
	NextAction       NextAction
	ProviderRefundID string
	Reason           string
	CreatedAt        time.Time
	// Grant is the grant a claim or takeover made, or the one a holder's
	// write-back carried (R25); zero for enqueues, operators' resolutions and
	// grants made before tokens existed.
	Grant TokenHash
}

// Observation is one receipt in the observation log (R15).
type Observation struct {
	ID               int64
	JobID            int64
	OperationKey     string
	ReportedAttempt  int64 // the attempt the reporter held; 0 if none
	JobAttempt       int64 // the job's attempt when the receipt was filed
	Source           string
	Outcome          Outcome
	ProviderRefundID string
	ProviderEventID  string
	Detail           string
	CreatedAt        time.Time
	// AttemptVerified is true when the report carried the lease token of the
	// grant of ReportedAttempt: the reporter really held that attempt.
	AttemptVerified bool
	// Reporter is who filed it, from the caller's credential rather than the
	// Source it named: the credential's name, "webhook:<provider>" for a
	// signed webhook, empty on a coordinator without credentials.
	Reporter string
	// Expedited is set in Observe's answer when filing this receipt moved
	// its job: the job was ready and is now due with next action reconcile
	// (R28). It is not stored: false on a duplicate, and in every read of
	// the log.
	Expedited bool
	// Attention is set in Observe's answer when filing this receipt put a
	// succeeded job on the attention list (R34): a receipt of failure, or
	// of another refund id. Not stored.
	Attention bool
	// KeptAside is set in Observe's answer when the job's log had no room
	// for this receipt (ObservationRoom): it was kept in the unmatched log
	// instead, as that entry (ID 0 here), where a person sees it, and moved
	// nothing (R28). Not stored.
	KeptAside *UnmatchedEvent
}

// JobDetail is a job with its history and observations, oldest first.
type JobDetail struct {
	Job    Job
	Events []Event
	// Observations is one page of the job's receipts, oldest first
	// (GetParams); ObservationCount counts them all, and
	// NextObservationsToken continues the page (empty on the last).
	Observations          []Observation
	ObservationCount      int64
	NextObservationsToken string
	// Ledger is our own record of the refund (R10); nil until the job
	// succeeded.
	Ledger *LedgerEntry
	// Now is the database's time of the read (R12).
	Now time.Time
}

// LedgerEntry is a job's row of refund_ledger, written in the transaction of
// its completion, or of an operator's resolution as refunded (R10).
type LedgerEntry struct {
	ProviderRefundID string
	AmountMinor      int64
	Currency         string
	// Attempt is the attempt whose completion (or whose review's
	// resolution) recorded it.
	Attempt    int64
	RecordedAt time.Time
}

// GetParams names a job and the page of its observations to read.
type GetParams struct {
	JobRef
	// ObservationsLimit is the page size, 0 for ObservationPageSize, at most
	// MaxObservationPage.
	ObservationsLimit int
	// ObservationsPageToken continues from an earlier page of the same job.
	ObservationsPageToken string
}

// JobRef names a job by ID or, when ID is zero, by operation key.
type JobRef struct {
	ID           int64
	OperationKey string
}

// EnqueueParams describes a new refund.
type EnqueueParams struct {
	OperationKey string
	OrderID      string
	PaymentID    string
	AmountMinor  int64
	Currency     string
	Provider     string
	NotBefore    time.Time // zero: due now by the database clock
	// Producer is the enqueuing credential's name, kept in the enqueued
	// history entry: a producer may cancel the jobs it enqueued (R32).
	Producer string
	// TraceParent and TraceState are the enqueue's W3C trace context (R35).
	TraceParent, TraceState string
}

// ClaimParams asks for up to MaxJobs jobs.
type ClaimParams struct {
	WorkerID string
	MaxJobs  int
	Lease    time.Duration
	Provider string // only this provider's jobs, when set
}

// Writeback is one fenced write by the holder of a grant (R9, R25):
// Complete, Reschedule or Escalate, chosen by Kind, carrying the grant's
// attempt and lease token; or an operator's resolution of a manual review
// (EventResolved), fenced by the attempt the operator looked at and
// authorised by the operator's role, not by a grant.
type Writeback struct {
	Kind    EventKind // EventCompleted, EventRescheduled, EventEscalated or EventResolved
	JobID   int64
	Attempt int64
	// LeaseToken is the grant's token (R25); empty only for a grant made
	// before tokens existed, and for resolutions.
	LeaseToken LeaseToken

	ProviderRefundID string // completed, resolved as refunded: required

	NextAction NextAction    // rescheduled: required
	Delay      time.Duration // rescheduled: from the database's now, when At is zero
	At         time.Time     // rescheduled: absolute time, wins over Delay

	Reason string // rescheduled, escalated; resolved: the operator's note

	Resolution Resolution // resolved: required
	// Actor is who writes, from the caller's credential: required for a
	// resolution (the operator), optional otherwise (the history then names
	// the job's holder).
	Actor string
}

// WriteResult is the job after a write-back.
type WriteResult struct {
	Job Job
	// Replayed is true when this same write had already been applied by an
	// earlier call whose reply was lost (R21); nothing was written now.
	Replayed bool
	// Expedited is true when a receipt of success or failure filed during
	// the grant made this reschedule to reconcile due now
	// (Writeback.ExpeditedBy, R28).
	Expedited bool
}

// ObservationParams is one receipt to file.
type ObservationParams struct {
	Job     JobRef
	Attempt int64
	// LeaseToken, with Attempt, proves the reporter held that attempt's
	// grant (Observation.AttemptVerified). A report without it, or with
	// another, is filed all the same (R15, R28).
	LeaseToken       LeaseToken
	Source           string
	Outcome          Outcome
	ProviderRefundID string
	ProviderEventID  string
	Detail           string
	// Reporter is who files it, from the caller's credential
	// (Observation.Reporter); the job's room is kept per reporter.
	Reporter string
	// Provider, when set, is the provider whose signed webhook says this: a
	// job of another provider is not touched (ErrReceiptMismatch, R28).
	Provider string
	// AmountMinor and Currency, when set, are what the receipt says the
	// refund is for: a receipt for another amount or currency than its
	// job's is not filed on it and moves nothing (ErrReceiptMismatch, R28).
	AmountMinor int64
	Currency    string
}

// Stats is a snapshot of the queue, at the database's time Now.
type Stats struct {
	Now time.Time
	// Jobs counts the jobs in ready, running and manual_review. Succeeded
	// jobs are history and are not counted: their number grows without bound.
	Jobs map[State]int64
	// OldestUnfinished is when the oldest ready or running job was enqueued;
	// zero when there is none. manual_review waits for a person and is not
	// counted here.
	OldestUnfinished time.Time
	// TxRetries counts the transactions of this store (since it was opened)
	// that the database rolled back as a whole (deadlock, lock-wait timeout,
	// busy file) and that ran again (R20). It should stay near zero: a rising
	// count means contention the claim and write-back paths are meant to
	// avoid.
	TxRetries uint64
}

// Store is what every backend provides and store/storetest verifies.
type Store interface {
	// Enqueue creates a ready job, or returns the existing one with created=false
	// when the key exists with the same values (R1). Errors: *ValidationError,
	// ErrKeyConflict.
	Enqueue(ctx context.Context, p EnqueueParams) (job Job, created bool, err error)

	// EnqueueMany enqueues several refunds in one transaction, each answered
	// on its own exactly as Enqueue would answer it, in order (a key repeated
	// in the batch answers like a second call). Used to coalesce concurrent
	// enqueues into one COMMIT.
	EnqueueMany(ctx context.Context, ps []EnqueueParams) []EnqueueOutcome

	// EnqueueAndClaim is EnqueueMany followed, in the same transaction and
	// under its one COMMIT, by ClaimMany(cs): claimers waiting for work are
	// answered with the enqueue's own commit instead of a claim transaction
	// of their own. Each claim takes what it would take one call later (the
	// oldest due work first, Q1, R23), which is the new jobs when nothing older
	// is due. The claims are answered empty when no enqueue of ps is valid; an
	// unknown COMMIT outcome is ErrWriteOutcomeUnknown for the enqueues and
	// ErrClaimOutcomeUnknown for the claims (R7).
	EnqueueAndClaim(ctx context.Context, ps []EnqueueParams, cs []ClaimParams) ([]EnqueueOutcome, []ClaimOutcome)

	// Claim grants up to MaxJobs jobs, each bumped and committed (R5, R6, R23).
	// Errors: *ValidationError, ErrClaimOutcomeUnknown (nothing may be acted on,
	// R7), ErrUnavailable, *BudgetExhaustedError (nothing granted).
	Claim(ctx context.Context, p ClaimParams) ([]ClaimedJob, error)

	// HasWork reports whether a claim with this provider filter (any when
	// empty) would find a due job or an expired lease now, without locking or
	// writing anything: one look on behalf of every idle long poll. Errors:
	// ErrUnavailable.
	HasWork(ctx context.Context, provider string) (bool, error)

	// ClaimMany runs several claims in one transaction, each answered on its
	// own as Claim would answer it, in order: a later claim of the batch never
	// gets a job an earlier one got. Used to coalesce concurrent claims into
	// one COMMIT.
	ClaimMany(ctx context.Context, ps []ClaimParams) []ClaimOutcome

	// Write applies a fenced write-back (R9, R10, R21). Errors: *ValidationError,
	// ErrNotFound, *FenceError (ErrStaleAttempt, ErrNotRunning),
	// ErrWriteOutcomeUnknown, ErrUnavailable.
	Write(ctx context.Context, w Writeback) (WriteResult, error)

	// WriteMany applies several write-backs in one transaction, each fenced and
	// answered on its own exactly as Write would answer it, in order. Used to
	// coalesce concurrent write-backs into one COMMIT.
	WriteMany(ctx context.Context, ws []Writeback) []WriteOutcome

	// RenewMany extends the leases of several grants in one transaction
	// (R27), each fenced and answered on its own as Renewal.Renew decides
	// it, in order; a job renewed twice in a batch ends with the later
	// lease. A renewal is safe to repeat: an unknown COMMIT outcome runs the
	// batch again, at most a few times. It writes no history: a renewal is
	// no transition (R3). Errors per renewal: see RenewOutcome.Err, and
	// *ValidationError.
	RenewMany(ctx context.Context, rs []Renewal) []RenewOutcome

	// Observe files a receipt (R15). duplicate is true when the same receipt
	// was on file; nothing was added. A new receipt of success or failure
	// for a ready job that may already have been sent (its first send is
	// recorded) makes the job due now with next action reconcile, in the
	// same transaction, and records an EventExpedited in its history
	// (obs.Expedited, R28): nothing a receipt does makes a refund be sent
	// earlier than without it. The job's state, attempt, lease and grant
	// never change, and jobs in any other state are not touched. A receipt
	// the job has no room for (ObservationRoom) is kept in the unmatched log
	// instead, in the same transaction (obs.KeptAside): never dropped.
	// Errors: *ValidationError, ErrNotFound, ErrReceiptMismatch (another
	// provider's job, another amount or currency: nothing filed),
	// ErrWriteOutcomeUnknown (the COMMIT was cut off; filing again is safe,
	// it is deduplicated), ErrUnavailable.
	Observe(ctx context.Context, p ObservationParams) (obs Observation, duplicate bool, err error)

	// KeepUnmatched files e in the unmatched log (R28): a verified provider
	// event that names no job is kept, never dropped. The same provider and
	// provider event id again is a duplicate: nothing is added, and the
	// event on file is returned with duplicate true. ID and ReceivedAt (the
	// database's clock) are set by the store. Errors: *ValidationError
	// (fields provider, provider_event_id, event_type, provider_refund_id,
	// operation_key, outcome, detail), ErrWriteOutcomeUnknown (the COMMIT
	// was cut off; keeping it again is safe, it is deduplicated),
	// ErrUnavailable.
	KeepUnmatched(ctx context.Context, e UnmatchedEvent) (kept UnmatchedEvent, duplicate bool, err error)

	// Unmatched returns the newest limit events of the unmatched log, newest
	// first, and how many it keeps in all, read at one moment. Errors:
	// *ValidationError (limit outside 1..MaxOverviewLimit), ErrUnavailable.
	Unmatched(ctx context.Context, limit int) (events []UnmatchedEvent, total int64, err error)

	// Get returns a job with its history, a page of its observations, its
	// ledger row and the database's time, read at one moment. Errors:
	// *ValidationError, ErrNotFound.
	Get(ctx context.Context, p GetParams) (JobDetail, error)

	// ConfigureBudgets sets the providers' outbound budgets (R19), shared
	// through the database; Claim then grants no more of a provider's jobs
	// than its budget allows and returns *BudgetExhaustedError when due jobs
	// wait only on empty budgets.
	ConfigureBudgets(ctx context.Context, budgets map[string]BudgetConfig) error

	// List pages through jobs by the filters of p, walking the index its
	// lookup or state chooses (ListParams.Order), and counts the receipts on
	// file for the page's jobs. Errors: *ValidationError, ErrUnavailable.
	List(ctx context.Context, p ListParams) (JobPage, error)

	// Stats reads what operators watch (M1) from the database: counts of the
	// unfinished and manual_review jobs and the oldest unfinished one.
	Stats(ctx context.Context) (Stats, error)

	// RecentTakeovers returns the takeovers (EventTakenOver) among the
	// newest TakeoverWindow transitions of the history, newest first, at
	// most limit (M1: frequent ones point at pauses or short leases). Its
	// cost is bounded by the window, never by the history (Q3). Errors:
	// *ValidationError (limit outside 1..MaxOverviewLimit), ErrUnavailable.
	RecentTakeovers(ctx context.Context, limit int) ([]Event, error)

	// Budgets returns every provider's outbound budget (R19) with the calls
	// it allows at the database's now, by provider name; none when no
	// budget is configured. Errors: ErrUnavailable.
	Budgets(ctx context.Context) ([]BudgetLevel, error)

	// Cancel stops a refund (R32) as store.CancelParams.Cancel decides it,
	// in one transaction with its history entry. Errors: *ValidationError,
	// ErrNotFound, ErrNotEnqueuedByCaller, *FenceError (ErrStaleAttempt,
	// ErrNotCancellable), ErrWriteOutcomeUnknown, ErrUnavailable.
	Cancel(ctx context.Context, p CancelParams) (CancelResult, error)

	// Acknowledge takes a job off the attention list (R34) as
	// store.AcknowledgeParams.Acknowledge decides it; replayed when the same
	// acknowledgement was made. Errors: *ValidationError, ErrNotFound,
	// *FenceError (ErrStaleAttempt, ErrNotOnAttentionList),
	// ErrWriteOutcomeUnknown, ErrUnavailable.
	Acknowledge(ctx context.Context, p AcknowledgeParams) (job Job, replayed bool, err error)

	// Attention returns the head of the attention list (R34), longest
	// listed first, at most limit, and its length. Errors:
	// *ValidationError, ErrUnavailable.
	Attention(ctx context.Context, limit int) ([]Job, int64, error)

	// PauseProvider pauses a provider (R33): no claim of any coordinator
	// grants its jobs once that coordinator's RefreshPauses has seen it
	// (this store's claims at once); changed is false when it was paused
	// already (the first pause stands). ResumeProvider undoes it; changed
	// is false when it was not paused. Each change is kept in the pause
	// history. Errors: *ValidationError, ErrUnavailable.
	PauseProvider(ctx context.Context, p PauseParams) (pause Pause, changed bool, err error)
	ResumeProvider(ctx context.Context, p PauseParams) (changed bool, err error)

	// RefreshPauses reads the providers paused now, which become this
	// store's claims' filter (R33). Errors: ErrUnavailable.
	RefreshPauses(ctx context.Context) ([]Pause, error)

	// PauseEvents returns the newest pauses and resumes, newest first, at
	// most limit. Errors: *ValidationError, ErrUnavailable.
	PauseEvents(ctx context.Context, limit int) ([]PauseEvent, error)

	// Activity counts, per minute of the database's clock, the transitions
	// and receipts of the last p.Minutes minutes (store.Activity). It reads
	// an id range of the history and of the receipts, whose first id a few
	// lookups of the primary key find (ids grow with time), and aggregates
	// at most p.MaxRows rows of each: no index on time, and never the
	// history beyond the window (Q3). Errors: *ValidationError,
	// ErrUnavailable.
	Activity(ctx context.Context, p ActivityParams) (Activity, error)

	// Ping checks that the database answers, for health checks. Errors:
	// ErrUnavailable.
	Ping(ctx context.Context) error

	// Close releases the backend's connections.
	Close() error
}

// The bounds of a stored trace context (R35): a W3C traceparent of version
// 00 is 55 characters; a tracestate of up to 32 entries fits 512.
const (
	MaxTraceParentLen = 55
	MaxTraceStateLen  = 512
)

// TraceContext is the trace context p stores: the enqueue's, or none when
// the traceparent does not fit (a trace context never fails an enqueue),
// and no tracestate without a traceparent or when it does not fit.
func (p EnqueueParams) TraceContext() (parent, state string) {
	if p.TraceParent == "" || len(p.TraceParent) > MaxTraceParentLen {
		return "", ""
	}
	if len(p.TraceState) > MaxTraceStateLen {
		return p.TraceParent, ""
	}
	return p.TraceParent, p.TraceState
}

// SameRefund reports whether an existing job is the refund p describes: the
// same order, payment, amount, currency and provider (R1). The schedule
// (NotBefore) does not count.
func SameRefund(j Job, p EnqueueParams) bool {
	return j.OrderID == p.OrderID && j.PaymentID == p.PaymentID && j.AmountMinor == p.AmountMinor &&
		j.Currency == p.Currency && j.Provider == p.Provider
}

// Grant returns the job as a claim at the database time now leaves it, and
// the history entry of the claim (claimed, or taken_over from an expired
// lease). Backends use it to answer without reading the rows back; the SQL
// they run must set the same values.
// It mints the grant's lease token (R25).
func (p ClaimParams) Grant(job Job, now time.Time) (ClaimedJob, Event) {
	token := NewLeaseToken()
	job.Grant = token.Hash()
	from := job.State
	takeover := from == StateRunning
	if job.CancelRequested() {
		job.NextAction = ActionReconcile // R32: never refund once a cancel was requested
	}
	if !takeover && job.NextAction == ActionRefund && job.FirstSentAt.IsZero() {
		job.FirstSentAt = now // R22: the key may reach the provider from now on
	}
	if takeover {
		job.NextAction = ActionReconcile // R6
	}
	job.State = StateRunning
	job.Attempt++ // R2
	job.LeaseUntil = now.Add(p.Lease).Truncate(time.Microsecond)
	job.NextAttemptAt = job.LeaseUntil // see Job.NextAttemptAt
	job.WorkerID = p.WorkerID
	job.UpdatedAt = now
	kind := EventClaimed
	if takeover {
		kind = EventTakenOver
	}
	return ClaimedJob{Job: job, LeaseToken: token, Takeover: takeover}, Event{JobID: job.ID, Attempt: job.Attempt,
		Kind: kind, WorkerID: job.WorkerID, FromState: from, ToState: job.State, NextAction: job.NextAction,
		CreatedAt: now, Grant: job.Grant}
}

// ListParams filters and pages jobs for operators and customer service. All
// filters are optional and combine with AND. At most one of OrderID,
// PaymentID and ProviderRefundID: each is a lookup on its own index, which
// the listing walks (Order).
type ListParams struct {
	State    State
	Provider string
	// OrderID lists all refunds of one order, newest first (Q7).
	OrderID string
	// PaymentID lists all refunds of one payment, newest first.
	PaymentID string
	// ProviderRefundID lists the jobs whose refund has this provider id, or
	// that have a receipt naming it (R15), newest first.
	ProviderRefundID string
	// ReasonPrefix keeps the jobs whose last_reason starts with it, byte for
	// byte; CreatedAfter and CreatedBefore (zero: unbounded) keep those
	// created at or after CreatedAfter and before CreatedBefore. They filter
	// the walk of the index the other filters choose: their cost is bounded
	// by the rows that walk passes, never by the history.
	ReasonPrefix                string
	CreatedAfter, CreatedBefore time.Time
	// Attention lists the jobs on the attention list (R34), longest
	// listed first; no other filter goes with it.
	Attention bool
	// Limit is the page size, 1..MaxPageSize.
	Limit int
	// PageToken continues from a previous page (keyset pagination, never
	// OFFSET, Q4).
	PageToken string
}

// JobPage is one page of ListJobs.
type JobPage struct {
	Jobs []Job
	// NextPageToken continues the listing; empty on the last page.
	NextPageToken string
	// ObservationCounts counts the receipts on file (R15) per job of the
	// page; a job without any is absent.
	ObservationCounts map[int64]int64
}
