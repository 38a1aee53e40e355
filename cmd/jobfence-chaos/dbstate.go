package main

import (
	"context"
	"database/sql"
	"fmt"
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
		// ArchivedAt is when the job left the working tables for
		// refund_jobs_archive (R31); NULL for one still in refund_jobs.
		ArchivedAt sql.NullTime
		// CancelRequestedAt is when a cancel was requested of the job,
		// which may have been sent (R32); AttentionSince and
		// AttentionReason put it on the attention list (R34). NULL and ""
		// when not, or on a database from before them.
		CancelRequestedAt, AttentionSince sql.NullTime
		AttentionReason                   string
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
		// Archived: read from refund_job_events_archive (R31).
		Archived bool
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
		// Archived: read from refund_observations_archive (R31).
		Archived bool
	}
	// keyRow is an operation key on file for ever (refund_operation_keys,
	// R30): the job it made and the refund it was enqueued for; FinalState
	// and ArchivedAt are set by the archive as the job leaves.
	keyRow struct {
		Key                                string
		JobID                              int64
		Order, Payment, Currency, Provider string
		AmountMinor                        int64
		FinalState                         sql.NullString
		ArchivedAt                         sql.NullTime
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
	// pauseEventRow is a provider paused or resumed (provider_pause_events,
	// R33), on the database's clock.
	pauseEventRow struct {
		ID       int64
		Provider string
		Action   string // "paused" or "resumed"
		Actor    string
		Reason   string
		At       time.Time
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
	// Retention: the database keeps the archive and the key table (R30,
	// R31). Jobs, Events and Observations are then the working tables'
	// rows and the archive's together, in id order, each marked where it
	// was read; Keys is refund_operation_keys.
	Retention bool
	Keys      []keyRow
	// Control: the database keeps cancels, pauses and the attention list
	// (R32-R34); PauseEvents are its pauses and resumes, in id order.
	Control     bool
	PauseEvents []pauseEventRow
}

// readDB reads the campaign's tables in one read-only, repeatable-read
// transaction: the jobs, their histories and their receipts from the
// working tables and the archive together (R31), and the key table (R30).
// Errors: the database's.
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
	// A database from before R30 and R31 has no archive and no key table.
	var archiveTables int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()
  AND TABLE_NAME IN ('refund_operation_keys', 'refund_jobs_archive', 'refund_job_events_archive',
  'refund_observations_archive')`).Scan(&archiveTables); err != nil {
		return st, err
	}
	st.Retention = archiveTables == 4
	// Nor one from before R32-R34 the cancels, pauses and attention list.
	var controlTables int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()
  AND TABLE_NAME = 'provider_pause_events'`).Scan(&controlTables); err != nil {
		return st, err
	}
	st.Control = controlTables == 1
	control := "NULL, NULL, ''"
	if st.Control {
		control = "cancel_requested_at, attention_since, attention_reason"
	}
	err = scanRows(ctx, tx, withArchive(st.Retention, `SELECT id, operation_key, state, attempt, next_action,
  next_attempt_at, lease_until, COALESCE(provider_refund_id, ''), last_reason, first_sent_at, `+control+`, %s
  FROM refund_jobs%s`, "NULL", "archived_at"), func(r *sql.Rows) error {
		var j jobRow
		err := r.Scan(&j.ID, &j.Key, &j.State, &j.Attempt, &j.NextAction, &j.NextAttemptAt, &j.LeaseUntil,
			&j.ProviderRefundID, &j.LastReason, &j.FirstSentAt, &j.CancelRequestedAt, &j.AttentionSince,
			&j.AttentionReason, &j.ArchivedAt)
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
	err = scanRows(ctx, tx, withArchive(st.Retention, `SELECT id, job_id, attempt, kind, worker_id, from_state, to_state,
  next_action, provider_refund_id, `+grant+`, reason, created_at, %s FROM refund_job_events%s`, "FALSE", "TRUE"),
		func(r *sql.Rows) error {
			var e eventRow
			err := r.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.WorkerID, &e.FromState, &e.ToState, &e.NextAction,
				&e.ProviderRefundID, &e.Grant, &e.Reason, &e.At, &e.Archived)
			st.Events = append(st.Events, e)
			return err
		})
	if err != nil {
		return st, err
	}
	err = scanRows(ctx, tx, withArchive(st.Retention, `SELECT id, job_id, operation_key, reported_attempt, job_attempt,
  source, outcome, provider_refund_id, provider_event_id, %s FROM refund_observations%s`, "FALSE", "TRUE"),
		func(r *sql.Rows) error {
			var o observationRow
			err := r.Scan(&o.ID, &o.JobID, &o.Key, &o.ReportedAttempt, &o.JobAttempt, &o.Source, &o.Outcome,
				&o.ProviderRefundID, &o.ProviderEventID, &o.Archived)
			st.Observations = append(st.Observations, o)
			return err
		})
	if err != nil {
		return st, err
	}
	if st.Retention {
		err = scanRows(ctx, tx, `SELECT operation_key, job_id, order_id, payment_id, currency, provider, amount_minor,
  final_state, archived_at FROM refund_operation_keys ORDER BY operation_key`, func(r *sql.Rows) error {
			var k keyRow
			err := r.Scan(&k.Key, &k.JobID, &k.Order, &k.Payment, &k.Currency, &k.Provider, &k.AmountMinor, &k.FinalState,
				&k.ArchivedAt)
			st.Keys = append(st.Keys, k)
			return err
		})
		if err != nil {
			return st, err
		}
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
	if err != nil || !st.Control {
		return st, err
	}
	err = scanRows(ctx, tx, `SELECT id, provider, action, actor, reason, created_at FROM provider_pause_events ORDER BY id`,
		func(r *sql.Rows) error {
			var p pauseEventRow
			err := r.Scan(&p.ID, &p.Provider, &p.Action, &p.Actor, &p.Reason, &p.At)
			st.PauseEvents = append(st.PauseEvents, p)
			return err
		})
	return st, err
}

// withArchive makes query, a SELECT of a working table whose first %s is
// the column that tells where a row was read and whose second follows the
// table's name, read the rows of that table and of its archive together,
// in id order (R31: the archive has the same columns), or the working
// table's alone where the database keeps no archive. live and archived are
// the column's value in each.
func withArchive(retention bool, query, live, archived string) string {
	q := fmt.Sprintf(query, live, "")
	if retention {
		q += "\nUNION ALL\n" + fmt.Sprintf(query, archived, "_archive")
	}
	return q + "\nORDER BY id"
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
