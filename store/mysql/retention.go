package mysql

import (
	"context"

	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// retention is this backend's SQL of the archive (R31). The archiver walks
// ix_refund_jobs_due under state 'succeeded', where a succeeded job's
// next_attempt_at is its completion (store.Job.NextAttemptAt): oldest
// completions first, the cost of the walk the batch's own. The purge
// backlog is InnoDB's history list length: deletes only delete-mark rows
// until the purge threads catch up, and scans slow down behind them.
var retention = sqlbase.RetentionStatements{
	ForUpdate:    " FOR UPDATE",
	InsertIgnore: "INSERT IGNORE",
	ArchiveCandidates: `SELECT id FROM refund_jobs FORCE INDEX (ix_refund_jobs_due)
 WHERE state = 'succeeded' AND next_attempt_at <= ? AND attention_since IS NULL AND cancel_requested_at IS NULL ORDER BY next_attempt_at, id LIMIT ?`,
	CancelledCandidates: `SELECT id FROM refund_jobs FORCE INDEX (ix_refund_jobs_due)
 WHERE state = 'cancelled' AND next_attempt_at <= ? AND attention_since IS NULL AND cancel_requested_at IS NULL ORDER BY next_attempt_at, id LIMIT ?`,
	OldestSucceeded: `SELECT MIN(next_attempt_at) FROM refund_jobs FORCE INDEX (ix_refund_jobs_due)
 WHERE state = 'succeeded' AND attention_since IS NULL AND cancel_requested_at IS NULL`,
	PurgeBacklog: `SELECT count FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'`,
}

// keysCompleteVersion is the contract migration after which every
// coordinator on the database writes the keys it enqueues (R30).
const keysCompleteVersion = 13

const selectKeysComplete = `SELECT COUNT(*) FROM jobfence_schema_migrations WHERE version = ?`

// ArchiveAllowed reports whether the archive may move jobs out of the
// working tables: once the contract migration 0013 is applied. Until then a
// coordinator of an earlier release may still run on the database, and it
// knows keys only by refund_jobs: it would enqueue an archived key again
// (R30). Errors: ErrUnavailable.
func (s *Store) ArchiveAllowed(ctx context.Context) (bool, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, selectKeysComplete, keysCompleteVersion).Scan(&n); err != nil {
		return false, unavailable(err)
	}
	return n == 1, nil
}
