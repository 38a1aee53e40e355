package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jobfence/jobfence/store"
)

// The fenced write-backs (R9). Each matches only the row that is still running
// under the caller's attempt; none looks at lease_until (R8: expiry only opens
// the competition, the takeover's COMMIT is the moment of loss). RETURNING
// reads the row back as written; no row returned means no transition
// happened.
const (
	completeFenced = `UPDATE refund_jobs
   SET state = 'succeeded', provider_refund_id = ?, lease_until = NULL, updated_at = ` + nowMicros + `
 WHERE id = ? AND state = 'running' AND attempt = ?
RETURNING ` + jobColumns

	// next_attempt_at: the caller's absolute time, else now plus the delay in
	// microseconds; the same now as updated_at (one statement, one clock read).
	rescheduleFenced = `UPDATE refund_jobs
   SET state = 'ready', next_action = ?, lease_until = NULL, last_reason = ?, updated_at = ` + nowMicros + `,
       next_attempt_at = COALESCE(?, ` + nowMicros + ` + ?)
 WHERE id = ? AND state = 'running' AND attempt = ?
RETURNING ` + jobColumns

	escalateFenced = `UPDATE refund_jobs
   SET state = 'manual_review', lease_until = NULL, last_reason = ?, updated_at = ` + nowMicros + `
 WHERE id = ? AND state = 'running' AND attempt = ?
RETURNING ` + jobColumns

	// R10: our own record of the refund, in the same transaction as the fenced
	// completion.
	insertLedger = `INSERT INTO refund_ledger
  (job_id, operation_key, provider, provider_refund_id, amount_minor, currency, attempt, recorded_at)
SELECT id, operation_key, provider, provider_refund_id, amount_minor, currency, attempt, updated_at
  FROM refund_jobs WHERE id = ?`

	// R8: only opens the job to takeover; a microsecond in the past so that a
	// claim in the same millisecond already sees it expired.
	expireLease = `UPDATE refund_jobs SET lease_until = ` + nowMicros + ` - 1
 WHERE id = ? AND state = 'running'`
)

// errNoRow rolls back a write-back whose fenced update matched no row.
var errNoRow = errors.New("fenced update matched no row")

// Write implements store.Store.
//
// The fenced UPDATE, the ledger row (Complete) and the history entry share one
// transaction (R10). On 0 rows it rolls back and re-reads the row to tell a
// replay from a stale or conflicting write (R10, R21). If the COMMIT's outcome
// is unknown it re-reads the row under the write lock to learn whether the
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
	var row *sql.Row
	switch w.Kind {
	case store.EventCompleted:
		row = tx.QueryRowContext(ctx, completeFenced, w.ProviderRefundID, w.JobID, w.Attempt)
	case store.EventRescheduled:
		row = tx.QueryRowContext(ctx, rescheduleFenced, w.NextAction, w.Reason, toMicros(w.At), w.Delay.Microseconds(),
			w.JobID, w.Attempt)
	case store.EventEscalated:
		row = tx.QueryRowContext(ctx, escalateFenced, w.Reason, w.JobID, w.Attempt)
	default:
		return store.Job{}, fmt.Errorf("write-back kind %q", w.Kind) // Validate rules this out
	}
	job, err := scanJob(row)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, errNoRow
	}
	if err != nil {
		return store.Job{}, err
	}
	if w.Kind == store.EventCompleted {
		if _, err := tx.ExecContext(ctx, insertLedger, w.JobID); err != nil {
			return store.Job{}, err
		}
	}
	if _, err := tx.ExecContext(ctx, insertEventFromJob, w.Kind, store.StateRunning, w.Reason, w.JobID); err != nil {
		return store.Job{}, err
	}
	return job, nil
}

// readLocked re-reads a job in its own BEGIN IMMEDIATE transaction: it waits
// for any writer, in this process or another, to finish, so a COMMIT whose
// outcome was unknown has settled before its outcome is read.
func (s *Store) readLocked(ctx context.Context, id int64) (store.Job, error) {
	var job store.Job
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		job, err = scanJob(tx.QueryRowContext(ctx, selectJobByID, id))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, store.ErrNotFound
	}
	return job, unavailable(err)
}

// ExpireLease implements store.Store.
func (s *Store) ExpireLease(ctx context.Context, jobID int64) error {
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, expireLease, jobID)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return unavailable(err)
	}
	if n == 1 {
		return nil
	}
	if _, err := s.jobByRef(ctx, store.JobRef{ID: jobID}); err != nil {
		return err
	}
	return fmt.Errorf("%w: job %d", store.ErrNotRunning, jobID)
}
