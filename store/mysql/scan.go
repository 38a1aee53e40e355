package mysql

import (
	"context"
	"database/sql"
	"time"

	"github.com/jobfence/jobfence/store"
)

const jobColumns = `id, operation_key, order_id, payment_id, amount_minor, currency, provider,
  state, attempt, next_action, next_attempt_at, lease_until, provider_refund_id,
  worker_id, last_reason, first_sent_at, created_at, updated_at`

const eventColumns = `id, job_id, attempt, kind, worker_id, from_state, to_state, next_action,
  provider_refund_id, reason, created_at`

const observationColumns = `id, job_id, operation_key, reported_attempt, job_attempt, source, outcome,
  provider_refund_id, provider_event_id, detail, created_at`

type scanner interface{ Scan(dest ...any) error }

func scanJob(row scanner) (store.Job, error) {
	var j store.Job
	var lease, firstSent sql.NullTime
	var refundID sql.NullString
	err := row.Scan(&j.ID, &j.OperationKey, &j.OrderID, &j.PaymentID, &j.AmountMinor, &j.Currency, &j.Provider,
		&j.State, &j.Attempt, &j.NextAction, &j.NextAttemptAt, &lease, &refundID,
		&j.WorkerID, &j.LastReason, &firstSent, &j.CreatedAt, &j.UpdatedAt)
	j.LeaseUntil = nullTime(lease)
	j.FirstSentAt = nullTime(firstSent)
	j.ProviderRefundID = refundID.String
	return j, err
}

func scanEvent(row scanner) (store.Event, error) {
	var e store.Event
	err := row.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.WorkerID, &e.FromState, &e.ToState, &e.NextAction,
		&e.ProviderRefundID, &e.Reason, &e.CreatedAt)
	return e, err
}

func scanObservation(row scanner) (store.Observation, error) {
	var o store.Observation
	err := row.Scan(&o.ID, &o.JobID, &o.OperationKey, &o.ReportedAttempt, &o.JobAttempt, &o.Source, &o.Outcome,
		&o.ProviderRefundID, &o.ProviderEventID, &o.Detail, &o.CreatedAt)
	return o, err
}

func nullTime(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// queryAll runs query and scans every row with scan.
func queryAll[T any](ctx context.Context, q querier, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// prefixed scans a leading extra column (the database clock) into *first and
// the rest as usual.
type prefixed struct {
	row   scanner
	first *time.Time
}

func (p prefixed) Scan(dest ...any) error { return p.row.Scan(append([]any{p.first}, dest...)...) }
