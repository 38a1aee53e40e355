package mysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	insertJob = `INSERT INTO refund_jobs
  (operation_key, order_id, payment_id, amount_minor, currency, provider,
   state, attempt, next_action, next_attempt_at, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, 'ready', 0, 'refund', COALESCE(?, UTC_TIMESTAMP(6)), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`

	// insertEventFromJob records the transition the job row now shows; the
	// caller names the kind, the state it came from and the reason.
	insertEventFromJob = `INSERT INTO refund_job_events
  (job_id, attempt, kind, worker_id, from_state, to_state, next_action, provider_refund_id, reason, created_at)
SELECT id, attempt, ?, worker_id, ?, state, next_action, COALESCE(provider_refund_id, ''), ?, updated_at
  FROM refund_jobs WHERE id = ?`

	selectJobByID  = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id = ?`
	selectJobByKey = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE operation_key = ?`
	selectEvents   = `SELECT ` + eventColumns + ` FROM refund_job_events WHERE job_id = ? ORDER BY id`
	selectJobObs   = `SELECT ` + observationColumns + ` FROM refund_observations WHERE job_id = ? ORDER BY id`
)

// Enqueue implements store.Store.
func (s *Store) Enqueue(ctx context.Context, p store.EnqueueParams) (store.Job, bool, error) {
	var notBefore any
	if !p.NotBefore.IsZero() {
		notBefore = p.NotBefore.UTC()
	}
	insert := func(tx *sql.Tx) (store.Job, error) {
		res, err := tx.ExecContext(ctx, insertJob,
			p.OperationKey, p.OrderID, p.PaymentID, p.AmountMinor, p.Currency, p.Provider, notBefore)
		if err != nil {
			return store.Job{}, err
		}
		id, err := res.LastInsertId()
		if err != nil {
			return store.Job{}, err
		}
		if _, err := tx.ExecContext(ctx, insertEventFromJob, store.EventEnqueued, "", "", id); err != nil {
			return store.Job{}, err
		}
		return scanJob(tx.QueryRowContext(ctx, selectJobByID, id))
	}
	byKey := func(key string) (store.Job, error) { return s.jobByRef(ctx, store.JobRef{OperationKey: key}) }
	return s.EnqueueWith(ctx, p, insert, byKey)
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, ref store.JobRef) (store.JobDetail, error) {
	if err := ref.Validate(); err != nil {
		return store.JobDetail{}, err
	}
	job, err := s.jobByRef(ctx, ref)
	if err != nil {
		return store.JobDetail{}, err
	}
	d := store.JobDetail{Job: job}
	d.Events, err = sqlbase.QueryAll(ctx, s.db, scanEvent, selectEvents, job.ID)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	d.Observations, err = sqlbase.QueryAll(ctx, s.db, scanObservation, selectJobObs, job.ID)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	return d, nil
}

// jobByRef reads one job without locking it.
func (s *Store) jobByRef(ctx context.Context, ref store.JobRef) (store.Job, error) {
	var row *sql.Row
	if ref.ID != 0 {
		row = s.db.QueryRowContext(ctx, selectJobByID, ref.ID)
	} else {
		row = s.db.QueryRowContext(ctx, selectJobByKey, ref.OperationKey)
	}
	job, err := scanJob(row)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, store.ErrNotFound
	}
	return job, unavailable(err)
}
