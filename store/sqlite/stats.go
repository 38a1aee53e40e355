package sqlite

import (
	"context"
	"database/sql"

	"github.com/jobfence/jobfence/store"
)

// Walks only the unfinished rows through the partial indexes; the history of
// succeeded jobs is never read (Q3).
const selectStats = `SELECT state, COUNT(*),
       MIN(CASE WHEN state IN ('ready', 'running') THEN created_at END)
  FROM refund_jobs WHERE state IN ('ready', 'running', 'manual_review')
 GROUP BY state`

// Stats implements store.Store.
func (s *Store) Stats(ctx context.Context) (store.Stats, error) {
	st := store.Stats{Jobs: map[store.State]int64{}}
	var now int64
	if err := s.db.QueryRowContext(ctx, selectNow).Scan(&now); err != nil {
		return st, unavailable(err)
	}
	st.Now = fromMicros(now)
	rows, err := s.db.QueryContext(ctx, selectStats)
	if err != nil {
		return st, unavailable(err)
	}
	defer rows.Close()
	for rows.Next() {
		var state store.State
		var n int64
		var oldest sql.NullInt64
		if err := rows.Scan(&state, &n, &oldest); err != nil {
			return st, err
		}
		st.Jobs[state] = n
		if t := nullMicros(oldest); !t.IsZero() && (st.OldestUnfinished.IsZero() || t.Before(st.OldestUnfinished)) {
			st.OldestUnfinished = t
		}
	}
	return st, unavailable(rows.Err())
}
