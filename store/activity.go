package store

import "time"

// The bounds of an activity read (Store.Activity).
const (
	// DefaultActivityMinutes is the window an activity read covers when the
	// caller names none: the last three hours.
	DefaultActivityMinutes = 180
	// MaxActivityMinutes bounds the window: six hours.
	MaxActivityMinutes = 360
	// ActivityMaxRows bounds the rows one activity read aggregates, of the
	// history and of the receipts each: past it only the newest are counted
	// (Activity.Truncated). At the benchmark's rates six hours are far
	// fewer; a burst of enqueues (one transition each) can be more.
	ActivityMaxRows = 500_000
)

// ActivityParams asks for the activity of the last Minutes minutes.
type ActivityParams struct {
	// Minutes is the window, the current minute included:
	// 1..MaxActivityMinutes.
	Minutes int
	// MaxRows bounds the rows aggregated from each of the history and the
	// receipts; 0 is ActivityMaxRows. Tests set fewer.
	MaxRows int
}

// Validate reports a window outside 1..MaxActivityMinutes (field minutes)
// or a negative MaxRows (field max_rows).
func (p ActivityParams) Validate() error {
	var v violations
	if p.Minutes < 1 || p.Minutes > MaxActivityMinutes {
		v.add("minutes", "must be between 1 and %d, got %d", MaxActivityMinutes, p.Minutes)
	}
	if p.MaxRows < 0 {
		v.add("max_rows", "must not be negative, got %d", p.MaxRows)
	}
	return v.err()
}

// Activity is what happened minute by minute in a window that ends at Now,
// the database's time of the read (R12), counted from the history and the
// receipts.
type Activity struct {
	Now time.Time
	// Minutes lists every minute of the window, oldest first, the last the
	// minute of Now (so far); a minute without activity has zeros.
	Minutes []ActivityMinute
	// Truncated: more rows lay in the window than ActivityParams.MaxRows,
	// and only the newest were counted, complete from CountedSince on: what
	// happened before it is counted in part or not at all.
	Truncated bool
	// CountedSince is when the counts are complete from: the window's start,
	// or, when Truncated, the oldest row counted.
	CountedSince time.Time
}

// ActivityMinute counts the transitions and receipts of one minute.
// Transitions count when they change the job's state (a replayed write
// writes no history, R21).
type ActivityMinute struct {
	// Start is the minute's first instant, UTC.
	Start time.Time
	// Succeeded counts the jobs that became succeeded (a completion, or a
	// person's resolution as refunded); ManualReview those that entered
	// manual review (reviews opened); Cancelled those that became
	// cancelled (R32).
	Succeeded, ManualReview, Cancelled int64
	// Takeovers counts takeovers of expired leases (R6, M1).
	Takeovers int64
	// ReviewsResolved counts the reviews a person resolved.
	ReviewsResolved int64
	// Receipts counts the receipts filed on jobs (R15, R28).
	Receipts int64
}
