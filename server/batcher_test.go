package server

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestBatcherHandsAbandonedOutcomes: a caller that gives up while its batch
// runs gets its context's error, and the outcome it will never read goes to
// abandoned (for a claim: the jobs to release), exactly once.
func TestBatcherHandsAbandonedOutcomes(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var abandoned []int
	b := newBatcher(func(_ context.Context, ins []int) []int {
		<-release
		out := make([]int, len(ins))
		for i, v := range ins {
			out[i] = v * 10
		}
		return out
	}, 1, 8, time.Minute, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}))
	b.abandoned = func(in, out int) {
		mu.Lock()
		abandoned = append(abandoned, out)
		mu.Unlock()
	}

	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() { _, err := b.do(ctx, 1); gone <- err }()
	time.Sleep(20 * time.Millisecond) // the call is in the running batch
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned call returned %v", err)
	}
	close(release)
	got, err := b.do(context.Background(), 2)
	if err != nil || got != 20 {
		t.Fatalf("next call = %d, %v", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(abandoned) != 1 || abandoned[0] != 10 {
		t.Fatalf("abandoned outcomes %v, want [10]", abandoned)
	}
}
