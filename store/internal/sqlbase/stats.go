package sqlbase

import (
	"context"
	"time"

	"github.com/jobfence/jobfence/store"
)

// Walks only the unfinished rows through the state indexes; the history of
// succeeded jobs is never read (Q3).
const selectStats = `SELECT state, COUNT(*),
       MIN(CASE WHEN state IN ('ready', 'running') THEN created_at END)
  FROM refund_jobs WHERE state IN ('ready', 'running', 'manual_review')
 GROUP BY state`

// Stats implements store.Store: the database's clock, then the counts and
// the oldest unfinished job (M1).
func (b *Backend) Stats(ctx context.Context) (store.Stats, error) {
	st := store.Stats{Jobs: map[store.State]int64{}, TxRetries: b.retries.Load()}
	if err := b.DB.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&st.Now}); err != nil {
		return st, b.Unavailable(err)
	}
	rows, err := b.DB.QueryContext(ctx, selectStats)
	if err != nil {
		return st, b.Unavailable(err)
	}
	defer rows.Close()
	for rows.Next() {
		var state store.State
		var n int64
		var oldest time.Time
		if err := rows.Scan(&state, &n, Time{&oldest}); err != nil {
			return st, err
		}
		st.Jobs[state] = n
		if !oldest.IsZero() && (st.OldestUnfinished.IsZero() || oldest.Before(st.OldestUnfinished)) {
			st.OldestUnfinished = oldest
		}
	}
	return st, b.Unavailable(rows.Err())
}

// Ping implements store.Store: one round trip on a pooled connection.
func (b *Backend) Ping(ctx context.Context) error {
	return b.Unavailable(b.DB.PingContext(ctx))
}
