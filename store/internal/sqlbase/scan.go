package sqlbase

import (
	"database/sql"

	"github.com/jobfence/jobfence/store"
)

// The tables' column lists, in the order the scan functions read them.
const (
	JobColumns = `id, operation_key, order_id, payment_id, amount_minor, currency, provider,
  state, attempt, next_action, next_attempt_at, lease_until, provider_refund_id,
  worker_id, last_reason, first_sent_at, created_at, updated_at, lease_token_hash, evidence_at,
  cancel_requested_at, attention_since, attention_reason, traceparent, tracestate`
	EventColumns = `id, job_id, attempt, kind, worker_id, from_state, to_state, next_action,
  provider_refund_id, reason, created_at, lease_token_hash`
	ObservationColumns = `id, job_id, operation_key, reported_attempt, job_attempt, source, outcome,
  provider_refund_id, provider_event_id, detail, created_at, attempt_verified, reporter`
	UnmatchedColumns = `id, provider, provider_event_id, event_type, provider_refund_id, operation_key, outcome,
  detail, received_at`
)

// ScanJob reads a row of JobColumns. Times scan through Time, so the one
// function reads MySQL's DATETIME and SQLite's INTEGER microseconds alike.
func ScanJob(row Scanner) (store.Job, error) {
	var j store.Job
	var refundID sql.NullString
	err := row.Scan(&j.ID, &j.OperationKey, &j.OrderID, &j.PaymentID, &j.AmountMinor, &j.Currency, &j.Provider,
		&j.State, &j.Attempt, &j.NextAction, Time{&j.NextAttemptAt}, Time{&j.LeaseUntil}, &refundID,
		&j.WorkerID, &j.LastReason, Time{&j.FirstSentAt}, Time{&j.CreatedAt}, Time{&j.UpdatedAt}, &j.Grant, Time{&j.EvidenceAt},
		Time{&j.CancelRequestedAt}, Time{&j.AttentionSince}, &j.AttentionReason, &j.TraceParent, &j.TraceState)
	j.ProviderRefundID = refundID.String
	return j, err
}

// ScanEvent reads a row of EventColumns.
func ScanEvent(row Scanner) (store.Event, error) {
	var e store.Event
	err := row.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.WorkerID, &e.FromState, &e.ToState, &e.NextAction,
		&e.ProviderRefundID, &e.Reason, Time{&e.CreatedAt}, &e.Grant)
	return e, err
}

// ScanObservation reads a row of ObservationColumns.
func ScanObservation(row Scanner) (store.Observation, error) {
	var o store.Observation
	err := row.Scan(&o.ID, &o.JobID, &o.OperationKey, &o.ReportedAttempt, &o.JobAttempt, &o.Source, &o.Outcome,
		&o.ProviderRefundID, &o.ProviderEventID, &o.Detail, Time{&o.CreatedAt}, &o.AttemptVerified, &o.Reporter)
	return o, err
}

// ScanUnmatched reads a row of UnmatchedColumns.
func ScanUnmatched(row Scanner) (store.UnmatchedEvent, error) {
	var e store.UnmatchedEvent
	err := row.Scan(&e.ID, &e.Provider, &e.ProviderEventID, &e.EventType, &e.ProviderRefundID, &e.OperationKey,
		&e.Outcome, &e.Detail, Time{&e.ReceivedAt})
	return e, err
}
