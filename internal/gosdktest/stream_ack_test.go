package jobfence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
)

// ackTap watches the coordinator's side of the worker streams: the
// WorkStarts, the grants sent and the acks read, each with when. It can
// hold the next grant back until its stream's worker has half-closed, so
// that the grant reaches a draining worker.
type ackTap struct {
	mu     sync.Mutex
	starts []*pb.WorkStart
	grants []tappedGrant
	acks   []tappedAck
	// holdNext: the next grant waits for its stream's half-close; held
	// gets its jobs' ids once it waits.
	holdNext bool
	held     chan []int64
}

type tappedGrant struct {
	at   time.Time
	jobs []*pb.ClaimedJob
}

type tappedAck struct {
	at     time.Time
	grants []*pb.GrantRef
}

func newAckTap() *ackTap { return &ackTap{held: make(chan []int64, 1)} }

func (a *ackTap) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &ackTapStream{ServerStream: ss, tap: a, halfClosed: make(chan struct{})})
}

// holdNextGrant makes the next grant sent wait until its worker half-closed.
func (a *ackTap) holdNextGrant() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.holdNext = true
}

func (a *ackTap) snapshot() ([]*pb.WorkStart, []tappedGrant, []tappedAck) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.starts), slices.Clone(a.grants), slices.Clone(a.acks)
}

type ackTapStream struct {
	grpc.ServerStream
	tap        *ackTap
	once       sync.Once
	halfClosed chan struct{}
}

func (s *ackTapStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if errors.Is(err, io.EOF) {
		s.once.Do(func() { close(s.halfClosed) })
	}
	if err != nil {
		return err
	}
	req := m.(*pb.WorkRequest)
	s.tap.mu.Lock()
	defer s.tap.mu.Unlock()
	switch {
	case req.GetStart() != nil:
		s.tap.starts = append(s.tap.starts, req.GetStart())
	case req.GetAck() != nil:
		s.tap.acks = append(s.tap.acks, tappedAck{at: time.Now(), grants: req.GetAck().GetGrants()})
	}
	return nil
}

func (s *ackTapStream) SendMsg(m any) error {
	grant := m.(*pb.WorkResponse).GetGrant()
	if grant == nil {
		return s.ServerStream.SendMsg(m)
	}
	s.tap.mu.Lock()
	hold := s.tap.holdNext
	s.tap.holdNext = false
	s.tap.mu.Unlock()
	if hold {
		var ids []int64
		for _, j := range grant.GetJobs() {
			ids = append(ids, j.GetJob().GetId())
		}
		s.tap.held <- ids
		select {
		case <-s.halfClosed:
		case <-s.Context().Done():
		case <-time.After(30 * time.Second): // the test failed; let the stream go
		}
	}
	err := s.ServerStream.SendMsg(m)
	if err == nil {
		s.tap.mu.Lock()
		s.tap.grants = append(s.tap.grants, tappedGrant{at: time.Now(), jobs: grant.GetJobs()})
		s.tap.mu.Unlock()
	}
	return err
}

func startTappedCoordinator(t *testing.T) (*coordinator, *ackTap) {
	t.Helper()
	tap := newAckTap()
	return startCoordinatorOn(t, testdb.MySQLBackend(), []grpc.ServerOption{grpc.ChainStreamInterceptor(tap.intercept)}), tap
}

// The Worker acknowledges each grant as it reads it, before the handler
// starts (WorkStart.acknowledges): one WorkAck per WorkGrant, naming each of
// its jobs with the grant's attempt and lease token (R25), within moments of
// the send. Handlers that run past the coordinator's acknowledgement
// timeout (server.StreamAckTimeout) keep their jobs: each completes under
// its first grant, where an unacknowledged grant would have been handed back
// at 5 s. The lease is 30 s, so the first renewal (R27), which also shows
// the coordinator a grant, comes too late to save one.
func TestWorkerStreamAcknowledgesEachGrantBeforeItsHandlerRuns_R25(t *testing.T) {
	t.Parallel() // mostly waiting out the handlers
	c, tap := startTappedCoordinator(t)
	slow := server.StreamAckTimeout + 2*time.Second
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		select { // a provider call this slow
		case <-time.After(slow):
		case <-ctx.Done():
		}
		return jobfence.Succeeded("re_slow")
	}}
	w := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "acker", Concurrency: 3, Lease: 30 * time.Second,
		PollInterval: time.Minute})
	r := runWorker(t, w)
	proctest.WaitFor(t, 10*time.Second, "the worker's stream", func() bool { s, _, _ := tap.snapshot(); return len(s) == 1 })
	var jobs []jobfence.Job
	for range 3 {
		jobs = append(jobs, c.enqueue(t, "acme"))
	}
	for _, j := range jobs {
		var d jobfence.JobDetail
		proctest.WaitFor(t, 20*time.Second, fmt.Sprintf("job %d written back", j.ID), func() bool {
			d = c.get(t, j.ID)
			return d.Job.State != jobfence.StateRunning && d.Job.State != jobfence.StateReady ||
				d.Job.Attempt > 0 && d.Job.State == jobfence.StateReady // handed back
		})
		if got, want := kinds(d), []string{"enqueued@0", "claimed@1", "completed@1"}; !slices.Equal(got, want) {
			t.Fatalf("job %d: history %v, want %v: the grant was handed back (last reason %q)", j.ID, got, want, d.Job.LastReason)
		}
	}
	r.cancel()
	if err := r.wait(t, 20*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := w.Stats(); s.Completed != 3 || s.StaleRejected != 0 || s.WriteFailures != 0 || s.Renewals != 0 {
		t.Fatalf("stats %+v: want three completions, nothing refused and no renewal", s)
	}

	starts, grants, acks := tap.snapshot()
	if len(starts) != 1 || !starts[0].GetAcknowledges() {
		t.Fatalf("WorkStarts %v: want one, with acknowledges", starts)
	}
	if len(acks) != len(grants) {
		t.Fatalf("%d WorkAcks for %d WorkGrants: want one for each", len(acks), len(grants))
	}
	for i, g := range grants {
		a := acks[i]
		var want, got []string
		for _, j := range g.jobs {
			want = append(want, grantKey(j.GetJob().GetId(), j.GetAttempt(), j.GetLeaseToken()))
		}
		for _, ref := range a.grants {
			got = append(got, grantKey(ref.GetJobId(), ref.GetAttempt(), ref.GetLeaseToken()))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("grant %d: acknowledged %v, want %v", i, got, want)
		}
		// A grant is in the tap once Send returned; its ack may come back
		// even sooner. Well before the handler's end, in any case.
		if took := a.at.Sub(g.at); took > server.StreamAckTimeout/2 {
			t.Fatalf("grant %d acknowledged %s after it was sent: the ack must not wait", i, took)
		}
	}
}

func grantKey(job, attempt int64, token string) string {
	return fmt.Sprintf("%d/%d/%s", job, attempt, token)
}

// A grant that reaches the worker after it half-closed its stream (its
// drain) can no longer be acknowledged: the Worker does not start it and
// writes nothing for it, and the coordinator hands it back under its own
// attempt and token when the stream ends (R7, R25): ready again, due now,
// never handled.
func TestWorkerStreamLeavesAGrantReadDuringItsDrainUnstarted_R25(t *testing.T) {
	c, tap := startTappedCoordinator(t)
	h := &recorder{}
	w := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "drainer", Lease: 30 * time.Second, PollInterval: time.Minute})
	r := runWorker(t, w)
	proctest.WaitFor(t, 10*time.Second, "the worker's stream", func() bool { s, _, _ := tap.snapshot(); return len(s) == 1 })
	tap.holdNextGrant()
	job := c.enqueue(t, "acme")
	select {
	case ids := <-tap.held:
		if !slices.Equal(ids, []int64{job.ID}) {
			t.Fatalf("held grant of jobs %v, want [%d]", ids, job.ID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the job was never granted")
	}
	r.cancel() // the drain half-closes the stream; then the grant goes out
	if err := r.wait(t, 20*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	d := waitState(t, c, job.ID, jobfence.StateReady)
	if got, want := kinds(d), []string{"enqueued@0", "claimed@1", "rescheduled@1"}; !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v", got, want)
	}
	if !strings.Contains(d.Job.LastReason, "acknowledged") {
		t.Fatalf("last reason %q: want the coordinator's hand-back of an unacknowledged grant", d.Job.LastReason)
	}
	if calls := h.log(); len(calls) != 0 {
		t.Fatalf("the draining worker handled %+v", calls)
	}
	if s := w.Stats(); s.Claimed != 0 || s.Completed+s.Rescheduled+s.Escalated+s.StaleRejected+s.WriteFailures != 0 {
		t.Fatalf("stats %+v: the grant read during the drain was acted on", s)
	}
	_, grants, acks := tap.snapshot()
	if len(grants) != 1 || len(acks) != 0 {
		t.Fatalf("%d grants sent, %d acknowledged: want the one grant, unacknowledged", len(grants), len(acks))
	}
}
