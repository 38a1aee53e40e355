package mysql

import (
	"context"
	"fmt"
	"time"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// The fenced write-backs (R9). A batch of writes changes the job rows by id
// where attempt and state still match (sqlbase.RowUpdate): only rows still
// running under the writer's attempt (or, for an operator's resolution, still
// in manual_review under the attempt the operator looked at) change. None looks at lease_until (R8:
// expiry only opens the competition; the takeover's COMMIT is the moment of
// loss).
const (
	// Locks the batch's rows in id order (two batches never wait on each other
	// in a cycle) and reads the database's clock (R12).
	lockJobsForWrite = `SELECT UTC_TIMESTAMP(6), ` + jobColumns + ` FROM refund_jobs
 WHERE id IN (%s) ORDER BY id FOR UPDATE`

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

func writeTx(ctx context.Context, tx sqlbase.Tx, ws []store.Writeback, idx []int) (store.BatchPlan, error) {
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
	// Each kind is one UPDATE of its rows, by primary key only: with few
	// running rows the optimizer may otherwise walk ix_refund_jobs_due or
	// ix_refund_jobs_lease on state and lock every entry it passes, which
	// deadlocked with concurrent claims.
	updates := []struct {
		match func(store.Writeback) bool
		set   string // shared SET clauses; their one ? is the database's now
		from  store.State
		cols  []string
		vals  func(store.Writeback) []any
	}{
		{kind(store.EventCompleted), "state = 'succeeded', lease_until = NULL, updated_at = ?", store.StateRunning,
			[]string{"provider_refund_id"}, func(w store.Writeback) []any { return []any{w.ProviderRefundID} }},
		{kind(store.EventRescheduled), "state = 'ready', lease_until = NULL, updated_at = ?", store.StateRunning,
			[]string{"next_action", "next_attempt_at", "last_reason"}, func(w store.Writeback) []any {
				return []any{w.NextAction, w.NextAttemptAt(now), w.Reason}
			}},
		{kind(store.EventEscalated), "state = 'manual_review', lease_until = NULL, updated_at = ?", store.StateRunning,
			[]string{"last_reason"}, func(w store.Writeback) []any { return []any{w.Reason} }},
		{resolved(store.ResolutionRefunded), "state = 'succeeded', updated_at = ?", store.StateManualReview,
			[]string{"provider_refund_id", "last_reason"}, func(w store.Writeback) []any {
				return []any{w.ProviderRefundID, w.Reason}
			}},
		{resolved(store.ResolutionReconcile), "state = 'ready', next_action = 'reconcile', updated_at = ?",
			store.StateManualReview, []string{"next_attempt_at", "last_reason"}, func(w store.Writeback) []any {
				return []any{now, w.Reason}
			}},
	}
	for _, k := range updates {
		applied := plan.Applied(k.match)
		if len(applied) == 0 {
			continue
		}
		u := sqlbase.RowUpdate{Table: "refund_jobs FORCE INDEX (PRIMARY)", Fixed: k.set, FixedArgs: []any{now},
			Where: "state = ?", WhereArgs: []any{k.from}, Cols: k.cols}
		for _, i := range applied {
			u.IDs = append(u.IDs, ws[i].JobID)
			u.Fences = append(u.Fences, ws[i].Attempt)
			u.Vals = append(u.Vals, k.vals(ws[i]))
		}
		if err := u.ExecAll(ctx, tx, "write-back"); err != nil {
			return plan, err
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
