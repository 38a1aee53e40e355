package storetest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jobfence/jobfence/store"
)

// fileReceipts files n receipts for job with distinct provider event ids.
func fileReceipts(t *testing.T, s store.Store, job int64, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, dup, err := s.Observe(ctxFor(t), store.ObservationParams{Job: store.JobRef{ID: job}, Source: "webhook",
			Outcome: store.OutcomePending, ProviderEventID: fmt.Sprintf("evt_%d_%d", job, i)}); err != nil || dup {
			t.Fatalf("receipt %d: dup %v, %v", i, dup, err)
		}
	}
}

// Issue: a job with many receipts made every claim it landed in
// undeliverable. A claim carries the newest few and their count; GetJob
// pages through all, oldest first, with a token bound to the job.
func testObservationsPaged_R15(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	other := enqueue(t, s, refund(t))
	const n = store.MaxClaimObservations + 7
	fileReceipts(t, s, job.ID, n)
	c := claim(t, s, "A", 1)[0]
	if c.Job.ID != job.ID || c.ObservationCount != n || len(c.Observations) != store.MaxClaimObservations {
		t.Fatalf("claim carries %d of %d receipts (count %d), want the newest %d", len(c.Observations), n,
			c.ObservationCount, store.MaxClaimObservations)
	}
	last := c.Observations[len(c.Observations)-1]
	if last.ProviderEventID != fmt.Sprintf("evt_%d_%d", job.ID, n-1) || c.Observations[0].ID > last.ID {
		t.Fatalf("claim's receipts %+v, want the newest, oldest first", c.Observations)
	}

	var seen []int64
	p := store.GetParams{JobRef: store.JobRef{ID: job.ID}, ObservationsLimit: 5}
	for page := 1; ; page++ {
		d, err := s.Get(ctxFor(t), p)
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		if d.ObservationCount != n || len(d.Observations) > 5 {
			t.Fatalf("page %d: %d receipts, count %d", page, len(d.Observations), d.ObservationCount)
		}
		for _, o := range d.Observations {
			seen = append(seen, o.ID)
		}
		if d.NextObservationsToken == "" {
			break
		}
		p.ObservationsPageToken = d.NextObservationsToken
		if _, err := s.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{ID: other.ID},
			ObservationsPageToken: d.NextObservationsToken}); err == nil {
			t.Fatal("a page token of one job was taken for another")
		}
	}
	if len(seen) != n {
		t.Fatalf("paged through %d receipts, want %d", len(seen), n)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Fatalf("pages out of order: %v", seen)
		}
	}
	_, err := s.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{ID: job.ID}, ObservationsLimit: store.MaxObservationPage + 1})
	wantViolation(t, err, "observations_page_size")
	_, err = s.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{ID: job.ID}, ObservationsPageToken: "bogus"})
	wantViolation(t, err, "observations_page_token")
}

// A job keeps at most MaxObservationsPerJob receipts: one more is refused
// (ErrObservationLimit), a repeat of one on file is still its duplicate, and
// other jobs are not affected.
func testObservationsCappedPerJob_R15(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	fileReceipts(t, s, job.ID, store.MaxObservationsPerJob)
	more := store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "webhook", Outcome: store.OutcomeSucceeded,
		ProviderEventID: "evt_one_too_many"}
	if _, _, err := s.Observe(ctxFor(t), more); !errors.Is(err, store.ErrObservationLimit) {
		t.Fatalf("receipt %d: %v, want ErrObservationLimit", store.MaxObservationsPerJob+1, err)
	}
	again := more
	again.ProviderEventID = fmt.Sprintf("evt_%d_%d", job.ID, 0)
	if o, dup, err := s.Observe(ctxFor(t), again); err != nil || !dup || o.ID == 0 {
		t.Fatalf("a repeat at the limit = %+v dup %v, %v; want the duplicate", o, dup, err)
	}
	fresh := enqueue(t, s, refund(t))
	fileReceipts(t, s, fresh.ID, 1)
	if d := get(t, s, job.ID); d.ObservationCount != store.MaxObservationsPerJob {
		t.Fatalf("%d receipts on file, want %d", d.ObservationCount, store.MaxObservationsPerJob)
	}
}
