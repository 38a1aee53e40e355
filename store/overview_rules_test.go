package store_test

import (
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// M1: an overview lists 1..MaxOverviewLimit of each kind; anything else is
// refused as limit.
func TestOverviewLimitBounds_M1(t *testing.T) {
	for _, ok := range []int{1, 10, store.MaxOverviewLimit} {
		if err := store.ValidateOverviewLimit(ok); err != nil {
			t.Errorf("limit %d: %v", ok, err)
		}
	}
	for _, bad := range []int{0, -1, store.MaxOverviewLimit + 1} {
		rulesOnlyField(t, store.ValidateOverviewLimit(bad), "limit")
	}
}

// R19: a budget's level is its bucket refilled to the database time given,
// by the same arithmetic claims spend it with (Budget.Available).
func TestBudgetLevelIsTheBucketRefilledToNow_R19(t *testing.T) {
	t0 := time.Date(2025, 3, 14, 9, 0, 0, 0, time.UTC)
	b := store.Budget{Provider: "acme", BudgetConfig: store.BudgetConfig{Rate: 2, Burst: 5}, Tokens: 0.5, RefilledAt: t0}
	for _, now := range []time.Time{t0, t0.Add(time.Second), t0.Add(time.Hour), t0.Add(-time.Minute)} {
		want := store.BudgetLevel{Provider: "acme", BudgetConfig: b.BudgetConfig, Available: b.Available(now), At: now}
		if got := b.Level(now); got != want {
			t.Errorf("Level(%v) = %+v, want %+v", now, got, want)
		}
	}
	if got := b.Level(t0.Add(time.Second)).Available; got != 2.5 {
		t.Errorf("a second after half a token at 2/s: %g available, want 2.5", got)
	}
}
