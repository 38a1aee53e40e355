package store

import "time"

// The bounds of what operators watch in one overview (M1).
const (
	// TakeoverWindow is how many of the newest transitions of the history
	// RecentTakeovers looks through: a bounded window, so that its cost never
	// grows with the history (Q3).
	TakeoverWindow = 10_000
	// MaxOverviewLimit bounds how many reviews, takeovers and stale
	// rejections one overview lists.
	MaxOverviewLimit = 100
)

// ValidateOverviewLimit reports a limit outside 1..MaxOverviewLimit, as a
// violation of limit.
func ValidateOverviewLimit(limit int) error {
	if limit < 1 || limit > MaxOverviewLimit {
		return Invalid("limit", "must be between 1 and %d, got %d", MaxOverviewLimit, limit)
	}
	return nil
}

// BudgetLevel is a provider's outbound budget (R19) as the database holds
// it at At, the database's time of the read.
type BudgetLevel struct {
	Provider string
	BudgetConfig
	// Available is how many calls the bucket allows at At, refilled to then.
	Available float64
	At        time.Time
}

// Level is the bucket as it stands at the database time now, refilled by
// Available.
func (b Budget) Level(now time.Time) BudgetLevel {
	return BudgetLevel{Provider: b.Provider, BudgetConfig: b.BudgetConfig, Available: b.Available(now), At: now}
}
