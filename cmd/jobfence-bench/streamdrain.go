package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// streamIdle is how long a stream worker waits for a grant before it takes
// the backlog for drained.
const streamIdle = 500 * time.Millisecond

// drainStream drains the backlog tag through worker streams (Coordinator.Work):
// each of --workers workers opens one stream with batch credits, completes
// every grant on the stream as it arrives, one goroutine per job like the
// unary drain, and gives the job's credit back once the completion is
// answered, until no grant came for streamIdle.
func (b *bench) drainStream(ctx context.Context, tag string, batch int, clients []pb.CoordinatorClient) (drainResult, error) {
	var mu sync.Mutex
	var done []time.Duration
	start := time.Now()
	err := parallel(ctx, b.cfg.workers, func(ctx context.Context, w int) error {
		mine, err := streamWorker(ctx, clients[w], fmt.Sprintf("bench-stream-%d", w), batch, start)
		mu.Lock()
		done = append(done, mine...)
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("%s drain: %w", tag, err)
		}
		return nil
	})
	if err != nil {
		return drainResult{}, err
	}
	slices.Sort(done)
	r := drainResult{jobs: len(done), done: done}
	if len(done) > 0 {
		r.elapsed = done[len(done)-1]
	}
	return r, b.checkDrained(ctx, tag, r.jobs)
}

// streamWorker is one worker of drainStream; it returns its completion
// times since start.
func streamWorker(ctx context.Context, c pb.CoordinatorClient, id string, credits int, start time.Time) ([]time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Work(ctx)
	if err != nil {
		return nil, err
	}
	var sendMu sync.Mutex
	send := func(m *pb.WorkRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	if err := send(&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: &pb.WorkStart{WorkerId: id,
		Credits: int32(credits), LeaseDuration: durationpb.New(time.Minute)}}}); err != nil {
		return nil, err
	}
	grants := make(chan *pb.ClaimedJob, credits)
	var pmu sync.Mutex
	pending := map[uint64]chan *pb.WorkReply{}
	ended := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			switch k := m.GetKind().(type) {
			case *pb.WorkResponse_Grant:
				for _, j := range k.Grant.GetJobs() {
					grants <- j
				}
			case *pb.WorkResponse_Reply:
				pmu.Lock()
				ch := pending[k.Reply.GetCallId()]
				delete(pending, k.Reply.GetCallId())
				pmu.Unlock()
				ch <- k.Reply
			}
		}
	}()
	var (
		mu    sync.Mutex
		done  []time.Duration
		first error
		jobs  sync.WaitGroup
		next  uint64
	)
	complete := func(j *pb.ClaimedJob, callID uint64) {
		defer jobs.Done()
		ch := make(chan *pb.WorkReply, 1)
		pmu.Lock()
		pending[callID] = ch
		pmu.Unlock()
		err := send(&pb.WorkRequest{Kind: &pb.WorkRequest_Call{Call: &pb.WorkCall{CallId: callID,
			Call: &pb.WorkCall_Complete{Complete: &pb.CompleteRequest{JobId: j.Job.Id, Attempt: j.Attempt,
				LeaseToken: j.LeaseToken, ProviderRefundId: fmt.Sprintf("re_bench_%d", j.Job.Id)}}}}})
		var reply *pb.WorkReply
		if err == nil {
			select {
			case reply = <-ch:
				if len(reply.GetError()) > 0 {
					var st spb.Status
					_ = proto.Unmarshal(reply.GetError(), &st)
					err = status.FromProto(&st).Err()
				} else if reply.GetComplete().GetReplayed() {
					err = errors.New("first completion answered as a replay")
				}
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if err == nil {
			err = send(&pb.WorkRequest{Kind: &pb.WorkRequest_Credit{Credit: &pb.WorkCredit{Credits: 1}}})
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil && first == nil {
			first = fmt.Errorf("complete job %d attempt %d: %w", j.Job.Id, j.Attempt, err)
		} else if err == nil {
			done = append(done, time.Since(start))
		}
	}
	idle := time.NewTimer(streamIdle)
	defer idle.Stop()
loop:
	for {
		select {
		case j := <-grants:
			next++
			jobs.Add(1)
			go complete(j, next)
			idle.Reset(streamIdle)
		case <-idle.C:
			break loop
		case err := <-ended:
			jobs.Wait()
			return done, fmt.Errorf("worker stream ended: %w", err)
		}
	}
	jobs.Wait()
	sendMu.Lock()
	err = stream.CloseSend()
	sendMu.Unlock()
	if err != nil {
		return done, err
	}
	if err := <-ended; !errors.Is(err, io.EOF) {
		return done, fmt.Errorf("worker stream ended: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return done, first
}
