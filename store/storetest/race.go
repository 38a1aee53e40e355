package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// RaceJobs is how many jobs the concurrency test races over; a backend may
// lower it (the embedded store has one writer).
var RaceJobs = 2000

// testConcurrentClaimers: 16 claimers on their own connections race over the
// jobs with 1 s leases, random pauses and leases cut short, then write back with
// the attempt they hold. Every grant's attempt is unique per job and
// increasing; no job is granted twice in one generation; no write with an old
// attempt lands; every job ends succeeded exactly once.
func testConcurrentClaimers(t *testing.T, s store.Store) {
	const workers = 16
	n := RaceJobs
	ctx := ctxFor(t)
	for i := 0; i < n; i++ {
		p := refund(t)
		p.OperationKey = fmt.Sprintf("race-%d", i)
		if _, _, err := s.Enqueue(ctx, p); err != nil {
			t.Fatal(err)
		}
	}

	type grant struct {
		worker  int
		attempt int64
	}
	var (
		mu         sync.Mutex
		grants     = map[int64][]grant{} // job → every grant of it
		succeeded  = map[int64]int64{}   // job → attempt whose complete succeeded
		staleSeen  int
		remaining  = n
		writeFails []string
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-done:
					return
				default:
				}
				got, err := s.Claim(ctx, store.ClaimParams{WorkerID: fmt.Sprintf("w%d", w), MaxJobs: 1 + rng.IntN(4), Lease: time.Second})
				if err != nil {
					mu.Lock()
					writeFails = append(writeFails, "claim: "+err.Error())
					mu.Unlock()
					return
				}
				if len(got) == 0 {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				mu.Lock()
				for _, c := range got {
					grants[c.Job.ID] = append(grants[c.Job.ID], grant{w, c.Job.Attempt})
				}
				mu.Unlock()
				for _, c := range got {
					switch r := rng.IntN(100); {
					case r < 8: // a zombie: lose the lease, then write anyway
						_ = Expire(ctx, s, c.Job.ID)
						time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
					case r < 10: // a pause past the lease
						time.Sleep(1100 * time.Millisecond)
					case r < 30:
						time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
					}
					res, err := s.Write(ctx, complete(of(c), fmt.Sprintf("re_%d_%d", c.Job.ID, c.Job.Attempt)))
					mu.Lock()
					switch {
					case err == nil && !res.Replayed:
						if prev, ok := succeeded[c.Job.ID]; ok {
							writeFails = append(writeFails, fmt.Sprintf("job %d completed twice: attempts %d and %d", c.Job.ID, prev, c.Job.Attempt))
						}
						succeeded[c.Job.ID] = c.Job.Attempt
						remaining--
						if remaining == 0 {
							close(done)
						}
					case errors.Is(err, store.ErrStaleAttempt):
						staleSeen++
					default:
						writeFails = append(writeFails, fmt.Sprintf("job %d attempt %d: replayed=%v err=%v", c.Job.ID, c.Job.Attempt, res.Replayed, err))
					}
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	if len(writeFails) > 0 {
		t.Fatalf("%d unexpected results, first: %s", len(writeFails), writeFails[0])
	}
	if remaining != 0 {
		t.Fatalf("%d jobs never completed", remaining)
	}

	takeovers := 0
	for id, gs := range grants {
		// Appends race with each other; the attempts themselves must still be
		// exactly 1, 2, 3… per job.
		slices.SortFunc(gs, func(a, b grant) int { return int(a.attempt - b.attempt) })
		for i, g := range gs {
			// Attempts per job are exactly 1, 2, 3…: unique, increasing, none reused.
			if g.attempt != int64(i+1) {
				t.Fatalf("job %d grants %v: grant %d has attempt %d", id, gs, i, g.attempt)
			}
		}
		takeovers += len(gs) - 1
		d := get(t, s, id)
		final := gs[len(gs)-1].attempt
		if d.Job.State != store.StateSucceeded || d.Job.Attempt != final || succeeded[id] != final {
			t.Fatalf("job %d = %s attempt %d, completed by attempt %d; last grant %d",
				id, d.Job.State, d.Job.Attempt, succeeded[id], final)
		}
		if c := countKind(d.Events, store.EventCompleted); c != 1 {
			t.Fatalf("job %d has %d completed events", id, c)
		}
	}
	if len(grants) != n {
		t.Fatalf("%d jobs granted, want %d", len(grants), n)
	}
	t.Logf("%d jobs, %d takeovers, %d stale writes rejected", n, takeovers, staleSeen)
	if takeovers == 0 || staleSeen == 0 {
		t.Fatalf("the race produced %d takeovers and %d stale writes; it proves nothing", takeovers, staleSeen)
	}
}
