package server

import "sync"

// waiters parks idle long-poll Claim calls until work may be available. A
// claimer registers before it queries, so a job enqueued between its empty
// query and its sleep still wakes it. Wakes go to the oldest waiters first,
// one per new job, so an enqueue does not stampede every idle worker.
type waiters struct {
	mu      sync.Mutex
	queue   []waiter
	stopped bool
}

type waiter struct {
	ch       chan struct{}
	provider string // the claim's provider filter; empty takes any
}

// add registers a waiter for jobs of provider (any when empty). Its channel is
// closed when it is woken.
func (w *waiters) add(provider string) chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		close(ch)
		return ch
	}
	w.queue = append(w.queue, waiter{ch: ch, provider: provider})
	return ch
}

// remove unregisters ch if it was not woken.
func (w *waiters) remove(ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range w.queue {
		if c.ch == ch {
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			return
		}
	}
}

// wake wakes the oldest waiter that would claim a job of provider.
func (w *waiters) wake(provider string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range w.queue {
		if c.provider == "" || c.provider == provider {
			close(c.ch)
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			return
		}
	}
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

func (w *waiters) isStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}
