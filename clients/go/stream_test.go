package jobfence_test

import (
	"slices"
	"testing"
	"time"

	jobfence "github.com/jobfence/jobfence/clients/go"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/server"
)

// The Worker takes its jobs from the worker stream by default: a job
// enqueued while it waits reaches it pushed, without a Claim call (its poll
// interval here is a minute), and its write-back goes on the stream too.
func TestWorkerTakesGrantsFromTheStream(t *testing.T) {
	c := startCoordinator(t)
	h := &recorder{}
	w := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "streamer", Concurrency: 4, PollInterval: time.Minute})
	r := runWorker(t, w)
	time.Sleep(200 * time.Millisecond) // the stream is open and its claim waits
	var ids []int64
	for range 10 {
		ids = append(ids, c.enqueue(t, "acme").ID)
	}
	for _, id := range ids {
		waitState(t, c, id, jobfence.StateSucceeded)
	}
	if n := c.callCount("Claim"); n != 0 {
		t.Fatalf("%d Claim calls; want every grant from the stream", n)
	}
	if n := c.callCount("Complete"); n != len(ids) {
		t.Fatalf("%d completions on the stream, want %d", n, len(ids))
	}
	r.cancel()
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := w.Stats(); s.Claimed != int64(len(ids)) || s.Completed != int64(len(ids)) {
		t.Fatalf("stats %+v", s)
	}
}

// R21 on the stream: a write-back served and then cut off with its stream
// is answered UNAVAILABLE, repeated, and lands once (the repeat is a
// replay); the worker opens a new stream and goes on taking work.
func TestWorkerStreamCutAfterWriteBackRepeatsIt_R21(t *testing.T) {
	c := startCoordinator(t)
	c.cutStreamAfter("Complete", 1)
	h := &recorder{}
	w := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "cut", PollInterval: time.Minute})
	r := runWorker(t, w)
	first := c.enqueue(t, "acme")
	d := waitState(t, c, first.ID, jobfence.StateSucceeded)
	if got, want := kinds(d), []string{"enqueued@0", "claimed@1", "completed@1"}; !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v: the repeat must not write again", got, want)
	}
	proctest.WaitFor(t, 10*time.Second, "the repeat answered as a replay", func() bool { return w.Stats().Replayed == 1 })
	second := c.enqueue(t, "acme")
	waitState(t, c, second.ID, jobfence.StateSucceeded)
	if got := h.log(); len(got) != 2 {
		t.Fatalf("handler calls %+v, want one per job", got)
	}
	r.cancel()
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := w.Stats(); s.Completed != 2 || s.StaleRejected != 0 || s.WriteFailures != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// An idle worker's stream stays one the coordinator grants work to: its
// heartbeats keep it from falling silent (server.StreamSilence), so a job
// enqueued after a long idle spell is still pushed to it.
func TestWorkerStreamHeartbeatsKeepAnIdleWorkerEligible(t *testing.T) {
	c := startCoordinator(t)
	h := &recorder{}
	w := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "idle", PollInterval: time.Minute})
	r := runWorker(t, w)
	time.Sleep(server.StreamSilence + 1500*time.Millisecond)
	job := c.enqueue(t, "acme")
	begun := time.Now()
	waitState(t, c, job.ID, jobfence.StateSucceeded)
	if took := time.Since(begun); took > 2*time.Second {
		t.Fatalf("the job took %s to reach the idle worker", took)
	}
	r.cancel()
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
