package dispatch

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
)

// holdingStore is a real store whose next ClaimMany or HasWork, once armed,
// waits after it has answered until released: the moment between a poll
// round's candidate walk (or an idle look) and what the waiters make of it.
type holdingStore struct {
	store.Store
	mu         sync.Mutex
	held, hold chan struct{}
}

func (h *holdingStore) arm() (held, release chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held, h.hold = make(chan struct{}), make(chan struct{})
	return h.held, h.hold
}

// pause holds the caller once, when armed.
func (h *holdingStore) pause() {
	h.mu.Lock()
	held, hold := h.held, h.hold
	h.held, h.hold = nil, nil
	h.mu.Unlock()
	if held != nil {
		close(held)
		<-hold
	}
}

func (h *holdingStore) ClaimMany(ctx context.Context, ps []store.ClaimParams) []store.ClaimOutcome {
	out := h.Store.ClaimMany(ctx, ps)
	h.pause()
	return out
}

func (h *holdingStore) HasWork(ctx context.Context, provider string) (bool, error) {
	work, err := h.Store.HasWork(ctx, provider)
	h.pause()
	return work, err
}

// TestPollRoundMissesNoWake: a job enqueued while the idle look of a poll
// instant runs, after it found nothing, wakes nobody (the waiters are out of
// the queue); they then claim at once rather than at the next poll instant,
// so the job reaches the waiting worker without a poll interval's delay.
func TestPollRoundMissesNoWake(t *testing.T) {
	for _, b := range testdb.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			const interval = 2 * time.Second
			h := &holdingStore{Store: b.Open(t)}
			s := New(h, Options{PollInterval: interval, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			type result struct {
				jobs []store.ClaimedJob
				err  error
				at   time.Time
			}
			got := make(chan result, 1)
			p := store.ClaimParams{WorkerID: "idle", MaxJobs: 1, Lease: time.Minute}
			go func() {
				jobs, err := s.Claim(ctx, p, 3*interval)
				got <- result{jobs, err, time.Now()}
			}()
			armed := func() bool {
				s.waiters.mu.Lock()
				defer s.waiters.mu.Unlock()
				return len(s.waiters.queue) == 1 && s.waiters.queue[0].claim != nil
			}
			for deadline := time.Now().Add(10 * time.Second); !armed(); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the claimer did not park")
				}
			}
			held, release := h.arm()
			select {
			case <-held: // the idle look has found nothing
			case <-time.After(2 * interval):
				t.Fatal("no idle look")
			}
			out, err := s.Enqueue(ctx, store.EnqueueParams{OperationKey: "during-the-round", OrderID: "o",
				PaymentID: "p", AmountMinor: 100, Currency: "EUR", Provider: "acme"})
			if err == nil {
				err = out.Err
			}
			if err != nil || !out.Created {
				t.Fatalf("enqueue: %v, %v", out, err)
			}
			released := time.Now()
			close(release)
			r := <-got
			if r.err != nil || len(r.jobs) != 1 || r.jobs[0].Job.ID != out.Job.ID {
				t.Fatalf("claim = %v, %v; want job %d", r.jobs, r.err, out.Job.ID)
			}
			if wait := r.at.Sub(released); wait > interval/2 {
				t.Fatalf("the job reached the waiting worker %s after the round: it waited for the next poll instant", wait)
			}
		})
	}
}
