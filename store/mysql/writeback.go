package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// The fenced write-backs (R9). A batch of writes is joined to the job rows on
// id AND attempt AND state: only rows still running under the writer's
// attempt (or, for an operator's resolution, still in manual_review under the
// attempt the operator looked at) change. None looks at lease_until (R8:
// expiry only opens the competition; the takeover's COMMIT is the moment of
// loss).
//
// Each UPDATE reaches its rows by primary key only (FORCE INDEX (PRIMARY)):
// with few running rows the optimizer may otherwise walk ix_refund_jobs_due
// or ix_refund_jobs_lease on state = 'running' and lock every entry it
// passes, which deadlocked with concurrent claims granting other jobs.
const (
	// Locks the batch's rows in id order (two batches never wait on each other
	// in a cycle) and reads the database's clock (R12).
	lockJobsForWrite = `SELECT UTC_TIMESTAMP(6), ` + jobColumns + ` FROM refund_jobs
 WHERE id IN (%s) ORDER BY id FOR UPDATE`

	completeFenced = `UPDATE refund_jobs j FORCE INDEX (PRIMARY)
  JOIN (%s) w ON j.id = w.id AND j.attempt = w.attempt AND j.state = 'running'
   SET j.state = 'succeeded', j.provider_refund_id = w.provider_refund_id, j.lease_until = NULL, j.updated_at = ?`
	completeRow = `SELECT ? AS id, ? AS attempt, ? AS provider_refund_id`

	rescheduleFenced = `UPDATE refund_jobs j FORCE INDEX (PRIMARY)
  JOIN (%s) w ON j.id = w.id AND j.attempt = w.attempt AND j.state = 'running'
   SET j.state = 'ready', j.next_action = w.next_action, j.next_attempt_at = w.next_attempt_at,
       j.lease_until = NULL, j.last_reason = w.reason, j.updated_at = ?`
	rescheduleRow = `SELECT ? AS id, ? AS attempt, ? AS next_action, ? AS next_attempt_at, ? AS reason`

	escalateFenced = `UPDATE refund_jobs j FORCE INDEX (PRIMARY)
  JOIN (%s) w ON j.id = w.id AND j.attempt = w.attempt AND j.state = 'running'
   SET j.state = 'manual_review', j.lease_until = NULL, j.last_reason = w.reason, j.updated_at = ?`
	escalateRow = `SELECT ? AS id, ? AS attempt, ? AS reason`

	resolveRefundedFenced = `UPDATE refund_jobs j FORCE INDEX (PRIMARY)
  JOIN (%s) w ON j.id = w.id AND j.attempt = w.attempt AND j.state = 'manual_review'
   SET j.state = 'succeeded', j.provider_refund_id = w.provider_refund_id, j.last_reason = w.reason, j.updated_at = ?`
	resolveRefundedRow = `SELECT ? AS id, ? AS attempt, ? AS provider_refund_id, ? AS reason`

	resolveReconcileFenced = `UPDATE refund_jobs j FORCE INDEX (PRIMARY)
  JOIN (%s) w ON j.id = w.id AND j.attempt = w.attempt AND j.state = 'manual_review'
   SET j.state = 'ready', j.next_action = 'reconcile', j.next_attempt_at = w.next_attempt_at,
       j.last_reason = w.reason, j.updated_at = ?`
	resolveReconcileRow = `SELECT ? AS id, ? AS attempt, ? AS next_attempt_at, ? AS reason`

	// R10: our own record of each refund, in the same transaction as the
	// fenced completions.
	insertLedger = `INSERT INTO refund_ledger
  (job_id, operation_key, provider, provider_refund_id, amount_minor, currency, attempt, recorded_at)
SELECT id, operation_key, provider, provider_refund_id, amount_minor, currency, attempt, updated_at
  FROM refund_jobs WHERE id IN (%s)`

	// Waits for a transaction still holding the rows, so that a COMMIT cut off
	// in flight has settled before we read its outcome (R20).
	selectJobsLocked = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id IN (%s) LOCK IN SHARE MODE`
)

func writeTx(ctx context.Context, tx *sql.Tx, ws []store.Writeback, idx []int) (store.BatchPlan, error) {
	plan, now, err := sqlbase.PlanWrites(ctx, tx, lockJobsForWrite, scanJob, ws, idx)
	if err != nil {
		return plan, err
	}
	if len(plan.Apply) == 0 {
		return plan, nil
	}
	kind := func(k store.EventKind) func(store.Writeback) bool {
		return func(w store.Writeback) bool { return w.Kind == k }
	}
	resolved := func(r store.Resolution) func(store.Writeback) bool {
		return func(w store.Writeback) bool { return w.Kind == store.EventResolved && w.Resolution == r }
	}
	updates := []struct {
		match  func(store.Writeback) bool
		update string
		row    string
		args   func(store.Writeback) []any
	}{
		{kind(store.EventCompleted), completeFenced, completeRow, func(w store.Writeback) []any {
			return []any{w.JobID, w.Attempt, w.ProviderRefundID}
		}},
		{kind(store.EventRescheduled), rescheduleFenced, rescheduleRow, func(w store.Writeback) []any {
			return []any{w.JobID, w.Attempt, w.NextAction, w.NextAttemptAt(now), w.Reason}
		}},
		{kind(store.EventEscalated), escalateFenced, escalateRow, func(w store.Writeback) []any {
			return []any{w.JobID, w.Attempt, w.Reason}
		}},
		{resolved(store.ResolutionRefunded), resolveRefundedFenced, resolveRefundedRow, func(w store.Writeback) []any {
			return []any{w.JobID, w.Attempt, w.ProviderRefundID, w.Reason}
		}},
		{resolved(store.ResolutionReconcile), resolveReconcileFenced, resolveReconcileRow, func(w store.Writeback) []any {
			return []any{w.JobID, w.Attempt, now, w.Reason}
		}},
	}
	for _, u := range updates {
		applied := plan.Applied(u.match)
		if len(applied) == 0 {
			continue
		}
		selects := make([]string, len(applied))
		var args []any
		for n, i := range applied {
			selects[n] = u.row
			args = append(args, u.args(ws[i])...)
		}
		args = append(args, now)
		res, err := tx.ExecContext(ctx, fmt.Sprintf(u.update, strings.Join(selects, " UNION ALL ")), args...)
		if err != nil {
			return plan, err
		}
		if n, err := res.RowsAffected(); err != nil {
			return plan, err
		} else if n != int64(len(applied)) {
			// The rows are locked by this transaction and passed the fence
			// when read; anything else is a bug, not a race. Write nothing.
			return plan, fmt.Errorf("write-back: %d writes passed the fence but %d rows matched", len(applied), n)
		}
	}
	if refunded := store.JobIDs(ws, plan.Applied(store.Writeback.Ledgered)); len(refunded) > 0 {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(insertLedger, sqlbase.Placeholders(len(refunded))), sqlbase.Int64Args(refunded)...); err != nil {
			return plan, err
		}
	}
	if err := sqlbase.InsertHistory(ctx, tx, plan.Events, asDatetime); err != nil {
		return plan, err
	}
	return plan, nil
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

// asDatetime stores a time in a DATETIME(6) column.
func asDatetime(t time.Time) any { return t }
