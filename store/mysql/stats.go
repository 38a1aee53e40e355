package mysql

import (
	"context"
	"database/sql"
	"time"

	"github.com/jobfence/jobfence/store"
)

// Walks only the unfinished rows through the (state, …) index; the history
// of succeeded jobs is never read (Q3).
const selectStats = `SELECT UTC_TIMESTAMP(6), state, COUNT(*),
       MIN(CASE WHEN state IN ('ready', 'running') THEN created_at END)
  FROM refund_jobs WHERE state IN ('ready', 'running', 'manual_review')
 GROUP BY state`

// Stats implements store.Store.
func (s *Store) Stats(ctx context.Context) (store.Stats, error) {
	st := store.Stats{Jobs: map[store.State]int64{}}
	rows, err := s.db.QueryContext(ctx, selectStats)
	if err != nil {
		return st, unavailable(err)
	}
	defer rows.Close()
	for rows.Next() {
		var state store.State
		var n int64
		var oldest sql.NullTime
		if err := rows.Scan(&st.Now, &state, &n, &oldest); err != nil {
			return st, err
		}
		st.Jobs[state] = n
		if oldest.Valid && (st.OldestUnfinished.IsZero() || oldest.Time.Before(st.OldestUnfinished)) {
			st.OldestUnfinished = oldest.Time
		}
	}
	if err := rows.Err(); err != nil {
		return st, unavailable(err)
	}
	if st.Now.IsZero() {
		if err := s.db.QueryRowContext(ctx, selectNow).Scan(&st.Now); err != nil {
			return st, unavailable(err)
		}
	}
	st.Now = st.Now.In(time.UTC)
	return st, nil
}
