package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jobfence/jobfence/store"
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
	if err := p.Validate(); err != nil {
		return store.Job{}, false, err
	}
	var notBefore any
	if !p.NotBefore.IsZero() {
		notBefore = p.NotBefore.UTC()
	}
	var job store.Job
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, insertJob,
			p.OperationKey, p.OrderID, p.PaymentID, p.AmountMinor, p.Currency, p.Provider, notBefore)
		if err != nil {
			return err
		}
		id, err := res.LastInsertId()
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, insertEventFromJob, store.EventEnqueued, "", "", id); err != nil {
			return err
		}
		job, err = scanJob(tx.QueryRowContext(ctx, selectJobByID, id))
		return err
	})
	var unknown *errCommitUnknown
	switch {
	case err == nil:
		return job, true, nil
	case isDuplicate(err):
		// R1: the key exists; same refund → the existing job, else a conflict.
		existing, err := s.jobByRef(ctx, store.JobRef{OperationKey: p.OperationKey})
		if err != nil {
			return store.Job{}, false, err
		}
		if !store.SameRefund(existing, p) {
			return existing, false, fmt.Errorf("%w: %s", store.ErrKeyConflict, p.OperationKey)
		}
		return existing, false, nil
	case errors.As(err, &unknown):
		return store.Job{}, false, fmt.Errorf("%w: enqueue %s: %v", store.ErrWriteOutcomeUnknown, p.OperationKey, err)
	default:
		return store.Job{}, false, unavailable(err)
	}
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
	d.Events, err = queryAll(ctx, s.db, scanEvent, selectEvents, job.ID)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	d.Observations, err = queryAll(ctx, s.db, scanObservation, selectJobObs, job.ID)
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
