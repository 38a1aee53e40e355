package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// ContentionRounds is how many claim and hand-back rounds each claimer of
// testClaimsAndWritebacksDoNotContend runs.
var ContentionRounds = 150

// testClaimsAndWritebacksDoNotContend: 16 claimers, the way the coordinator
// coalesces calls, each claim 4 jobs in one shared transaction and hand them
// all back in one write-back batch to their place in the due order, while
// running jobs with live leases and ready jobs not yet due surround the due
// ones in the indexes. Claims skip each other's rows (R13) and write-backs
// lock only their own rows, so no transaction is rolled back for a deadlock
// or a lock wait and retried (R20): every call succeeds and the store's retry
// count stays zero. (Before claims stopped locking the lease index and
// write-backs were held to the primary key, this deadlocked a few times per
// ten thousand rounds on MariaDB; TestClaimLeavesLiveLeasesUnlocked in
// store/mysql shows the lock deterministically.)
func testClaimsAndWritebacksDoNotContend(t *testing.T, s store.Store) {
	const claimers, perTx = 16, 4
	ctx := ctxFor(t)
	future := dbNow(t, s).Add(time.Hour)
	for i := 0; i < 200; i++ {
		p := refund(t)
		if i%2 == 1 {
			p.NotBefore = future // ends the due range with a job nobody claims
		}
		enqueue(t, s, p)
	}
	var (
		mu    sync.Mutex
		fails []string
		wg    sync.WaitGroup
	)
	fail := func(f string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fails = append(fails, fmt.Sprintf(f, args...))
	}
	for w := 0; w < claimers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			ps := make([]store.ClaimParams, perTx)
			for i := range ps {
				ps[i] = store.ClaimParams{WorkerID: fmt.Sprintf("w%d-%d", w, i), MaxJobs: 1, Lease: time.Minute}
			}
			for r := 0; r < ContentionRounds; r++ {
				var ws []store.Writeback
				for _, out := range s.ClaimMany(ctx, ps) {
					if out.Err != nil {
						fail("claim: %v", out.Err)
						return
					}
					for _, c := range out.Jobs {
						// Back to its place in the due order, as it was.
						ws = append(ws, store.Writeback{Kind: store.EventRescheduled, JobID: c.Job.ID,
							Attempt: c.Job.Attempt, LeaseToken: c.LeaseToken, NextAction: store.ActionRefund, At: c.Job.NextAttemptAt,
							Reason: "handed back"})
					}
				}
				for i, out := range s.WriteMany(ctx, ws) {
					if out.Err != nil {
						fail("reschedule job %d attempt %d: %v", ws[i].JobID, ws[i].Attempt, out.Err)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	if len(fails) > 0 {
		t.Fatalf("%d calls failed, first: %s", len(fails), fails[0])
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Jobs[store.StateReady] != 200 {
		t.Fatalf("jobs by state after the run: %v; want all 200 ready", st.Jobs)
	}
	if st.TxRetries != 0 {
		t.Fatalf("%d transactions were rolled back by the database and retried; claims and write-backs contend", st.TxRetries)
	}
}
