package mysql

// The write-backs' own SQL; the fenced UPDATEs are sqlbase's (RowUpdate).
const (
	// Locks the batch's rows in id order (two batches never wait on each other
	// in a cycle) and reads the database's clock (R12).
	lockForWrite = `SELECT UTC_TIMESTAMP(6), ` + jobColumns + ` FROM refund_jobs
 WHERE id IN (%s) ORDER BY id FOR UPDATE`

	// Waits for a transaction still holding the rows, so that a COMMIT cut off
	// in flight has settled before we read its outcome (R20).
	lockedRead = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id IN (%s) LOCK IN SHARE MODE`
)

// R8: only opens the job to takeover, a microsecond ago by the database
// clock; next_attempt_at moves with the lease (store.Job.NextAttemptAt).
const expireLease = `UPDATE refund_jobs SET lease_until = TIMESTAMPADD(MICROSECOND, -1, UTC_TIMESTAMP(6)),
 next_attempt_at = TIMESTAMPADD(MICROSECOND, -1, UTC_TIMESTAMP(6))
 WHERE id = ? AND state = 'running'`
