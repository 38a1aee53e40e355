package jobfence_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
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

// A coordinator that vanishes without a FIN or RST (its host gone, a path
// dropping every packet) is noticed by the connection's keepalive
// (DefaultKeepaliveTime, then DefaultKeepaliveTimeout for the ping's
// answer), not by the kernel's retransmission timeout some 15 minutes
// later: the worker stream ends UNAVAILABLE, the write-back it carried is
// answered UNAVAILABLE and repeated on a new connection (R21), landing once
// under its grant (R9, R25), and the worker opens a new stream with its
// free slot and is granted a job enqueued after the blackhole (R18). The
// worker's calls time out only after a minute, so nothing but the keepalive
// meets the bound.
func TestWorkerStreamOnABlackholedConnectionReconnects_R21(t *testing.T) {
	t.Parallel() // mostly waiting for the keepalive
	c := startCoordinator(t)
	p := startBlackholeProxy(t, c.addr)
	wc, err := jobfence.Dial(p.addr, jobfence.WithCallTimeout(time.Minute),
		jobfence.WithRetry(6, 10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wc.Close() })
	first := c.enqueue(t, "acme")
	started, release := make(chan struct{}), make(chan struct{})
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		if j.Job.ID == first.ID {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return jobfence.Succeeded(fmt.Sprintf("re_%d", j.Job.ID))
	}}
	var mu sync.Mutex
	var ended time.Time // the first stream's end
	var endErr error
	w, err := jobfence.NewWorker(wc, h, jobfence.WorkerOptions{
		WorkerID: "blackholed", PollInterval: time.Minute, ClaimBackoff: 50 * time.Millisecond,
		RenewInterval: 200 * time.Millisecond,
		ReceiptSpool:  filepath.Join(t.TempDir(), "receipts.jsonl"),
		OnEvent: func(e jobfence.WorkerEvent) {
			mu.Lock()
			defer mu.Unlock()
			if e.Kind == jobfence.WorkerClaimFailed && ended.IsZero() {
				ended, endErr = time.Now(), e.Err
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := runWorker(t, w)
	t.Cleanup(func() {
		if t.Failed() {
			p.close() // a stream still on the dead connection would hold the drain
		}
	})
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the job never reached the worker")
	}
	// The coordinator has seen the worker hold the grant once a renewal is
	// answered on the stream, after the grant's acknowledgement: a grant
	// whose ack the blackhole took with it is handed back, as one never
	// received.
	proctest.WaitFor(t, 10*time.Second, "a renewal of the held grant", func() bool { return w.Stats().Renewals >= 1 })
	blackholed := time.Now()
	p.blackhole()
	close(release) // the write-back goes on the dead stream
	second := c.enqueue(t, "acme")
	// Detection takes 5 to 15 s after the blackhole (the last read, then a
	// ping after 10 s of silence and 5 s for its answer).
	const bound = 30 * time.Second
	proctest.WaitFor(t, bound, "both jobs succeeded after the blackhole", func() bool {
		return c.get(t, first.ID).Job.State == jobfence.StateSucceeded &&
			c.get(t, second.ID).Job.State == jobfence.StateSucceeded
	})
	took := time.Since(blackholed)
	mu.Lock()
	detected, why := ended.Sub(blackholed), endErr
	mu.Unlock()
	t.Logf("stream ended %s after the blackhole (%v); both jobs done after %s", detected.Round(time.Millisecond), why,
		took.Round(time.Millisecond))
	if ended.IsZero() || !errors.Is(why, jobfence.ErrUnavailable) {
		t.Fatalf("stream end %v (%v); want UNAVAILABLE", detected, why)
	}
	if got, want := kinds(c.get(t, first.ID)), []string{"enqueued@0", "claimed@1", "completed@1"}; !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v: the grant held through the blackhole writes back once", got, want)
	}
	if n := p.acceptedConns(); n < 2 {
		t.Fatalf("%d connections through the proxy; want a new one after the blackhole", n)
	}
	r.cancel()
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := w.Stats(); s.Completed != 2 || s.Replayed != 0 || s.WriteFailures != 0 || s.StaleRejected != 0 || s.ClaimFailures < 1 {
		t.Fatalf("stats %+v", s)
	}
}
