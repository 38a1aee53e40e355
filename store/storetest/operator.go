package storetest

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// testGetReadsLedgerAndClock_R10_R12: Get carries the ledger row the
// completion wrote in its own transaction, or the operator's resolution, and
// the database's time; nothing before the job succeeded.
func testGetReadsLedgerAndClock_R10_R12(t *testing.T, s store.Store) {
	p := refund(t)
	job := enqueue(t, s, p)
	d := get(t, s, job.ID)
	if d.Ledger != nil || d.Now.Before(job.CreatedAt) {
		t.Fatalf("ready job: ledger %+v, now %v (created %v); want no ledger and the database's now", d.Ledger, d.Now,
			job.CreatedAt)
	}
	a := takeOverTo(t, s, job.ID, 2, "A")
	if d := get(t, s, job.ID); d.Ledger != nil || d.Now.Before(a.Job.UpdatedAt) {
		t.Fatalf("running job: ledger %+v, now %v (claimed %v)", d.Ledger, d.Now, a.Job.UpdatedAt)
	}
	done := write(t, s, complete(of(a), "re_ledger")).Job
	d = get(t, s, job.ID)
	want := store.LedgerEntry{ProviderRefundID: "re_ledger", AmountMinor: p.AmountMinor, Currency: p.Currency,
		Attempt: 2, RecordedAt: done.UpdatedAt}
	if d.Ledger == nil || *d.Ledger != want || d.Now.Before(done.UpdatedAt) {
		t.Fatalf("succeeded job: ledger %+v, now %v; want %+v and a time at or after %v", d.Ledger, d.Now, want,
			done.UpdatedAt)
	}

	review, attempt := escalated(t, s)
	if d := get(t, s, review.ID); d.Ledger != nil {
		t.Fatalf("job in review: ledger %+v", d.Ledger)
	}
	resolved := write(t, s, resolve(review.ID, attempt, store.ResolutionRefunded, "re_ops")).Job
	want = store.LedgerEntry{ProviderRefundID: "re_ops", AmountMinor: review.AmountMinor, Currency: review.Currency,
		Attempt: attempt, RecordedAt: resolved.UpdatedAt}
	if d := get(t, s, review.ID); d.Ledger == nil || *d.Ledger != want {
		t.Fatalf("resolved as refunded: ledger %+v, want %+v", d.Ledger, want)
	}
}

// testRecentTakeovers_M1: the takeovers among the newest transitions,
// newest first, as many as asked for, with who took over under which
// attempt.
func testRecentTakeovers_M1(t *testing.T, s store.Store) {
	if got, err := s.RecentTakeovers(ctxFor(t), 10); err != nil || len(got) != 0 {
		t.Fatalf("RecentTakeovers on an empty history = %v, %v", got, err)
	}
	first := enqueue(t, s, refund(t))
	takeOverTo(t, s, first.ID, 2, "B")
	second := enqueue(t, s, refund(t))
	c := takeOverTo(t, s, second.ID, 3, "C")
	write(t, s, complete(of(c), "re_1"))
	enqueue(t, s, refund(t))

	got, err := s.RecentTakeovers(ctxFor(t), 10)
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		job, attempt int64
		worker       string
	}
	var saw []seen
	for _, e := range got {
		if e.Kind != store.EventTakenOver || e.FromState != store.StateRunning || e.ToState != store.StateRunning ||
			e.NextAction != store.ActionReconcile || e.Grant.IsZero() {
			t.Fatalf("takeover event = %+v", e)
		}
		saw = append(saw, seen{e.JobID, e.Attempt, e.WorkerID})
	}
	want := []seen{{second.ID, 3, "C"}, {second.ID, 2, "C"}, {first.ID, 2, "B"}}
	if !slices.Equal(saw, want) || !slices.IsSortedFunc(got, func(a, b store.Event) int { return cmp.Compare(b.ID, a.ID) }) {
		t.Fatalf("recent takeovers = %+v, want %+v newest first", saw, want)
	}
	if one, err := s.RecentTakeovers(ctxFor(t), 1); err != nil || len(one) != 1 || one[0].ID != got[0].ID {
		t.Fatalf("RecentTakeovers(1) = %+v, %v; want the newest, %d", one, err, got[0].ID)
	}
	for _, limit := range []int{0, -1, store.MaxOverviewLimit + 1} {
		_, err := s.RecentTakeovers(ctxFor(t), limit)
		wantViolation(t, err, "limit")
	}
}

// testRecentTakeoversWindowBounded_M1_Q3: a takeover older than the newest
// TakeoverWindow transitions is not looked for: the read never walks the
// history beyond the window.
func testRecentTakeoversWindowBounded_M1_Q3(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	takeOverTo(t, s, job.ID, 2, "B")
	if got, err := s.RecentTakeovers(ctxFor(t), 1); err != nil || len(got) != 1 {
		t.Fatalf("RecentTakeovers = %v, %v; want the takeover", got, err)
	}
	// Enqueues, one transition each, with nothing due: after
	// TakeoverWindow-1 of them the takeover is the oldest transition of the
	// window, after one more it is out of it.
	enqueueN := func(n int) {
		t.Helper()
		for n > 0 {
			batch := make([]store.EnqueueParams, min(n, 500))
			for i := range batch {
				batch[i] = refund(t)
				batch[i].NotBefore = time.Date(2999, 1, 1, 0, 0, 0, 0, time.UTC)
			}
			for _, out := range s.EnqueueMany(ctxFor(t), batch) {
				if out.Err != nil || !out.Created {
					t.Fatalf("EnqueueMany: created %v, %v", out.Created, out.Err)
				}
			}
			n -= len(batch)
		}
	}
	enqueueN(store.TakeoverWindow - 1)
	if got, err := s.RecentTakeovers(ctxFor(t), store.MaxOverviewLimit); err != nil || len(got) != 1 {
		t.Fatalf("RecentTakeovers with the takeover the window's oldest = %+v, %v; want it", got, err)
	}
	enqueueN(1)
	if got, err := s.RecentTakeovers(ctxFor(t), store.MaxOverviewLimit); err != nil || len(got) != 0 {
		t.Fatalf("RecentTakeovers with the takeover out of the window = %+v, %v; want none", got, err)
	}
}

// testBudgetsListedRefilled_R19: every provider's budget, by name, with the
// calls it allows refilled to the database's now.
func testBudgetsListedRefilled_R19(t *testing.T, s store.Store) {
	if got, err := s.Budgets(ctxFor(t)); err != nil || len(got) != 0 {
		t.Fatalf("Budgets with none configured = %+v, %v", got, err)
	}
	cfg := map[string]store.BudgetConfig{
		"slow": {Rate: 0.001, Burst: 5}, // refills nothing during the test
		"fast": {Rate: 1000, Burst: 5},  // refills within milliseconds
		"idle": {Rate: 1, Burst: 3},
	}
	if err := s.ConfigureBudgets(ctxFor(t), cfg); err != nil {
		t.Fatal(err)
	}
	for _, provider := range []string{"slow", "slow", "fast", "fast"} {
		p := refund(t)
		p.Provider = provider
		enqueue(t, s, p)
	}
	claimed := claim(t, s, "A", 10)
	if len(claimed) != 4 {
		t.Fatalf("claimed %v, want the 4 jobs", ids(claimed))
	}
	waitForClock(t, s, claimed[0].Job.UpdatedAt.Add(10*time.Millisecond))
	got, err := s.Budgets(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range got {
		names = append(names, l.Provider)
		if l.BudgetConfig != cfg[l.Provider] || l.At.Before(claimed[0].Job.UpdatedAt) {
			t.Fatalf("budget %+v, want %+v at the database's now", l, cfg[l.Provider])
		}
	}
	if !slices.Equal(names, []string{"fast", "idle", "slow"}) {
		t.Fatalf("budgets of %v, want fast, idle and slow in that order", names)
	}
	// fast spent 2 and refilled to its burst; slow spent 2 and refilled
	// next to nothing; idle spent nothing.
	if fast, idle, slow := got[0].Available, got[1].Available, got[2].Available; fast != 5 || idle != 3 ||
		slow < 3 || slow > 3.01 {
		t.Fatalf("available fast %v idle %v slow %v, want 5, 3 and 3 (plus a thousandth a second)", fast, idle, slow)
	}
}
