package server

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jobfence/jobfence/store"
)

// M1: the stale rejections a coordinator keeps are its newest
// staleRejectionsKept, newest first, with the count of all since it
// started; concurrent write-backs record them safely.
func TestStaleLogKeepsTheNewest_M1(t *testing.T) {
	var l staleLog
	if got, total := l.recent(10); len(got) != 0 || total != 0 {
		t.Fatalf("empty log = %v, %d", got, total)
	}
	stale := func(job, current int64) error {
		return &store.FenceError{Err: store.ErrStaleAttempt, Attempt: 1, Current: store.Job{ID: job, Attempt: current}}
	}
	ctx := context.WithValue(context.Background(), identityKey{}, Identity{Name: "worker-a"})
	for id := int64(1); id <= 250; id++ {
		l.add(ctx, store.Writeback{Kind: store.EventCompleted, JobID: id, Attempt: 1}, stale(id, id+1))
	}
	got, total := l.recent(staleRejectionsKept + 5)
	if total != 250 || len(got) != staleRejectionsKept {
		t.Fatalf("kept %d of %d, want %d of 250", len(got), total, staleRejectionsKept)
	}
	for i, r := range got {
		if want := int64(250 - i); r.jobID != want || r.currentAttempt != want+1 || r.attempt != 1 ||
			r.rpc != "Complete" || r.caller != "worker-a" || r.at.IsZero() {
			t.Fatalf("rejection %d = %+v, want job %d newest first", i, r, want)
		}
	}
	if few, _ := l.recent(3); len(few) != 3 || few[0].jobID != 250 || few[2].jobID != 248 {
		t.Fatalf("recent(3) = %+v", few)
	}

	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				l.add(context.Background(), store.Writeback{Kind: store.EventEscalated, JobID: int64(g*1000 + i), Attempt: 2},
					fmt.Errorf("wrapped: %w", stale(1, 3)))
				l.recent(5)
			}
		}()
	}
	wg.Wait()
	got, total = l.recent(staleRejectionsKept)
	if total != 250+800 || len(got) != staleRejectionsKept || got[0].rpc != "Escalate" || got[0].caller != "" ||
		got[0].currentAttempt != 3 {
		t.Fatalf("after concurrent adds: %d kept of %d, newest %+v", len(got), total, got[0])
	}
}
