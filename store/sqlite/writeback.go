package sqlite

import (
	"context"
	"fmt"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// The write-backs' own SQL; the fenced UPDATEs are sqlbase's (RowUpdate).
const (
	// The batch's rows and the clock (R12). No locking read in SQLite: the
	// transaction's BEGIN IMMEDIATE holds the only write lock.
	selectNowAndJobs = `SELECT ` + nowMicros + `, ` + jobColumns + ` FROM refund_jobs WHERE id IN (%s)`

	// R8: only opens the job to takeover; a microsecond in the past so that a
	// claim in the same millisecond already sees it expired.
	expireLease = `UPDATE refund_jobs SET lease_until = ` + nowMicros + ` - 1
 WHERE id = ? AND state = 'running'`
)

// ExpireLease implements store.Store.
func (s *Store) ExpireLease(ctx context.Context, jobID int64) error {
	var n int64
	err := s.InTx(ctx, func(tx sqlbase.Tx) error {
		res, err := tx.ExecContext(ctx, expireLease, jobID)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return unavailable(err)
	}
	if n == 1 {
		return nil
	}
	if _, err := s.jobByRef(ctx, store.JobRef{ID: jobID}); err != nil {
		return err
	}
	return fmt.Errorf("%w: job %d", store.ErrNotRunning, jobID)
}
