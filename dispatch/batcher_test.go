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
	}}, 1, 8, time.Minute, 0, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}), nil, nil)

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
		}}, flushers, 8, time.Minute, 0, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}), nil, nil)
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
	b := newBatcher[int, int](testFlush{run: func(_ context.Context, ins []int) []int { return ins }}, 2, 8, time.Minute, 0,
		prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}), nil, nil)
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

// TestBatcherHoldsBatchesOpenUnderLoad: calls from many callers, coming
// far more often than twice per window, share batches held open for them
// (many calls a transaction); without a window the same load runs in
// batches of what queued during the previous one (a flush takes 1ms here,
// about a short transaction with its COMMIT: about 4 calls).
func TestBatcherHoldsBatchesOpenUnderLoad(t *testing.T) {
	mean := func(window time.Duration) float64 {
		var mu sync.Mutex
		batches, calls := 0, 0
		b := newBatcher[int, int](testFlush{run: func(_ context.Context, ins []int) []int {
			mu.Lock()
			batches, calls = batches+1, calls+len(ins)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return ins
		}}, 1, 128, time.Minute, window, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}), nil, nil)
		defer b.close()
		// 8 callers, each a call every 2ms without waiting for its answer
		// (an open loop, like producers at a steady rate): 4,000 calls/s.
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 250 * time.Microsecond) // one call every 250µs in all
				tick := time.NewTicker(2 * time.Millisecond)
				defer tick.Stop()
				var calls sync.WaitGroup
				for range 150 {
					<-tick.C
					calls.Go(func() { b.do(context.Background(), 1) }) //nolint:errcheck
				}
				calls.Wait()
			})
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return float64(calls) / float64(batches)
	}
	held, plain := mean(20*time.Millisecond), mean(0)
	t.Logf("calls per batch: %.1f held open (window 20ms), %.1f without", held, plain)
	if held < 8 || held < 2*plain {
		t.Errorf("under load, %.1f calls per batch held open for up to 20ms (%.1f without); want at least 8 and "+
			"twice as many (4,000 calls/s)", held, plain)
	}
}

// TestBatcherNeverHoldsAWaitingCaller: callers that each wait for their
// answer before the next call (a closed loop: workers completing jobs one
// after another) are not held up waiting for calls that cannot come: a
// hold in vain backs off, so that 200 rounds of such callers take a small
// part of what a hold each would (200 windows).
func TestBatcherNeverHoldsAWaitingCaller(t *testing.T) {
	const window = 20 * time.Millisecond
	for callers := 1; callers <= 8; callers *= 2 {
		b := newBatcher[int, int](testFlush{run: func(_ context.Context, ins []int) []int { return ins }}, 1, 128,
			time.Minute, window, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}), nil, nil)
		began := time.Now()
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				for range 200 {
					if _, err := b.do(context.Background(), 1); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.close()
		if took := time.Since(began); took >= 50*window {
			t.Errorf("%d callers in a closed loop: 200 calls each took %s; batches waited for calls that could not come",
				callers, took)
		}
	}
}
