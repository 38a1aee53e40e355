package sqlbase

import (
	"context"
	"fmt"
	"time"

	"github.com/jobfence/jobfence/store"
)

// The fenced write-backs (R9, R25). A batch of writes changes the job rows by
// id where attempt, lease token and state still match (RowUpdate): only rows
// still running under the writer's grant (or, for an operator's resolution,
// still in manual_review under the attempt the operator looked at) change.
// None looks at lease_until (R8: expiry only opens the competition; the
// takeover's COMMIT is the moment of loss).

// insertLedger is our own record of each refund, in the same transaction as
// the fenced completions (R10).
const insertLedger = `INSERT INTO refund_ledger
  (job_id, operation_key, provider, provider_refund_id, amount_minor, currency, attempt, recorded_at)
SELECT id, operation_key, provider, provider_refund_id, amount_minor, currency, attempt, updated_at
  FROM refund_jobs WHERE id IN (%s)`

// writeKind is one fenced UPDATE of a batch: the rows of every write of its
// kind, each set to its own values.
type writeKind struct {
	match func(store.Writeback) bool
	set   string // the SET clauses every row shares; their one ? is the database's now
	from  store.State
	cols  []string
	vals  func(w store.Writeback, now time.Time) []any
	// holder: the writes are a grant holder's, fenced by its lease token
	// (R25); an operator's resolution is not.
	holder bool
}

func ofKind(k store.EventKind) func(store.Writeback) bool {
	return func(w store.Writeback) bool { return w.Kind == k }
}

func resolvedAs(r store.Resolution) func(store.Writeback) bool {
	return func(w store.Writeback) bool { return w.Kind == store.EventResolved && w.Resolution == r }
}

// writeKinds are the statements of a batch, one per kind of write; each must
// set what store.Writeback.Apply answers with.
func writeKinds(at func(time.Time) any) []writeKind {
	return []writeKind{
		{ofKind(store.EventCompleted), "state = 'succeeded', lease_until = NULL, updated_at = ?", store.StateRunning,
			[]string{"provider_refund_id"}, func(w store.Writeback, _ time.Time) []any {
				return []any{w.ProviderRefundID}
			}, true},
		{ofKind(store.EventRescheduled), "state = 'ready', lease_until = NULL, updated_at = ?", store.StateRunning,
			[]string{"next_action", "next_attempt_at", "last_reason"}, func(w store.Writeback, now time.Time) []any {
				return []any{w.NextAction, at(w.NextAttemptAt(now)), w.Reason}
			}, true},
		{ofKind(store.EventEscalated), "state = 'manual_review', lease_until = NULL, updated_at = ?", store.StateRunning,
			[]string{"last_reason"}, func(w store.Writeback, _ time.Time) []any { return []any{w.Reason} }, true},
		{resolvedAs(store.ResolutionRefunded), "state = 'succeeded', updated_at = ?", store.StateManualReview,
			[]string{"provider_refund_id", "last_reason"}, func(w store.Writeback, _ time.Time) []any {
				return []any{w.ProviderRefundID, w.Reason}
			}, false},
		{resolvedAs(store.ResolutionReconcile), "state = 'ready', next_action = 'reconcile', updated_at = ?",
			store.StateManualReview, []string{"next_attempt_at", "last_reason"}, func(w store.Writeback, now time.Time) []any {
				return []any{at(now), w.Reason}
			}, false},
	}
}

// writeTx runs the writes ws[i], i in idx, in tx: it locks their rows and
// reads the database clock (R12), plans them against the rows
// (store.PlanBatch), applies the plan with one fenced UPDATE per kind of
// write, by primary key only, records the refunds in the ledger (R10) and
// appends the history (R3). Each UPDATE must match every row the plan let
// through; anything else rolls the batch back.
func (b *Backend) writeTx(ctx context.Context, tx Tx, ws []store.Writeback, idx []int) (store.BatchPlan, error) {
	q := b.Claims
	plan, now, err := PlanWrites(ctx, tx, q.LockForWrite, q.ScanJob, ws, idx)
	if err != nil || len(plan.Apply) == 0 {
		return plan, err
	}
	for _, k := range writeKinds(q.At) {
		applied := plan.Applied(k.match)
		if len(applied) == 0 {
			continue
		}
		u := RowUpdate{Table: q.UpdateTable, Fixed: k.set, FixedArgs: []any{q.At(now)},
			Where: "state = ?", WhereArgs: []any{k.from}, Cols: k.cols}
		for _, i := range applied {
			u.IDs = append(u.IDs, ws[i].JobID)
			u.Fences = append(u.Fences, ws[i].Attempt)
			if k.holder {
				u.Grants = append(u.Grants, ws[i].Grant())
			}
			u.Vals = append(u.Vals, k.vals(ws[i], now))
		}
		if err := u.ExecAll(ctx, tx, "write-back"); err != nil {
			return plan, err
		}
	}
	if refunded := store.JobIDs(ws, plan.Applied(store.Writeback.Ledgered)); len(refunded) > 0 {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(insertLedger, Placeholders(len(refunded))), Int64Args(refunded)...); err != nil {
			return plan, err
		}
	}
	return plan, InsertHistory(ctx, tx, plan.Events, q.At)
}
