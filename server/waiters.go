package server

import "sync"

// waiters parks idle long-poll Claim calls until work may be available. A
// claimer registers before it queries, so a job enqueued between its empty
// query and its sleep still wakes it. Wakes go to the oldest waiters first,
// one per new job, so an enqueue does not stampede every idle worker.
type waiters struct {
	mu      sync.Mutex
	queue   []chan struct{}
	stopped bool
}

// add registers a waiter. Its channel is closed when it is woken.
func (w *waiters) add() chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		close(ch)
		return ch
	}
	w.queue = append(w.queue, ch)
	return ch
}

// remove unregisters ch if it was not woken.
func (w *waiters) remove(ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range w.queue {
		if c == ch {
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			return
		}
	}
}

// wake wakes up to n waiters, oldest first.
func (w *waiters) wake(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ; n > 0 && len(w.queue) > 0; n-- {
		close(w.queue[0])
		w.queue = w.queue[1:]
	}
}

// stop wakes every waiter and makes later ones return at once.
func (w *waiters) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	for _, ch := range w.queue {
		close(ch)
	}
	w.queue = nil
}

func (w *waiters) isStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}
