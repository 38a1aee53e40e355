package store

import (
	"fmt"
	"math"
	"time"
)

// BudgetConfig is a provider's outbound budget (R19): a token bucket refilled
// at Rate calls per second up to Burst. Every granted job, refund or
// reconcile, takes one token.
type BudgetConfig struct {
	Rate  float64
	Burst float64
}

// Validate reports what is wrong with a budget.
func (c BudgetConfig) Validate() error {
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) || !(c.Burst >= 1) || math.IsInf(c.Burst, 0) {
		return fmt.Errorf("budget needs a positive rate and a burst of at least 1, got %g/s burst %g", c.Rate, c.Burst)
	}
	return nil
}

// Budget is a provider's bucket as stored, shared by every coordinator on the
// database.
type Budget struct {
	Provider string
	BudgetConfig
	Tokens     float64
	RefilledAt time.Time
}

// Available is how many tokens the bucket holds at the database time now. A
// clock that went back refills nothing.
func (b Budget) Available(now time.Time) float64 {
	elapsed := now.Sub(b.RefilledAt).Seconds()
	if elapsed < 0 {
		elapsed = 0
	}
	return math.Min(b.Burst, b.Tokens+b.Rate*elapsed)
}

// Wait is how long until the bucket holds one token, from now.
func (b Budget) Wait(now time.Time) time.Duration {
	missing := 1 - b.Available(now)
	if missing <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(missing / b.Rate * float64(time.Second)))
}

// BudgetExhaustedError is returned by Claim when due jobs exist but their
// providers' budgets allow none now; nothing was granted. Come back after
// RetryAfter.
type BudgetExhaustedError struct {
	RetryAfter time.Duration
}

func (e *BudgetExhaustedError) Error() string {
	return fmt.Sprintf("provider budget exhausted: retry after %s", e.RetryAfter)
}
