package sqlite

import (
	"context"

	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// retention is this backend's SQL of the archive (R31). Its transactions
// hold the database's only write lock, so reads lock nothing more; the
// archiver walks the partial index ix_refund_jobs_succeeded, oldest
// completions first. SQLite has no purge backlog.
var retention = sqlbase.RetentionStatements{
	InsertIgnore: "INSERT OR IGNORE",
	ArchiveCandidates: `SELECT id FROM refund_jobs
 WHERE state = 'succeeded' AND next_attempt_at <= ? AND attention_since IS NULL AND cancel_requested_at IS NULL ORDER BY next_attempt_at, id LIMIT ?`,
	CancelledCandidates: `SELECT id FROM refund_jobs
 WHERE state = 'cancelled' AND next_attempt_at <= ? AND attention_since IS NULL AND cancel_requested_at IS NULL ORDER BY next_attempt_at, id LIMIT ?`,
	OldestSucceeded: `SELECT MIN(next_attempt_at) FROM refund_jobs WHERE state = 'succeeded' AND attention_since IS NULL AND cancel_requested_at IS NULL`,
}

// ArchiveAllowed reports whether the archive may move jobs: always, since
// one process at a time serves the file, of this release.
func (s *Store) ArchiveAllowed(context.Context) (bool, error) { return true, nil }
