package jobfence

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// errNoStream: the call was not sent on a stream (none open, or the worker
// is draining); it goes as a unary call instead.
var errNoStream = errors.New("jobfence: no worker stream")

// errStreamUnsupported: the coordinator does not serve Work; the worker
// claims with unary long polls instead.
var errStreamUnsupported = errors.New("jobfence: the coordinator has no worker stream")

// workSession is a Worker's stream to the coordinator (Coordinator.Work):
// grants arrive as slots free up, and write-backs, renewals and receipts go
// on it as calls, each answered as the unary call would be. It keeps the
// count of free slots the coordinator may fill (credits): a new stream
// opens with all of them, a grant uses one per job, a finished job gives
// one back. Calls made while no stream is open go as unary calls.
//
// It acknowledges every grant as it reads it (WorkStart.acknowledges): one
// WorkAck per WorkGrant, sent before any of its jobs starts. The
// coordinator hands back a grant left unacknowledged for 5 s (half the
// lease at most), so a worker that stops reading holds no job. A grant read
// after the half-close (the drain) can no longer be acknowledged: it is not
// started, and the coordinator takes it back when the stream ends.
//
// It is built from the client, the start message and the slot count, and
// tells its owner what happens through sessionHooks; reopening a stream
// that ended is the owner's (Worker.streamLoop).
type workSession struct {
	rpc   pb.CoordinatorClient
	start *pb.WorkStart // without credits
	hooks sessionHooks

	mu      sync.Mutex
	stream  pb.Coordinator_WorkClient // nil while none is open
	free    int                       // slots running no job: the open stream's credits
	closing bool                      // half-closed: nothing more is sent
	nextID  uint64
	pending map[uint64]chan callAnswer
	// sendMu serialises the sends of the open stream and its half-close.
	// mu is taken under it only for a look at closing, never the other way
	// round, and never held across a send: a send may wait on flow control
	// while the coordinator waits for receive, which takes mu, to read its
	// answers.
	sendMu sync.Mutex
}

type callAnswer struct {
	reply *pb.WorkReply
	err   error
}

// sessionHooks is what a workSession tells the Worker that owns it, and the
// one thing it asks: whether the worker stops.
type sessionHooks interface {
	// granted starts job c, granted and acknowledged on the stream; ctx is
	// serve's.
	granted(ctx context.Context, c ClaimedJob)
	// dropped: the jobs of a grant that could not be acknowledged (read
	// after the half-close, or the send failed) were not started; the
	// coordinator hands them back.
	dropped(ids []int64, err error)
	// retryAfter: due work waits on a provider's budget (R19); the
	// coordinator offers it again after d, holding the credits.
	retryAfter(d time.Duration)
	// heard: a grant came, so the coordinator is reachable again.
	heard()
	// stopping reports whether the worker stops: a stream that opens then
	// is half-closed at once.
	stopping() bool
}

// newWorkSession returns the session of a worker that opens its streams
// with start (credits aside) and runs slots jobs at once.
func newWorkSession(rpc pb.CoordinatorClient, start *pb.WorkStart, slots int, hooks sessionHooks) *workSession {
	return &workSession{rpc: rpc, start: start, hooks: hooks, free: slots, pending: map[uint64]chan callAnswer{}}
}

// workStart is the WorkStart of a worker with options o, credits aside.
func workStart(o WorkerOptions) *pb.WorkStart {
	start := &pb.WorkStart{WorkerId: o.WorkerID, Provider: o.Provider, Acknowledges: true}
	if o.Lease != 0 {
		start.LeaseDuration = durationpb.New(o.Lease)
	}
	return start
}

// serve opens one stream, with every free slot as credit, and reads it until
// it ends: after the worker's half-close, once the coordinator has answered
// it (every call sent answered, every grant in flight received and left
// unstarted). opened: the coordinator took the stream. Errors: how the
// stream ended; errStreamUnsupported when the coordinator has no Work
// (nothing was granted).
func (s *workSession) serve(ctx context.Context) (opened bool, err error) {
	stream, err := s.open(ctx)
	if err != nil {
		return false, err
	}
	return true, s.receive(ctx, stream)
}

// open opens a stream with every free slot as credit.
func (s *workSession) open(ctx context.Context) (pb.Coordinator_WorkClient, error) {
	stream, err := s.rpc.Work(ctx)
	if err != nil {
		return nil, decodeError(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start := proto.Clone(s.start).(*pb.WorkStart)
	start.Credits = int32(max(s.free, 0))
	if err := stream.Send(&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: start}}); err != nil {
		_, err = stream.Recv() // the status that ended it
		return nil, streamError(err)
	}
	s.stream, s.closing = stream, false
	if s.hooks.stopping() {
		s.closing = true // stopped meanwhile: no send has this stream yet
		_ = stream.CloseSend()
	}
	go s.heartbeats(stream)
	return stream, nil
}

// streamHeartbeat is how often a stream that is open and not half-closed
// says the worker is still there (a WorkCredit of 0): the coordinator grants
// nothing to a stream silent for 3 s (server.StreamSilence), so that a
// frozen worker is not handed jobs it cannot start.
const streamHeartbeat = time.Second

// heartbeats sends stream's heartbeats until it ends or is half-closed.
func (s *workSession) heartbeats(stream pb.Coordinator_WorkClient) {
	t := time.NewTicker(streamHeartbeat)
	defer t.Stop()
	for range t.C {
		s.mu.Lock()
		current := s.stream == stream && !s.closing
		s.mu.Unlock()
		if !current || s.send(stream, &pb.WorkRequest{Kind: &pb.WorkRequest_Credit{Credit: &pb.WorkCredit{}}}) != nil {
			return
		}
	}
}

// receive reads stream until it ends: grants are acknowledged and started,
// replies handed to their calls. At the end the calls still waiting are
// answered UNAVAILABLE (safe to repeat, R21).
func (s *workSession) receive(ctx context.Context, stream pb.Coordinator_WorkClient) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			s.mu.Lock()
			s.stream = nil
			pending := s.pending
			s.pending = map[uint64]chan callAnswer{}
			s.mu.Unlock()
			lost := status.Error(codes.Unavailable, "worker stream ended before the answer: "+errText(err))
			for _, ch := range pending {
				ch <- callAnswer{err: lost}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return streamError(err)
		}
		switch k := m.GetKind().(type) {
		case *pb.WorkResponse_Grant:
			received := time.Now()
			jobs := k.Grant.GetJobs()
			if len(jobs) == 0 {
				continue
			}
			// The ack goes first, before a job takes a slot or a handler
			// starts: the coordinator hands back what is not acknowledged
			// within 5 s.
			if err := s.acknowledge(stream, jobs); err != nil {
				// Unacknowledged, the grants are the coordinator's to hand
				// back when the stream ends; a handler started on one would
				// run on a grant already ended (R25). They never took a slot.
				s.hooks.dropped(grantedIDs(jobs), err)
				continue
			}
			s.mu.Lock()
			s.free -= len(jobs)
			s.mu.Unlock()
			s.hooks.heard()
			for _, j := range jobs {
				s.hooks.granted(ctx, claimedFromProto(j, received))
			}
		case *pb.WorkResponse_Reply:
			s.mu.Lock()
			ch, ok := s.pending[k.Reply.GetCallId()]
			delete(s.pending, k.Reply.GetCallId())
			s.mu.Unlock()
			if ok {
				ch <- callAnswer{reply: k.Reply}
			}
		case *pb.WorkResponse_RetryAfter:
			// R19: due work waits on the provider's budget; the coordinator
			// offers it again after the wait, holding the credits.
			s.hooks.retryAfter(k.RetryAfter.AsDuration())
		}
	}
}

// freed gives a slot back: one credit more for the coordinator.
func (s *workSession) freed() {
	s.mu.Lock()
	s.free++
	stream, closing := s.stream, s.closing
	s.mu.Unlock()
	if stream == nil || closing {
		return // the next stream opens with it
	}
	// A failed send ends the stream; receive sees it and the next opens with
	// every free slot.
	s.send(stream, &pb.WorkRequest{Kind: &pb.WorkRequest_Credit{Credit: &pb.WorkCredit{Credits: 1}}})
}

// errHalfClosed: the worker half-closed its stream (the drain), which takes
// nothing more.
var errHalfClosed = errors.New("jobfence: the worker stream is half-closed")

// send sends m on stream; errHalfClosed once the worker half-closed it. The
// look at closing and the send share sendMu with closeSend's CloseSend: a
// send after it would fail the whole stream, calls in flight included.
func (s *workSession) send(stream pb.Coordinator_WorkClient, m *pb.WorkRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return errHalfClosed
	}
	return stream.Send(m)
}

// maxAckGrants bounds the grants one WorkAck names.
const maxAckGrants = 100

// acknowledge tells the coordinator the worker has jobs, the grants of one
// WorkGrant (at most 100 jobs, so one WorkAck). Errors: errHalfClosed after
// the drain's half-close; the stream's error when the send failed.
func (s *workSession) acknowledge(stream pb.Coordinator_WorkClient, jobs []*pb.ClaimedJob) error {
	refs := make([]*pb.GrantRef, len(jobs))
	for i, j := range jobs {
		refs[i] = &pb.GrantRef{JobId: j.GetJob().GetId(), Attempt: j.GetAttempt(), LeaseToken: j.GetLeaseToken()}
	}
	for len(refs) > 0 {
		n := min(len(refs), maxAckGrants)
		if err := s.send(stream, &pb.WorkRequest{Kind: &pb.WorkRequest_Ack{Ack: &pb.WorkAck{Grants: refs[:n]}}}); err != nil {
			return err
		}
		refs = refs[n:]
	}
	return nil
}

// grantedIDs lists the ids of a grant's jobs, for the log.
func grantedIDs(jobs []*pb.ClaimedJob) []int64 {
	ids := make([]int64, len(jobs))
	for i, j := range jobs {
		ids[i] = j.GetJob().GetId()
	}
	return ids
}

// closeSend half-closes the stream when the worker stops: no more grants,
// and those still on their way are not started (they cannot be
// acknowledged); calls from now on go as unary calls.
func (s *workSession) closeSend() {
	s.mu.Lock()
	stream := s.stream
	closing := s.closing
	s.closing = true
	s.mu.Unlock()
	if stream != nil && !closing {
		s.sendMu.Lock() // after a send that saw closing unset
		_ = stream.CloseSend()
		s.sendMu.Unlock()
	}
}

// call sends c on the stream and waits for its reply, or for ctx. c
// carries the trace context of the span ctx holds (R35: one stream carries
// many jobs' calls, so gRPC metadata, which is per stream, cannot).
// errNoStream when no stream takes calls.
func (s *workSession) call(ctx context.Context, c *pb.WorkCall) (*pb.WorkReply, error) {
	traceCall(ctx, c)
	ch := make(chan callAnswer, 1)
	s.mu.Lock()
	stream := s.stream
	if stream == nil || s.closing {
		s.mu.Unlock()
		return nil, errNoStream
	}
	s.nextID++
	id := s.nextID
	c.CallId = id
	s.pending[id] = ch
	s.mu.Unlock()
	if err := s.send(stream, &pb.WorkRequest{Kind: &pb.WorkRequest_Call{Call: c}}); err != nil {
		s.mu.Lock()
		_, mine := s.pending[id]
		delete(s.pending, id)
		s.mu.Unlock()
		if mine {
			return nil, errNoStream // not sent: the stream is ending, and receive sees why
		}
		a := <-ch // receive answered it with the stream's end
		return nil, a.err
	}
	select {
	case a := <-ch:
		if a.err != nil {
			return nil, a.err
		}
		if len(a.reply.GetError()) > 0 {
			var st spb.Status
			if err := proto.Unmarshal(a.reply.GetError(), &st); err != nil {
				return nil, status.Error(codes.Internal, "jobfence: a worker stream reply's error does not decode: "+err.Error())
			}
			return nil, status.FromProto(&st).Err()
		}
		return a.reply, nil
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.pending, id)
		s.mu.Unlock()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// streamError is the error a stream ended with, decoded;
// errStreamUnsupported when the coordinator has no Work.
func streamError(err error) error {
	if status.Code(err) == codes.Unimplemented {
		return errStreamUnsupported
	}
	return decodeError(err)
}

func errText(err error) string {
	if errors.Is(err, io.EOF) {
		return "closed by the coordinator"
	}
	return err.Error()
}

// streamRPC is the Worker's view of the coordinator: write-backs, renewals
// and receipts go on the worker stream when one is open, every other call
// and those without a stream as unary calls. Its answers and errors are the
// unary calls' (a reply carries the unary call's status), so the Client's
// retries (R21) and error decoding (R24) apply unchanged: a call cut with
// its stream is answered UNAVAILABLE and repeated, on the next stream or as
// a unary call.
type streamRPC struct {
	pb.CoordinatorClient
	s *workSession
}

func (r streamRPC) Complete(ctx context.Context, in *pb.CompleteRequest, opts ...grpc.CallOption) (*pb.CompleteResponse, error) {
	reply, err := r.s.call(ctx, &pb.WorkCall{Call: &pb.WorkCall_Complete{Complete: in}})
	if errors.Is(err, errNoStream) {
		return r.CoordinatorClient.Complete(ctx, in, opts...)
	}
	return reply.GetComplete(), err
}

func (r streamRPC) Reschedule(ctx context.Context, in *pb.RescheduleRequest, opts ...grpc.CallOption) (*pb.RescheduleResponse, error) {
	reply, err := r.s.call(ctx, &pb.WorkCall{Call: &pb.WorkCall_Reschedule{Reschedule: in}})
	if errors.Is(err, errNoStream) {
		return r.CoordinatorClient.Reschedule(ctx, in, opts...)
	}
	return reply.GetReschedule(), err
}

func (r streamRPC) Escalate(ctx context.Context, in *pb.EscalateRequest, opts ...grpc.CallOption) (*pb.EscalateResponse, error) {
	reply, err := r.s.call(ctx, &pb.WorkCall{Call: &pb.WorkCall_Escalate{Escalate: in}})
	if errors.Is(err, errNoStream) {
		return r.CoordinatorClient.Escalate(ctx, in, opts...)
	}
	return reply.GetEscalate(), err
}

func (r streamRPC) RenewLeases(ctx context.Context, in *pb.RenewLeasesRequest, opts ...grpc.CallOption) (*pb.RenewLeasesResponse, error) {
	reply, err := r.s.call(ctx, &pb.WorkCall{Call: &pb.WorkCall_RenewLeases{RenewLeases: in}})
	if errors.Is(err, errNoStream) {
		return r.CoordinatorClient.RenewLeases(ctx, in, opts...)
	}
	return reply.GetRenewLeases(), err
}

func (r streamRPC) ReportObservation(ctx context.Context, in *pb.ReportObservationRequest,
	opts ...grpc.CallOption) (*pb.ReportObservationResponse, error) {
	reply, err := r.s.call(ctx, &pb.WorkCall{Call: &pb.WorkCall_ReportObservation{ReportObservation: in}})
	if errors.Is(err, errNoStream) {
		return r.CoordinatorClient.ReportObservation(ctx, in, opts...)
	}
	return reply.GetReportObservation(), err
}
