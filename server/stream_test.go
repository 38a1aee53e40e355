package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
)

// workStream is a test worker on the worker stream: what the coordinator
// sends arrives on grants, replies and retryAfter; end gets the stream's end.
type workStream struct {
	t       *testing.T
	stream  pb.Coordinator_WorkClient
	cancel  context.CancelFunc
	grants  chan *pb.ClaimedJob
	replies chan *pb.WorkReply
	end     chan error
	callID  uint64
	sendMu  sync.Mutex
	quiet   chan struct{} // closed: no more heartbeats
	once    sync.Once
}

// heartbeats sends a heartbeat every server.StreamHeartbeat, as the SDKs
// do, until the stream's context ends or silence is called.
func (w *workStream) heartbeats(ctx context.Context) {
	t := time.NewTicker(server.StreamHeartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.quiet:
			return
		case <-t.C:
		}
		_ = w.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Credit{Credit: &pb.WorkCredit{Credits: 0}}})
	}
}

// silence stops the heartbeats: the worker falls silent, as a frozen one.
func (w *workStream) silence() { w.once.Do(func() { close(w.quiet) }) }

func (w *workStream) send(m *pb.WorkRequest) error {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	return w.stream.Send(m)
}

func (c *coordinator) openWork(t *testing.T, ctx context.Context, start *pb.WorkStart) *workStream {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	stream, err := c.client.Work(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: start}}); err != nil {
		t.Fatal(err)
	}
	w := &workStream{t: t, stream: stream, cancel: cancel, grants: make(chan *pb.ClaimedJob, 2000),
		replies: make(chan *pb.WorkReply, 100), end: make(chan error, 1), quiet: make(chan struct{})}
	go w.heartbeats(ctx)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				w.end <- err
				return
			}
			switch k := m.Kind.(type) {
			case *pb.WorkResponse_Grant:
				for _, j := range k.Grant.Jobs {
					w.grants <- j
				}
			case *pb.WorkResponse_Reply:
				w.replies <- k.Reply
			}
		}
	}()
	return w
}

func (w *workStream) grant() *pb.ClaimedJob {
	w.t.Helper()
	select {
	case g := <-w.grants:
		return g
	case err := <-w.end:
		w.t.Fatalf("the stream ended before a grant: %v", err)
	case <-time.After(10 * time.Second):
		w.t.Fatal("no grant within 10s")
	}
	return nil
}

func (w *workStream) noGrant(within time.Duration) {
	w.t.Helper()
	select {
	case g := <-w.grants:
		w.t.Fatalf("granted job %d attempt %d, want nothing granted now (no credit, or a silent stream)", g.Job.Id, g.Attempt)
	case <-time.After(within):
	}
}

func (w *workStream) credit(n int32) {
	w.t.Helper()
	if err := w.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Credit{Credit: &pb.WorkCredit{Credits: n}}}); err != nil {
		w.t.Fatal(err)
	}
}

// call sends c and returns its reply.
func (w *workStream) call(c *pb.WorkCall) *pb.WorkReply {
	w.t.Helper()
	w.callID++
	c.CallId = w.callID
	if err := w.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Call{Call: c}}); err != nil {
		w.t.Fatal(err)
	}
	select {
	case r := <-w.replies:
		if r.CallId != c.CallId {
			w.t.Fatalf("reply to call %d, want %d", r.CallId, c.CallId)
		}
		return r
	case err := <-w.end:
		w.t.Fatalf("the stream ended before the reply: %v", err)
	case <-time.After(10 * time.Second):
		w.t.Fatal("no reply within 10s")
	}
	return nil
}

// ended waits for the stream's end and returns its error.
func (w *workStream) ended(within time.Duration) error {
	w.t.Helper()
	select {
	case err := <-w.end:
		return err
	case <-time.After(within):
		w.t.Fatalf("the stream did not end within %s", within)
	}
	return nil
}

// replyError is the error a reply carries, as the unary call returns it.
func replyError(t *testing.T, r *pb.WorkReply) error {
	t.Helper()
	if len(r.Error) == 0 {
		return nil
	}
	var st spb.Status
	if err := proto.Unmarshal(r.Error, &st); err != nil {
		t.Fatalf("reply error does not decode as a google.rpc.Status: %v", err)
	}
	return status.FromProto(&st).Err()
}

func completeCall(g *pb.ClaimedJob, token string) *pb.WorkCall {
	return &pb.WorkCall{Call: &pb.WorkCall_Complete{Complete: &pb.CompleteRequest{JobId: g.Job.Id, Attempt: g.Attempt,
		LeaseToken: token, ProviderRefundId: "re_" + g.Job.OperationKey}}}
}

// The worker stream: an enqueue reaches a worker holding a credit at once,
// with no poll (the test coordinator polls once a minute); grants never
// exceed the credits; a write-back on the stream is answered exactly as the
// unary call would answer it: the completion, its replay (R21) and a write
// without the grant's token refused STALE_ATTEMPT with the unary call's
// status, code, reason and metadata (R9, R25).
func TestWorkStreamGrantsOnEnqueueAndAnswersLikeUnary(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		w := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "stream-a", Credits: 1, LeaseDuration: durationpb.New(time.Minute)})
		time.Sleep(100 * time.Millisecond) // the stream's claim waits
		first := c.enqueue(t)
		begun := time.Now()
		g := w.grant()
		if g.Job.Id != first.Id || g.Attempt != 1 || g.LeaseToken == "" || g.NextAction != pb.NextAction_NEXT_ACTION_REFUND {
			t.Fatalf("grant = %v, want job %d attempt 1 with a token", g, first.Id)
		}
		if took := time.Since(begun); took > 5*time.Second {
			t.Fatalf("the grant took %s: it waited for a poll", took)
		}
		second := c.enqueue(t)
		w.noGrant(300 * time.Millisecond) // its one credit is used
		w.credit(1)
		if g2 := w.grant(); g2.Job.Id != second.Id {
			t.Fatalf("after a credit, granted job %d, want %d", g2.Job.Id, second.Id)
		}

		forged := w.call(completeCall(g, "AAAAAAAAAAAAAAAAAAAAAA"))
		_, unary := c.client.Complete(ctx, completeCall(g, "AAAAAAAAAAAAAAAAAAAAAA").GetComplete())
		got := replyError(t, forged)
		meta := errorInfo(t, got, codes.FailedPrecondition, server.ReasonStaleAttempt)
		if status.Convert(got).Message() != status.Convert(unary).Message() || meta["current_attempt"] != "1" {
			t.Fatalf("stream refusal %v (metadata %v), unary %v: want the same", got, meta, unary)
		}
		done := w.call(completeCall(g, g.LeaseToken))
		if err := replyError(t, done); err != nil || done.GetComplete().GetJob().GetState() != pb.JobState_JOB_STATE_SUCCEEDED ||
			done.GetComplete().GetReplayed() {
			t.Fatalf("Complete on the stream = %v, %v", done, err)
		}
		again := w.call(completeCall(g, g.LeaseToken))
		if err := replyError(t, again); err != nil || !again.GetComplete().GetReplayed() {
			t.Fatalf("the same Complete again = %v, %v; want replayed (R21)", again, err)
		}
		bad := w.call(&pb.WorkCall{})
		if err := replyError(t, bad); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "call") {
			t.Fatalf("a call of no kind = %v, want INVALID_ARGUMENT naming call", err)
		}
		// The stream goes on after a bad call, and renews on it too (R27).
		renewed := w.call(&pb.WorkCall{Call: &pb.WorkCall_RenewLeases{RenewLeases: &pb.RenewLeasesRequest{
			Grants: []*pb.GrantRef{{JobId: second.Id, Attempt: 1, LeaseToken: "AAAAAAAAAAAAAAAAAAAAAA"}}}}})
		if err := replyError(t, renewed); err != nil ||
			renewed.GetRenewLeases().GetRenewals()[0].GetRefused() != pb.ErrorReason_ERROR_REASON_STALE_ATTEMPT {
			t.Fatalf("a renewal without the token = %v, %v; want it refused STALE_ATTEMPT", renewed, err)
		}
		w.silence()
		w.sendMu.Lock()
		err := w.stream.CloseSend()
		w.sendMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if err := w.ended(10 * time.Second); !errors.Is(err, io.EOF) {
			t.Fatalf("after a half-close the stream ended with %v, want a clean end", err)
		}
	})
}

// A malformed opening or credit ends the stream with INVALID_ARGUMENT
// naming the field.
func TestWorkStreamBadInput(t *testing.T) {
	c := start(t, testdb.SQLiteBackend())
	ctx := ctxFor(t)
	for _, tc := range []struct {
		first *pb.WorkRequest
		field string
	}{
		{&pb.WorkRequest{Kind: &pb.WorkRequest_Credit{Credit: &pb.WorkCredit{Credits: 1}}}, "start"},
		{&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: &pb.WorkStart{Credits: 1}}}, "start.worker_id"},
		{&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: &pb.WorkStart{WorkerId: "w", Credits: 1001}}}, "start.credits"},
		{&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: &pb.WorkStart{WorkerId: "w",
			LeaseDuration: durationpb.New(time.Hour)}}}, "start.lease_duration"},
	} {
		stream, err := c.client.Work(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(tc.first); err != nil {
			t.Fatal(err)
		}
		_, err = stream.Recv()
		errorInfo(t, err, codes.InvalidArgument, server.ReasonInvalidArgument)
		if !strings.Contains(err.Error(), tc.field+":") {
			t.Fatalf("first message %v: %v, want the field %s named", tc.first, err, tc.field)
		}
	}
	w := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "w", Credits: 999})
	w.credit(2)
	err := w.ended(10 * time.Second)
	errorInfo(t, err, codes.InvalidArgument, server.ReasonInvalidArgument)
	if !strings.Contains(err.Error(), "credit.credits") {
		t.Fatalf("credits past the bound: %v, want credit.credits named", err)
	}
}

// R7, R25: a stream that ends while its claim waits takes nothing with it.
// A job enqueued after the worker left is claimed by the next worker as a
// first grant, attempt 1; and Drain ends open streams with UNAVAILABLE.
func TestWorkStreamEndsWithoutTakingWork(t *testing.T) {
	c := start(t, testdb.SQLiteBackend())
	ctx := ctxFor(t)
	w := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "leaving", Credits: 5})
	time.Sleep(100 * time.Millisecond)
	w.cancel()
	_ = w.ended(10 * time.Second)
	time.Sleep(100 * time.Millisecond)
	j := c.enqueue(t)
	if g := c.claimOne(t, "next", j.Id); g.Attempt != 1 {
		t.Fatalf("the next worker got attempt %d, want 1: a grant went to the stream that left", g.Attempt)
	}

	open := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "staying", Credits: 5})
	time.Sleep(100 * time.Millisecond)
	c.server.Drain()
	if err := open.ended(10 * time.Second); status.Code(err) != codes.Unavailable {
		t.Fatalf("after Drain the stream ended with %v, want UNAVAILABLE", err)
	}
}

// R25, rolling deploys: an acknowledgement on its way when the coordinator
// begins to stop keeps the grant with the worker that has it. The stopping
// coordinator grants nothing more but reads the stream for up to
// StreamDrainGrace while a grant it sent is unacknowledged; the job is not
// handed back (no second attempt), and the worker's write-back under its
// grant lands.
func TestStopReadsAcknowledgementsOnTheirWay(t *testing.T) {
	c := start(t, testdb.SQLiteBackend())
	ctx := ctxFor(t)
	w := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "acking", Credits: 2, LeaseDuration: durationpb.New(time.Minute),
		Acknowledges: true})
	j := c.enqueue(t)
	g := w.grant()
	c.server.Drain()
	time.Sleep(100 * time.Millisecond) // the acknowledgement leaves after the stop began
	if err := w.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Ack{Ack: &pb.WorkAck{Grants: []*pb.GrantRef{
		{JobId: g.Job.Id, Attempt: g.Attempt, LeaseToken: g.LeaseToken}}}}}); err != nil {
		t.Errorf("the acknowledgement could not be sent: %v (the stream had ended)", err)
	}
	began := time.Now()
	if err := w.ended(10 * time.Second); status.Code(err) != codes.Unavailable {
		t.Fatalf("the stream ended with %v, want UNAVAILABLE", err)
	}
	if took := time.Since(began); took > server.StreamDrainGrace/2 {
		t.Errorf("the stream ended %s after the last grant's acknowledgement, want at once", took)
	}
	d, err := c.store.Get(ctx, store.GetParams{JobRef: store.JobRef{ID: j.Id}})
	if err != nil || d.Job.State != store.StateRunning || d.Job.Attempt != g.Attempt {
		t.Fatalf("job after the stop: %+v, %v; want it running under attempt %d, not handed back", d.Job, err, g.Attempt)
	}
	if _, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: j.Id, Attempt: g.Attempt, LeaseToken: g.LeaseToken,
		ProviderRefundId: "re_drain"}); err != nil {
		t.Fatalf("the acknowledged grant's completion: %v, want it to land", err)
	}
}

// stuckStream opens a worker stream on its own connection with fixed HTTP/2
// windows of 64 KiB (no window growth, so that what it leaves unread fills
// them soon) that sends heartbeats, and spam when set, but reads nothing.
func (c *coordinator) stuckStream(t *testing.T, ctx context.Context, start *pb.WorkStart,
	spam *pb.WorkRequest) pb.Coordinator_WorkClient {
	t.Helper()
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stuck, err := pb.NewCoordinatorClient(conn).Work(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stuck.Send(&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: start}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		beat := time.NewTicker(server.StreamHeartbeat)
		defer beat.Stop()
		for {
			m := &pb.WorkRequest{Kind: &pb.WorkRequest_Credit{Credit: &pb.WorkCredit{}}}
			if spam != nil {
				m = spam
			} else {
				<-beat.C
			}
			if stuck.Send(m) != nil {
				return
			}
		}
	}()
	return stuck
}

// heldBy samples, until ctx ends, how many running jobs worker holds, and
// returns the most it saw.
func (c *coordinator) heldBy(ctx context.Context, worker string) func() int {
	var most atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			page, err := c.store.List(ctx, store.ListParams{State: store.StateRunning, Limit: store.MaxPageSize})
			if err == nil {
				n := int64(0)
				for _, j := range page.Jobs {
					if j.WorkerID == worker {
						n++
					}
				}
				if n > most.Load() {
					most.Store(n)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() int { <-done; return int(most.Load()) }
}

// drainWith has reader complete n jobs as they are granted, pipelining each
// completion and its credit, within d.
func drainWith(t *testing.T, reader *workStream, n int, d time.Duration) {
	t.Helper()
	completed, deadline := 0, time.After(d)
	for completed < n {
		select {
		case g := <-reader.grants:
			reader.callID++
			c := completeCall(g, g.LeaseToken)
			c.CallId = reader.callID
			if err := reader.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Call{Call: c}}); err != nil {
				t.Fatal(err)
			}
			reader.credit(1)
		case r := <-reader.replies:
			if err := replyError(t, r); err != nil {
				t.Fatalf("a completion of the reading worker: %v", err)
			}
			completed++
		case <-deadline:
			t.Fatalf("the reading worker completed %d of %d jobs in %s", completed, n, d)
		}
	}
}

// enqueueMany enqueues n refunds with long order ids (larger grants fill a
// stream's window sooner).
func (c *coordinator) enqueueMany(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for range n {
		req := refundReq()
		req.OrderId = strings.Repeat("o", 120)
		if _, err := c.client.EnqueueRefund(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
}

// A worker that reads nothing cannot stall the others, nor hold more than
// MaxUnshownGrants jobs whatever its credits: a worker of an earlier
// release (no acknowledgements) is granted no more until it shows it has
// some; its stream is cut after a third of its lease with a message unread
// (here: the answers to its calls), the grants not yet written are handed
// back under their own tokens, and a second worker reading its stream is
// granted work all along (here: every job).
func TestWorkStreamSlowReaderIsCutAndItsGrantsHandedBack(t *testing.T) {
	// Polls as in production: the stuck worker's grants are taken over at
	// the first poll instant after their leases ran out.
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) { o.ClaimPollInterval = 200 * time.Millisecond })
	ctx := ctxFor(t)
	// It asks for a grant it does not hold, again and again: each answer
	// waits for it in vain.
	bogus := &pb.WorkRequest{Kind: &pb.WorkRequest_Call{Call: &pb.WorkCall{Call: &pb.WorkCall_RenewLeases{
		RenewLeases: &pb.RenewLeasesRequest{Grants: []*pb.GrantRef{{JobId: 1 << 40, Attempt: 1,
			LeaseToken: strings.Repeat("t", 40)}}}}}}}
	const n = 1500
	c.enqueueMany(t, ctx, n)
	sampling, stop := context.WithCancel(ctx)
	most := c.heldBy(sampling, "stuck")
	stuck := c.stuckStream(t, ctx, &pb.WorkStart{WorkerId: "stuck", Credits: server.MaxStreamCredits,
		LeaseDuration: durationpb.New(3 * time.Second)}, bogus)
	reader := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "reader", Credits: 100, LeaseDuration: durationpb.New(time.Minute),
		Acknowledges: true})
	drainWith(t, reader, n, 40*time.Second)
	stop()
	if held := most(); held > server.MaxUnshownGrants || held == 0 {
		t.Fatalf("the worker that reads nothing held up to %d jobs at once, want 1..%d", held, server.MaxUnshownGrants)
	}
	ended := make(chan error, 1)
	go func() {
		var err error
		for err == nil {
			_, err = stuck.Recv() // what it was sent, then the end
		}
		ended <- err
	}()
	select {
	case err := <-ended:
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "read nothing") {
			t.Fatalf("the stuck stream ended with %v, want UNAVAILABLE for reading nothing", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream of a worker that read nothing was not cut")
	}
}

// A worker that acknowledges its grants (WorkStart.acknowledges) and then
// reads nothing holds no job for long: with 1,000 credits and 15-minute
// leases it is granted at most MaxUnshownGrants jobs at once, each handed
// back within StreamAckTimeout under its own token, so a second worker
// completes every job long before any lease could run out — none taken
// over — and the coordinator counts the grants it handed back unacknowledged.
func TestWorkStreamUnacknowledgedGrantsHandedBack(t *testing.T) {
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) { o.ClaimPollInterval = 200 * time.Millisecond })
	ctx := ctxFor(t)
	const n = 600
	c.enqueueMany(t, ctx, n)
	sampling, stop := context.WithCancel(ctx)
	most := c.heldBy(sampling, "careless")
	c.stuckStream(t, ctx, &pb.WorkStart{WorkerId: "careless", Credits: server.MaxStreamCredits,
		LeaseDuration: durationpb.New(15 * time.Minute), Acknowledges: true}, nil)
	proctest.WaitFor(t, 10*time.Second, "the careless worker's first grants", func() bool { // it takes them alone
		page, err := c.store.List(ctx, store.ListParams{State: store.StateRunning, Limit: 1})
		return err == nil && len(page.Jobs) == 1
	})
	reader := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "reader", Credits: 100, LeaseDuration: durationpb.New(time.Minute),
		Acknowledges: true})
	drainWith(t, reader, n, 60*time.Second)
	stop()
	if held := most(); held > server.MaxUnshownGrants || held == 0 {
		t.Fatalf("the careless worker held up to %d jobs at once, want 1..%d", held, server.MaxUnshownGrants)
	}
	back, unacked := c.counter(t, "jobfence_grants_handed_back_total"), c.counter(t, "jobfence_grants_unacknowledged_total")
	if taken := c.counter(t, "jobfence_takeovers_total"); taken != 0 || unacked == 0 || back < unacked {
		t.Fatalf("%v taken over, %v handed back, %v of them unacknowledged: want none taken over, the careless "+
			"worker's grants handed back", taken, back, unacked)
	}
	t.Logf("%v grants handed back unacknowledged", unacked)
}

// T1 on worker streams: A is granted attempt 1, its lease runs out, B's
// stream takes the job over (attempt 2, reconcile) and completes it; A's
// late completion on its own stream is refused STALE_ATTEMPT naming attempt
// 2, and A files the provider's answer on the stream as an observation
// (R15), which is then on the job. The history shows A wrote nothing.
func TestZombieLateWritesRejectedOnWorkerStreams_T1(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		a := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "zombie-a", Credits: 1, LeaseDuration: durationpb.New(time.Minute)})
		job := c.enqueue(t)
		ga := a.grant()
		c.expire(t, job.Id)
		b := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "worker-b", Credits: 1, LeaseDuration: durationpb.New(time.Minute)})
		gb := b.grant() // at the next poll instant at the latest: the test coordinator polls each minute, a stream opening claims at once
		if gb.Job.Id != job.Id || gb.Attempt != 2 || !gb.Takeover || gb.NextAction != pb.NextAction_NEXT_ACTION_RECONCILE {
			t.Fatalf("B's grant = %v, want job %d taken over at attempt 2 to reconcile", gb, job.Id)
		}
		if r := b.call(completeCall(gb, gb.LeaseToken)); replyError(t, r) != nil {
			t.Fatalf("B's completion: %v", replyError(t, r))
		}
		late := replyError(t, a.call(completeCall(ga, ga.LeaseToken)))
		if meta := errorInfo(t, late, codes.FailedPrecondition, server.ReasonStaleAttempt); meta["current_attempt"] != "2" {
			t.Fatalf("A's late completion: metadata %v, want current_attempt 2", meta)
		}
		filed := a.call(&pb.WorkCall{Call: &pb.WorkCall_ReportObservation{ReportObservation: &pb.ReportObservationRequest{
			Job: &pb.ReportObservationRequest_JobId{JobId: job.Id}, Attempt: ga.Attempt, LeaseToken: ga.LeaseToken,
			Source: "worker:zombie-a", Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED,
			ProviderRefundId: "re_" + job.OperationKey}}})
		if err := replyError(t, filed); err != nil || filed.GetReportObservation().GetObservation().GetId() == 0 {
			t.Fatalf("A's observation on the stream = %v, %v", filed, err)
		}
		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: job.Id}})
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, e := range got.Events {
			kinds = append(kinds, fmt.Sprintf("%s@%d", e.Kind, e.Attempt))
		}
		if want := "enqueued@0 claimed@1 taken_over@2 completed@2"; strings.Join(kinds, " ") != want ||
			got.Job.State != pb.JobState_JOB_STATE_SUCCEEDED || len(got.Observations) != 1 ||
			!got.Observations[0].AttemptVerified {
			t.Fatalf("history %v, state %v, observations %v; want %s and A's verified receipt", kinds, got.Job.State,
				got.Observations, want)
		}
	})
}

// A frozen worker keeps its stream and its credits, but is granted nothing
// once it has sent nothing for server.StreamSilence: a job enqueued then
// goes to a worker that can start it, first grant at attempt 1, instead of
// waiting a lease for a takeover. Its next message (a heartbeat) makes it
// eligible again.
func TestWorkStreamSilentIsGrantedNothing(t *testing.T) {
	c := start(t, testdb.SQLiteBackend())
	ctx := ctxFor(t)
	w := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "frozen", Credits: 4, LeaseDuration: durationpb.New(time.Minute)})
	w.silence()
	time.Sleep(server.StreamSilence + time.Second)
	j := c.enqueue(t)
	w.noGrant(500 * time.Millisecond)
	if g := c.claimOne(t, "alive", j.Id); g.Attempt != 1 {
		t.Fatalf("the live worker got attempt %d, want 1: the job went to the silent stream first", g.Attempt)
	}
	w.credit(0) // it wakes up
	time.Sleep(100 * time.Millisecond)
	again := c.enqueue(t)
	if g := w.grant(); g.Job.Id != again.Id || g.Attempt != 1 {
		t.Fatalf("after a heartbeat the stream was granted %v, want job %d", g, again.Id)
	}
}

// An acknowledgement counts only with the grant's own lease token: when an
// acknowledging worker's stream ends, the grant it acknowledged stays its
// own (running under attempt 1), and the grants it did not acknowledge —
// one of them "acknowledged" with another token — are handed back at once,
// ready and due, long before StreamAckTimeout. An acknowledgement of more
// than 100 grants ends the stream INVALID_ARGUMENT naming ack.grants.
func TestWorkStreamEndHandsBackUnacknowledgedGrants(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		w := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "acks", Credits: 3, LeaseDuration: durationpb.New(time.Minute),
			Acknowledges: true})
		for range 3 {
			c.enqueue(t)
		}
		kept, forged, silent := w.grant(), w.grant(), w.grant()
		ack := func(g *pb.ClaimedJob, token string) {
			t.Helper()
			if err := w.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Ack{Ack: &pb.WorkAck{Grants: []*pb.GrantRef{
				{JobId: g.Job.Id, Attempt: g.Attempt, LeaseToken: token}}}}}); err != nil {
				t.Fatal(err)
			}
		}
		ack(kept, kept.LeaseToken)
		ack(forged, strings.Repeat("x", len(forged.LeaseToken)))
		// A renewal on the stream answers after the acknowledgements are read.
		if r := w.call(&pb.WorkCall{Call: &pb.WorkCall_RenewLeases{RenewLeases: &pb.RenewLeasesRequest{Grants: []*pb.GrantRef{
			{JobId: kept.Job.Id, Attempt: kept.Attempt, LeaseToken: kept.LeaseToken}}}}}); replyError(t, r) != nil {
			t.Fatalf("renewal: %v", replyError(t, r))
		}
		began := time.Now()
		w.cancel()
		for _, g := range []*pb.ClaimedJob{forged, silent} {
			proctest.WaitFor(t, 10*time.Second, "the unacknowledged grant handed back", func() bool {
				d, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: g.Job.Id}})
				return err == nil && d.Job.State == pb.JobState_JOB_STATE_READY && d.Job.Attempt == 1
			})
		}
		if waited := time.Since(began); waited >= server.StreamAckTimeout {
			t.Fatalf("handed back %s after the stream ended, want at its end", waited)
		}
		if n := c.counter(t, "jobfence_grants_unacknowledged_total"); n != 2 {
			t.Fatalf("jobfence_grants_unacknowledged_total = %v, want the 2 grants sent and not acknowledged", n)
		}
		if d, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: kept.Job.Id}}); err != nil ||
			d.Job.State != pb.JobState_JOB_STATE_RUNNING || d.Job.Attempt != 1 {
			t.Fatalf("the acknowledged grant's job = %v, %v; want still running under attempt 1", d.GetJob(), err)
		}

		bad := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "acks", Credits: 1, Acknowledges: true})
		refs := make([]*pb.GrantRef, 101)
		for i := range refs {
			refs[i] = &pb.GrantRef{JobId: int64(i + 1), Attempt: 1, LeaseToken: "t"}
		}
		if err := bad.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Ack{Ack: &pb.WorkAck{Grants: refs}}}); err != nil {
			t.Fatal(err)
		}
		err := bad.ended(10 * time.Second)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "ack.grants") {
			t.Fatalf("an acknowledgement of 101 grants ended the stream with %v, want INVALID_ARGUMENT naming ack.grants", err)
		}
	})
}

// A coordinator that stops hands back, before its write path closes, the
// grants its worker streams still held unacknowledged: none waits out its
// lease for a takeover after a rolling deploy.
func TestStopHandsBackBeforeClosing(t *testing.T) {
	c := start(t, testdb.SQLiteBackend())
	ctx := ctxFor(t)
	w := c.openWork(t, ctx, &pb.WorkStart{WorkerId: "held", Credits: 3, LeaseDuration: durationpb.New(time.Minute),
		Acknowledges: true})
	jobs := []*pb.Job{c.enqueue(t), c.enqueue(t), c.enqueue(t)}
	for range jobs {
		w.grant() // read, never acknowledged
	}
	c.server.Drain()
	if err := w.ended(10 * time.Second); status.Code(err) != codes.Unavailable {
		t.Fatalf("the stream ended with %v, want UNAVAILABLE", err)
	}
	c.server.Close()
	for _, j := range jobs {
		d, err := c.store.Get(ctx, store.GetParams{JobRef: store.JobRef{ID: j.Id}})
		if err != nil || d.Job.State != store.StateReady {
			t.Fatalf("job %d after the coordinator closed: %+v, %v; want it handed back, ready", j.Id, d.Job, err)
		}
	}
}
