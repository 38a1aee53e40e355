package storetest

import (
	"testing"

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
