package jobfence_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/proto"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/storetest"
)

// coordinator is a real coordinator server on a loopback socket over a fresh
// MySQL database, with a fault hook that can lose replies after the server
// committed (as a cut connection would), or refuse calls before they reach
// the server (as an unreachable coordinator would).
type coordinator struct {
	addr   string
	store  store.Store
	client *jobfence.Client

	mu     sync.Mutex
	drop   map[string]int // full method → replies still to lose after commit
	refuse map[string]refusal
	calls  map[string]int // full method → calls served
	// cut: full methods whose next reply on a worker stream ends the
	// stream instead of going out, after the call was served.
	cut map[string]int
}

// refusal is how many calls of a method still fail, with which status,
// before the server sees them.
type refusal struct {
	n  int
	st *status.Status
}

// startCoordinator starts a coordinator on MySQL.
func startCoordinator(t *testing.T, opts ...jobfence.Option) *coordinator {
	t.Helper()
	return startCoordinatorOn(t, testdb.MySQLBackend(), nil, opts...) // MySQL: mandatory, never skipped
}

// startCoordinatorOn starts a coordinator on backend b with extra server
// options; opts configure its client.
func startCoordinatorOn(t *testing.T, b testdb.Backend, extra []grpc.ServerOption, opts ...jobfence.Option) *coordinator {
	t.Helper()
	c := &coordinator{store: b.Open(t), drop: map[string]int{}, refuse: map[string]refusal{}, calls: map[string]int{},
		cut: map[string]int{}}
	srv := server.New(c.store, server.Options{
		Lease:                30 * time.Second,
		ProviderKeyRetention: map[string]time.Duration{"shortwindow": 2 * time.Second},
		Logger:               slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	t.Cleanup(srv.Close) // after the server stops: cleanups run last first
	gs, _ := srv.NewGRPCServer(append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(c.lossy),
		grpc.ChainStreamInterceptor(c.lossyStream)}, extra...)...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis) //nolint:errcheck
	t.Cleanup(gs.Stop)
	c.addr = lis.Addr().String()
	c.client, err = jobfence.Dial(c.addr, append([]jobfence.Option{jobfence.WithRetry(6, 10*time.Millisecond, 50*time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.client.Close() })
	return c
}

// lossy serves the call, then loses the reply of methods armed with dropAfterCommit.
func (c *coordinator) lossy(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	c.mu.Lock()
	if r := c.refuse[info.FullMethod]; r.n > 0 {
		r.n--
		c.refuse[info.FullMethod] = r
		c.mu.Unlock()
		return nil, r.st.Err()
	}
	c.mu.Unlock()
	resp, err := h(ctx, req)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[info.FullMethod]++
	if err == nil && c.drop[info.FullMethod] > 0 {
		c.drop[info.FullMethod]--
		if info.FullMethod == "/jobfence.v1.Coordinator/Claim" {
			// The claim committed, but the caller learns only that the
			// outcome is unknown (R7).
			st, _ := status.New(codes.Unavailable, "test: claim commit outcome unknown").WithDetails(
				&errdetails.ErrorInfo{Domain: "jobfence", Reason: "CLAIM_OUTCOME_UNKNOWN"})
			return nil, st.Err()
		}
		return nil, status.Error(codes.Unavailable, "test: reply lost after commit")
	}
	return resp, err
}

// lossyStream is lossy for the calls on worker streams: a refused call is
// answered with its refusal before the server sees it, and a dropped one is
// served and its reply replaced by UNAVAILABLE.
func (c *coordinator) lossyStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &lossyWorkStream{ServerStream: ss, c: c, methods: map[uint64]string{}})
}

type lossyWorkStream struct {
	grpc.ServerStream
	c       *coordinator
	sendMu  sync.Mutex
	mu      sync.Mutex
	methods map[uint64]string // call id → full method
}

// workCallMethod is the unary method a worker stream call stands for.
func workCallMethod(c *pb.WorkCall) string {
	name := "Unknown"
	switch c.GetCall().(type) {
	case *pb.WorkCall_Complete:
		name = "Complete"
	case *pb.WorkCall_Reschedule:
		name = "Reschedule"
	case *pb.WorkCall_Escalate:
		name = "Escalate"
	case *pb.WorkCall_RenewLeases:
		name = "RenewLeases"
	case *pb.WorkCall_ReportObservation:
		name = "ReportObservation"
	}
	return "/jobfence.v1.Coordinator/" + name
}

func (s *lossyWorkStream) RecvMsg(m any) error {
	for {
		if err := s.ServerStream.RecvMsg(m); err != nil {
			return err
		}
		call := m.(*pb.WorkRequest).GetCall()
		if call == nil {
			return nil
		}
		method := workCallMethod(call)
		s.c.mu.Lock()
		r := s.c.refuse[method]
		refused := r.n > 0
		if refused {
			r.n--
			s.c.refuse[method] = r
		}
		s.c.mu.Unlock()
		if !refused {
			s.mu.Lock()
			s.methods[call.GetCallId()] = method
			s.mu.Unlock()
			return nil
		}
		b, _ := proto.Marshal(r.st.Proto())
		if err := s.SendMsg(&pb.WorkResponse{Kind: &pb.WorkResponse_Reply{Reply: &pb.WorkReply{CallId: call.GetCallId(),
			Error: b}}}); err != nil {
			return err
		}
	}
}

func (s *lossyWorkStream) SendMsg(m any) error {
	if reply := m.(*pb.WorkResponse).GetReply(); reply != nil {
		s.mu.Lock()
		method, ok := s.methods[reply.GetCallId()]
		delete(s.methods, reply.GetCallId())
		s.mu.Unlock()
		if ok {
			s.c.mu.Lock()
			s.c.calls[method]++
			if s.c.cut[method] > 0 {
				s.c.cut[method]--
				s.c.mu.Unlock()
				return status.Error(codes.Unavailable, "test: worker stream cut after the call was served")
			}
			if len(reply.GetError()) == 0 && s.c.drop[method] > 0 {
				s.c.drop[method]--
				b, _ := proto.Marshal(status.New(codes.Unavailable, "test: reply lost after commit").Proto())
				m = &pb.WorkResponse{Kind: &pb.WorkResponse_Reply{Reply: &pb.WorkReply{CallId: reply.GetCallId(), Error: b}}}
			}
			s.c.mu.Unlock()
		}
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.ServerStream.SendMsg(m)
}

// cutStreamAfter makes the next n calls of method on a worker stream commit
// and then end their stream without the reply.
func (c *coordinator) cutStreamAfter(method string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut["/jobfence.v1.Coordinator/"+method] += n
}

// dropAfterCommit makes the next n calls of method ("Complete", "Claim"…)
// commit and then lose their reply; n = 0 ends the drops still to come.
func (c *coordinator) dropAfterCommit(method string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n == 0 {
		delete(c.drop, "/jobfence.v1.Coordinator/"+method)
		return
	}
	c.drop["/jobfence.v1.Coordinator/"+method] += n
}

// refuseCalls makes the next n calls of method fail with st before the
// server sees them; n = 0 ends a refusal.
func (c *coordinator) refuseCalls(method string, n int, st *status.Status) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refuse["/jobfence.v1.Coordinator/"+method] = refusal{n: n, st: st}
}

func (c *coordinator) callCount(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls["/jobfence.v1.Coordinator/"+method]
}

func (c *coordinator) expire(t *testing.T, jobID int64) {
	t.Helper()
	if err := storetest.Expire(ctxFor(t), c.store, jobID); err != nil {
		t.Fatal(err)
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var keySeq atomic.Int64

func refund(provider string) jobfence.EnqueueRequest {
	n := keySeq.Add(1)
	return jobfence.EnqueueRequest{
		OperationKey: fmt.Sprintf("op-%d", n), OrderID: fmt.Sprintf("ord-%d", n), PaymentID: fmt.Sprintf("pay-%d", n),
		AmountMinor: 4200, Currency: "EUR", Provider: provider,
	}
}

func (c *coordinator) enqueue(t *testing.T, provider string) jobfence.Job {
	t.Helper()
	job, created, err := c.client.EnqueueRefund(ctxFor(t), refund(provider))
	if err != nil || !created {
		t.Fatalf("EnqueueRefund: %v, created=%v", err, created)
	}
	return job
}

// claimOne claims one job of want's provider and requires it to be want.
func (c *coordinator) claimOne(t *testing.T, worker string, want jobfence.Job) jobfence.ClaimedJob {
	t.Helper()
	jobs, err := c.client.Claim(ctxFor(t), jobfence.ClaimRequest{WorkerID: worker, MaxJobs: 1, Provider: want.Provider})
	if err != nil || len(jobs) != 1 || jobs[0].Job.ID != want.ID {
		t.Fatalf("Claim(%s) = %+v, %v; want job %d", worker, jobs, err, want.ID)
	}
	return jobs[0]
}

func (c *coordinator) get(t *testing.T, id int64) jobfence.JobDetail {
	t.Helper()
	d, err := c.client.GetJob(ctxFor(t), id)
	if err != nil {
		t.Fatalf("GetJob(%d): %v", id, err)
	}
	return d
}

// kinds lists the history as "kind@attempt" strings.
func kinds(d jobfence.JobDetail) []string {
	out := make([]string, len(d.Events))
	for i, e := range d.Events {
		out[i] = fmt.Sprintf("%s@%d", e.Kind, e.Attempt)
	}
	return out
}

// running is a Worker's Run in progress.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// runWorker runs w until the test ends (or cancel).
func runWorker(t *testing.T, w *jobfence.Worker) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() { r.err = w.Run(ctx); close(r.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Errorf("worker did not stop")
		}
	})
	return r
}

// wait returns Run's error, failing the test if Run does not return within d.
func (r *running) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(d):
		t.Fatalf("Run did not return within %s", d)
		return nil
	}
}

// returned reports whether Run has returned.
func (r *running) returned() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// blackholeProxy is a TCP proxy to a coordinator that can blackhole the
// connections it carries: blackhole keeps their sockets open and forwards
// nothing more, in either direction, and closes nothing, as a coordinator
// host that vanished or a path that drops every packet would (no FIN, no
// RST). Connections accepted after it are forwarded normally, as a new
// connection's path to another replica would be.
type blackholeProxy struct {
	addr string
	lis  net.Listener

	mu       sync.Mutex
	conns    []*proxiedConn
	accepted int
	closed   sync.Once
}

// proxiedConn is one client connection and its connection to the target.
type proxiedConn struct {
	down, up net.Conn
	black    atomic.Bool
	closed   chan struct{} // closed with the proxy
}

// startBlackholeProxy proxies a loopback port to target until the test ends.
func startBlackholeProxy(t *testing.T, target string) *blackholeProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackholeProxy{addr: lis.Addr().String(), lis: lis}
	go p.accept(target)
	t.Cleanup(p.close)
	return p
}

func (p *blackholeProxy) accept(target string) {
	for {
		down, err := p.lis.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			down.Close()
			continue
		}
		c := &proxiedConn{down: down, up: up, closed: make(chan struct{})}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.accepted++
		p.mu.Unlock()
		go c.pump(down, up)
		go c.pump(up, down)
	}
}

// pump copies src to dst until the connection is blackholed: then it reads
// no more and writes nothing, and the bytes of both ends wait in the
// kernels' buffers, acknowledged by TCP and never delivered. What is read
// after blackhole returned is dropped.
func (c *proxiedConn) pump(src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if c.black.Load() {
			<-c.closed
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil && err == nil {
				err = werr
			}
		}
		if err != nil {
			// A close the blackhole did not make is forwarded as one.
			src.Close()
			dst.Close()
			return
		}
	}
}

// blackhole stops every connection open now: nothing more is forwarded
// from when it returns, and nothing is closed.
func (p *blackholeProxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.black.Store(true)
	}
}

// acceptedConns is how many connections the proxy has accepted.
func (p *blackholeProxy) acceptedConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// close closes the listener and every connection; it may be called again.
func (p *blackholeProxy) close() {
	p.closed.Do(func() {
		p.lis.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			close(c.closed)
			c.down.Close()
			c.up.Close()
		}
		p.conns = nil
	})
}
