package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jobfence/jobfence/store"
)

// The fenced write-backs (R9). Each matches only the row that is still running
// under the caller's attempt; none looks at lease_until (R8: expiry only opens
// the competition, the takeover's COMMIT is the moment of loss).
const (
	completeFenced = `UPDATE refund_jobs
   SET state = 'succeeded', provider_refund_id = ?, lease_until = NULL, updated_at = UTC_TIMESTAMP(6)
 WHERE id = ? AND state = 'running' AND attempt = ?`

	rescheduleFenced = `UPDATE refund_jobs
   SET state = 'ready', next_action = ?, lease_until = NULL, last_reason = ?, updated_at = UTC_TIMESTAMP(6),
       next_attempt_at = COALESCE(?, TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)))
 WHERE id = ? AND state = 'running' AND attempt = ?`

	escalateFenced = `UPDATE refund_jobs
   SET state = 'manual_review', lease_until = NULL, last_reason = ?, updated_at = UTC_TIMESTAMP(6)
 WHERE id = ? AND state = 'running' AND attempt = ?`

	// R10: our own record of the refund, in the same transaction as the fenced
	// completion.
	insertLedger = `INSERT INTO refund_ledger
  (job_id, operation_key, provider, provider_refund_id, amount_minor, currency, attempt, recorded_at)
SELECT id, operation_key, provider, provider_refund_id, amount_minor, currency, attempt, updated_at
  FROM refund_jobs WHERE id = ?`

	// Waits for a transaction still holding the row, so that a COMMIT cut off in
	// flight has settled before we read its outcome (R20).
	selectJobLocked = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id = ? LOCK IN SHARE MODE`
)

// errNoRow rolls back a write-back whose fenced update matched no row.
var errNoRow = errors.New("fenced update matched no row")

// Write implements store.Store.
//
// The fenced UPDATE, the ledger row (Complete) and the history entry share one
// transaction on one connection (R10). On 0 rows it rolls back and re-reads
// the row to tell a replay from a stale or conflicting write (R10, R21). If the
// COMMIT's reply is lost it re-reads the row under a lock to learn whether the
// write landed (R20).
func (s *Store) Write(ctx context.Context, w store.Writeback) (store.WriteResult, error) {
	if err := w.Validate(); err != nil {
		return store.WriteResult{}, err
	}
	for try := 1; ; try++ {
		var job store.Job
		err := s.inTx(ctx, func(tx *sql.Tx) error {
			var err error
			job, err = writeTx(ctx, tx, w)
			return err
		})
		var unknown *errCommitUnknown
		switch {
		case err == nil:
			return store.WriteResult{Job: job}, nil
		case errors.Is(err, errNoRow):
			current, err := s.readLocked(ctx, w.JobID)
			if err != nil {
				return store.WriteResult{}, err
			}
			return store.Settle(w, current)
		case errors.As(err, &unknown):
			current, rerr := s.readLocked(ctx, w.JobID)
			if rerr != nil {
				return store.WriteResult{}, fmt.Errorf("%w: job %d attempt %d: %v (re-read: %v)",
					store.ErrWriteOutcomeUnknown, w.JobID, w.Attempt, err, rerr)
			}
			if w.AppliedTo(current) {
				return store.WriteResult{Job: current}, nil // our COMMIT landed
			}
			if current.State == store.StateRunning && current.Attempt == w.Attempt && try < maxTries {
				continue // it did not land and nothing else happened: write again
			}
			return store.Settle(w, current)
		default:
			return store.WriteResult{}, unavailable(err)
		}
	}
}

func writeTx(ctx context.Context, tx *sql.Tx, w store.Writeback) (store.Job, error) {
	var res sql.Result
	var err error
	switch w.Kind {
	case store.EventCompleted:
		res, err = tx.ExecContext(ctx, completeFenced, w.ProviderRefundID, w.JobID, w.Attempt)
	case store.EventRescheduled:
		var at any
		if !w.At.IsZero() {
			at = w.At.UTC()
		}
		res, err = tx.ExecContext(ctx, rescheduleFenced, w.NextAction, w.Reason, at, w.Delay.Microseconds(), w.JobID, w.Attempt)
	case store.EventEscalated:
		res, err = tx.ExecContext(ctx, escalateFenced, w.Reason, w.JobID, w.Attempt)
	}
	if err != nil {
		return store.Job{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return store.Job{}, err
	}
	if n != 1 {
		return store.Job{}, errNoRow
	}
	if w.Kind == store.EventCompleted {
		if _, err := tx.ExecContext(ctx, insertLedger, w.JobID); err != nil {
			return store.Job{}, err
		}
	}
	if _, err := tx.ExecContext(ctx, insertEventFromJob, w.Kind, store.StateRunning, w.Reason, w.JobID); err != nil {
		return store.Job{}, err
	}
	return scanJob(tx.QueryRowContext(ctx, selectJobByID, w.JobID))
}

// readLocked re-reads a job in its own short transaction, waiting for any
// transaction that still holds the row.
func (s *Store) readLocked(ctx context.Context, id int64) (store.Job, error) {
	var job store.Job
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		job, err = scanJob(tx.QueryRowContext(ctx, selectJobLocked, id))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, store.ErrNotFound
	}
	return job, unavailable(err)
}

// ExpireLease implements store.Store.
func (s *Store) ExpireLease(ctx context.Context, jobID int64) error {
	res, err := s.db.ExecContext(ctx, expireLease, jobID)
	if err != nil {
		return unavailable(err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return unavailable(err)
	} else if n == 1 {
		return nil
	}
	if _, err := s.jobByRef(ctx, store.JobRef{ID: jobID}); err != nil {
		return err
	}
	return fmt.Errorf("%w: job %d", store.ErrNotRunning, jobID)
}

const expireLease = `UPDATE refund_jobs SET lease_until = TIMESTAMPADD(MICROSECOND, -1, UTC_TIMESTAMP(6))
 WHERE id = ? AND state = 'running'`
