package dispatch

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobfence/jobfence/tracing"
)

// batcher coalesces concurrent calls into shared transactions: one COMMIT
// for many enqueues or write-backs is what lets a backlog drain faster than
// one durable commit per job. At low rates it adds no wait: the idle flusher
// takes a call at once (but for the odd burst); calls that arrive while it is busy are gathered into
// its next batch. Under load it waits a little on purpose: when calls come
// at least twice per window from several callers, the first flusher holds a
// batch open while they keep coming, up to window, so that one transaction,
// one COMMIT and a few round trips carry many calls instead of each paying
// its own exactly when the machine has the least time to spare. The store
// answers each call of a batch on its own.
//
// One flusher runs calls as they come. The others are overflow: they take
// queued calls only while that flusher's batch has run for overflowAfter, so
// a slow or stalled transaction (a lock wait, a connection dying) does not
// hold up every call behind it, while in the usual case batches stay large
// and transactions do not compete for the database (on two cores, two
// flushers taking calls alike cost more database CPU per job and more
// latency than one: docs/BENCHMARKS.md).
type batcher[In, Out any, K batchKind[In, Out]] struct {
	kind     K
	queue    chan *batchCall[In, Out]
	maxBatch int
	timeout  time.Duration
	sizes    prometheus.Observer
	// busy holds, while the first flusher runs a batch, when it started
	// (UnixNano); 0 when it is idle. started wakes the overflow flushers.
	busy    atomic.Int64
	started chan struct{}
	// done is closed by close: the flushers stop, and calls waiting or made
	// later answer ErrClosed.
	done      chan struct{}
	closeOnce sync.Once
	// tracer, when tracing is on, traces each batch as one span named
	// spanName, linked to every call it served (R35); nil traces nothing.
	tracer   trace.Tracer
	spanName string
	// window is the longest the first flusher holds a batch open for more
	// calls under load; 0 never. pace is its estimate of the load; only the
	// first flusher uses it.
	window time.Duration
	pace   pace
	holds  prometheus.Observer // how long each held batch waited; nil: not observed
}

// windowCalls is how many calls a batch held open waits for at most: past a
// few dozen, one more call saves its share of a transaction that is no
// longer much.
const windowCalls = 32

// pace estimates how often calls come, from those that arrive while the
// first flusher runs a batch (smoothed: time running over calls arrived).
// Calls that wait for the batch's answers before they call again (a closed
// loop: workers completing jobs one after another) cannot arrive then, so
// they never make a batch wait for calls that cannot come; a lone caller
// never waits; and the time a batch is held open counts for nothing.
type pace struct {
	running time.Duration // smoothed time of a batch's transaction and answers
	arrived float64       // smoothed calls that arrived meanwhile
}

// ran records a batch that ran for took while arrived calls queued.
func (p *pace) ran(took time.Duration, arrived int) {
	p.running = (3*p.running + took) / 4
	p.arrived = (3*p.arrived + float64(arrived)) / 4
}

// hold reports how long to wait at most for each further call of a batch:
// four times the estimated gap between calls when calls come at least
// twice per window; 0 otherwise.
func (p *pace) hold(window time.Duration) time.Duration {
	if p.arrived <= 0 {
		return 0
	}
	gap := time.Duration(float64(p.running) / p.arrived)
	if 2*gap > window {
		return 0
	}
	return min(4*gap, window)
}

// A batchKind is one kind of batched call, what a batcher's flushers run:
// flush runs a batch of calls in one transaction and answers each, in
// order; abandon receives the outcome of a call whose caller gave up before
// it was answered. Each kind has its type in flush.go.
type batchKind[In, Out any] interface {
	flush(ctx context.Context, batch []In) []Out
	abandon(in In, out Out)
	// failed reports whether out is an error, counted on the batch's span.
	failed(out Out) bool
	// name is the kind's name on the batch's span: enqueue, claim, write,
	// renew.
	name() string
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
	// call is the span context of the caller, when traced: the batch's span
	// links to it; batch is the batch's span context, set before done is
	// closed: the caller's span links back to it.
	call, batch trace.SpanContext
}

// overflowAfter is how long the first flusher's batch runs before the
// overflow flushers take the calls queued behind it: longer than a healthy
// transaction, short against a stalled one.
const overflowAfter = 20 * time.Millisecond

// newBatcher starts flushers goroutines (one, and flushers-1 overflow) that
// hand batches of up to maxBatch calls to kind.flush, each under timeout,
// held open under load for up to window, traced by tracer unless it is nil.
func newBatcher[In, Out any, K batchKind[In, Out]](kind K, flushers, maxBatch int, timeout, window time.Duration,
	sizes prometheus.Observer, holds *prometheus.HistogramVec, tracer trace.Tracer) *batcher[In, Out, K] {
	b := &batcher[In, Out, K]{kind: kind, queue: make(chan *batchCall[In, Out], flushers*maxBatch), maxBatch: maxBatch,
		timeout: timeout, window: window, sizes: sizes, started: make(chan struct{}, flushers), done: make(chan struct{}),
		tracer: tracer, spanName: tracing.SpanBatch + " " + kind.name()}
	if holds != nil {
		b.holds = holds.WithLabelValues(kind.name())
	}
	go b.lead()
	for i := 1; i < flushers; i++ {
		go b.overflow()
	}
	return b
}

// do queues in and waits for its outcome. If ctx ends first the call may still
// be applied: enqueues and write-backs are safe to repeat (R1, R21); a claim
// granted to a caller that left goes to its kind's abandon, which hands it
// back.
func (b *batcher[In, Out, K]) do(ctx context.Context, in In) (Out, error) {
	c := &batchCall[In, Out]{in: in, done: make(chan struct{})}
	if b.tracer != nil {
		c.call = trace.SpanContextFromContext(ctx)
	}
	var zero Out
	select {
	case b.queue <- c:
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-b.done:
		return zero, ErrClosed
	}
	select {
	case <-c.done:
		linkBatch(ctx, c.batch)
		return c.out, nil
	case <-ctx.Done():
		if c.state.CompareAndSwap(callWaiting, callAbandoned) {
			return zero, ctx.Err()
		}
		<-c.done // answered meanwhile: the caller gets it after all
		linkBatch(ctx, c.batch)
		return c.out, nil
	case <-b.done:
		if c.state.CompareAndSwap(callWaiting, callAbandoned) {
			return zero, ErrClosed
		}
		<-c.done
		return c.out, nil
	}
}

// close stops the flushers once their batches in flight are answered.
func (b *batcher[In, Out, K]) close() { b.closeOnce.Do(func() { close(b.done) }) }

// lead is the first flusher: it runs every call as it comes, with those
// queued behind it.
func (b *batcher[In, Out, K]) lead() {
	for {
		var first *batchCall[In, Out]
		select {
		case first = <-b.queue:
		case <-b.done:
			close(b.started) // the overflow flushers stop too
			return
		}
		b.busy.Store(time.Now().UnixNano())
		for range cap(b.started) {
			select {
			case b.started <- struct{}{}:
			default:
			}
		}
		b.runBatch(first, true)
		b.busy.Store(0)
	}
}

// overflow is an overflow flusher: once the first flusher has run one batch
// for overflowAfter, it takes the calls queued meanwhile, until that batch
// ends.
func (b *batcher[In, Out, K]) overflow() {
	t := time.NewTimer(overflowAfter)
	t.Stop()
	for range b.started {
		for {
			since := b.busy.Load()
			if since == 0 {
				break // idle again: wait for its next batch
			}
			if wait := overflowAfter - time.Since(time.Unix(0, since)); wait > 0 {
				t.Reset(wait)
				<-t.C
				continue
			}
			select {
			case first := <-b.queue:
				b.runBatch(first, false)
			default:
				t.Reset(overflowAfter / 4) // nothing queued: look again soon
				<-t.C
			}
		}
	}
}

// runBatch runs first with the calls queued behind it, up to maxBatch, and
// answers each. The first flusher (lead) holds the batch open under load
// (pace) for up to windowCalls calls, for window at most and only while
// they keep coming: once none came for four times the gap between calls, it
// runs what it has. An overflow flusher never waits: it runs because calls
// already wait too long.
func (b *batcher[In, Out, K]) runBatch(first *batchCall[In, Out], lead bool) {
	batch, ins := []*batchCall[In, Out]{first}, []In{first.in}
gather:
	for len(batch) < b.maxBatch {
		select {
		case c := <-b.queue:
			batch, ins = append(batch, c), append(ins, c.in)
		default:
			break gather
		}
	}
	if lead && b.window > 0 {
		if each, want := b.pace.hold(b.window), min(windowCalls, b.maxBatch); each > 0 && len(batch) < want {
			held := time.Now()
			end := held.Add(b.window)
			t := time.NewTimer(each)
		hold:
			for len(batch) < want {
				select {
				case c := <-b.queue:
					batch, ins = append(batch, c), append(ins, c.in)
				case <-t.C:
					break hold
				case <-b.done:
					break hold
				}
				left := time.Until(end)
				if left <= 0 {
					break
				}
				t.Reset(min(each, left))
			}
			t.Stop()
			if b.holds != nil {
				b.holds.Observe(time.Since(held).Seconds())
			}
		}
	}
	b.sizes.Observe(float64(len(batch)))
	// The batch outlives any one caller: a caller that gives up must not
	// cut the others' transaction.
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	var span trace.Span
	if b.tracer != nil {
		ctx, span = b.startSpan(ctx, batch)
	}
	began := time.Now()
	outs := b.kind.flush(ctx, ins)
	if lead {
		// Calls that queued while the transaction ran: none can be waiting
		// for this batch's answers.
		b.pace.ran(time.Since(began), len(b.queue))
	}
	cancel()
	if span != nil {
		failed := 0
		for _, o := range outs {
			if b.kind.failed(o) {
				failed++
			}
		}
		span.SetAttributes(tracing.BatchFailedKey.Int(failed))
		span.End()
		for _, c := range batch {
			c.batch = span.SpanContext()
		}
	}
	for i, c := range batch {
		c.out = outs[i]
		if c.state.CompareAndSwap(callWaiting, callAnswered) {
			close(c.done)
		} else {
			b.kind.abandon(c.in, c.out)
		}
	}
}

// callLink and batchLink are the attributes of a batch's link to a call it
// served and of a call's link to its batch (shared, never changed).
var (
	callLink  = []attribute.KeyValue{tracing.LinkKind.String(tracing.LinkCall)}
	batchLink = []attribute.KeyValue{tracing.LinkKind.String(tracing.LinkBatch)}
)

// startSpan starts the span of a batch's shared transaction: a root of its
// own (one transaction serves many calls, of many traces) linked to each
// call it serves, not a child of any (R35). The store's statements are its
// children.
func (b *batcher[In, Out, K]) startSpan(ctx context.Context, batch []*batchCall[In, Out]) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(batch))
	for _, c := range batch {
		if c.call.IsValid() {
			links = append(links, trace.Link{SpanContext: c.call, Attributes: callLink})
		}
	}
	return b.tracer.Start(ctx, b.spanName, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithLinks(links...), trace.WithAttributes(tracing.BatchKindKey.String(b.kind.name()),
			tracing.BatchSizeKey.Int(len(batch))))
}

// linkBatch links the span of ctx, a call a batch served, to the batch's
// span: from a call's trace, its transaction is one click away.
func linkBatch(ctx context.Context, batch trace.SpanContext) {
	if batch.IsValid() {
		trace.SpanFromContext(ctx).AddLink(trace.Link{SpanContext: batch, Attributes: batchLink})
	}
}
