package sqlbase

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jobfence/jobfence/store"
)

// The counts walk only the unfinished rows' entries of the state indexes,
// never a row (the history of succeeded jobs is never read, Q3): a count
// that reads each row's created_at costs a random read per job in review,
// seconds at 20,000 of them on a cold buffer pool.
const selectStateCounts = `SELECT state, COUNT(*) FROM refund_jobs
 WHERE state IN ('ready', 'running', 'manual_review') GROUP BY state`

// The oldest unfinished job is the first enqueued of them: the least id of
// the ready and running entries (ids grow with each insert, and created_at
// is the database's clock at the insert), then one row read.
const selectOldestUnfinished = `SELECT created_at FROM refund_jobs
 WHERE id = (SELECT MIN(id) FROM refund_jobs WHERE state IN ('ready', 'running'))`

// Stats implements store.Store: the database's clock, then the counts and
// the oldest unfinished job (M1).
func (b *Backend) Stats(ctx context.Context) (store.Stats, error) {
	st := store.Stats{Jobs: map[store.State]int64{}, TxRetries: b.retries.Load()}
	if err := b.DB.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&st.Now}); err != nil {
		return st, b.Unavailable(err)
	}
	rows, err := b.DB.QueryContext(ctx, selectStateCounts)
	if err != nil {
		return st, b.Unavailable(err)
	}
	defer rows.Close()
	for rows.Next() {
		var state store.State
		var n int64
		if err := rows.Scan(&state, &n); err != nil {
			return st, err
		}
		st.Jobs[state] = n
	}
	if err := rows.Err(); err != nil {
		return st, b.Unavailable(err)
	}
	err = b.DB.QueryRowContext(ctx, selectOldestUnfinished).Scan(Time{&st.OldestUnfinished})
	if errors.Is(err, sql.ErrNoRows) {
		err = nil // nothing unfinished
	}
	return st, b.Unavailable(err)
}

// Ping implements store.Store: one round trip on a pooled connection.
func (b *Backend) Ping(ctx context.Context) error {
	return b.Unavailable(b.DB.PingContext(ctx))
}
