package sqlite

import (
	"context"
	"database/sql"

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

// R19: provider budgets, shared by every coordinator on the database.
const (
	selectAllBudgets = `SELECT provider, tokens, rate, burst, refilled_at FROM provider_budgets`
	lockBudgets      = `SELECT provider, tokens, rate, burst, refilled_at FROM provider_budgets
 WHERE provider IN (%s) ORDER BY provider`
)

var claimSQL = sqlbase.ClaimSQL{
	Now:             selectNow,
	ExpiredLeases:   selectExpiredLeases,
	DueJobs:         selectDueJobs,
	Grant:           claimSelected,
	Observations:    selectObservationsOf,
	AllBudgets:      selectAllBudgets,
	Budgets:         lockBudgets,
	At:              toMicros,
	ScanJob:         scanJob,
	ScanObservation: scanObservation,
}

// Claim implements store.Store.
//
// One short BEGIN IMMEDIATE transaction (R5, R11): read the database clock
// once, select expired leases and then due jobs under the write lock, bump
// them, record the history, COMMIT. Only a successful COMMIT grants anything;
// if its outcome is unknown nothing is granted and nothing is retried (R7). A
// busy write lock leaves nothing behind and is retried whole (R20).
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.ClaimedJob, error) {
	return s.base.Claim(ctx, p, func(tx *sql.Tx) ([]store.ClaimedJob, error) {
		return sqlbase.ClaimTx(ctx, tx, claimSQL, p, s.budgeted.Load())
	})
}

// ConfigureBudgets implements store.Store.
func (s *Store) ConfigureBudgets(ctx context.Context, cfg map[string]store.BudgetConfig) error {
	any, err := s.base.ConfigureBudgets(ctx, claimSQL, cfg)
	if err == nil {
		s.budgeted.Store(any)
	}
	return err
}
