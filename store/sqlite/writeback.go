package sqlite

// The write-backs' own SQL; the fenced UPDATEs are sqlbase's (RowUpdate).
const (
	// The batch's rows and the clock (R12). No locking read in SQLite: the
	// transaction's BEGIN IMMEDIATE holds the only write lock.
	lockForWrite = `SELECT ` + nowExpr + `, ` + jobColumns + ` FROM refund_jobs WHERE id IN (%s)`

	// Re-reads the jobs in %s after a lost COMMIT (R20); the write lock of
	// this read's own transaction has waited for any other.
	lockedRead = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id IN (%s)`

	// R8: only opens the job to takeover; a microsecond in the past so that a
	// claim in the same millisecond already sees it expired. next_attempt_at
	// moves with the lease (store.Job.NextAttemptAt).
	expireLease = `UPDATE refund_jobs SET lease_until = ` + nowExpr + ` - 1, next_attempt_at = ` + nowExpr + ` - 1
 WHERE id = ? AND state = 'running'`
)
