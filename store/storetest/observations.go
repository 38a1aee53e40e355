package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jobfence/jobfence/store"
)

// fileReceipts files n receipts for job with distinct provider event ids.
func fileReceipts(t *testing.T, s store.Store, job int64, n int) {
	t.Helper()
	fileReceiptsFrom(t, s, job, 0, n, func(i int) string {
		return fmt.Sprintf("webhook:p%d", i/store.MaxObservationsPerReporter)
	})
}

// fileReceiptsFrom files receipts from..to-1 of job, pending, each from
// reporter(i), without a grant's token, and requires each filed on the job.
func fileReceiptsFrom(t *testing.T, s store.Store, job int64, from, to int, reporter func(int) string) {
	t.Helper()
	for i := from; i < to; i++ {
		o, dup, err := s.Observe(ctxFor(t), store.ObservationParams{Job: store.JobRef{ID: job}, Source: "webhook",
			Outcome: store.OutcomePending, ProviderEventID: fmt.Sprintf("evt_%d_%d", job, i), Reporter: reporter(i)})
		if err != nil || dup || o.KeptAside != nil {
			t.Fatalf("receipt %d: %+v dup %v, %v", i, o, dup, err)
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

// keptAside files p and requires it kept in the unmatched log, not on its
// job (R28: never dropped), new, moving nothing; it returns the entry.
func keptAside(t *testing.T, s store.Store, p store.ObservationParams, job store.Job) store.UnmatchedEvent {
	t.Helper()
	before := get(t, s, job.ID)
	o, dup, err := s.Observe(ctxFor(t), p)
	if err != nil || dup || o.KeptAside == nil || o.ID != 0 || o.Expedited || o.JobID != job.ID {
		t.Fatalf("Observe(%s from %q) = %+v dup %v, %v; want it kept aside", p.ProviderEventID, p.Reporter, o, dup, err)
	}
	k := *o.KeptAside
	if k.ID == 0 || k.EventType != store.KeptAsideType || !strings.HasPrefix(k.ProviderEventID, store.KeptAsidePrefix) ||
		k.Provider != job.Provider || k.OperationKey != job.OperationKey || k.Outcome != p.Outcome ||
		k.ProviderRefundID != p.ProviderRefundID || !strings.Contains(k.Detail, fmt.Sprintf("job %d", job.ID)) {
		t.Fatalf("kept aside as %+v", k)
	}
	if events, _ := unmatched(t, s, store.MaxOverviewLimit); !slices.ContainsFunc(events, func(e store.UnmatchedEvent) bool {
		return e == k
	}) {
		t.Fatalf("%+v is not in the unmatched log %+v", k, events)
	}
	after := get(t, s, job.ID)
	if after.Job != before.Job || after.ObservationCount != before.ObservationCount || len(after.Events) != len(before.Events) {
		t.Fatalf("a receipt kept aside changed job %d:\n before %+v (%d receipts)\n after  %+v (%d receipts)", job.ID,
			before.Job, before.ObservationCount, after.Job, after.ObservationCount)
	}
	if again, dup, err := s.Observe(ctxFor(t), p); err != nil || !dup || again.KeptAside == nil || again.KeptAside.ID != k.ID {
		t.Fatalf("its repeat = %+v dup %v, %v; want the entry kept", again, dup, err)
	}
	return k
}

// testObservationRoomPerJob_R28: a job keeps at most MaxObservationsPerJob
// receipts, of which MaxUnverifiedObservationsPerJob without their grant's
// token and MaxObservationsPerReporter from one reporter without it, so
// that no credential or provider can fill another's job: the holders'
// receipts always find room. A receipt without room is kept in the
// unmatched log, never dropped, and moves nothing; a repeat of one on file
// is still its duplicate; other jobs are not affected.
func testObservationRoomPerJob_R28(t *testing.T, s store.Store) {
	job := sentAndWaiting(t, s, refund(t), 0)
	// One reporter fills its share; the next of its receipts, even one of
	// success, is kept aside, while another reporter still files.
	fileReceiptsFrom(t, s, job.ID, 0, store.MaxObservationsPerReporter, func(int) string { return "worker-x" })
	keptAside(t, s, store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "worker:x", Reporter: "worker-x",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_forged", ProviderEventID: "evt_x_more"}, job)
	// Many reporters fill the job's share of unverified receipts.
	fileReceiptsFrom(t, s, job.ID, store.MaxObservationsPerReporter, store.MaxUnverifiedObservationsPerJob,
		func(i int) string { return fmt.Sprintf("webhook:p%d", i/store.MaxObservationsPerReporter) })
	keptAside(t, s, store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "webhook", Reporter: "webhook:fresh",
		Outcome: store.OutcomeFailed, ProviderEventID: "evt_fresh"}, job)

	// The holder's receipts, carrying their grant's token, fill the rest.
	c := claimOne(t, s, "holder", job.ID)
	for i := store.MaxUnverifiedObservationsPerJob; i < store.MaxObservationsPerJob; i++ {
		o, dup, err := s.Observe(ctxFor(t), store.ObservationParams{Job: store.JobRef{ID: job.ID}, Attempt: c.Job.Attempt,
			LeaseToken: c.LeaseToken, Source: "worker:holder", Reporter: "worker-x", Outcome: store.OutcomePending,
			ProviderEventID: fmt.Sprintf("evt_%d_%d", job.ID, i)})
		if err != nil || dup || o.KeptAside != nil || !o.AttemptVerified {
			t.Fatalf("the holder's receipt %d = %+v dup %v, %v; want it filed, verified", i, o, dup, err)
		}
	}
	full := get(t, s, job.ID).Job
	keptAside(t, s, store.ObservationParams{Job: store.JobRef{ID: job.ID}, Attempt: c.Job.Attempt, LeaseToken: c.LeaseToken,
		Source: "worker:holder", Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_real",
		ProviderEventID: "evt_one_too_many"}, full)
	again := store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "webhook", Outcome: store.OutcomePending,
		ProviderEventID: fmt.Sprintf("evt_%d_%d", job.ID, 0)}
	if o, dup, err := s.Observe(ctxFor(t), again); err != nil || !dup || o.ID == 0 || o.KeptAside != nil {
		t.Fatalf("a repeat at the limit = %+v dup %v, %v; want the duplicate", o, dup, err)
	}
	fresh := enqueue(t, s, refund(t))
	fileReceipts(t, s, fresh.ID, 1)
	if d := get(t, s, job.ID); d.ObservationCount != store.MaxObservationsPerJob {
		t.Fatalf("%d receipts on file, want %d", d.ObservationCount, store.MaxObservationsPerJob)
	}
}
