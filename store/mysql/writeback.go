package mysql

import (
	"context"
	"fmt"
	"time"

	"github.com/jobfence/jobfence/store"
)

// The write-backs' own SQL; the fenced UPDATEs are sqlbase's (RowUpdate).
const (
	// Locks the batch's rows in id order (two batches never wait on each other
	// in a cycle) and reads the database's clock (R12).
	lockJobsForWrite = `SELECT UTC_TIMESTAMP(6), ` + jobColumns + ` FROM refund_jobs
 WHERE id IN (%s) ORDER BY id FOR UPDATE`

	// Waits for a transaction still holding the rows, so that a COMMIT cut off
	// in flight has settled before we read its outcome (R20).
	selectJobsLocked = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id IN (%s) LOCK IN SHARE MODE`
)

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
