package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobfence/jobfence/store"
)

// writeBatcher coalesces concurrent write-backs into shared transactions:
// one COMMIT for many Completes is what lets a backlog drain faster than one
// durable commit per job. It adds no wait: an idle flusher takes a write at
// once; only writes that arrive while every flusher is busy are gathered into
// the next batch. Each write is still fenced on its own and answered on its
// own (R9, R21).
type writeBatcher struct {
	store    store.Store
	queue    chan *writeCall
	maxBatch int
	timeout  time.Duration
	sizes    prometheus.Observer
}

type writeCall struct {
	w    store.Writeback
	out  store.WriteOutcome
	done chan struct{}
}

// newWriteBatcher starts flushers goroutines that run batches of up to
// maxBatch writes, each in a transaction bounded by timeout.
func newWriteBatcher(st store.Store, flushers, maxBatch int, timeout time.Duration, sizes prometheus.Observer) *writeBatcher {
	b := &writeBatcher{store: st, queue: make(chan *writeCall, flushers*maxBatch), maxBatch: maxBatch, timeout: timeout,
		sizes: sizes}
	for i := 0; i < flushers; i++ {
		go b.flush()
	}
	return b
}

// Write queues w and waits for its outcome. If ctx ends first the write may
// still be applied; repeating it is safe (R21).
func (b *writeBatcher) Write(ctx context.Context, w store.Writeback) (store.WriteResult, error) {
	c := &writeCall{w: w, done: make(chan struct{})}
	select {
	case b.queue <- c:
	case <-ctx.Done():
		return store.WriteResult{}, ctx.Err()
	}
	select {
	case <-c.done:
		return c.out.Result, c.out.Err
	case <-ctx.Done():
		return store.WriteResult{}, ctx.Err()
	}
}

func (b *writeBatcher) flush() {
	batch := make([]*writeCall, 0, b.maxBatch)
	ws := make([]store.Writeback, 0, b.maxBatch)
	for first := range b.queue {
		batch, ws = append(batch[:0], first), append(ws[:0], first.w)
	gather:
		for len(batch) < b.maxBatch {
			select {
			case c := <-b.queue:
				batch, ws = append(batch, c), append(ws, c.w)
			default:
				break gather
			}
		}
		// The batch outlives any one caller: a caller that gives up must not
		// cut the others' transaction.
		b.sizes.Observe(float64(len(batch)))
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		out := b.store.WriteMany(ctx, ws)
		cancel()
		for i, c := range batch {
			c.out = out[i]
			close(c.done)
		}
	}
}
