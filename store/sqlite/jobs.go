package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	// next_attempt_at is always set (DESIGN.md, Columns): the caller's
	// not_before, else the database's now.
	insertJob = `INSERT INTO refund_jobs
  (operation_key, order_id, payment_id, amount_minor, currency, provider,
   state, attempt, next_action, next_attempt_at, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, 'ready', 0, 'refund', COALESCE(?, ` + nowMicros + `), ` + nowMicros + `, ` + nowMicros + `)
RETURNING ` + jobColumns

	// insertEventFromJob records the transition the job row now shows; the
	// caller names the kind, the state it came from and the reason.
	insertEventFromJob = `INSERT INTO refund_job_events
  (job_id, attempt, kind, worker_id, from_state, to_state, next_action, provider_refund_id, reason, created_at)
SELECT id, attempt, ?, worker_id, ?, state, next_action, COALESCE(provider_refund_id, ''), ?, updated_at
  FROM refund_jobs WHERE id = ?`

	selectJobByID   = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id = ?`
	selectJobByKey  = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE operation_key = ?`
	selectJobsByIDs = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id IN (%s)`
	selectEvents    = `SELECT ` + eventColumns + ` FROM refund_job_events WHERE job_id = ? ORDER BY id`
	selectJobObs    = `SELECT ` + observationColumns + ` FROM refund_observations WHERE job_id = ? ORDER BY id`
)

// Enqueue implements store.Store.
func (s *Store) Enqueue(ctx context.Context, p store.EnqueueParams) (store.Job, bool, error) {
	insert := func(tx *sql.Tx) (store.Job, error) {
		job, err := scanJob(tx.QueryRowContext(ctx, insertJob,
			p.OperationKey, p.OrderID, p.PaymentID, p.AmountMinor, p.Currency, p.Provider, toMicros(p.NotBefore)))
		if err != nil {
			return job, err
		}
		_, err = tx.ExecContext(ctx, insertEventFromJob, store.EventEnqueued, "", "", job.ID)
		return job, err
	}
	byKey := func(key string) (store.Job, error) { return s.jobByRef(ctx, store.JobRef{OperationKey: key}) }
	return s.EnqueueWith(ctx, p, insert, byKey)
}

// Get implements store.Store. The job, its history and its observations are
// read in one transaction, so they show one moment.
func (s *Store) Get(ctx context.Context, ref store.JobRef) (store.JobDetail, error) {
	if err := ref.Validate(); err != nil {
		return store.JobDetail{}, err
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true}) // a deferred BEGIN: takes no write lock
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	job, err := jobByRef(ctx, tx, ref)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	d := store.JobDetail{Job: job}
	d.Events, err = sqlbase.QueryAll(ctx, tx, scanEvent, selectEvents, job.ID)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	d.Observations, err = sqlbase.QueryAll(ctx, tx, scanObservation, selectJobObs, job.ID)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	return d, nil
}

// jobByRef reads one job outside any transaction. Errors: ErrNotFound,
// ErrUnavailable.
func (s *Store) jobByRef(ctx context.Context, ref store.JobRef) (store.Job, error) {
	job, err := jobByRef(ctx, s.db, ref)
	return job, unavailable(err)
}

type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// jobByRef reads one job by id or, when the id is zero, by operation key.
// Errors: ErrNotFound, or the driver's error as is (InTx retries on it).
func jobByRef(ctx context.Context, q rowQuerier, ref store.JobRef) (store.Job, error) {
	var row *sql.Row
	if ref.ID != 0 {
		row = q.QueryRowContext(ctx, selectJobByID, ref.ID)
	} else {
		row = q.QueryRowContext(ctx, selectJobByKey, ref.OperationKey)
	}
	job, err := scanJob(row)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, store.ErrNotFound
	}
	return job, err
}
