package sqlbase

import (
	"context"
	"fmt"
	"strings"
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

// Write implements store.Store.
func (b *Backend) Write(ctx context.Context, w store.Writeback) (store.WriteResult, error) {
	out := b.WriteMany(ctx, []store.Writeback{w})
	return out[0].Result, out[0].Err
}

// WriteMany implements store.Store: it validates ws and applies them in one
// transaction (writeTx), answering each write on its own (R9, R10, R21). If
// the COMMIT's outcome is unknown the rows are re-read (settleUnknown): a
// write that shows is done; one whose job still runs under its grant did not
// land and is written again, at most Tries times; the rest are settled
// against their rows (R20).
func (b *Backend) WriteMany(ctx context.Context, ws []store.Writeback) []store.WriteOutcome {
	out := make([]store.WriteOutcome, len(ws))
	pending := store.Valid(ws, func(i int, err error) { out[i].Err = err })
	for try := 1; len(pending) > 0; try++ {
		var plan store.BatchPlan
		err := b.InTx(ctx, func(tx Tx) error {
			var err error
			plan, err = b.writeTx(ctx, tx, ws, pending)
			return err
		})
		switch {
		case err == nil:
			for _, i := range pending {
				out[i] = plan.Outcome(i)
			}
			return out
		case IsCommitUnknown(err):
			pending = b.settleUnknown(ctx, ws, pending, out, err, try < Tries)
		default:
			for _, i := range pending {
				out[i].Err = b.Unavailable(err)
			}
			return out
		}
	}
	return out
}

// settleUnknown answers the writes ws[i], i in idx, of a transaction whose
// COMMIT outcome is unknown (cause), from their rows re-read once any
// transaction holding them has ended (LockedRead). It returns the writes to
// run again: those whose job still runs under their grant, when again.
func (b *Backend) settleUnknown(ctx context.Context, ws []store.Writeback, idx []int, out []store.WriteOutcome,
	cause error, again bool) []int {
	ids := store.JobIDs(ws, idx)
	var jobs []store.Job
	err := b.InTx(ctx, func(tx Tx) error {
		var err error
		jobs, err = QueryAll(ctx, tx, ScanJob, fmt.Sprintf(b.LockedRead, Placeholders(len(ids))), Int64Args(ids)...)
		return err
	})
	if err != nil {
		for _, i := range idx {
			out[i].Err = fmt.Errorf("%w: job %d attempt %d: %v (re-read: %v)",
				store.ErrWriteOutcomeUnknown, ws[i].JobID, ws[i].Attempt, cause, b.Unavailable(err))
		}
		return nil
	}
	current := make(map[int64]store.Job, len(jobs))
	for _, j := range jobs {
		current[j.ID] = j
	}
	if err := withArchived(ctx, b.DB, ids, current); err != nil {
		for _, i := range idx {
			out[i].Err = fmt.Errorf("%w: job %d attempt %d: %v (re-read: %v)",
				store.ErrWriteOutcomeUnknown, ws[i].JobID, ws[i].Attempt, cause, b.Unavailable(err))
		}
		return nil
	}
	var retry []int
	for _, i := range idx {
		w := ws[i]
		cur, ok := current[w.JobID]
		switch {
		case !ok:
			out[i].Err = store.ErrNotFound
		case w.AppliedTo(cur):
			out[i] = store.WriteOutcome{Result: store.WriteResult{Job: cur}} // the lost COMMIT landed
		case w.Fenced(cur) && again:
			retry = append(retry, i)
		default:
			res, err := store.Settle(w, cur)
			out[i] = store.WriteOutcome{Result: res, Err: err}
		}
	}
	return retry
}

// PlanWrites reads the rows of the jobs of ws[i], i in idx, with query (its
// %s takes the id placeholders, its first column is the database clock) and
// plans the batch against them (store.PlanBatch). It returns the plan and the
// clock.
func PlanWrites(ctx context.Context, tx Tx, query string, ws []store.Writeback, idx []int) (store.BatchPlan, time.Time, error) {
	ids := store.JobIDs(ws, idx)
	current, now, err := lockJobs(ctx, tx, query, ids)
	if err != nil {
		return store.BatchPlan{}, now, err
	}
	if err := withArchived(ctx, tx, ids, current); err != nil {
		return store.BatchPlan{}, now, err
	}
	return store.PlanBatch(ws, idx, current, now), now, nil
}

// withArchived adds to current the archived jobs among ids it lacks (R31):
// a late write to a job that left the working tables is answered as for
// the final job it is (a replay, STALE_ATTEMPT, JOB_NOT_RUNNING), never
// NOT_FOUND. An archived job never runs, so no plan writes to it.
func withArchived(ctx context.Context, q Querier, ids []int64, current map[int64]store.Job) error {
	var missing []int64
	for _, id := range ids {
		if _, ok := current[id]; !ok {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	gone, err := archivedJobs(ctx, q, missing)
	for id, j := range gone {
		current[id] = j
	}
	return err
}

// lockJobs reads the rows of the jobs ids with query (its %s takes the id
// placeholders, its first column is the database clock), by id, and the
// clock. Missing jobs are absent.
func lockJobs(ctx context.Context, tx Tx, query string, ids []int64) (map[int64]store.Job, time.Time, error) {
	var now time.Time
	jobs, err := QueryAll(ctx, tx, func(row Scanner) (store.Job, error) {
		return ScanJob(Prefixed{Row: row, First: []any{Time{&now}}})
	}, fmt.Sprintf(query, Placeholders(len(ids))), Int64Args(ids)...)
	if err != nil {
		return nil, now, err
	}
	current := make(map[int64]store.Job, len(jobs))
	for _, j := range jobs {
		current[j.ID] = j
	}
	return current, now, nil
}

// writeKind is one fenced UPDATE of a batch: the rows of every write of its
// kind, each set to its own values.
type writeKind struct {
	match func(store.Writeback) bool
	set   string // the SET clauses every row shares; each ? is the database's now
	from  store.State
	cols  []string
	vals  func(w store.Writeback, after store.Job) []any // after: the row as the plan leaves it
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
		// next_attempt_at: when it completed, no longer its lease end (store.Job).
		{ofKind(store.EventCompleted), "state = 'succeeded', lease_until = NULL, next_attempt_at = ?, updated_at = ?",
			store.StateRunning,
			[]string{"provider_refund_id"}, func(w store.Writeback, _ store.Job) []any {
				return []any{w.ProviderRefundID}
			}, true},
		{ofKind(store.EventRescheduled), "state = 'ready', lease_until = NULL, updated_at = ?", store.StateRunning,
			[]string{"next_action", "next_attempt_at", "last_reason"}, func(w store.Writeback, after store.Job) []any {
				return []any{w.NextAction, at(after.NextAttemptAt), w.Reason} // R28: due now when ExpeditedBy
			}, true},
		// next_attempt_at: when the job entered review, so that a listing of
		// the reviews by state shows the longest waiting first.
		{ofKind(store.EventEscalated), "state = 'manual_review', lease_until = NULL, next_attempt_at = ?, updated_at = ?",
			store.StateRunning, []string{"last_reason"}, func(w store.Writeback, _ store.Job) []any {
				return []any{w.Reason}
			}, true},
		// next_attempt_at: when it was resolved, its completion (the
		// archive's retention counts from it, R31).
		{resolvedAs(store.ResolutionRefunded), "state = 'succeeded', next_attempt_at = ?, updated_at = ?", store.StateManualReview,
			[]string{"provider_refund_id", "last_reason"}, func(w store.Writeback, _ store.Job) []any {
				return []any{w.ProviderRefundID, w.Reason}
			}, false},
		// next_attempt_at: when it was cancelled, the archive's walk (R31).
		{resolvedAs(store.ResolutionCancelled), "state = 'cancelled', next_attempt_at = ?, updated_at = ?",
			store.StateManualReview, []string{"last_reason"}, func(w store.Writeback, _ store.Job) []any {
				return []any{w.Reason}
			}, false},
		{resolvedAs(store.ResolutionReconcile), "state = 'ready', next_action = 'reconcile', updated_at = ?",
			store.StateManualReview, []string{"next_attempt_at", "last_reason"}, func(w store.Writeback, after store.Job) []any {
				return []any{at(after.NextAttemptAt), w.Reason}
			}, false},
	}
}

// listTooLate puts on the attention list the jobs of the plan's
// completions whose cancel was requested (R32, R34): the provider had the
// refund. A statement of its own, run only when there are any, so that the
// completions of every other job pay nothing for it.
func (b *Backend) listTooLate(ctx context.Context, tx Tx, ws []store.Writeback, plan store.BatchPlan) error {
	for _, i := range plan.Applied(ofKind(store.EventCompleted)) {
		after := plan.After[i]
		if !after.CancelRequested() {
			continue
		}
		if _, err := tx.ExecContext(ctx, setAttention, b.At(after.AttentionSince), after.AttentionReason, ws[i].JobID); err != nil {
			return err
		}
	}
	return nil
}

// writeTx runs the writes ws[i], i in idx, in tx: it locks their rows and
// reads the database clock (R12), plans them against the rows
// (store.PlanBatch), applies the plan with one fenced UPDATE per kind of
// write, by primary key only, records the refunds in the ledger (R10) and
// appends the history (R3). Each UPDATE must match every row the plan let
// through; anything else rolls the batch back.
func (b *Backend) writeTx(ctx context.Context, tx Tx, ws []store.Writeback, idx []int) (store.BatchPlan, error) {
	plan, now, err := PlanWrites(ctx, tx, b.SQL.LockForWrite, ws, idx)
	if err != nil || len(plan.Apply) == 0 {
		return plan, err
	}
	for _, k := range writeKinds(b.At) {
		applied := plan.Applied(k.match)
		if len(applied) == 0 {
			continue
		}
		fixed := make([]any, strings.Count(k.set, "?"))
		for i := range fixed {
			fixed[i] = b.At(now)
		}
		u := RowUpdate{Table: b.SQL.UpdateTable, Fixed: k.set, FixedArgs: fixed,
			Where: "state = ?", WhereArgs: []any{k.from}, Cols: k.cols}
		for _, i := range applied {
			u.IDs = append(u.IDs, ws[i].JobID)
			u.Fences = append(u.Fences, ws[i].Attempt)
			if k.holder {
				u.Grants = append(u.Grants, ws[i].Grant())
			}
			u.Vals = append(u.Vals, k.vals(ws[i], plan.After[i]))
		}
		if err := u.ExecAll(ctx, tx, "write-back"); err != nil {
			return plan, err
		}
	}
	if err := b.listTooLate(ctx, tx, ws, plan); err != nil {
		return plan, err
	}
	if refunded := store.JobIDs(ws, plan.Applied(store.Writeback.Ledgered)); len(refunded) > 0 {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(insertLedger, Placeholders(len(refunded))), Int64Args(refunded)...); err != nil {
			return plan, err
		}
	}
	return plan, InsertHistory(ctx, tx, plan.Events, b.At)
}
