package server

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// batcher coalesces concurrent calls into shared transactions: one COMMIT
// for many enqueues or write-backs is what lets a backlog drain faster than
// one durable commit per job. It adds no wait: an idle flusher takes a call
// at once; only calls that arrive while every flusher is busy are gathered
// into the next batch. The store answers each call of a batch on its own.
type batcher[In, Out any] struct {
	run      func(context.Context, []In) []Out
	queue    chan *batchCall[In, Out]
	maxBatch int
	timeout  time.Duration
	sizes    prometheus.Observer
	// abandoned, when set, receives the outcome of a call whose caller gave up
	// before it was answered.
	abandoned func(In, Out)
}

// The states of a call: waiting for its batch, answered, or given up.
const (
	callWaiting int32 = iota
	callAnswered
	callAbandoned
)

type batchCall[In, Out any] struct {
	in    In
	out   Out
	done  chan struct{}
	state atomic.Int32
}

// newBatcher starts flushers goroutines that hand batches of up to maxBatch
// calls to run, each under timeout.
func newBatcher[In, Out any](run func(context.Context, []In) []Out, flushers, maxBatch int, timeout time.Duration,
	sizes prometheus.Observer) *batcher[In, Out] {
	b := &batcher[In, Out]{run: run, queue: make(chan *batchCall[In, Out], flushers*maxBatch), maxBatch: maxBatch,
		timeout: timeout, sizes: sizes}
	for i := 0; i < flushers; i++ {
		go b.flush()
	}
	return b
}

// do queues in and waits for its outcome. If ctx ends first the call may still
// be applied; the calls batched here are all safe to repeat (R1, R21).
func (b *batcher[In, Out]) do(ctx context.Context, in In) (Out, error) {
	c := &batchCall[In, Out]{in: in, done: make(chan struct{})}
	var zero Out
	select {
	case b.queue <- c:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	select {
	case <-c.done:
		return c.out, nil
	case <-ctx.Done():
		if c.state.CompareAndSwap(callWaiting, callAbandoned) {
			return zero, ctx.Err()
		}
		<-c.done // answered meanwhile: the caller gets it after all
		return c.out, nil
	}
}

func (b *batcher[In, Out]) flush() {
	batch := make([]*batchCall[In, Out], 0, b.maxBatch)
	ins := make([]In, 0, b.maxBatch)
	for first := range b.queue {
		batch, ins = append(batch[:0], first), append(ins[:0], first.in)
	gather:
		for len(batch) < b.maxBatch {
			select {
			case c := <-b.queue:
				batch, ins = append(batch, c), append(ins, c.in)
			default:
				break gather
			}
		}
		b.sizes.Observe(float64(len(batch)))
		// The batch outlives any one caller: a caller that gives up must not
		// cut the others' transaction.
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		outs := b.run(ctx, ins)
		cancel()
		for i, c := range batch {
			c.out = outs[i]
			if c.state.CompareAndSwap(callWaiting, callAnswered) {
				close(c.done)
			} else if b.abandoned != nil {
				b.abandoned(c.in, c.out)
			}
		}
	}
}
