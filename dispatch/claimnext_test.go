package dispatch

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
)

// countingStore counts the claim transactions the dispatcher runs.
type countingStore struct {
	store.Store
	claims atomic.Int64
}

func (c *countingStore) ClaimMany(ctx context.Context, ps []store.ClaimParams) []store.ClaimOutcome {
	c.claims.Add(1)
	return c.Store.ClaimMany(ctx, ps)
}

var nextKey atomic.Int64

func enqueueOne(t *testing.T, d *Dispatcher) int64 {
	t.Helper()
	out, err := enqueueNext(context.Background(), d)
	if err != nil || !out.Created {
		t.Fatalf("enqueue: %v, %v", out, err)
	}
	return out.Job.ID
}

// enqueueNext enqueues a refund under the next key; err includes the
// outcome's own. Safe from any goroutine.
func enqueueNext(ctx context.Context, d *Dispatcher) (store.EnqueueOutcome, error) {
	out, err := d.Enqueue(ctx, store.EnqueueParams{OperationKey: fmt.Sprintf("next-%d", nextKey.Add(1)),
		OrderID: "o", PaymentID: "p", AmountMinor: 100, Currency: "EUR", Provider: "acme"})
	if err == nil {
		err = out.Err
	}
	return out, err
}

// waitArmed waits until n waiters are armed.
func waitArmed(t *testing.T, d *Dispatcher, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		d.waiters.mu.Lock()
		armed := 0
		for _, w := range d.waiters.queue {
			if w.claim != nil {
				armed++
			}
		}
		d.waiters.mu.Unlock()
		if armed == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters armed, want %d", armed, n)
		}
	}
}

// ClaimNext after a grant of fewer jobs than asked for waits without an
// empty claim transaction first, and still gets the next enqueue's job
// handed over; a wake since that grant (a job nobody was waiting for) makes
// it look first, so that job is not left for the next poll instant (here a
// minute away).
func TestClaimNextSkipsTheLookAfterAShortfallUnlessWoken(t *testing.T) {
	for _, b := range testdb.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			st := &countingStore{Store: b.Open(t)}
			d := New(st, Options{PollInterval: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			defer d.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p := store.ClaimParams{WorkerID: "stream", MaxJobs: 4, Lease: time.Minute}
			var prev Shortfall
			claim := func() <-chan []store.ClaimedJob {
				got := make(chan []store.ClaimedJob, 1)
				go func() {
					jobs, err := d.ClaimNext(ctx, p, 30*time.Second, &prev)
					if err != nil {
						t.Error(err)
					}
					got <- jobs
				}()
				return got
			}
			first := claim()
			waitArmed(t, d, 1)
			id := enqueueOne(t, d)
			if jobs := <-first; len(jobs) != 1 || jobs[0].Job.ID != id {
				t.Fatalf("first grant %v, want job %d handed over", jobs, id)
			}
			before := st.claims.Load()
			second := claim()
			waitArmed(t, d, 1)
			if n := st.claims.Load() - before; n != 0 {
				t.Fatalf("%d claim transactions before waiting after a shortfall, want none", n)
			}
			id = enqueueOne(t, d)
			if jobs := <-second; len(jobs) != 1 || jobs[0].Job.ID != id {
				t.Fatalf("second grant %v, want job %d handed over", jobs, id)
			}

			unseen := enqueueOne(t, d) // no waiter: it only wakes, and stays due
			third := claim()
			select {
			case jobs := <-third:
				if len(jobs) != 1 || jobs[0].Job.ID != unseen {
					t.Fatalf("third grant %v, want job %d", jobs, unseen)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the job enqueued since the shortfall waited for the next poll instant: the wake did not make the claim look")
			}
		})
	}
}

// Claims are never held open for more claims, however fast they come: a
// claim is a worker with free slots (a stream's credits, a long poll), and
// holding it idles them. Enqueues under the same window are (the control).
func TestClaimsAreNeverHeldOpen(t *testing.T) {
	st := testdb.SQLiteBackend().Open(t)
	holds := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "holds"}, []string{"kind"})
	d := New(st, Options{PollInterval: time.Minute, Window: 50 * time.Millisecond, Metrics: Metrics{Holds: holds},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const jobs = 600
	// 12 producers enqueue without waiting for each other, then 12 workers
	// claim one job a call until all are taken: both far above twice per window.
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Go(func() {
			for i := w; i < jobs; i += 12 {
				if _, err := enqueueNext(ctx, d); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	var claimed atomic.Int64
	for range 12 {
		wg.Go(func() {
			for claimed.Load() < jobs && ctx.Err() == nil {
				got, err := d.Claim(ctx, store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: time.Minute}, 0)
				if err != nil {
					t.Error(err)
					return
				}
				claimed.Add(int64(len(got)))
			}
		})
	}
	wg.Wait()
	count := func(kind string) uint64 {
		var m dto.Metric
		if err := holds.WithLabelValues(kind).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	if n := count("enqueue"); n == 0 {
		t.Errorf("no enqueue batch was held open under the load: the control shows nothing")
	}
	if n := count("claim"); n != 0 {
		t.Errorf("%d claim batches were held open, want none", n)
	}
}
