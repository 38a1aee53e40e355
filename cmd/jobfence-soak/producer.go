package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
)

const (
	// producerConns is how many connections the producer's calls share.
	producerConns = 4
	// maxEnqueuesInFlight bounds the producer's concurrent calls; while a
	// restart holds that many, later jobs start late (their lag shows it).
	maxEnqueuesInFlight = 10000
	// enqueueGiveUp is how long one job's enqueue is retried while the
	// coordinator does not answer, before it counts as failed.
	enqueueGiveUp = 2 * time.Minute
	// soakProvider is the provider of the soak's refunds.
	soakProvider = "soak"
)

// producer enqueues job i at start + i/rate, each on its own goroutine, so
// that a slow or failed answer does not hold the next job back, and
// retries an enqueue the coordinator did not answer: the operation key
// makes the repeat return the same job (R1).
type producer struct {
	s       *soak
	clients []*jobfence.Client
	prefix  string // of every operation key of the run
	n       int
	// sentAt is, per job, the soak clock (ns since its start) just before
	// its first EnqueueRefund call; 0 until then.
	sentAt []atomic.Int64
	// jobID is, per job, the id its enqueue answered; 0 until then.
	jobID []atomic.Int64
	// done is set, per job, by its first completion.
	done []atomic.Bool

	acked     atomic.Int64 // enqueues answered
	completed atomic.Int64 // jobs completed (first completion each)
	retries   atomic.Int64 // enqueue calls repeated after UNAVAILABLE
	failed    atomic.Int64 // enqueues given up or refused
	lastSent  atomic.Int64 // soak clock of the last job's first call
}

func newProducer(s *soak, prefix string, n int) (*producer, error) {
	p := &producer{s: s, prefix: prefix, n: n, sentAt: make([]atomic.Int64, n), jobID: make([]atomic.Int64, n),
		done: make([]atomic.Bool, n)}
	for range producerConns {
		// One try per call: the producer repeats it itself, counting.
		c, err := jobfence.Dial(s.listen, jobfence.WithRetry(1, 0, 0))
		if err != nil {
			p.close()
			return nil, err
		}
		p.clients = append(p.clients, c)
	}
	return p, nil
}

func (p *producer) close() {
	for _, c := range p.clients {
		c.Close()
	}
}

// key is job i's operation key.
func (p *producer) key(i int) string { return fmt.Sprintf("%s%09d", p.prefix, i) }

// index is the job number of key, false when it is none of this run's.
func (p *producer) index(key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, p.prefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0 && i < p.n
}

// run enqueues the n jobs on the schedule that starts at start (a soak
// clock reading), and returns when every enqueue was answered, failed, or
// ctx ended.
func (p *producer) run(ctx context.Context, start time.Duration) {
	sem := make(chan struct{}, maxEnqueuesInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	rate := int64(p.s.cfg.rate)
	for i := range p.n {
		at := start + time.Duration(int64(i)*int64(time.Second)/rate)
		if !p.s.sleepUntil(ctx, at) {
			return
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			p.enqueue(ctx, i, at)
		})
	}
}

// enqueue sends job i, scheduled at the soak clock's at, until the
// coordinator answers it.
func (p *producer) enqueue(ctx context.Context, i int, at time.Duration) {
	key := p.key(i)
	req := jobfence.EnqueueRequest{OperationKey: key, OrderID: "order-" + key, PaymentID: "pay-" + key,
		AmountMinor: int64(100 + i%100000), Currency: "EUR", Provider: soakProvider}
	c := p.clients[i%len(p.clients)]
	first := p.s.clock()
	p.sentAt[i].Store(int64(first))
	if i == p.n-1 {
		p.lastSent.Store(int64(first))
	}
	p.s.win.sent(first - at)
	backoff := 100 * time.Millisecond
	for try := 1; ; try++ {
		job, created, err := c.EnqueueRefund(ctx, req)
		if err == nil {
			p.answered(i, key, job.ID, created, try)
			return
		}
		if ctx.Err() != nil {
			return
		}
		retryable := errors.Is(err, jobfence.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
		if !retryable || p.s.clock()-first > enqueueGiveUp {
			p.failed.Add(1)
			p.s.fail("enqueue %s: %v (try %d, %s after the first)", key, err, try,
				(p.s.clock() - first).Round(time.Millisecond))
			return
		}
		p.retries.Add(1)
		if !p.s.sleepFor(ctx, time.Duration(float64(backoff)*(0.5+rand.Float64()))) {
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

// answered records job i's enqueue answer. A first try answering an
// existing job, or a repeat answering another job than an earlier answer,
// is a key with two jobs or a key reused: both functional failures.
func (p *producer) answered(i int, key string, id int64, created bool, try int) {
	if prev := p.jobID[i].Swap(id); prev != 0 && prev != id {
		p.s.fail("key %s answered job %d, then job %d", key, prev, id)
	}
	if !created && try == 1 {
		p.s.fail("key %s: the first enqueue found job %d already there (created=false)", key, id)
	}
	p.acked.Add(1)
	p.s.win.enqueued()
}

// complete records the first completion of the job with key at the soak
// clock's now, and its enqueue→completed latency. A second completion that
// is not a replay of the first is a functional failure (a refund completed
// twice).
func (p *producer) complete(key string, id int64, replayed bool, now time.Duration) {
	i, ok := p.index(key)
	if !ok {
		p.s.fail("worker completed job %d whose key %q the producer never sent", id, key)
		return
	}
	if !p.done[i].CompareAndSwap(false, true) {
		if !replayed {
			p.s.fail("job %d (%s) completed twice, the second not a replay", id, key)
		}
		return
	}
	p.completed.Add(1)
	sent := time.Duration(p.sentAt[i].Load())
	p.s.win.completed(now - sent)
}
