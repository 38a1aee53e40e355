package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// testProviderBudget_R19: no more of a provider's jobs are granted than its
// budget allows; refunds and takeovers (reconciles) draw from the same
// budget; other providers are not held up; an empty claim says when to come
// back.
func testProviderBudget(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	if err := s.ConfigureBudgets(ctx, map[string]store.BudgetConfig{"acme": {Rate: 0}}); err == nil {
		t.Fatal("a budget with no rate was accepted")
	}
	// 2 tokens, then one every 1000 s: nothing refills during the test.
	if err := s.ConfigureBudgets(ctx, map[string]store.BudgetConfig{"acme": {Rate: 0.001, Burst: 2}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		enqueue(t, s, refund(t))
	}
	other := refund(t)
	other.Provider = "globex"
	enqueue(t, s, other)

	got := claim(t, s, "A", 10)
	perProvider := map[string]int{}
	for _, c := range got {
		perProvider[c.Job.Provider]++
	}
	if perProvider["acme"] != 2 || perProvider["globex"] != 1 {
		t.Fatalf("claimed %v, want 2 acme jobs (its burst) and the globex job", perProvider)
	}
	_, err := s.Claim(ctx, store.ClaimParams{WorkerID: "A", MaxJobs: 10, Lease: time.Minute})
	var be *store.BudgetExhaustedError
	if !errors.As(err, &be) || be.RetryAfter < 900*time.Second || be.RetryAfter > 1000*time.Second {
		t.Fatalf("claim with acme jobs due and its budget empty = %v, want BudgetExhaustedError ~1000s", err)
	}
	// Other providers are not held up by acme's empty budget.
	if got, err := s.Claim(ctx, store.ClaimParams{WorkerID: "G", MaxJobs: 10, Lease: time.Minute, Provider: "globex"}); err != nil || len(got) != 0 {
		t.Fatalf("globex-only claim = %v, %v; want nothing and no error", ids(got), err)
	}
	// A takeover is a reconcile: it needs a token too.
	expire(t, s, got[0].Job.ID)
	if _, err := s.Claim(ctx, store.ClaimParams{WorkerID: "B", MaxJobs: 10, Lease: time.Minute}); !errors.As(err, &be) {
		t.Fatalf("takeover with an empty budget: %v, want BudgetExhaustedError", err)
	}
	if d := get(t, s, got[0].Job.ID); d.Job.Attempt != 1 || d.Job.WorkerID != "A" {
		t.Fatalf("job taken over without budget: %+v", d.Job)
	}

	// A faster budget refills within milliseconds; no budget means no limit.
	if err := s.ConfigureBudgets(ctx, map[string]store.BudgetConfig{"acme": {Rate: 1000, Burst: 1}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if got := claim(t, s, "B", 10); len(got) != 1 {
		t.Fatalf("claimed %d with a burst of 1, want 1", len(got))
	}
	if err := s.ConfigureBudgets(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := claim(t, s, "C", 10); len(got) != 2 {
		t.Fatalf("claimed %d without a budget, want the 2 acme jobs left", len(got))
	}
}
