package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// newestFirst returns ids from the last to the first.
func newestFirst(ids ...int64) []int64 {
	out := slices.Clone(ids)
	slices.Reverse(out)
	return out
}

// jobIDs returns the ids of jobs.
func jobIDs(jobs []store.Job) []int64 {
	out := make([]int64, len(jobs))
	for i, j := range jobs {
		out[i] = j.ID
	}
	return out
}

// wantListing pages through p with every page size from 1 to 3 (keyset,
// never OFFSET, Q4) and requires want each time.
func wantListing(t *testing.T, s store.Store, p store.ListParams, want []int64, what string) {
	t.Helper()
	for limit := 1; limit <= 3; limit++ {
		p.Limit = limit
		if got := listAll(t, s, p); !slices.Equal(got, want) {
			t.Fatalf("%s, %d a page = %v, want %v", what, limit, got, want)
		}
	}
}

// receipt files a receipt naming refundID for job: pending, so that a
// parked job stays parked (R28 expedites on success or failure only).
func receipt(t *testing.T, s store.Store, job int64, refundID string) {
	t.Helper()
	n := keySeq.Add(1)
	if _, _, err := s.Observe(ctxFor(t), store.ObservationParams{Job: store.JobRef{ID: job}, Source: "webhook",
		Outcome: store.OutcomePending, ProviderRefundID: refundID, ProviderEventID: fmt.Sprintf("evt_%d", n)}); err != nil {
		t.Fatalf("receipt for job %d: %v", job, err)
	}
}

// parked enqueues p due an hour from now: ready, but not claimed by the
// claims of the test.
func parked(t *testing.T, s store.Store, p store.EnqueueParams) store.Job {
	t.Helper()
	p.NotBefore = dbNow(t, s).Add(time.Hour)
	return enqueue(t, s, p)
}

// completed enqueues p, claims it and completes it with refundID.
func completed(t *testing.T, s store.Store, p store.EnqueueParams, refundID string) store.Job {
	t.Helper()
	job := enqueue(t, s, p)
	return write(t, s, complete(of(claimOne(t, s, "A", job.ID)), refundID)).Job
}

// testListJobsByPayment: all refunds of one payment, newest first, page by
// page, combined with the other filters.
func testListJobsByPayment(t *testing.T, s store.Store) {
	var all, done []int64
	for i := 0; i < 5; i++ {
		p := refund(t)
		p.PaymentID = "pay-P"
		if i%2 == 0 {
			done = append(done, completed(t, s, p, fmt.Sprintf("re_%d", i)).ID)
			all = append(all, done[len(done)-1])
		} else {
			all = append(all, parked(t, s, p).ID)
		}
		parked(t, s, refund(t)) // another payment's
	}
	wantListing(t, s, store.ListParams{PaymentID: "pay-P"}, newestFirst(all...), "pay-P")
	wantListing(t, s, store.ListParams{PaymentID: "pay-P", State: store.StateSucceeded}, newestFirst(done...),
		"pay-P succeeded")
	wantListing(t, s, store.ListParams{PaymentID: "pay-P", Provider: "globex"}, nil, "pay-P at globex")
	wantListing(t, s, store.ListParams{PaymentID: "pay-none"}, nil, "an unknown payment")

	// The token is bound to the payment.
	page, err := s.List(ctxFor(t), store.ListParams{PaymentID: "pay-P", Limit: 2})
	if err != nil || page.NextPageToken == "" {
		t.Fatalf("first page = %+v, %v", page, err)
	}
	_, err = s.List(ctxFor(t), store.ListParams{PaymentID: "pay-Q", Limit: 2, PageToken: page.NextPageToken})
	wantViolation(t, err, "page_token")
}

// testListJobsByProviderRefundID_R15: the jobs whose refund has the id and
// those with a receipt naming it, each once, newest first; a receipt alone
// finds a job, and filters that drop candidates do not end the listing early.
func testListJobsByProviderRefundID_R15(t *testing.T, s store.Store) {
	own := completed(t, s, refund(t), "re_X")
	viaReceipt := parked(t, s, refund(t))
	receipt(t, s, viaReceipt.ID, "re_X")
	both := completed(t, s, refund(t), "re_X")
	receipt(t, s, both.ID, "re_X")
	other := parked(t, s, refund(t))
	receipt(t, s, other.ID, "re_Y")
	twice := parked(t, s, refund(t))
	receipt(t, s, twice.ID, "re_X")
	receipt(t, s, twice.ID, "re_X")
	completed(t, s, refund(t), "re_Y")

	wantListing(t, s, store.ListParams{ProviderRefundID: "re_X"},
		[]int64{twice.ID, both.ID, viaReceipt.ID, own.ID}, "re_X")
	wantListing(t, s, store.ListParams{ProviderRefundID: "re_X", State: store.StateSucceeded},
		[]int64{both.ID, own.ID}, "re_X succeeded")
	wantListing(t, s, store.ListParams{ProviderRefundID: "re_X", State: store.StateReady},
		[]int64{twice.ID, viaReceipt.ID}, "re_X ready")
	wantListing(t, s, store.ListParams{ProviderRefundID: "re_none"}, nil, "an unknown refund id")
	// Only by a receipt, and refund ids are byte-exact.
	wantListing(t, s, store.ListParams{ProviderRefundID: "re_x"}, nil, "re_x")

	// Many candidates the filters drop, before the one they keep: the
	// listing walks past them instead of ending with an empty page.
	p := refund(t)
	p.Provider = "globex"
	kept := enqueue(t, s, p)
	receipt(t, s, kept.ID, "re_Z")
	for i := 0; i < 7; i++ {
		j := enqueue(t, s, refund(t))
		receipt(t, s, j.ID, "re_Z")
	}
	wantListing(t, s, store.ListParams{ProviderRefundID: "re_Z", Provider: "globex"}, []int64{kept.ID}, "re_Z at globex")
	page, err := s.List(ctxFor(t), store.ListParams{ProviderRefundID: "re_Z", Provider: "globex", Limit: 1})
	if err != nil || len(page.Jobs) != 1 || page.NextPageToken != "" {
		t.Fatalf("re_Z at globex = %+v, %v; want one job on the last page", page, err)
	}
}

// testListJobsOneLookupAtATime: order_id, payment_id and provider_refund_id
// are lookups on their own indexes; two at once are refused, naming the
// second.
func testListJobsOneLookupAtATime(t *testing.T, s store.Store) {
	for field, p := range map[string]store.ListParams{
		"payment_id":         {OrderID: "o", PaymentID: "p", Limit: 1},
		"provider_refund_id": {OrderID: "o", ProviderRefundID: "re_1", Limit: 1},
	} {
		_, err := s.List(ctxFor(t), p)
		wantViolation(t, err, field)
	}
	_, err := s.List(ctxFor(t), store.ListParams{PaymentID: "p", ProviderRefundID: "re_1", Limit: 1})
	wantViolation(t, err, "provider_refund_id")
	for field, p := range map[string]store.ListParams{
		"payment_id":         {PaymentID: strings.Repeat("p", store.MaxKeyLen+1), Limit: 1},
		"provider_refund_id": {ProviderRefundID: strings.Repeat("r", store.MaxRefIDLen+1), Limit: 1},
		"reason_prefix":      {ReasonPrefix: strings.Repeat("r", store.MaxReasonLen+1), Limit: 1},
		"created_after": {CreatedAfter: time.Date(2025, 1, 2, 0, 0, 0, 0, time.UTC),
			CreatedBefore: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), Limit: 1},
	} {
		_, err := s.List(ctxFor(t), p)
		wantViolation(t, err, field)
	}
}

// testListJobsReasonPrefix: last_reason starts with the prefix, byte for
// byte: LIKE's wildcards are plain characters, case counts, and so do
// trailing spaces.
func testListJobsReasonPrefix(t *testing.T, s store.Store) {
	reasons := []string{"50% off_a", "50X off_a", "50% offXa", "abc", "Abc", "abc ", "xabc", "é+", "e+", `a\b`}
	byReason := map[string]int64{}
	for _, r := range reasons {
		job := enqueue(t, s, refund(t))
		w := reschedule(of(claimOne(t, s, "A", job.ID)), time.Hour)
		w.Reason = r
		write(t, s, w)
		byReason[r] = job.ID
	}
	escalatedJob, _ := escalated(t, s) // "no record outside window"
	for prefix, want := range map[string][]string{
		"50% off_": {"50% off_a"},
		"50%":      {"50% off_a", "50% offXa"},
		"5":        {"50% off_a", "50X off_a", "50% offXa"},
		"abc":      {"abc", "abc "},
		"abc ":     {"abc "},
		"é":        {"é+"},
		`a\`:       {`a\b`},
		"_":        nil,
		"%":        nil,
	} {
		var ids []int64
		for _, r := range want {
			ids = append(ids, byReason[r])
		}
		// By state, ready oldest due first: all next_attempt_at an hour from
		// each reschedule, in the order they ran.
		wantListing(t, s, store.ListParams{State: store.StateReady, ReasonPrefix: prefix}, ids, "ready "+prefix)
	}
	// Q3: alone, the filter would walk the whole history.
	_, err := s.List(ctxFor(t), store.ListParams{ReasonPrefix: "abc", Limit: 10})
	wantViolation(t, err, "reason_prefix")
	wantListing(t, s, store.ListParams{State: store.StateManualReview, ReasonPrefix: "no record"},
		[]int64{escalatedJob.ID}, "reviews")
	wantListing(t, s, store.ListParams{State: store.StateManualReview, ReasonPrefix: "abc"}, nil, "reviews abc")
}

// testListJobsCreatedRange: created_after is inclusive, created_before
// exclusive, at the stored microsecond, on the walk of every index.
func testListJobsCreatedRange(t *testing.T, s store.Store) {
	// In review the walk starts where created_after allows (a job enters
	// review after it is created): escalated out of creation order, every
	// job in range is listed, longest in review first.
	var mr []store.Job
	for range 3 {
		if len(mr) > 0 {
			waitForClock(t, s, mr[len(mr)-1].CreatedAt)
		}
		mr = append(mr, enqueue(t, s, refund(t)))
	}
	var held []store.ClaimedJob
	for _, j := range mr {
		held = append(held, claimOne(t, s, "A", j.ID))
	}
	for _, i := range []int{2, 0, 1} {
		write(t, s, escalate(of(held[i])))
		waitForClock(t, s, dbNow(t, s)) // distinct times of entering review
	}
	review := store.ListParams{State: store.StateManualReview}
	review.CreatedAfter = mr[0].CreatedAt
	wantListing(t, s, review, []int64{mr[2].ID, mr[0].ID, mr[1].ID}, "reviews created from the first")
	review.CreatedAfter = mr[1].CreatedAt
	wantListing(t, s, review, []int64{mr[2].ID, mr[1].ID}, "reviews created from the second")
	review.CreatedAfter, review.CreatedBefore = mr[0].CreatedAt, mr[1].CreatedAt
	wantListing(t, s, review, []int64{mr[0].ID}, "reviews created before the second")

	var jobs []store.Job // 0..5 of one payment, 6 of another
	for i := 0; i < 7; i++ {
		if i > 0 {
			waitForClock(t, s, jobs[i-1].CreatedAt) // distinct creation times
		}
		p := refund(t)
		if i < 6 {
			p.PaymentID = "pay-R"
		}
		jobs = append(jobs, enqueue(t, s, p))
	}
	ids := jobIDs(jobs)
	from, to := jobs[1].CreatedAt, jobs[4].CreatedAt
	for _, c := range []struct {
		name          string
		after, before time.Time
		// Oldest first: of the payment, and of all jobs.
		payment, all []int64
	}{
		{"after inclusive, before exclusive", from, to, ids[1:4], ids[1:4]},
		{"a nanosecond past stored times", from.Add(time.Nanosecond), to.Add(time.Nanosecond), ids[2:5], ids[2:5]},
		{"after only", from, time.Time{}, ids[1:6], ids[1:]},
		{"before only", time.Time{}, to, ids[:4], ids[:4]},
	} {
		by := store.ListParams{CreatedAfter: c.after, CreatedBefore: c.before}
		payment, state := by, by
		payment.PaymentID, state.State = "pay-R", store.StateReady
		wantListing(t, s, payment, newestFirst(c.payment...), c.name+", by payment")
		wantListing(t, s, state, c.all, c.name+", by state (oldest due first)")
		if _, err := s.List(ctxFor(t), store.ListParams{CreatedAfter: c.after, CreatedBefore: c.before, Limit: 10}); err == nil {
			t.Fatalf("%s: a created range alone walks the whole history, and must be refused (Q3)", c.name)
		}
	}
	// A token is bound to its range.
	p := store.ListParams{PaymentID: "pay-R", CreatedAfter: from, Limit: 1}
	page, err := s.List(ctxFor(t), p)
	if err != nil || page.NextPageToken == "" {
		t.Fatalf("first page = %+v, %v", page, err)
	}
	p.PageToken, p.CreatedAfter = page.NextPageToken, to
	_, err = s.List(ctxFor(t), p)
	wantViolation(t, err, "page_token")
}

// testListJobsObservationCounts_R15: each page counts the receipts on file
// for its own jobs; a job without any is absent.
func testListJobsObservationCounts_R15(t *testing.T, s store.Store) {
	a := enqueue(t, s, refund(t))
	b := enqueue(t, s, refund(t))
	c := enqueue(t, s, refund(t))
	fileReceipts(t, s, a.ID, 3)
	fileReceipts(t, s, c.ID, 1)
	first, err := s.List(ctxFor(t), store.ListParams{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := jobIDs(first.Jobs); !slices.Equal(got, []int64{c.ID, b.ID}) ||
		len(first.ObservationCounts) != 1 || first.ObservationCounts[c.ID] != 1 {
		t.Fatalf("first page %v counts %v, want [%d %d] with {%d: 1}", got, first.ObservationCounts, c.ID, b.ID, c.ID)
	}
	second, err := s.List(ctxFor(t), store.ListParams{Limit: 2, PageToken: first.NextPageToken})
	if err != nil {
		t.Fatal(err)
	}
	if got := jobIDs(second.Jobs); !slices.Equal(got, []int64{a.ID}) ||
		len(second.ObservationCounts) != 1 || second.ObservationCounts[a.ID] != 3 {
		t.Fatalf("second page %v counts %v, want [%d] with {%d: 3}", got, second.ObservationCounts, a.ID, a.ID)
	}
}
