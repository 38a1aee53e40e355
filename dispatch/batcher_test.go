package dispatch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// testFlush is a batchKind of functions, for tests of the batcher alone.
type testFlush struct {
	run       func(context.Context, []int) []int
	abandoned func(in, out int)
}

func (f testFlush) flush(ctx context.Context, ins []int) []int { return f.run(ctx, ins) }

func (f testFlush) abandon(in, out int) {
	if f.abandoned != nil {
		f.abandoned(in, out)
	}
}

func (testFlush) failed(out int) bool { return out < 0 }
func (testFlush) name() string        { return "test" }

// TestBatcherHandsAbandonedOutcomes: a caller that gives up while its batch
// runs gets its context's error, and the outcome it will never read goes to
// its kind's abandon (for a claim: the jobs to release), exactly once.
func TestBatcherHandsAbandonedOutcomes(t *testing.T) {
	running, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var abandoned []int
	b := newBatcher[int, int](testFlush{run: func(_ context.Context, ins []int) []int {
		if ins[0] == 1 {
			close(running)
		}
		<-release
		out := make([]int, len(ins))
		for i, v := range ins {
			out[i] = v * 10
		}
		return out
	}, abandoned: func(in, out int) {
		mu.Lock()
		abandoned = append(abandoned, out)
		mu.Unlock()
	}}, 1, 8, time.Minute, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}), nil)

	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() { _, err := b.do(ctx, 1); gone <- err }()
	<-running // the call is in the running batch
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

// TestBatcherOverflowsAStalledBatch: calls queued behind a batch that hangs
// are run by an overflow flusher once it has run for overflowAfter, while a
// batcher of one flusher keeps them waiting.
func TestBatcherOverflowsAStalledBatch(t *testing.T) {
	for _, flushers := range []int{1, 2} {
		stalled, stall := make(chan struct{}), make(chan struct{})
		b := newBatcher[int, int](testFlush{run: func(_ context.Context, ins []int) []int {
			if ins[0] == 1 {
				close(stalled)
				<-stall
			}
			return ins
		}}, flushers, 8, time.Minute, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}), nil)
		go b.do(context.Background(), 1) //nolint:errcheck
		// The first call's batch is running.
		<-stalled
		// One flusher: still waiting well past overflowAfter. Two: the
		// stalled batch never ends before close(stall), so only the
		// overflow can answer the call, however long a loaded machine
		// takes to run it.
		wait := 10 * overflowAfter
		if flushers == 2 {
			wait = 10 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		got, err := b.do(ctx, 2)
		cancel()
		if flushers == 1 && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("one flusher: the call behind a stalled batch = %d, %v; want it still waiting", got, err)
		}
		if flushers == 2 && (err != nil || got != 2) {
			t.Errorf("two flushers: the call behind a stalled batch = %d, %v; want it run by the overflow", got, err)
		}
		close(stall)
	}
}

// TestBatcherClosed: after close the flushers stop, and a call answers
// ErrClosed instead of waiting for a batch that will never run.
func TestBatcherClosed(t *testing.T) {
	b := newBatcher[int, int](testFlush{run: func(_ context.Context, ins []int) []int { return ins }}, 2, 8, time.Minute,
		prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}), nil)
	if out, err := b.do(context.Background(), 7); err != nil || out != 7 {
		t.Fatalf("do before close = %d, %v", out, err)
	}
	b.close()
	b.close() // twice is fine
	done := make(chan error, 1)
	go func() {
		_, err := b.do(context.Background(), 8)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("do after close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("do after close still waits")
	}
}
