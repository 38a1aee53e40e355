package sqlbase

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jobfence/jobfence/store"
)

// selectRecentTakeovers reads the takeovers among the newest transitions of
// the history (its first argument: store.TakeoverWindow), newest first, at
// most its second argument: a walk of the primary key from its end, bounded
// by the window and needing no index of its own (Q3).
const selectRecentTakeovers = `SELECT ` + EventColumns + ` FROM (
  SELECT ` + EventColumns + ` FROM refund_job_events ORDER BY id DESC LIMIT ?) newest
 WHERE kind = 'taken_over' ORDER BY id DESC LIMIT ?`

// RecentTakeovers implements store.Store.
func (b *Backend) RecentTakeovers(ctx context.Context, limit int) ([]store.Event, error) {
	if err := store.ValidateOverviewLimit(limit); err != nil {
		return nil, err
	}
	events, err := QueryAll(ctx, b.DB, ScanEvent, selectRecentTakeovers, store.TakeoverWindow, limit)
	return events, b.Unavailable(err)
}

// Budgets implements store.Store: the database's clock and every budget,
// read in one read-only transaction, each refilled to that clock
// (store.Budget.Level).
func (b *Backend) Budgets(ctx context.Context) ([]store.BudgetLevel, error) {
	tx, err := b.DB.BeginTx(ctx, b.ReadTx)
	if err != nil {
		return nil, b.Unavailable(err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	var now time.Time
	if err := tx.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&now}); err != nil {
		return nil, b.Unavailable(err)
	}
	budgets, err := b.readBudgets(ctx, tx, nil)
	if err != nil {
		return nil, b.Unavailable(err)
	}
	levels := make([]store.BudgetLevel, 0, len(budgets))
	for _, budget := range budgets {
		levels = append(levels, budget.Level(now))
	}
	slices.SortFunc(levels, func(a, b store.BudgetLevel) int { return strings.Compare(a.Provider, b.Provider) })
	return levels, nil
}
