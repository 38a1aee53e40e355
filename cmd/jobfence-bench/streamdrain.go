package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/server"
)

// streamIdle is how long a draining stream worker waits for a grant before
// it gives up on the rest of the backlog: a stall, which checkDrained then
// reports. A drain ends when the workers completed the whole backlog; an
// idle bound short enough to end it instead was taken on a loaded machine
// for the end of a backlog that still had most of its jobs.
const streamIdle = 10 * time.Second

// benchStream is a bench worker's stream (Coordinator.Work): grants arrive
// on grants (or, timed, on timed), completions are calls answered by their
// replies.
type benchStream struct {
	stream  pb.Coordinator_WorkClient
	grants  chan *pb.ClaimedJob
	timed   chan timedGrant
	ended   chan error // the stream's end: io.EOF after a clean one
	sendMu  sync.Mutex
	closed  bool // CloseSend was called: a Send now would end the stream
	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan *pb.WorkReply
}

// timedGrant is a WorkGrant as a stream's receive loop read it.
type timedGrant struct {
	jobs []*pb.ClaimedJob
	at   time.Time // when Recv returned it
}

// openStream opens a stream with credits; its grants arrive job by job on
// grants.
func openStream(ctx context.Context, c pb.CoordinatorClient, id string, credits int) (*benchStream, error) {
	return openStreamOf(ctx, c, id, credits, false)
}

// openTimedStream is openStream whose receive loop stamps each WorkGrant
// with the time it read it, before anything else sees it (the end of a
// grant's delivery), and hands it on whole, on timed.
func openTimedStream(ctx context.Context, c pb.CoordinatorClient, id string, credits int) (*benchStream, error) {
	return openStreamOf(ctx, c, id, credits, true)
}

func openStreamOf(ctx context.Context, c pb.CoordinatorClient, id string, credits int, timed bool) (*benchStream, error) {
	stream, err := c.Work(ctx)
	if err != nil {
		return nil, err
	}
	// Each grant uses at least one credit, so at most credits grants wait
	// unread: the receive loop never blocks on them.
	s := &benchStream{stream: stream, ended: make(chan error, 1), pending: map[uint64]chan *pb.WorkReply{}}
	if timed {
		s.timed = make(chan timedGrant, credits)
	} else {
		s.grants = make(chan *pb.ClaimedJob, credits)
	}
	if err := s.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: &pb.WorkStart{WorkerId: id,
		Credits: int32(credits), LeaseDuration: durationpb.New(time.Minute)}}}); err != nil {
		return nil, err
	}
	go func() {
		// Heartbeats, as the SDKs send them: a stream silent for
		// server.StreamSilence is granted nothing.
		t := time.NewTicker(server.StreamHeartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if s.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Credit{Credit: &pb.WorkCredit{}}}) != nil {
				return
			}
		}
	}()
	go func() {
		for {
			m, err := stream.Recv()
			at := time.Now()
			if err != nil {
				s.ended <- err
				return
			}
			switch k := m.GetKind().(type) {
			case *pb.WorkResponse_Grant:
				if s.timed != nil {
					s.timed <- timedGrant{jobs: k.Grant.GetJobs(), at: at}
					continue
				}
				for _, j := range k.Grant.GetJobs() {
					s.grants <- j
				}
			case *pb.WorkResponse_Reply:
				s.mu.Lock()
				ch := s.pending[k.Reply.GetCallId()]
				delete(s.pending, k.Reply.GetCallId())
				s.mu.Unlock()
				if ch != nil {
					ch <- k.Reply
				}
			}
		}
	}()
	return s, nil
}

func (s *benchStream) send(m *pb.WorkRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.closed {
		// grpc-go ends the whole stream with INTERNAL for a Send after
		// CloseSend; the heartbeat that races close must not.
		return io.ErrClosedPipe
	}
	return s.stream.Send(m)
}

// complete completes j on the stream and, once answered, gives its credit
// back.
func (s *benchStream) complete(ctx context.Context, j *pb.ClaimedJob) error {
	ch := make(chan *pb.WorkReply, 1)
	s.mu.Lock()
	s.next++
	id := s.next
	s.pending[id] = ch
	s.mu.Unlock()
	err := s.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Call{Call: &pb.WorkCall{CallId: id,
		Call: &pb.WorkCall_Complete{Complete: &pb.CompleteRequest{JobId: j.Job.Id, Attempt: j.Attempt,
			LeaseToken: j.LeaseToken, ProviderRefundId: fmt.Sprintf("re_bench_%d", j.Job.Id)}}}}})
	if err != nil {
		return err
	}
	select {
	case reply := <-ch:
		if len(reply.GetError()) > 0 {
			var st spb.Status
			_ = proto.Unmarshal(reply.GetError(), &st)
			return status.FromProto(&st).Err()
		}
		if reply.GetComplete().GetReplayed() {
			return errors.New("first completion answered as a replay")
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.send(&pb.WorkRequest{Kind: &pb.WorkRequest_Credit{Credit: &pb.WorkCredit{Credits: 1}}})
}

// close half-closes the stream and waits for its clean end.
func (s *benchStream) close() error {
	s.sendMu.Lock()
	s.closed = true
	err := s.stream.CloseSend()
	s.sendMu.Unlock()
	if err != nil {
		return err
	}
	if err := <-s.ended; !errors.Is(err, io.EOF) {
		return fmt.Errorf("worker stream ended: %w", err)
	}
	return nil
}

// drainStream drains the backlog tag through worker streams: each of
// --workers workers opens one stream with batch credits, completes every
// grant on the stream as it arrives, one goroutine per job like the unary
// drain, and gives the job's credit back once the completion is answered,
// until the backlog is completed (or no grant came for streamIdle).
func (b *bench) drainStream(ctx context.Context, tag string, batch int, clients []pb.CoordinatorClient) (drainResult, error) {
	var mu sync.Mutex
	var done []time.Duration
	drained := make(chan struct{})
	start := time.Now()
	err := parallel(ctx, b.cfg.workers, func(ctx context.Context, w int) error {
		s, err := openStream(ctx, clients[w], fmt.Sprintf("bench-stream-%d", w), batch)
		if err != nil {
			return fmt.Errorf("%s drain: %w", tag, err)
		}
		var jobs sync.WaitGroup
		var first error
		idle := time.NewTimer(streamIdle)
		defer idle.Stop()
	loop:
		for {
			select {
			case j := <-s.grants:
				jobs.Go(func() {
					err := s.complete(ctx, j)
					mu.Lock()
					defer mu.Unlock()
					if err != nil && first == nil {
						first = fmt.Errorf("%s drain: complete job %d attempt %d: %w", tag, j.Job.Id, j.Attempt, err)
					} else if err == nil {
						done = append(done, time.Since(start))
						if len(done) == b.cfg.backlog {
							close(drained)
						}
					}
				})
				idle.Reset(streamIdle)
			case <-drained:
				break loop
			case <-idle.C:
				break loop
			case err := <-s.ended:
				jobs.Wait()
				return fmt.Errorf("%s drain: worker stream ended: %w", tag, err)
			}
		}
		jobs.Wait()
		if first != nil {
			return first
		}
		return s.close()
	})
	if err != nil {
		return drainResult{}, err
	}
	return b.drained(ctx, tag, done)
}
