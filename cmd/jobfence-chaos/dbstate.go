package main

import (
	"context"
	"database/sql"
	"time"
)

// The rows the checks read, straight from MariaDB.
type (
	jobRow struct {
		ID               int64
		Key              string
		State            string
		Attempt          int64
		NextAction       string
		NextAttemptAt    time.Time
		LeaseUntil       sql.NullTime
		ProviderRefundID string
		LastReason       string
		// FirstSentAt is when the job's operation key could first have
		// reached the provider (its first claim to refund, R22); NULL for
		// one never sent.
		FirstSentAt sql.NullTime
	}
	eventRow struct {
		ID               int64
		JobID            int64
		Attempt          int64
		Kind             string
		WorkerID         string
		FromState        string
		ToState          string
		NextAction       string
		ProviderRefundID string
		// Grant is the fingerprint of the event's lease_token_hash (R25):
		// lowercase hex of its first 6 bytes, as workers log it; "" for none.
		// On claimed and taken_over the new grant, on a holder's write-back
		// the grant the writer carried.
		Grant string
		// Reason is the event's reason: a coordinator's hand-back of a
		// grant it could not deliver says so there (handBackReasons).
		Reason string
		// At is created_at, on the database's clock (R12).
		At time.Time
	}
	observationRow struct {
		ID               int64
		JobID            int64
		Key              string
		ReportedAttempt  int64
		JobAttempt       int64
		Source           string
		Outcome          string
		ProviderRefundID string
		// ProviderEventID is the provider's event id of a webhook's receipt
		// (a charge.refunded event's id, ':' and the refund's, per refund it
		// lists); "" for a worker's.
		ProviderEventID string
	}
	// unmatchedRow is a verified provider event that named no job
	// (refund_unmatched_events, R28).
	unmatchedRow struct {
		ID               int64
		Provider         string
		ProviderEventID  string
		EventType        string
		ProviderRefundID string
		Key              string
		Outcome          string
	}
	ledgerRow struct {
		JobID            int64
		Key              string
		ProviderRefundID string
		Attempt          int64
	}
)

// dbState is everything the checks read from the database, in one
// read-only snapshot.
type dbState struct {
	// Now is the database's clock when the snapshot was read, ReadAt the
	// campaign's then: ReadAt - Now takes a history's time to the clock of
	// the campaign's timeline.
	Now, ReadAt  time.Time
	Jobs         []jobRow
	Events       []eventRow
	Observations []observationRow
	Ledger       []ledgerRow
	Unmatched    []unmatchedRow
	// Tokens: the history keeps each grant's lease_token_hash (R25), so
	// every claim and takeover must carry one.
	Tokens bool
}

// readDB reads the campaign's tables in one read-only, repeatable-read
// transaction. Errors: the database's.
func readDB(ctx context.Context, db *sql.DB) (dbState, error) {
	var st dbState
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return st, err
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	before := time.Now()
	if err := tx.QueryRowContext(ctx, `SELECT UTC_TIMESTAMP(6)`).Scan(&st.Now); err != nil {
		return st, err
	}
	st.ReadAt = before.Add(time.Since(before) / 2)
	err = scanRows(ctx, tx, `SELECT id, operation_key, state, attempt, next_action, next_attempt_at, lease_until,
  COALESCE(provider_refund_id, ''), last_reason, first_sent_at FROM refund_jobs ORDER BY id`, func(r *sql.Rows) error {
		var j jobRow
		err := r.Scan(&j.ID, &j.Key, &j.State, &j.Attempt, &j.NextAction, &j.NextAttemptAt, &j.LeaseUntil,
			&j.ProviderRefundID, &j.LastReason, &j.FirstSentAt)
		st.Jobs = append(st.Jobs, j)
		return err
	})
	if err != nil {
		return st, err
	}
	// A database from before R25 has no lease_token_hash: its grants have no
	// fingerprint.
	var tokenCols int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
  AND TABLE_NAME = 'refund_job_events' AND COLUMN_NAME = 'lease_token_hash'`).Scan(&tokenCols); err != nil {
		return st, err
	}
	grant := "''"
	st.Tokens = tokenCols > 0
	if st.Tokens {
		grant = "LOWER(HEX(LEFT(lease_token_hash, 6)))"
	}
	err = scanRows(ctx, tx, `SELECT id, job_id, attempt, kind, worker_id, from_state, to_state, next_action,
  provider_refund_id, `+grant+`, reason, created_at FROM refund_job_events ORDER BY id`, func(r *sql.Rows) error {
		var e eventRow
		err := r.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.WorkerID, &e.FromState, &e.ToState, &e.NextAction,
			&e.ProviderRefundID, &e.Grant, &e.Reason, &e.At)
		st.Events = append(st.Events, e)
		return err
	})
	if err != nil {
		return st, err
	}
	err = scanRows(ctx, tx, `SELECT id, job_id, operation_key, reported_attempt, job_attempt, source, outcome,
  provider_refund_id, provider_event_id FROM refund_observations ORDER BY id`, func(r *sql.Rows) error {
		var o observationRow
		err := r.Scan(&o.ID, &o.JobID, &o.Key, &o.ReportedAttempt, &o.JobAttempt, &o.Source, &o.Outcome, &o.ProviderRefundID,
			&o.ProviderEventID)
		st.Observations = append(st.Observations, o)
		return err
	})
	if err != nil {
		return st, err
	}
	err = scanRows(ctx, tx, `SELECT job_id, operation_key, provider_refund_id, attempt FROM refund_ledger ORDER BY job_id`,
		func(r *sql.Rows) error {
			var l ledgerRow
			err := r.Scan(&l.JobID, &l.Key, &l.ProviderRefundID, &l.Attempt)
			st.Ledger = append(st.Ledger, l)
			return err
		})
	if err != nil {
		return st, err
	}
	err = scanRows(ctx, tx, `SELECT id, provider, provider_event_id, event_type, provider_refund_id, operation_key, outcome
  FROM refund_unmatched_events ORDER BY id`, func(r *sql.Rows) error {
		var u unmatchedRow
		err := r.Scan(&u.ID, &u.Provider, &u.ProviderEventID, &u.EventType, &u.ProviderRefundID, &u.Key, &u.Outcome)
		st.Unmatched = append(st.Unmatched, u)
		return err
	})
	return st, err
}

func scanRows(ctx context.Context, tx *sql.Tx, query string, scan func(*sql.Rows) error) error {
	rows, err := tx.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
