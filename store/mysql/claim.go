package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	// R12: one cutoff per claim, from the database's clock.
	selectNow = `SELECT UTC_TIMESTAMP(6)`

	// R6, R23: expired leases, oldest first. SKIP LOCKED lets concurrent
	// claimers pass each other (R13); the lock is what grants, not the read.
	lockExpiredLeases = `SELECT ` + jobColumns + ` FROM refund_jobs FORCE INDEX (ix_refund_jobs_lease)
 WHERE state = 'running' AND lease_until <= ?%s
 ORDER BY lease_until, id
 LIMIT ?
 FOR UPDATE SKIP LOCKED`

	// Q1, Q2, R23: ready and due, oldest first, stable by id (Q4). FORCE
	// INDEX keeps the (state, next_attempt_at, id) walk even with a provider
	// filter, whose own index would mean a sort of all that provider's rows.
	lockDueJobs = `SELECT ` + jobColumns + ` FROM refund_jobs FORCE INDEX (ix_refund_jobs_due)
 WHERE state = 'ready' AND next_attempt_at <= ?%s
 ORDER BY next_attempt_at, id
 LIMIT ?
 FOR UPDATE SKIP LOCKED`

	// R5, R6: bump attempt under the row locks taken above. The WHERE re-checks
	// the conditions. Assignment order matters on MySQL (left to right, later
	// ones see earlier results): first_sent_at and next_action read the old
	// state before state is overwritten. The values are those of
	// store.ClaimParams.Grant, which answers the caller without a read-back.
	claimLocked = `UPDATE refund_jobs SET
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
// One short transaction on one connection (R5, R11): read the database clock,
// lock expired leases and due jobs with SKIP LOCKED, bump them, record the
// history, COMMIT. Only a successful COMMIT grants anything; if its outcome is
// unknown nothing is granted and nothing is retried (R7). Deadlocks and
// lock-wait timeouts roll everything back and are retried whole (R20).
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.ClaimedJob, error) {
	return s.base.Claim(ctx, p, func(tx *sql.Tx) ([]store.ClaimedJob, error) { return claimTx(ctx, tx, p) })
}

func claimTx(ctx context.Context, tx *sql.Tx, p store.ClaimParams) ([]store.ClaimedJob, error) {
	var now time.Time
	if err := tx.QueryRowContext(ctx, selectNow).Scan(&now); err != nil {
		return nil, err
	}
	filter, filterArgs := "", []any{}
	if p.Provider != "" {
		filter, filterArgs = " AND provider = ?", []any{p.Provider}
	}
	lock := func(query string, limit int) ([]store.Job, error) {
		args := append(append([]any{now}, filterArgs...), limit)
		return sqlbase.QueryAll(ctx, tx, scanJob, fmt.Sprintf(query, filter), args...)
	}
	// R23: takeovers first, then due jobs, each group oldest first.
	locked, err := lock(lockExpiredLeases, p.MaxJobs)
	if err != nil {
		return nil, err
	}
	if rest := p.MaxJobs - len(locked); rest > 0 {
		due, err := lock(lockDueJobs, rest)
		if err != nil {
			return nil, err
		}
		locked = append(locked, due...)
	}
	if len(locked) == 0 {
		return nil, nil
	}

	ids := make([]int64, len(locked))
	claimed := make([]store.ClaimedJob, len(locked))
	events := make([]store.Event, len(locked))
	for i, cur := range locked {
		ids[i] = cur.ID
		claimed[i], events[i] = p.Grant(cur, now)
	}
	args := append([]any{now, claimed[0].Job.LeaseUntil, p.WorkerID, now}, sqlbase.Int64Args(ids)...)
	args = append(args, now, now)
	res, err := tx.ExecContext(ctx, fmt.Sprintf(claimLocked, sqlbase.Placeholders(len(ids))), args...)
	if err != nil {
		return nil, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return nil, err
	} else if n != int64(len(ids)) {
		// The rows are locked by this transaction; a mismatch means the
		// re-check failed. Grant nothing rather than guess which.
		return nil, fmt.Errorf("claim: locked %d jobs but %d passed the re-check", len(ids), n)
	}
	if err := sqlbase.InsertHistory(ctx, tx, events, asDatetime); err != nil {
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
