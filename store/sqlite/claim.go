package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	// R12, Q1: one cutoff per claim, from the database's clock.
	selectNow = `SELECT ` + nowMicros

	// R6, R23: expired leases, oldest first. INDEXED BY pins the partial
	// index: with a provider filter the planner would otherwise pick a wider
	// index and sort. No SKIP LOCKED in SQLite: the
	// claim's BEGIN IMMEDIATE holds the only write lock, so nothing read here
	// can be claimed by anyone else before this transaction commits (R13).
	selectExpiredLeases = `SELECT ` + jobColumns + ` FROM refund_jobs INDEXED BY ix_refund_jobs_lease
 WHERE state = 'running' AND lease_until <= ?%s
 ORDER BY lease_until, id
 LIMIT ?`

	// Q1, Q2, R23: ready and due, oldest first, stable by id (Q4).
	selectDueJobs = `SELECT ` + jobColumns + ` FROM refund_jobs INDEXED BY ix_refund_jobs_due
 WHERE state = 'ready' AND next_attempt_at <= ?%s
 ORDER BY next_attempt_at, id
 LIMIT ?`

	// R5, R6: bump attempt. The WHERE re-checks the conditions. SQLite
	// evaluates every SET expression against the row as it was before the
	// UPDATE (unlike MySQL, where later assignments see earlier ones), so
	// first_sent_at and next_action read the old state whatever their order.
	// Parameters: now, lease_until, worker_id, now, ids…, now, now.
	claimSelected = `UPDATE refund_jobs SET
  first_sent_at = CASE WHEN state = 'ready' AND next_action = 'refund' AND first_sent_at IS NULL
                       THEN ? ELSE first_sent_at END,
  next_action   = CASE WHEN state = 'running' THEN 'reconcile' ELSE next_action END,
  state         = 'running',
  attempt       = attempt + 1,
  lease_until   = ?,
  worker_id     = ?,
  updated_at    = ?
 WHERE id IN (%s)
   AND ((state = 'ready' AND next_attempt_at <= ?) OR (state = 'running' AND lease_until <= ?))`

	selectObservationsOf = `SELECT ` + observationColumns + ` FROM refund_observations
 WHERE job_id IN (%s) ORDER BY job_id, id`
)

// Claim implements store.Store.
//
// One short BEGIN IMMEDIATE transaction (R5, R11): read the database clock
// once, select expired leases and then due jobs under the write lock, bump
// them, record the history, COMMIT. Only a successful COMMIT grants anything;
// if its outcome is unknown nothing is granted and nothing is retried (R7). A
// busy write lock leaves nothing behind and is retried whole (R20).
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.ClaimedJob, error) {
	return s.base.Claim(ctx, p, func(tx *sql.Tx) ([]store.ClaimedJob, error) { return claimTx(ctx, tx, p) })
}

func claimTx(ctx context.Context, tx *sql.Tx, p store.ClaimParams) ([]store.ClaimedJob, error) {
	var now int64
	if err := tx.QueryRowContext(ctx, selectNow).Scan(&now); err != nil {
		return nil, err
	}
	filter, filterArgs := "", []any{}
	if p.Provider != "" {
		filter, filterArgs = " AND provider = ?", []any{p.Provider}
	}
	selectJobs := func(query string, limit int) ([]store.Job, error) {
		args := append(append([]any{now}, filterArgs...), limit)
		return sqlbase.QueryAll(ctx, tx, scanJob, fmt.Sprintf(query, filter), args...)
	}
	// R23: takeovers first, then due jobs, each group oldest first.
	selected, err := selectJobs(selectExpiredLeases, p.MaxJobs)
	if err != nil {
		return nil, err
	}
	if rest := p.MaxJobs - len(selected); rest > 0 {
		due, err := selectJobs(selectDueJobs, rest)
		if err != nil {
			return nil, err
		}
		selected = append(selected, due...)
	}
	if len(selected) == 0 {
		return nil, nil
	}

	nowTime := fromMicros(now)
	ids := make([]int64, len(selected))
	claimed := make([]store.ClaimedJob, len(selected))
	events := make([]store.Event, len(selected))
	for i, cur := range selected {
		ids[i] = cur.ID
		claimed[i], events[i] = p.Grant(cur, nowTime)
	}
	args := append([]any{now, toMicros(claimed[0].Job.LeaseUntil), p.WorkerID, now}, sqlbase.Int64Args(ids)...)
	args = append(args, now, now)
	res, err := tx.ExecContext(ctx, fmt.Sprintf(claimSelected, sqlbase.Placeholders(len(ids))), args...)
	if err != nil {
		return nil, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return nil, err
	} else if n != int64(len(ids)) {
		// Nothing else can write while this transaction holds the write lock;
		// a mismatch means the re-check failed. Grant nothing rather than guess.
		return nil, fmt.Errorf("claim: selected %d jobs but %d passed the re-check", len(ids), n)
	}
	if err := sqlbase.InsertHistory(ctx, tx, events, toMicros); err != nil {
		return nil, err
	}
	// R15: hand the receipts on file to the new holder. Read before COMMIT so
	// that a failure here grants nothing, rather than granting jobs the caller
	// never hears of.
	if err := sqlbase.AttachObservations(ctx, tx, claimed, selectObservationsOf, scanObservation); err != nil {
		return nil, err
	}
	return claimed, nil
}
