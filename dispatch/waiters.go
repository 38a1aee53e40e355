package dispatch

import (
	"sync"

	"go.opentelemetry.io/otel/trace"

	"github.com/jobfence/jobfence/store"
)

// waiters parks idle long-poll Claim calls until work may be available. A
// claimer registers before it queries, so a job enqueued between its empty
// query and its sleep still wakes it. Wakes go to the oldest waiters first,
// one per new job, so an enqueue does not stampede every idle worker.
//
// A waiter whose claim came back empty is armed with its claim: an enqueue
// may then take it and run the claim in its own transaction (hand-off), so
// the new job reaches an idle worker with the enqueue's COMMIT instead of a
// wake and a claim transaction of its own.
type waiters struct {
	mu      sync.Mutex
	queue   []*waiter
	stopped bool
	wakes   uint64 // wake calls so far, whether or not they found a waiter
}

type waiter struct {
	ch       chan struct{} // closed when woken or handed an outcome
	provider string        // the claim's provider filter; empty takes any
	claim    *store.ClaimParams
	// handed is set, before ch is closed, when an enqueue or a poll round
	// took the waiter: out is then its claim's outcome. looked says a poll
	// round claimed for it and no wake can have missed it meanwhile.
	handed, looked bool
	out            store.ClaimOutcome
	// wakes is the wake count when the waiter was taken to be handed its
	// outcome: what the caller's next claim compares against (Shortfall).
	wakes uint64
	// call is the waiting call's span context when traced, set by arm;
	// batch the span context of the transaction that claimed for it, set
	// before it is handed its outcome (R35).
	call, batch trace.SpanContext
}

// add registers a waiter for jobs of provider (any when empty).
func (w *waiters) add(provider string) *waiter {
	wt := &waiter{ch: make(chan struct{}), provider: provider}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		close(wt.ch)
		return wt
	}
	w.queue = append(w.queue, wt)
	return wt
}

// arm makes wt, if still waiting, one an enqueue may hand work to with p;
// call is the waiting call's span context (invalid when not traced).
func (w *waiters) arm(wt *waiter, p store.ClaimParams, call trace.SpanContext) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wt.claim = &p
	wt.call = call
}

// remove unregisters wt. It reports false when wt was woken or taken first.
func (w *waiters) remove(wt *waiter) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range w.queue {
		if c == wt {
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			return true
		}
	}
	return false
}

// wake wakes the oldest waiter that would claim a job of provider.
func (w *waiters) wake(provider string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wakes++
	for i, c := range w.queue {
		if c.provider == "" || c.provider == provider {
			close(c.ch)
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			return
		}
	}
}

// take removes and returns up to n armed waiters, oldest first, that would
// claim a job of one of providers (nil: any). The caller must hand each its
// outcome.
func (w *waiters) take(n int, providers map[string]bool) []*waiter {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*waiter
	kept := w.queue[:0]
	for _, c := range w.queue {
		if len(out) < n && c.claim != nil && (providers == nil || c.provider == "" || providers[c.provider]) {
			c.wakes = w.wakes
			out = append(out, c)
			continue
		}
		kept = append(kept, c)
	}
	clear(w.queue[len(kept):])
	w.queue = kept
	return out
}

// hand gives a taken waiter its claim's outcome and wakes it.
func (w *waiters) hand(wt *waiter, out store.ClaimOutcome) {
	wt.out, wt.handed = out, true
	close(wt.ch)
}

// stop wakes every waiter and makes later ones return at once.
func (w *waiters) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	for _, c := range w.queue {
		close(c.ch)
	}
	w.queue = nil
}

// wakeCount returns how many wakes there have been: a poll round that saw it
// change while its waiters were out of the queue may have missed one.
func (w *waiters) wakeCount() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wakes
}

func (w *waiters) isStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}
