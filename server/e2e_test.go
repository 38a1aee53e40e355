package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/storetest"
)

// coordinator is a real gRPC server on a loopback socket over a real store.
type coordinator struct {
	addr   string // the gRPC listener, host:port
	client pb.CoordinatorClient
	conn   *grpc.ClientConn
	store  store.Store
	// watched is store as the server sees it, counting what tests wait for.
	watched *watchedStore
	server  *server.Server
	reg     *prometheus.Registry
	// dropNext, when set to a method name, makes the server commit that call
	// and then lose its reply, as a cut connection would (T4).
	dropNext atomic.Value
}

func start(t *testing.T, b testdb.Backend, configure ...func(*server.Options)) *coordinator {
	t.Helper()
	c := &coordinator{store: b.Open(t), reg: prometheus.NewRegistry()}
	c.watched = &watchedStore{Store: c.store}
	c.dropNext.Store("")
	opts := server.Options{
		Metrics:              server.NewMetrics(c.reg, c.store),
		Lease:                30 * time.Second,
		ClaimPollInterval:    time.Minute,
		ProviderKeyRetention: map[string]time.Duration{"globex": 7 * 24 * time.Hour},
		Logger:               slog.New(slog.NewTextHandler(io.Discard, nil)),
		// Tests read as fast as they can; limit_test.go holds the bounds.
		ReadsPerSecond: 1e4, ReadsPerSecondPerCredential: 1e4,
	}
	for _, f := range configure {
		f(&opts)
	}
	srv := server.New(c.watched, opts)
	lossy := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err == nil && c.dropNext.CompareAndSwap(info.FullMethod, "") {
			return nil, status.Error(codes.Unavailable, "test: reply lost after commit")
		}
		return resp, err
	}
	c.server = srv
	t.Cleanup(srv.Close) // after the server stops: cleanups run last first
	gs, _ := srv.NewGRPCServer(grpc.ChainUnaryInterceptor(lossy))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis) //nolint:errcheck
	t.Cleanup(gs.Stop)
	c.addr = lis.Addr().String()
	c.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.conn.Close() })
	c.client = pb.NewCoordinatorClient(c.conn)
	return c
}

// watchedStore is the coordinator's store as the tests watch it: it counts
// the claims that claim transactions have answered, and the idle looks that
// failed.
type watchedStore struct {
	store.Store
	claimed atomic.Int64
	// lookErrors counts the HasWork calls that failed (an idle look is
	// bounded by the poll interval): the dispatcher takes such a look for
	// work and runs a poll round.
	lookErrors atomic.Int64
	// listGate, when set, holds every List until it is closed; listing
	// counts the Lists held.
	listGate atomic.Pointer[chan struct{}]
	listing  atomic.Int64
}

func (s *watchedStore) List(ctx context.Context, p store.ListParams) (store.JobPage, error) {
	if g := s.listGate.Load(); g != nil {
		s.listing.Add(1)
		select {
		case <-*g:
		case <-ctx.Done():
		}
		s.listing.Add(-1)
	}
	return s.Store.List(ctx, p)
}

func (s *watchedStore) ClaimMany(ctx context.Context, ps []store.ClaimParams) []store.ClaimOutcome {
	out := s.Store.ClaimMany(ctx, ps)
	s.claimed.Add(int64(len(ps)))
	return out
}

func (s *watchedStore) HasWork(ctx context.Context, provider string) (bool, error) {
	work, err := s.Store.HasWork(ctx, provider)
	if err != nil {
		s.lookErrors.Add(1)
	}
	return work, err
}

// forEachBackend runs fn as a parallel subtest against every store backend,
// on a coordinator started with configure.
func forEachBackend(t *testing.T, fn func(t *testing.T, c *coordinator), configure ...func(*server.Options)) {
	for _, b := range testdb.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, start(t, b, configure...))
		})
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var keySeq atomic.Int64

func refundReq() *pb.EnqueueRefundRequest {
	n := keySeq.Add(1)
	return &pb.EnqueueRefundRequest{
		OperationKey: fmt.Sprintf("op-%d", n), OrderId: fmt.Sprintf("ord-%d", n), PaymentId: fmt.Sprintf("pay-%d", n),
		AmountMinor: 4200, Currency: "USD", Provider: "acme",
	}
}

func (c *coordinator) enqueue(t *testing.T) *pb.Job {
	t.Helper()
	resp, err := c.client.EnqueueRefund(ctxFor(t), refundReq())
	if err != nil || !resp.Created {
		t.Fatalf("EnqueueRefund: %v %v", resp, err)
	}
	return resp.Job
}

func (c *coordinator) claimOne(t *testing.T, worker string, id int64) *pb.ClaimedJob {
	t.Helper()
	resp, err := c.client.Claim(ctxFor(t), &pb.ClaimRequest{WorkerId: worker, MaxJobs: 1})
	if err != nil || len(resp.Jobs) != 1 || resp.Jobs[0].Job.Id != id {
		t.Fatalf("Claim(%s) = %v, %v; want job %d", worker, resp, err, id)
	}
	return resp.Jobs[0]
}

func (c *coordinator) expire(t *testing.T, id int64) {
	t.Helper()
	if err := storetest.Expire(ctxFor(t), c.store, id); err != nil {
		t.Fatal(err)
	}
}

// errorInfo requires a status with code and an ErrorInfo of domain jobfence
// with reason, and returns its metadata.
func errorInfo(t *testing.T, err error, code codes.Code, reason string) map[string]string {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Fatalf("err = %v, want code %s", err, code)
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			if ei.Domain != server.Domain || ei.Reason != reason {
				t.Fatalf("ErrorInfo = %s/%s, want %s/%s", ei.Domain, ei.Reason, server.Domain, reason)
			}
			return ei.Metadata
		}
	}
	t.Fatalf("status %v has no ErrorInfo", st)
	return nil
}

func TestZombieLateWritesRejectedOverGRPC_T1(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		var a *pb.ClaimedJob
		for a = c.claimOne(t, "A", job.Id); a.Attempt < 7; a = c.claimOne(t, "A", job.Id) {
			c.expire(t, job.Id)
		}
		c.expire(t, job.Id)
		b := c.claimOne(t, "B", job.Id)
		if b.Attempt != 8 || !b.Takeover || b.NextAction != pb.NextAction_NEXT_ACTION_RECONCILE {
			t.Fatalf("B = attempt %d takeover %v %s", b.Attempt, b.Takeover, b.NextAction)
		}
		if b.Job.OperationKey != job.OperationKey {
			t.Fatalf("operation_key changed: %q", b.Job.OperationKey)
		}
		if _, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: b.Attempt, LeaseToken: b.LeaseToken, ProviderRefundId: "re_B"}); err != nil {
			t.Fatal(err)
		}
		lateCalls := map[string]func() error{
			"Complete": func() error {
				_, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, ProviderRefundId: "re_A"})
				return err
			},
			"Reschedule": func() error {
				_, err := c.client.Reschedule(ctx, &pb.RescheduleRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken,
					When: &pb.RescheduleRequest_Delay{Delay: durationpb.New(time.Second)}, Reason: "socket timeout"})
				return err
			},
			"Escalate": func() error {
				_, err := c.client.Escalate(ctx, &pb.EscalateRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Reason: "confused"})
				return err
			},
		}
		for name, call := range lateCalls {
			meta := errorInfo(t, call(), codes.FailedPrecondition, server.ReasonStaleAttempt)
			if meta["current_attempt"] != "8" || meta["current_state"] != "JOB_STATE_SUCCEEDED" || meta["attempt"] != "7" {
				t.Fatalf("%s: metadata %v", name, meta)
			}
		}
		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: job.Id}})
		if err != nil {
			t.Fatal(err)
		}
		if got.Job.State != pb.JobState_JOB_STATE_SUCCEEDED || got.Job.Attempt != 8 || got.Job.ProviderRefundId != "re_B" {
			t.Fatalf("job = %v", got.Job)
		}
		last := got.Events[len(got.Events)-1]
		if last.Kind != "completed" || last.Attempt != 8 || last.WorkerId != "B" || last.CreatedAt == nil {
			t.Fatalf("last event = %v", last)
		}
	})
}

func TestLeaseExpiredNobodyTookOverOverGRPC_T2(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		a := c.claimOne(t, "A", job.Id)
		c.expire(t, job.Id)
		resp, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, ProviderRefundId: "re_A"})
		if err != nil || resp.Replayed || resp.Job.State != pb.JobState_JOB_STATE_SUCCEEDED {
			t.Fatalf("late Complete = %v, %v", resp, err)
		}
		claimed, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: "B", MaxJobs: 10})
		if err != nil || len(claimed.Jobs) != 0 {
			t.Fatalf("B's Claim = %v, %v; want nothing", claimed, err)
		}
	})
}

func TestCommitThenLostReplyOverGRPC_T4(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		a := c.claimOne(t, "A", job.Id)
		req := &pb.CompleteRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, ProviderRefundId: "re_1"}
		c.dropNext.Store(pb.Coordinator_Complete_FullMethodName)
		if _, err := c.client.Complete(ctx, req); status.Code(err) != codes.Unavailable {
			t.Fatalf("first Complete = %v, want the reply lost", err)
		}
		resp, err := c.client.Complete(ctx, req)
		if err != nil || !resp.Replayed || resp.Job.State != pb.JobState_JOB_STATE_SUCCEEDED {
			t.Fatalf("retried Complete = %v, %v; want replayed", resp, err)
		}
		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_OperationKey{OperationKey: job.OperationKey}})
		if err != nil {
			t.Fatal(err)
		}
		completed := 0
		for _, e := range got.Events {
			if e.Kind == "completed" {
				completed++
			}
		}
		if completed != 1 {
			t.Fatalf("%d completed events, want 1", completed)
		}
		// Same attempt, another outcome: not a replay.
		_, err = c.client.Escalate(ctx, &pb.EscalateRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Reason: "second thoughts"})
		errorInfo(t, err, codes.FailedPrecondition, server.ReasonJobNotRunning)
	})
}

func TestRescheduleAndClaimAgainOverGRPC(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		a := c.claimOne(t, "A", job.Id)
		if a.NextAction != pb.NextAction_NEXT_ACTION_REFUND || a.Takeover || a.LeaseUntil == nil {
			t.Fatalf("first claim = %v", a)
		}
		if !a.ClaimedAt.AsTime().Equal(a.Job.FirstSentAt.AsTime()) || a.LeaseUntil.AsTime().Sub(a.ClaimedAt.AsTime()) != 30*time.Second {
			t.Fatalf("claimed_at %v, first_sent_at %v, lease_until %v: want the claim's database time",
				a.ClaimedAt.AsTime(), a.Job.FirstSentAt.AsTime(), a.LeaseUntil.AsTime())
		}
		// R22: the resend window starts at the first send, per provider.
		if a.ResendDeadline == nil || a.ResendDeadline.AsTime().Sub(a.Job.FirstSentAt.AsTime()) != 24*time.Hour {
			t.Fatalf("resend_deadline %v, first_sent_at %v: want 24h apart", a.ResendDeadline, a.Job.FirstSentAt)
		}
		resp, err := c.client.Reschedule(ctx, &pb.RescheduleRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Reason: "pending at provider"})
		if err != nil || resp.Job.State != pb.JobState_JOB_STATE_READY || resp.Job.NextAction != pb.NextAction_NEXT_ACTION_RECONCILE {
			t.Fatalf("Reschedule = %v, %v; want ready, reconcile by default", resp, err)
		}
		b := c.claimOne(t, "B", job.Id)
		if b.Attempt != 2 || b.NextAction != pb.NextAction_NEXT_ACTION_RECONCILE || b.Takeover {
			t.Fatalf("re-claim = %v", b)
		}
		if !b.ResendDeadline.AsTime().Equal(a.ResendDeadline.AsTime()) {
			t.Fatalf("resend_deadline moved from %v to %v", a.ResendDeadline.AsTime(), b.ResendDeadline.AsTime())
		}
		esc, err := c.client.Escalate(ctx, &pb.EscalateRequest{JobId: job.Id, Attempt: b.Attempt, LeaseToken: b.LeaseToken, Reason: "no record after window"})
		if err != nil || esc.Job.State != pb.JobState_JOB_STATE_MANUAL_REVIEW || esc.Job.LastReason != "no record after window" {
			t.Fatalf("Escalate = %v, %v", esc, err)
		}

		other := refundReq()
		other.Provider = "globex"
		if _, err := c.client.EnqueueRefund(ctx, other); err != nil {
			t.Fatal(err)
		}
		g, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: "C", MaxJobs: 5, Provider: "globex",
			LeaseDuration: durationpb.New(2 * time.Second)})
		if err != nil || len(g.Jobs) != 1 {
			t.Fatalf("Claim(globex) = %v, %v", g, err)
		}
		if d := g.Jobs[0].ResendDeadline.AsTime().Sub(g.Jobs[0].Job.FirstSentAt.AsTime()); d != 7*24*time.Hour {
			t.Fatalf("globex resend window %v, want 168h", d)
		}
		if d := g.Jobs[0].LeaseUntil.AsTime().Sub(g.Jobs[0].Job.UpdatedAt.AsTime()); d != 2*time.Second {
			t.Fatalf("lease %v, want the requested 2s", d)
		}
	})
}

func TestObservationsOverGRPC_R15(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		a := c.claimOne(t, "A", job.Id)
		c.expire(t, job.Id)
		b := c.claimOne(t, "B", job.Id)
		req := &pb.ReportObservationRequest{Job: &pb.ReportObservationRequest_JobId{JobId: job.Id}, Attempt: a.Attempt,
			Source: "worker:A", Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED, ProviderRefundId: "re_A"}
		first, err := c.client.ReportObservation(ctx, req)
		if err != nil || first.Duplicate || first.Observation.JobAttempt != b.Attempt || first.Observation.ReportedAttempt != a.Attempt {
			t.Fatalf("ReportObservation = %v, %v", first, err)
		}
		again, err := c.client.ReportObservation(ctx, req)
		if err != nil || !again.Duplicate || again.Observation.Id != first.Observation.Id {
			t.Fatalf("repeat = %v, %v", again, err)
		}
		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: job.Id}})
		if err != nil || got.Job.State != pb.JobState_JOB_STATE_RUNNING || got.Job.Attempt != b.Attempt || len(got.Observations) != 1 {
			t.Fatalf("GetJob = %v, %v", got, err)
		}
		_, err = c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
			Job:    &pb.ReportObservationRequest_OperationKey{OperationKey: "no-such-key"},
			Source: "webhook", Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_PENDING})
		errorInfo(t, err, codes.NotFound, server.ReasonNotFound)
	})
}

func TestEnqueueConflictOverGRPC_R1(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		req := refundReq()
		first, err := c.client.EnqueueRefund(ctx, req)
		if err != nil || !first.Created {
			t.Fatal(first, err)
		}
		again, err := c.client.EnqueueRefund(ctx, req)
		if err != nil || again.Created || again.Job.Id != first.Job.Id {
			t.Fatalf("same refund again = %v, %v", again, err)
		}
		req.AmountMinor++
		_, err = c.client.EnqueueRefund(ctx, req)
		meta := errorInfo(t, err, codes.AlreadyExists, server.ReasonKeyConflict)
		if meta["operation_key"] != req.OperationKey || meta["job_id"] != fmt.Sprint(first.Job.Id) {
			t.Fatalf("conflict metadata = %v", meta)
		}
	})
}

func TestBadInputOverGRPC(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		claimed := c.claimOne(t, "A", job.Id)
		long := strings.Repeat("x", 129)
		enq := func(f func(r *pb.EnqueueRefundRequest)) func() error {
			return func() error {
				r := refundReq()
				f(r)
				_, err := c.client.EnqueueRefund(ctx, r)
				return err
			}
		}
		claim := func(r *pb.ClaimRequest) func() error {
			return func() error { _, err := c.client.Claim(ctx, r); return err }
		}
		cases := []struct {
			field string
			call  func() error
		}{
			{"operation_key", enq(func(r *pb.EnqueueRefundRequest) { r.OperationKey = "" })},
			{"operation_key", enq(func(r *pb.EnqueueRefundRequest) { r.OperationKey = long })},
			{"amount_minor", enq(func(r *pb.EnqueueRefundRequest) { r.AmountMinor = 0 })},
			{"amount_minor", enq(func(r *pb.EnqueueRefundRequest) { r.AmountMinor = -1 })},
			{"currency", enq(func(r *pb.EnqueueRefundRequest) { r.Currency = "usd" })},
			{"currency", enq(func(r *pb.EnqueueRefundRequest) { r.Currency = "XXX" })},
			{"provider", enq(func(r *pb.EnqueueRefundRequest) { r.Provider = "" })},
			{"not_before", enq(func(r *pb.EnqueueRefundRequest) {
				r.NotBefore = &timestamppb.Timestamp{Seconds: 1, Nanos: -5}
			})},
			{"max_jobs", claim(&pb.ClaimRequest{WorkerId: "w", MaxJobs: 0})},
			{"max_jobs", claim(&pb.ClaimRequest{WorkerId: "w", MaxJobs: 101})},
			{"lease_duration", claim(&pb.ClaimRequest{WorkerId: "w", MaxJobs: 1, LeaseDuration: durationpb.New(500 * time.Millisecond)})},
			{"lease_duration", claim(&pb.ClaimRequest{WorkerId: "w", MaxJobs: 1, LeaseDuration: durationpb.New(16 * time.Minute)})},
			{"worker_id", claim(&pb.ClaimRequest{MaxJobs: 1})},
			{"attempt", func() error {
				_, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: 0, ProviderRefundId: "re"})
				return err
			}},
			{"provider_refund_id", func() error {
				_, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: claimed.Attempt})
				return err
			}},
			{"delay", func() error {
				_, err := c.client.Reschedule(ctx, &pb.RescheduleRequest{JobId: job.Id, Attempt: claimed.Attempt, LeaseToken: claimed.LeaseToken,
					When: &pb.RescheduleRequest_Delay{Delay: durationpb.New(-time.Second)}})
				return err
			}},
			{"reason", func() error {
				_, err := c.client.Escalate(ctx, &pb.EscalateRequest{JobId: job.Id, Attempt: claimed.Attempt})
				return err
			}},
			{"outcome", func() error {
				_, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
					Job: &pb.ReportObservationRequest_JobId{JobId: job.Id}, Source: "x"})
				return err
			}},
			{"job_id", func() error {
				_, err := c.client.GetJob(ctx, &pb.GetJobRequest{})
				return err
			}},
		}
		for _, tc := range cases {
			err := tc.call()
			errorInfo(t, err, codes.InvalidArgument, server.ReasonInvalidArgument)
			st, _ := status.FromError(err)
			found := false
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, v := range br.FieldViolations {
						found = found || v.Field == tc.field
					}
				}
			}
			if !found {
				t.Errorf("%s: %v has no field violation for %s", tc.field, err, tc.field)
			}
		}
		_, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id + 999, Attempt: 1, ProviderRefundId: "re"})
		errorInfo(t, err, codes.NotFound, server.ReasonNotFound)
		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: job.Id}})
		if err != nil || got.Job.State != pb.JobState_JOB_STATE_RUNNING || got.Job.Attempt != 1 || len(got.Events) != 2 {
			t.Fatalf("rejected input changed the job: %v, %v", got, err)
		}
	})
}

func TestHealthServing(t *testing.T) {
	c := start(t, testdb.MySQLBackend())
	resp, err := healthpb.NewHealthClient(c.conn).Check(ctxFor(t), &healthpb.HealthCheckRequest{
		Service: pb.Coordinator_ServiceDesc.ServiceName})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", resp, err)
	}
}

var _ = errors.New

// counter reads a counter without labels from c's registry.
func (c *coordinator) counter(t *testing.T, name string) float64 {
	t.Helper()
	return c.metric(t, name).GetCounter().GetValue()
}

func (c *coordinator) metric(t *testing.T, name string) *dto.Metric {
	t.Helper()
	families, err := c.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0]
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// parked waits until claim transactions have answered n claims (the long
// polls' first, empty claims) and gives their callers a moment to park and
// arm, which costs them no database round trip. It counts the claims as the
// store answers them: the claim transactions' batch-size metric is observed
// as a transaction begins, and a slow one (say, on a new connection in place
// of an idle one the server had closed) has then not answered yet.
func (c *coordinator) parked(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.watched.claimed.Load() < int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("claim transactions answered fewer than %d claims", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
}

// TestClaimLongPollWakesOnEnqueue: with a poll interval far beyond the test,
// only an enqueue can answer a waiting claimer. One parked with its empty
// claim is answered by the hand-off, in the enqueue's own transaction, not
// by a claim transaction of its own; one the hand-off did not serve is woken
// and claims at once. Each job is granted once.
func TestClaimLongPollWakesOnEnqueue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		// longPoll starts a long poll and returns once it waits, armed.
		longPoll := func(req *pb.ClaimRequest) <-chan *pb.ClaimResponse {
			t.Helper()
			answered := c.watched.claimed.Load()
			got := make(chan *pb.ClaimResponse, 1)
			go func() {
				resp, err := c.client.Claim(ctx, req)
				if err != nil {
					t.Errorf("long poll %s: %v", req.WorkerId, err)
				}
				got <- resp
			}()
			c.parked(t, int(answered)+1)
			return got
		}
		gets := func(what string, got <-chan *pb.ClaimResponse, id int64) {
			t.Helper()
			select {
			case resp := <-got:
				if len(resp.GetJobs()) != 1 || resp.Jobs[0].Job.Id != id || resp.Jobs[0].Attempt != 1 {
					t.Fatalf("%s = %v, want job %d attempt 1", what, resp, id)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s was not woken by the enqueue of job %d", what, id)
			}
		}
		handoffs := func(want float64) {
			t.Helper()
			if n := c.counter(t, "jobfence_handoff_claims_total"); n != want {
				t.Fatalf("%v claims answered by a hand-off, want %v", n, want)
			}
		}
		wait := durationpb.New(20 * time.Second)

		idle := longPoll(&pb.ClaimRequest{WorkerId: "idle", MaxJobs: 1, Wait: wait})
		job := c.enqueue(t)
		gets("long poll", idle, job.Id)
		handoffs(1)

		// A hand-off goes to a waiter that would claim the job: the older waiter
		// only takes globex jobs, so the acme job must go to the newer one.
		globex := longPoll(&pb.ClaimRequest{WorkerId: "g", MaxJobs: 1, Provider: "globex",
			Wait: durationpb.New(3 * time.Second)})
		unfiltered := longPoll(&pb.ClaimRequest{WorkerId: "any", MaxJobs: 1, Wait: wait})
		acme := c.enqueue(t)
		gets("unfiltered long poll", unfiltered, acme.Id)
		if resp := <-globex; resp == nil || len(resp.Jobs) != 0 {
			t.Fatalf("globex-only waiter got %v", resp)
		}
		handoffs(2)

		// The hand-off takes the oldest due work first (Q1): a job enqueued as
		// through another replica, which woke nobody, goes to the first
		// waiter, and the new job it leaves wakes the second, which claims it
		// at once instead of at the next poll instant.
		first := longPoll(&pb.ClaimRequest{WorkerId: "first", MaxJobs: 1, Wait: wait})
		second := longPoll(&pb.ClaimRequest{WorkerId: "second", MaxJobs: 1, Wait: wait})
		older, _, err := c.store.Enqueue(ctx, store.EnqueueParams{OperationKey: "unannounced", OrderID: "o",
			PaymentID: "p", AmountMinor: 100, Currency: "EUR", Provider: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		left := c.enqueue(t)
		gets("first waiter", first, older.ID)
		gets("second waiter", second, left.Id)
		handoffs(3)
		for _, id := range []int64{job.Id, acme.Id, older.ID, left.Id} {
			got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: id}})
			if err != nil || got.Job.State != pb.JobState_JOB_STATE_RUNNING || got.Job.Attempt != 1 {
				t.Fatalf("job %d = %v, %v; want running at attempt 1, granted once", id, got, err)
			}
		}

		// Nothing to do: an empty answer once the wait is over.
		resp, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: "idle", MaxJobs: 1, Wait: durationpb.New(300 * time.Millisecond)})
		if err != nil || len(resp.Jobs) != 0 {
			t.Fatalf("idle long poll = %v, %v", resp, err)
		}
		_, err = c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: "idle", MaxJobs: 1, Wait: durationpb.New(2 * time.Minute)})
		errorInfo(t, err, codes.InvalidArgument, server.ReasonInvalidArgument)
	}, func(o *server.Options) { o.ClaimPollInterval = time.Hour })
}

// TestDrainReleasesWaitingClaims: a graceful stop is not held up by idle
// long polls.
func TestDrainReleasesWaitingClaims(t *testing.T) {
	c := start(t, testdb.SQLiteBackend())
	done := make(chan error, 1)
	go func() {
		resp, err := c.client.Claim(ctxFor(t), &pb.ClaimRequest{WorkerId: "idle", MaxJobs: 1, Wait: durationpb.New(50 * time.Second)})
		if err == nil && len(resp.Jobs) != 0 {
			err = fmt.Errorf("granted %d jobs", len(resp.Jobs))
		}
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	c.server.Drain()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not release the waiting claim")
	}
}

// TestMoreCallsThanStreamWorkers: calls are served by a pool of goroutines
// (grpc.NumStreamWorkers), which must not bound how many run at once: 100
// long polls, more than the pool, all wait at the same time and each gets
// a job.
func TestMoreCallsThanStreamWorkers(t *testing.T) {
	const n = 100
	c := start(t, testdb.SQLiteBackend())
	ctx := ctxFor(t)
	got := make(chan int64, n)
	for i := range n {
		go func() {
			resp, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: fmt.Sprintf("w%d", i), MaxJobs: 1,
				Wait: durationpb.New(30 * time.Second)})
			if err != nil || len(resp.Jobs) != 1 {
				t.Errorf("long poll %d = %v, %v", i, resp, err)
				got <- 0
				return
			}
			got <- resp.Jobs[0].Job.Id
		}()
	}
	c.parked(t, n)
	seen := map[int64]bool{}
	for range n {
		c.enqueue(t)
	}
	for range n {
		select {
		case id := <-got:
			if id == 0 || seen[id] {
				t.Fatalf("job %d handed out twice or not at all", id)
			}
			seen[id] = true
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d of %d long polls got a job", len(seen), n)
		}
	}
}

// TestConcurrentWritesCoalescedStayFenced: 16 workers claim and complete
// concurrently, so write-backs are coalesced into shared transactions; some
// workers lose their lease first and write late. Every job ends completed once,
// by its last attempt; every late write is STALE_ATTEMPT (R9, R21).
func TestConcurrentWritesCoalescedStayFenced(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		const jobs, workers = 300, 16
		for i := 0; i < jobs; i++ {
			c.enqueue(t)
		}
		var completed, stale, zombies atomic.Int64
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			go func(w int) {
				for completed.Load() < jobs {
					resp, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: fmt.Sprintf("w%d", w), MaxJobs: 4})
					if err != nil {
						errs <- err
						return
					}
					done := make(chan error, len(resp.Jobs))
					for i, j := range resp.Jobs {
						go func(j *pb.ClaimedJob, zombie bool) {
							if zombie {
								// Lose the lease and wait for someone to take over
								// before writing (R8: expiry alone only opens the
								// competition; a loaded machine may take its time).
								zombies.Add(1)
								storetest.Expire(ctx, c.store, j.Job.Id) //nolint:errcheck
								for {
									got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: j.Job.Id}})
									if err != nil || got.Job.Attempt > j.Attempt {
										break
									}
									time.Sleep(5 * time.Millisecond)
								}
							}
							res, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: j.Job.Id, Attempt: j.Attempt, LeaseToken: j.LeaseToken,
								ProviderRefundId: fmt.Sprintf("re_%d_%d", j.Job.Id, j.Attempt)})
							switch {
							case err == nil && !res.Replayed:
								completed.Add(1)
								err = nil
							case status.Code(err) == codes.FailedPrecondition:
								stale.Add(1)
								err = nil
							case err == nil:
								err = fmt.Errorf("job %d: unexpected replay", j.Job.Id)
							}
							done <- err
						}(j, (w+i)%9 == 0 && j.Attempt == 1)
					}
					for range resp.Jobs {
						if err := <-done; err != nil {
							errs <- err
							return
						}
					}
					if len(resp.Jobs) == 0 {
						time.Sleep(5 * time.Millisecond)
					}
				}
				errs <- nil
			}(w)
		}
		for w := 0; w < workers; w++ {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if completed.Load() != jobs {
			t.Fatalf("%d completions for %d jobs", completed.Load(), jobs)
		}
		for id := int64(1); id <= jobs; id++ {
			got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: id}})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, e := range got.Events {
				if e.Kind == "completed" {
					n++
					if e.Attempt != got.Job.Attempt {
						t.Fatalf("job %d completed under attempt %d, current %d", id, e.Attempt, got.Job.Attempt)
					}
				}
			}
			if n != 1 || got.Job.State != pb.JobState_JOB_STATE_SUCCEEDED {
				t.Fatalf("job %d: %s with %d completions", id, got.Job.State, n)
			}
		}
		t.Logf("%d zombies, %d stale writes rejected", zombies.Load(), stale.Load())
		if stale.Load() == 0 {
			t.Fatal("no late write was rejected; the test proves nothing")
		}
		if stale.Load() != zombies.Load() {
			t.Fatalf("%d zombies wrote after a takeover but %d were rejected", zombies.Load(), stale.Load())
		}
	})
}

// TestMetricsM1: the four M1 figures move with what happens to jobs.
func TestMetricsM1(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		c.enqueue(t)
		a := c.claimOne(t, "A", job.Id)
		c.expire(t, job.Id)
		b := c.claimOne(t, "B", job.Id)
		_, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, ProviderRefundId: "re_A"})
		errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)
		_, err = c.client.Escalate(ctx, &pb.EscalateRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Reason: "late"})
		errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)
		if _, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: b.Attempt, LeaseToken: b.LeaseToken, ProviderRefundId: "re_B"}); err != nil {
			t.Fatal(err)
		}
		want := `
# HELP jobfence_granted_jobs_total Jobs granted by Claim, by next_action; the reconcile share is the share of provider calls that are reconciles.
# TYPE jobfence_granted_jobs_total counter
jobfence_granted_jobs_total{next_action="reconcile"} 1
jobfence_granted_jobs_total{next_action="refund"} 1
# HELP jobfence_jobs Jobs by state (ready, running, manual_review; succeeded history is not counted).
# TYPE jobfence_jobs gauge
jobfence_jobs{state="manual_review"} 0
jobfence_jobs{state="ready"} 1
jobfence_jobs{state="running"} 0
# HELP jobfence_stale_attempt_rejections_total Write-backs and lease renewals rejected because they do not carry the job's current grant (R9, R25, R27), by RPC.
# TYPE jobfence_stale_attempt_rejections_total counter
jobfence_stale_attempt_rejections_total{rpc="Complete"} 1
jobfence_stale_attempt_rejections_total{rpc="Escalate"} 1
jobfence_stale_attempt_rejections_total{rpc="RenewLeases"} 0
jobfence_stale_attempt_rejections_total{rpc="Reschedule"} 0
# HELP jobfence_takeovers_total Jobs taken over from an expired lease (R6). Frequent takeovers point at GC pauses, too-short leases or over-claiming.
# TYPE jobfence_takeovers_total counter
jobfence_takeovers_total 1
`
		if err := testutil.GatherAndCompare(c.reg, strings.NewReader(want), "jobfence_granted_jobs_total", "jobfence_jobs",
			"jobfence_stale_attempt_rejections_total", "jobfence_takeovers_total"); err != nil {
			t.Fatal(err)
		}
		families, err := c.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, f := range families {
			seen[f.GetName()] = true
			if f.GetName() == "jobfence_oldest_unfinished_job_age_seconds" {
				if age := f.GetMetric()[0].GetGauge().GetValue(); age < 0 || age > 60 {
					t.Fatalf("oldest unfinished job age %v s", age)
				}
			}
		}
		for _, name := range []string{"jobfence_oldest_unfinished_job_age_seconds", "jobfence_claim_batch_size",
			"jobfence_write_batch_size", "jobfence_db_transaction_retries_total", "grpc_server_handled_total", "grpc_server_handling_seconds"} {
			if !seen[name] {
				t.Errorf("metric %s missing", name)
			}
		}
	})
}

// TestOperatorListAndResolveOverGRPC: an operator finds the job in review,
// resolves it with the attempt they looked at, and a stale view is refused.
func TestOperatorListAndResolveOverGRPC(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		var review *pb.Job
		for i := 0; i < 3; i++ {
			job := c.enqueue(t)
			a := c.claimOne(t, "A", job.Id)
			if _, err := c.client.Escalate(ctx, &pb.EscalateRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Reason: "no record"}); err != nil {
				t.Fatal(err)
			}
			review = job
		}
		first, err := c.client.ListJobs(ctx, &pb.ListJobsRequest{State: pb.JobState_JOB_STATE_MANUAL_REVIEW, PageSize: 2})
		if err != nil || len(first.Jobs) != 2 || first.NextPageToken == "" {
			t.Fatalf("first page = %v, %v", first, err)
		}
		second, err := c.client.ListJobs(ctx, &pb.ListJobsRequest{State: pb.JobState_JOB_STATE_MANUAL_REVIEW, PageSize: 2,
			PageToken: first.NextPageToken})
		if err != nil || len(second.Jobs) != 1 || second.NextPageToken != "" || second.Jobs[0].Id != review.Id {
			t.Fatalf("second page = %v, %v; want the last job %d", second, err, review.Id)
		}
		_, err = c.client.ListJobs(ctx, &pb.ListJobsRequest{PageToken: first.NextPageToken})
		errorInfo(t, err, codes.InvalidArgument, server.ReasonInvalidArgument)

		seen := second.Jobs[0]
		resp, err := c.client.ResolveReview(ctx, &pb.ResolveReviewRequest{JobId: seen.Id, Attempt: seen.Attempt,
			Resolution: pb.ReviewResolution_REVIEW_RESOLUTION_RECONCILE, Note: "provider support says retry the lookup"})
		if err != nil || resp.Job.State != pb.JobState_JOB_STATE_READY || resp.Job.NextAction != pb.NextAction_NEXT_ACTION_RECONCILE {
			t.Fatalf("ResolveReview = %v, %v", resp, err)
		}
		b := c.claimOne(t, "B", seen.Id)
		_, err = c.client.ResolveReview(ctx, &pb.ResolveReviewRequest{JobId: seen.Id, Attempt: seen.Attempt,
			Resolution: pb.ReviewResolution_REVIEW_RESOLUTION_REFUNDED, ProviderRefundId: "re_x", Note: "stale view"})
		meta := errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)
		if meta["current_attempt"] != fmt.Sprint(b.Attempt) {
			t.Fatalf("metadata %v", meta)
		}
		_, err = c.client.ResolveReview(ctx, &pb.ResolveReviewRequest{JobId: seen.Id, Attempt: b.Attempt,
			Resolution: pb.ReviewResolution_REVIEW_RESOLUTION_REFUNDED, ProviderRefundId: "re_x", Note: "not in review"})
		errorInfo(t, err, codes.FailedPrecondition, server.ReasonJobNotInReview)
		_, err = c.client.ResolveReview(ctx, &pb.ResolveReviewRequest{JobId: seen.Id, Attempt: b.Attempt})
		errorInfo(t, err, codes.InvalidArgument, server.ReasonInvalidArgument)

		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: seen.Id}})
		if err != nil {
			t.Fatal(err)
		}
		var resolved *pb.JobEvent
		for _, e := range got.Events {
			if e.Kind == "resolved" {
				resolved = e
			}
		}
		if resolved == nil || resolved.WorkerId != "operator" || resolved.Reason != "provider support says retry the lookup" ||
			resolved.FromState != pb.JobState_JOB_STATE_MANUAL_REVIEW {
			t.Fatalf("resolution in history = %v", resolved)
		}
	})
}

// TestClaimSaysWhenBudgetRefills_R19: due jobs held back by an empty provider
// budget answer no jobs and retry_after.
func TestClaimSaysWhenBudgetRefills_R19(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		if err := c.store.ConfigureBudgets(ctx, map[string]store.BudgetConfig{"acme": {Rate: 0.5, Burst: 1}}); err != nil {
			t.Fatal(err)
		}
		c.enqueue(t)
		c.enqueue(t)
		first, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: "w", MaxJobs: 5, Wait: durationpb.New(time.Second)})
		if err != nil || len(first.Jobs) != 1 || first.RetryAfter != nil {
			t.Fatalf("first claim = %v, %v; want the one job the burst allows", first, err)
		}
		second, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: "w", MaxJobs: 5, Wait: durationpb.New(time.Second)})
		if err != nil || len(second.Jobs) != 0 || second.RetryAfter == nil ||
			second.RetryAfter.AsDuration() <= 0 || second.RetryAfter.AsDuration() > 2*time.Second {
			t.Fatalf("second claim = %v, %v; want no jobs and retry_after within 2s", second, err)
		}
	})
}

// TestIdleLongPollsLookAgainTogether: idle long polls look again for work at
// the same instants, with one look for all of them and no transaction: 12
// workers that started waiting at different moments, waiting through eight
// poll intervals, cost about one look per interval, not one per worker, and
// no claim transaction while there is nothing to claim; and a job nothing
// woke them for (enqueued as through another replica) reaches exactly one of
// them at the next look.
//
// The interval is half a second: an idle look is bounded by it, and on a
// loaded two-core machine a look on MySQL took longer than 100 ms, failed,
// and was taken for work (a claim transaction per waiter); waiters' timers
// also fired late enough there to skip instants of 100 ms.
func TestIdleLongPollsLookAgainTogether(t *testing.T) {
	const workers, interval, intervals = 12, 500 * time.Millisecond, 8
	for _, b := range testdb.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := start(t, b, func(o *server.Options) { o.ClaimPollInterval = interval })
			ctx := ctxFor(t)
			hist := func() (txs uint64, claims float64) {
				h := c.metric(t, "jobfence_claim_tx_batch_size").GetHistogram()
				return h.GetSampleCount(), h.GetSampleSum()
			}
			// The long polls wait far longer than the test needs, however
			// slowly a loaded machine starts them; the ones left are
			// cancelled once one of them got the job.
			polls, stopPolls := context.WithCancel(ctx)
			defer stopPolls()
			var stopped atomic.Bool
			got := make(chan []*pb.ClaimedJob, workers)
			for w := range workers {
				go func() {
					resp, err := c.client.Claim(polls, &pb.ClaimRequest{WorkerId: fmt.Sprintf("idle-%d", w), MaxJobs: 1,
						Wait: durationpb.New(30 * time.Second)})
					if err != nil && !(stopped.Load() && status.Code(err) == codes.Canceled) {
						t.Errorf("idle long poll: %v", err)
					}
					got <- resp.GetJobs()
				}()
				time.Sleep(interval / workers) // workers start waiting at moments spread over an interval
			}
			c.parked(t, workers)
			looks := func() float64 { return c.metric(t, "jobfence_idle_looks_total").GetCounter().GetValue() }
			txs0, _ := hist()
			looks0, failed0 := looks(), c.watched.lookErrors.Load()
			time.Sleep(intervals * interval)
			txs1, _ := hist()
			n, failed := looks()-looks0, c.watched.lookErrors.Load()-failed0
			if n > 2*intervals { // one per worker per interval when each looks on its own: 12
				t.Errorf("%v looks in %d intervals: the waiting workers did not look together", n, intervals)
			}
			if failed > 0 {
				// A look that fails is taken for work (a poll round claims)
				// and may outlast its instant: what follows holds for looks
				// the database answered.
				t.Logf("%d idle looks failed (the database took longer than a poll interval); "+
					"their claim transactions and skipped instants are not counted against the looks", failed)
			} else {
				if n < intervals-2 {
					t.Errorf("%v looks in %d intervals by %d waiting workers: they stopped looking", n, intervals, workers)
				}
				if txs := txs1 - txs0; txs > 0 {
					t.Errorf("%d claim transactions with nothing to claim: an idle look should have been enough", txs)
				}
			}

			// Through the store, as another replica would: no wake here.
			job, _, err := c.store.Enqueue(ctx, store.EnqueueParams{OperationKey: "unannounced", OrderID: "o", PaymentID: "p",
				AmountMinor: 100, Currency: "EUR", Provider: "acme"})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case jobs := <-got:
				if len(jobs) != 1 || jobs[0].Job.Id != job.ID || jobs[0].Attempt != 1 {
					t.Fatalf("first long poll to return got %v, want job %d attempt 1", jobs, job.ID)
				}
			case <-time.After(3 * interval):
				t.Fatal("no waiting worker got the job at the next look")
			}
			stopped.Store(true)
			stopPolls()
			for range workers - 1 {
				if jobs := <-got; len(jobs) != 0 {
					t.Errorf("another long poll got %v too", jobs)
				}
			}
			// Granted once, and not to a long poll that left: that grant
			// would have been handed back.
			d, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: job.ID}})
			if err != nil || d.Job.State != pb.JobState_JOB_STATE_RUNNING || d.Job.Attempt != 1 {
				t.Fatalf("job after the long polls ended = %v, %v; want running under attempt 1", d, err)
			}
		})
	}
}
