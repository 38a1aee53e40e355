package sqlbase

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jobfence/jobfence/store"
)

// An activity read (Backend.Activity) never walks the history by time: the
// history and the receipts have no index on created_at, and one would cost
// every claim and write-back an entry. Their ids grow with time instead (an
// auto-increment, inserted at the database's clock), so a binary search of
// the primary key finds the first id of the window in a few point lookups
// and the read aggregates that id range, bounded by store.ActivityMaxRows.

// The tables an activity read counts, named here only (never from input).
const (
	historyTable  = "refund_job_events"
	receiptsTable = "refund_observations"
)

const (
	// selectIDBounds reads the first and last ids of a table (%s): both ends
	// of its primary key.
	selectIDBounds = `SELECT MIN(id), MAX(id) FROM %s`
	// selectFirstFrom reads the first row of a table (%s) at or after an id,
	// and its time: one lookup of the primary key.
	selectFirstFrom = `SELECT id, created_at FROM %s WHERE id >= ? ORDER BY id LIMIT 1`

	// selectHistoryActivity counts the transitions of an id range of the
	// history per minute since its first argument (%s is the backend's
	// Statements.MinuteSince). A transition counts when it changes the
	// state: an acknowledgement or an expedite, which keep it, is no finish.
	selectHistoryActivity = `SELECT %s AS minute,
  SUM(CASE WHEN to_state = 'succeeded' AND from_state <> 'succeeded' THEN 1 ELSE 0 END),
  SUM(CASE WHEN to_state = 'manual_review' AND from_state <> 'manual_review' THEN 1 ELSE 0 END),
  SUM(CASE WHEN to_state = 'cancelled' AND from_state <> 'cancelled' THEN 1 ELSE 0 END),
  SUM(CASE WHEN kind = 'taken_over' THEN 1 ELSE 0 END),
  SUM(CASE WHEN kind = 'resolved' THEN 1 ELSE 0 END)
 FROM refund_job_events WHERE id >= ? AND id <= ? AND created_at >= ?
 GROUP BY minute`

	// selectReceiptActivity counts the receipts of an id range per minute,
	// as selectHistoryActivity does.
	selectReceiptActivity = `SELECT %s AS minute, COUNT(*)
 FROM refund_observations WHERE id >= ? AND id <= ? AND created_at >= ?
 GROUP BY minute`
)

// activitySlack is how much earlier than the window the search for its first
// id aims: ids are taken at the insert, times at the transaction's read of
// the clock, so a row may carry an earlier time than one inserted before it
// by a transaction that waited (a lock wait, a slow commit). Rows of the
// slack are read and left out by their time.
const activitySlack = time.Minute

// Activity implements store.Store: the database's clock, then per table the
// id range of the window (idRange) and its counts per minute.
func (b *Backend) Activity(ctx context.Context, p store.ActivityParams) (store.Activity, error) {
	if err := p.Validate(); err != nil {
		return store.Activity{}, err
	}
	maxRows := int64(p.MaxRows)
	if maxRows == 0 {
		maxRows = store.ActivityMaxRows
	}
	var a store.Activity
	if err := b.DB.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&a.Now}); err != nil {
		return a, b.Unavailable(err)
	}
	since := a.Now.Truncate(time.Minute).Add(-time.Duration(p.Minutes-1) * time.Minute)
	a.CountedSince = since
	a.Minutes = make([]store.ActivityMinute, p.Minutes)
	for i := range a.Minutes {
		a.Minutes[i].Start = since.Add(time.Duration(i) * time.Minute)
	}
	// minute returns the minute of index i, or nil for an index outside the
	// window (a row committed after the clock was read).
	minute := func(i int64) *store.ActivityMinute {
		if i < 0 || i >= int64(len(a.Minutes)) {
			return nil
		}
		return &a.Minutes[i]
	}
	for _, t := range []struct {
		table, query string
		add          func(Scanner) error
	}{
		{historyTable, selectHistoryActivity, func(r Scanner) error {
			var i, succeeded, review, cancelled, takeovers, resolved int64
			if err := r.Scan(&i, &succeeded, &review, &cancelled, &takeovers, &resolved); err != nil {
				return err
			}
			if m := minute(i); m != nil {
				m.Succeeded, m.ManualReview, m.Cancelled = succeeded, review, cancelled
				m.Takeovers, m.ReviewsResolved = takeovers, resolved
			}
			return nil
		}},
		{receiptsTable, selectReceiptActivity, func(r Scanner) error {
			var i, n int64
			if err := r.Scan(&i, &n); err != nil {
				return err
			}
			if m := minute(i); m != nil {
				m.Receipts = n
			}
			return nil
		}},
	} {
		from, to, counted, err := b.idRange(ctx, t.table, since, maxRows)
		if err != nil {
			return a, b.Unavailable(err)
		}
		if from > to {
			continue // nothing in the window
		}
		if counted.After(a.CountedSince) {
			a.Truncated, a.CountedSince = true, counted
		}
		if err := b.eachRow(ctx, func(r Scanner) error { return t.add(r) }, fmt.Sprintf(t.query, b.SQL.MinuteSince),
			b.At(since), from, to, b.At(since)); err != nil {
			return a, b.Unavailable(err)
		}
	}
	return a, nil
}

// idRange returns the ids of table's rows to count for a window starting
// at since: from the first row the search finds at or after since less
// activitySlack, to the last; at most maxRows of them, the newest, and then
// the time of the first (counted, zero when not cut). from > to: none.
func (b *Backend) idRange(ctx context.Context, table string, since time.Time, maxRows int64) (from, to int64,
	counted time.Time, err error) {
	var lo, hi sql.NullInt64
	if err := b.DB.QueryRowContext(ctx, fmt.Sprintf(selectIDBounds, table)).Scan(&lo, &hi); err != nil {
		return 0, 0, counted, err
	}
	if !lo.Valid {
		return 1, 0, counted, nil // an empty table
	}
	from, err = b.firstAtOrAfter(ctx, table, lo.Int64, hi.Int64, since.Add(-activitySlack))
	if err != nil || hi.Int64-from+1 <= maxRows {
		return from, hi.Int64, counted, err
	}
	from = hi.Int64 - maxRows + 1
	_, counted, err = b.firstFrom(ctx, table, from)
	return from, hi.Int64, counted, err
}

// firstAtOrAfter finds, by a binary search of the primary key between lo and
// hi, the first id of table whose row is at or after t: hi+1 when none is.
// Each step is one lookup (firstFrom); gaps in the ids (rolled-back inserts,
// archived rows) are stepped over.
func (b *Backend) firstAtOrAfter(ctx context.Context, table string, lo, hi int64, t time.Time) (int64, error) {
	hi++ // the answer is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		id, at, err := b.firstFrom(ctx, table, mid)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			hi = mid // archived since the bounds were read
		case err != nil:
			return 0, err
		case at.Before(t):
			lo = id + 1
		default:
			hi = mid
		}
	}
	return lo, nil
}

// firstFrom reads the id and time of table's first row at or after id.
// Errors: sql.ErrNoRows when there is none.
func (b *Backend) firstFrom(ctx context.Context, table string, id int64) (int64, time.Time, error) {
	var at time.Time
	err := b.DB.QueryRowContext(ctx, fmt.Sprintf(selectFirstFrom, table), id).Scan(&id, Time{&at})
	return id, at, err
}

// eachRow runs query and passes each row to fn.
func (b *Backend) eachRow(ctx context.Context, fn func(Scanner) error, query string, args ...any) error {
	rows, err := b.DB.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// AgeHistory moves the times of a job's history and receipts d into the
// past: a seam for tests (storetest.HistoryAger), never called by the
// coordinator. Tests age jobs oldest first, so that ids still grow with
// time, as the activity read relies on. Errors: store.ErrNotFound.
func (b *Backend) AgeHistory(ctx context.Context, jobID int64, d time.Duration) error {
	if _, err := JobByRef(ctx, b.DB, store.JobRef{ID: jobID}); err != nil {
		return b.Unavailable(err)
	}
	return b.Unavailable(b.InTx(ctx, func(tx Tx) error {
		for _, table := range []string{historyTable, receiptsTable} {
			type row struct {
				id int64
				at time.Time
			}
			rows, err := QueryAll(ctx, tx, func(r Scanner) (row, error) {
				var v row
				return v, r.Scan(&v.id, Time{&v.at})
			}, "SELECT id, created_at FROM "+table+" WHERE job_id = ?", jobID)
			if err != nil {
				return err
			}
			for _, r := range rows {
				if _, err := tx.ExecContext(ctx, "UPDATE "+table+" SET created_at = ? WHERE id = ?", b.At(r.at.Add(-d)),
					r.id); err != nil {
					return err
				}
			}
		}
		return nil
	}))
}
