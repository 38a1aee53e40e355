package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// The fenced write-backs (R9). Each matches only the row that is still running
// under the caller's attempt; none looks at lease_until (R8: expiry only opens
// the competition, the takeover's COMMIT is the moment of loss). now is the
// clock read at the start of the batch's transaction (R12).
const (
	selectNowAndJobs = `SELECT ` + nowMicros + `, ` + jobColumns + ` FROM refund_jobs WHERE id IN (%s)`

	completeFenced = `UPDATE refund_jobs
   SET state = 'succeeded', provider_refund_id = ?, lease_until = NULL, updated_at = ?
 WHERE id = ? AND state = 'running' AND attempt = ?`

	rescheduleFenced = `UPDATE refund_jobs
   SET state = 'ready', next_action = ?, next_attempt_at = ?, lease_until = NULL, last_reason = ?, updated_at = ?
 WHERE id = ? AND state = 'running' AND attempt = ?`

	escalateFenced = `UPDATE refund_jobs
   SET state = 'manual_review', lease_until = NULL, last_reason = ?, updated_at = ?
 WHERE id = ? AND state = 'running' AND attempt = ?`

	// An operator's resolution, fenced by the attempt the operator looked at.
	resolveRefundedFenced = `UPDATE refund_jobs
   SET state = 'succeeded', provider_refund_id = ?, last_reason = ?, updated_at = ?
 WHERE id = ? AND state = 'manual_review' AND attempt = ?`

	resolveReconcileFenced = `UPDATE refund_jobs
   SET state = 'ready', next_action = 'reconcile', next_attempt_at = ?, last_reason = ?, updated_at = ?
 WHERE id = ? AND state = 'manual_review' AND attempt = ?`

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

func writeTx(ctx context.Context, tx sqlbase.Tx, ws []store.Writeback, idx []int) (store.BatchPlan, error) {
	plan, nowTime, err := sqlbase.PlanWrites(ctx, tx, selectNowAndJobs, scanJob, ws, idx)
	if err != nil {
		return plan, err
	}
	now := nowTime.UnixMicro()
	for _, i := range plan.Apply {
		w := ws[i]
		var res sql.Result
		switch w.Kind {
		case store.EventCompleted:
			res, err = tx.ExecContext(ctx, completeFenced, w.ProviderRefundID, now, w.JobID, w.Attempt)
		case store.EventRescheduled:
			res, err = tx.ExecContext(ctx, rescheduleFenced, w.NextAction, toMicros(w.NextAttemptAt(nowTime)), w.Reason, now,
				w.JobID, w.Attempt)
		case store.EventEscalated:
			res, err = tx.ExecContext(ctx, escalateFenced, w.Reason, now, w.JobID, w.Attempt)
		case store.EventResolved:
			if w.Resolution == store.ResolutionRefunded {
				res, err = tx.ExecContext(ctx, resolveRefundedFenced, w.ProviderRefundID, w.Reason, now, w.JobID, w.Attempt)
			} else {
				res, err = tx.ExecContext(ctx, resolveReconcileFenced, now, w.Reason, now, w.JobID, w.Attempt)
			}
		}
		if err != nil {
			return plan, err
		}
		if n, err := res.RowsAffected(); err != nil {
			return plan, err
		} else if n != 1 {
			// Nothing else writes while this transaction holds the write
			// lock, and the row passed the fence when read: a bug, not a race.
			return plan, fmt.Errorf("write-back: job %d passed the fence but %d rows matched", w.JobID, n)
		}
		if w.Ledgered() {
			if _, err := tx.ExecContext(ctx, insertLedger, w.JobID); err != nil {
				return plan, err
			}
		}
	}
	if err := sqlbase.InsertHistory(ctx, tx, plan.Events, toMicros); err != nil {
		return plan, err
	}
	return plan, nil
}

// ExpireLease implements store.Store.
func (s *Store) ExpireLease(ctx context.Context, jobID int64) error {
	var n int64
	err := s.InTx(ctx, func(tx sqlbase.Tx) error {
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
