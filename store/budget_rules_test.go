package store_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// R19: a provider's bucket refills at Rate per second from RefilledAt up to
// Burst, on the database time given; a clock that went back refills nothing.
func TestBudgetAvailableRefillsOnTheGivenClock_R19(t *testing.T) {
	t0 := time.Date(2025, 3, 14, 9, 0, 0, 0, time.UTC)
	b := store.Budget{Provider: "acme", BudgetConfig: store.BudgetConfig{Rate: 2, Burst: 5}, Tokens: 0.5, RefilledAt: t0}
	cases := []struct {
		name string
		now  time.Time
		want float64
	}{
		{"at the refill", t0, 0.5},
		{"a quarter second later", t0.Add(250 * time.Millisecond), 1},
		{"one second later", t0.Add(time.Second), 2.5},
		{"just full", t0.Add(2250 * time.Millisecond), 5},
		{"an hour later: never above burst", t0.Add(time.Hour), 5},
		{"the clock went back", t0.Add(-time.Minute), 0.5},
	}
	for _, c := range cases {
		if got := b.Available(c.now); got != c.want {
			t.Errorf("%s: Available = %g, want %g", c.name, got, c.want)
		}
	}
	// Tokens are not minted by rounding: 1/3 s at 3/s is one token.
	third := store.Budget{BudgetConfig: store.BudgetConfig{Rate: 3, Burst: 1}, RefilledAt: t0}
	if got := third.Available(t0.Add(time.Second / 3)); math.Abs(got-1) > 1e-6 {
		t.Errorf("Available after a third of a second at 3/s = %g, want ~1", got)
	}
}

// R19: Wait is how long until one token is in the bucket, rounded up so a
// claimer that comes back after it finds the token.
func TestBudgetWaitUntilOneToken_R19(t *testing.T) {
	t0 := time.Date(2025, 3, 14, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		b    store.Budget
		now  time.Time
		want time.Duration
	}{
		{"a token in the bucket", store.Budget{BudgetConfig: store.BudgetConfig{Rate: 1, Burst: 2}, Tokens: 1.5, RefilledAt: t0}, t0, 0},
		{"exactly one token", store.Budget{BudgetConfig: store.BudgetConfig{Rate: 1, Burst: 2}, Tokens: 1, RefilledAt: t0}, t0, 0},
		{"empty at 2/s", store.Budget{BudgetConfig: store.BudgetConfig{Rate: 2, Burst: 5}, RefilledAt: t0}, t0, 500 * time.Millisecond},
		{"half refilled", store.Budget{BudgetConfig: store.BudgetConfig{Rate: 2, Burst: 5}, RefilledAt: t0},
			t0.Add(250 * time.Millisecond), 250 * time.Millisecond},
		{"a quarter token at 0.5/s", store.Budget{BudgetConfig: store.BudgetConfig{Rate: 0.5, Burst: 1}, Tokens: 0.25, RefilledAt: t0},
			t0, 1500 * time.Millisecond},
		{"rounded up", store.Budget{BudgetConfig: store.BudgetConfig{Rate: 3, Burst: 1}, RefilledAt: t0}, t0, 333333334 * time.Nanosecond},
		{"refilled since", store.Budget{BudgetConfig: store.BudgetConfig{Rate: 2, Burst: 5}, RefilledAt: t0}, t0.Add(time.Second), 0},
		{"the clock went back", store.Budget{BudgetConfig: store.BudgetConfig{Rate: 2, Burst: 5}, RefilledAt: t0},
			t0.Add(-time.Hour), 500 * time.Millisecond},
	}
	for _, c := range cases {
		if got := c.b.Wait(c.now); got != c.want {
			t.Errorf("%s: Wait = %v, want %v", c.name, got, c.want)
		}
		if w := c.b.Wait(c.now); !c.now.Before(c.b.RefilledAt) && c.b.Available(c.now.Add(w)) < 1-1e-9 {
			t.Errorf("%s: after Wait %v the bucket holds %g, want a token", c.name, w, c.b.Available(c.now.Add(w)))
		}
	}
}

// R19: a budget needs a positive, finite rate and a finite burst of at
// least one (a smaller one would never grant a job).
func TestBudgetConfigValidate_R19(t *testing.T) {
	for _, c := range []struct {
		cfg store.BudgetConfig
		ok  bool
	}{
		{store.BudgetConfig{Rate: 1, Burst: 1}, true},
		{store.BudgetConfig{Rate: 0.01, Burst: 100}, true},
		{store.BudgetConfig{Rate: 0, Burst: 1}, false},
		{store.BudgetConfig{Rate: -1, Burst: 1}, false},
		{store.BudgetConfig{Rate: math.NaN(), Burst: 1}, false},
		{store.BudgetConfig{Rate: math.Inf(1), Burst: 1}, false},
		{store.BudgetConfig{Rate: 1, Burst: 0.5}, false},
		{store.BudgetConfig{Rate: 1, Burst: math.NaN()}, false},
		{store.BudgetConfig{Rate: 1, Burst: math.Inf(1)}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", c.cfg, err, c.ok)
		}
	}
	e := &store.BudgetExhaustedError{RetryAfter: 1500 * time.Millisecond}
	if !strings.Contains(e.Error(), "1.5s") {
		t.Errorf("BudgetExhaustedError = %q, want it to name the wait", e.Error())
	}
}
