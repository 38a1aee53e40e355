package jobfence

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// The tests of R35 in the SDK: a Worker against a coordinator of the test's
// own (a real gRPC server on a loopback socket) that grants one job whose
// enqueue carried a trace context, and records the trace context of every
// call it is sent: WorkCall fields on the worker stream, metadata on unary
// calls. Spans go to an in-memory recorder.

const (
	traceGrantParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traceGrantState  = "vendor=opaque,other=1"
	traceToken       = "tok-secret-0123456789ab" // the grant's lease token: never in a span
)

// tracedCall is one call the test coordinator was sent.
type tracedCall struct {
	method      string
	onStream    bool
	traceparent string
	tracestate  string
}

type traceCoordinator struct {
	pb.UnimplementedCoordinatorServer
	job         *pb.ClaimedJob
	noWork      bool
	refuseWrite bool // write-backs answered STALE_ATTEMPT
	refuseRenew bool // renewals answered STALE_ATTEMPT

	mu      sync.Mutex
	granted bool
	calls   []tracedCall
}

func (c *traceCoordinator) record(ctx context.Context, method string) {
	md, _ := metadata.FromIncomingContext(ctx)
	first := func(k string) string {
		if v := md.Get(k); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, tracedCall{method: method, traceparent: first("traceparent"), tracestate: first("tracestate")})
}

func (c *traceCoordinator) seen() []tracedCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]tracedCall(nil), c.calls...)
}

// renewed waits until the coordinator has seen a renewal (the renewer
// renews at a third of the lease), for a handler that must outlast one; a
// busy machine may run the renewer late, so it waits for the call rather
// than a fixed time, up to a bound.
func (c *traceCoordinator) renewed() {
	poll(10*time.Second, func() bool {
		for _, call := range c.seen() {
			if call.method == "RenewLeases" {
				return true
			}
		}
		return false
	})
}

// poll reports whether cond came true within d, looking every 5ms.
func poll(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// grantOnce is the job the first time, then nothing.
func (c *traceCoordinator) grantOnce() []*pb.ClaimedJob {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.granted {
		return nil
	}
	c.granted = true
	return []*pb.ClaimedJob{c.job}
}

func staleStatus(jobID int64) *status.Status {
	st, _ := status.New(codes.FailedPrecondition, "stale attempt").WithDetails(&errdetails.ErrorInfo{
		Domain: ErrorDomain, Reason: ReasonStaleAttempt,
		Metadata: map[string]string{"job_id": "7", "attempt": "1", "current_attempt": "2"}})
	return st
}

func (c *traceCoordinator) Claim(ctx context.Context, r *pb.ClaimRequest) (*pb.ClaimResponse, error) {
	c.record(ctx, "Claim")
	jobs := c.grantOnce()
	if len(jobs) == 0 {
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	return &pb.ClaimResponse{Jobs: jobs}, nil
}

func (c *traceCoordinator) Complete(ctx context.Context, r *pb.CompleteRequest) (*pb.CompleteResponse, error) {
	c.record(ctx, "Complete")
	if c.refuseWrite {
		return nil, staleStatus(r.GetJobId()).Err()
	}
	return &pb.CompleteResponse{Job: c.job.GetJob()}, nil
}

func (c *traceCoordinator) Reschedule(ctx context.Context, r *pb.RescheduleRequest) (*pb.RescheduleResponse, error) {
	c.record(ctx, "Reschedule")
	if c.refuseWrite {
		return nil, staleStatus(r.GetJobId()).Err()
	}
	return &pb.RescheduleResponse{Job: c.job.GetJob()}, nil
}

func (c *traceCoordinator) Escalate(ctx context.Context, r *pb.EscalateRequest) (*pb.EscalateResponse, error) {
	c.record(ctx, "Escalate")
	if c.refuseWrite {
		return nil, staleStatus(r.GetJobId()).Err()
	}
	return &pb.EscalateResponse{Job: c.job.GetJob()}, nil
}

func (c *traceCoordinator) RenewLeases(ctx context.Context, r *pb.RenewLeasesRequest) (*pb.RenewLeasesResponse, error) {
	c.record(ctx, "RenewLeases")
	return c.renewals(r), nil
}

func (c *traceCoordinator) renewals(r *pb.RenewLeasesRequest) *pb.RenewLeasesResponse {
	resp := &pb.RenewLeasesResponse{}
	for _, g := range r.GetGrants() {
		l := &pb.LeaseRenewal{JobId: g.GetJobId(), Attempt: g.GetAttempt()}
		if c.refuseRenew {
			l.Refused, l.Message = pb.ErrorReason_ERROR_REASON_STALE_ATTEMPT, "taken over"
			l.Metadata = map[string]string{"job_id": "7", "attempt": "1", "current_attempt": "2"}
		} else {
			l.LeaseUntil = timestamppb.New(time.Now().Add(time.Second))
		}
		resp.Renewals = append(resp.Renewals, l)
	}
	return resp
}

func (c *traceCoordinator) ReportObservation(ctx context.Context, r *pb.ReportObservationRequest) (*pb.ReportObservationResponse, error) {
	c.record(ctx, "ReportObservation")
	return &pb.ReportObservationResponse{Observation: &pb.Observation{Id: 1}}, nil
}

func (c *traceCoordinator) Work(srv pb.Coordinator_WorkServer) error {
	if c.noWork {
		return status.Error(codes.Unimplemented, "no Work here")
	}
	if _, err := srv.Recv(); err != nil { // the WorkStart
		return err
	}
	var sendMu sync.Mutex
	send := func(m *pb.WorkResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return srv.Send(m)
	}
	if jobs := c.grantOnce(); len(jobs) > 0 {
		if err := send(&pb.WorkResponse{Kind: &pb.WorkResponse_Grant{Grant: &pb.WorkGrant{Jobs: jobs}}}); err != nil {
			return err
		}
	}
	for {
		m, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		call := m.GetCall()
		if call == nil {
			continue
		}
		reply := &pb.WorkReply{CallId: call.GetCallId()}
		method := strings.TrimPrefix(workCallName(call), "/jobfence.v1.Coordinator/")
		c.mu.Lock()
		c.calls = append(c.calls, tracedCall{method: method, onStream: true, traceparent: call.GetTraceparent(),
			tracestate: call.GetTracestate()})
		c.mu.Unlock()
		switch k := call.GetCall().(type) {
		case *pb.WorkCall_RenewLeases:
			reply.Result = &pb.WorkReply_RenewLeases{RenewLeases: c.renewals(k.RenewLeases)}
		case *pb.WorkCall_ReportObservation:
			reply.Result = &pb.WorkReply_ReportObservation{ReportObservation: &pb.ReportObservationResponse{
				Observation: &pb.Observation{Id: 1}}}
		default:
			if c.refuseWrite {
				reply.Error, _ = proto.Marshal(staleStatus(c.job.GetJob().GetId()).Proto())
				break
			}
			switch call.GetCall().(type) {
			case *pb.WorkCall_Complete:
				reply.Result = &pb.WorkReply_Complete{Complete: &pb.CompleteResponse{Job: c.job.GetJob()}}
			case *pb.WorkCall_Reschedule:
				reply.Result = &pb.WorkReply_Reschedule{Reschedule: &pb.RescheduleResponse{Job: c.job.GetJob()}}
			case *pb.WorkCall_Escalate:
				reply.Result = &pb.WorkReply_Escalate{Escalate: &pb.EscalateResponse{Job: c.job.GetJob()}}
			}
		}
		if err := send(&pb.WorkResponse{Kind: &pb.WorkResponse_Reply{Reply: reply}}); err != nil {
			return err
		}
	}
}

// workCallName is the unary method a stream call stands for.
func workCallName(c *pb.WorkCall) string {
	switch c.GetCall().(type) {
	case *pb.WorkCall_Complete:
		return "Complete"
	case *pb.WorkCall_Reschedule:
		return "Reschedule"
	case *pb.WorkCall_Escalate:
		return "Escalate"
	case *pb.WorkCall_RenewLeases:
		return "RenewLeases"
	case *pb.WorkCall_ReportObservation:
		return "ReportObservation"
	}
	return "Unknown"
}

// tracedJob is the grant the test coordinator hands out: job 7, attempt 1,
// its enqueue's trace context unless traceparent is empty; lease is the
// grant's lease (renewals at a third of it).
func tracedJob(traceparent string, lease time.Duration) *pb.ClaimedJob {
	now := time.Now()
	return &pb.ClaimedJob{
		Job: &pb.Job{Id: 7, OperationKey: "op-traced", OrderId: "ord-1", PaymentId: "pay-1", AmountMinor: 4200,
			Currency: "EUR", Provider: "acme", State: pb.JobState_JOB_STATE_RUNNING, Attempt: 1,
			NextAction: pb.NextAction_NEXT_ACTION_REFUND, Traceparent: traceparent},
		Attempt: 1, LeaseToken: traceToken, NextAction: pb.NextAction_NEXT_ACTION_REFUND,
		ClaimedAt: timestamppb.New(now), LeaseUntil: timestamppb.New(now.Add(lease)),
		Traceparent: traceparent, Tracestate: traceGrantState,
	}
}

// traceRun is one Worker run against a traceCoordinator.
type traceRun struct {
	coord *traceCoordinator
	spans *tracetest.SpanRecorder
	// handlerSpan is the span context current in the handler's context.
	handlerSpan trace.SpanContext
}

// runTraced runs a Worker (tp: its TracerProvider, nil for none) until its
// one job is written back, and returns what the coordinator and the
// recorder saw. handle is the handler's body.
func runTraced(t *testing.T, coord *traceCoordinator, sr *tracetest.SpanRecorder, noStream bool,
	handle func(ctx context.Context) Result) *traceRun {
	t.Helper()
	gs := grpc.NewServer()
	pb.RegisterCoordinatorServer(gs, coord)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis) //nolint:errcheck
	t.Cleanup(gs.Stop)
	client, err := Dial(lis.Addr().String(), WithRetry(1, time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })

	var tp trace.TracerProvider
	if sr != nil {
		tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	}
	run := &traceRun{coord: coord, spans: sr}
	var mu sync.Mutex
	handled := make(chan struct{})
	written := make(chan struct{}, 1)
	h := func(ctx context.Context, _ ClaimedJob) Result {
		mu.Lock()
		run.handlerSpan = trace.SpanContextFromContext(ctx)
		mu.Unlock()
		defer close(handled)
		return handle(ctx)
	}
	w, err := NewWorker(client, HandlerFuncs{RefundFunc: h, ReconcileFunc: h}, WorkerOptions{
		WorkerID: "w-trace", ReceiptSpool: ReceiptSpoolOff, NoStream: noStream, TracerProvider: tp,
		OnEvent: func(e WorkerEvent) {
			switch e.Kind {
			case WorkerWritten, WorkerStale, WorkerWriteFailed:
				written <- struct{}{}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	select {
	case <-written:
	case <-time.After(10 * time.Second):
		t.Fatal("the job was not written back")
	}
	// The span ends after the write-back and the receipt it may file.
	if sr != nil && !poll(10*time.Second, func() bool { return attemptEnded(sr) }) {
		t.Fatal("the attempt span did not end")
	}
	<-handled
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return run
}

func newRecorder() (*tracetest.SpanRecorder, trace.TracerProvider) {
	sr := tracetest.NewSpanRecorder()
	return sr, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
}

func attemptEnded(sr *tracetest.SpanRecorder) bool {
	for _, s := range sr.Ended() {
		if s.Name() == AttemptSpanName {
			return true
		}
	}
	return false
}

func attemptSpanOf(t *testing.T, sr *tracetest.SpanRecorder) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == AttemptSpanName {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d ended %s spans, want 1 (all: %v)", len(found), AttemptSpanName, spanNames(sr))
	}
	return found[0]
}

func spanNames(sr *tracetest.SpanRecorder) []string {
	var names []string
	for _, s := range sr.Ended() {
		names = append(names, s.Name())
	}
	return names
}

func attrsOf(kvs []attribute.KeyValue) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// checkAttemptSpan checks what every attempt span of job 7 carries: its
// kind, its link to the grant's trace context (R35: a link, not a parent),
// its attributes, its outcome, and no lease token anywhere (R25).
func checkAttemptSpan(t *testing.T, s sdktrace.ReadOnlySpan, outcome string, errType string) {
	t.Helper()
	if s.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("kind %v, want consumer", s.SpanKind())
	}
	if s.Parent().IsValid() {
		t.Errorf("the attempt span has a parent %v: it must be a root linked to the enqueue", s.Parent())
	}
	links := s.Links()
	if len(links) != 1 {
		t.Fatalf("%d links, want 1 to the enqueue", len(links))
	}
	l := links[0].SpanContext
	if l.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || l.SpanID().String() != "00f067aa0ba902b7" ||
		!l.IsSampled() || l.TraceState().String() != traceGrantState {
		t.Errorf("link %s/%s sampled=%v state=%q; want the grant's %s, state %q", l.TraceID(), l.SpanID(), l.IsSampled(),
			l.TraceState(), traceGrantParent, traceGrantState)
	}
	if got := attrsOf(links[0].Attributes)["jobfence.link"].AsString(); got != "enqueue" {
		t.Errorf("link attribute jobfence.link=%q, want enqueue", got)
	}
	a := attrsOf(s.Attributes())
	want := map[string]any{
		"messaging.system": "jobfence", "messaging.operation.type": "process", "messaging.operation.name": "attempt",
		"messaging.destination.name": "acme", "messaging.message.id": "7", "jobfence.job.id": int64(7),
		"jobfence.attempt": int64(1), "jobfence.provider": "acme", "jobfence.next_action": "refund",
		"jobfence.takeover": false, "jobfence.cancel_requested": false, "jobfence.worker_id": "w-trace",
		"jobfence.outcome": outcome, "jobfence.operation_key": "op-traced",
	}
	for k, v := range want {
		if got, ok := a[k]; !ok || got.AsInterface() != v {
			t.Errorf("attribute %s = %v (present %v), want %v", k, got.AsInterface(), ok, v)
		}
	}
	if errType == "" {
		if s.Status().Code == otelcodes.Error {
			t.Errorf("status %v, want unset", s.Status())
		}
	} else if s.Status().Code != otelcodes.Error || a["error.type"].AsString() != errType {
		t.Errorf("status %v, error.type %q; want an error status, error.type %q", s.Status(), a["error.type"].AsString(), errType)
	}
	noToken(t, s)
}

// noToken fails when the lease token is in any attribute, link, event or
// status of s (R25).
func noToken(t *testing.T, s sdktrace.ReadOnlySpan) {
	t.Helper()
	check := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			if strings.Contains(kv.Value.Emit(), traceToken) {
				t.Errorf("the lease token is in %s attribute %s (R25)", where, kv.Key)
			}
		}
	}
	check("span", s.Attributes())
	for _, l := range s.Links() {
		check("link", l.Attributes)
	}
	for _, e := range s.Events() {
		check("event", e.Attributes)
	}
	if strings.Contains(s.Status().Description, traceToken) || strings.Contains(s.Name(), traceToken) {
		t.Errorf("the lease token is in the span's name or status (R25)")
	}
}

// checkCalls: every call the worker made for the job (all but Claim)
// carries the attempt span's trace context, on the stream or as metadata.
func checkCalls(t *testing.T, calls []tracedCall, s sdktrace.ReadOnlySpan, onStream bool, methods ...string) {
	t.Helper()
	want := "00-" + s.SpanContext().TraceID().String() + "-" + s.SpanContext().SpanID().String() + "-01"
	seen := map[string]bool{}
	for _, c := range calls {
		if c.method == "Claim" {
			if c.traceparent != "" {
				t.Errorf("a Claim carries traceparent %q; it is made in no span", c.traceparent)
			}
			continue
		}
		seen[c.method] = true
		if c.traceparent != want {
			t.Errorf("%s (on stream %v) carries traceparent %q, want the attempt span's %q", c.method, c.onStream, c.traceparent, want)
		}
		if c.onStream != onStream {
			t.Errorf("%s on stream %v, want %v", c.method, c.onStream, onStream)
		}
	}
	for _, m := range methods {
		if !seen[m] {
			t.Errorf("no %s call seen (calls: %+v)", m, calls)
		}
	}
}

// A completed attempt on the worker stream: the span around the handler,
// current in its context, linked to the enqueue; the write-back and the
// renewals carry it in their WorkCalls (R35).
func TestAttemptSpanLinkedToEnqueueAndCarriedByWorkCalls_R35(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	coord := &traceCoordinator{job: tracedJob(traceGrantParent, 300*time.Millisecond)}
	run := runTraced(t, coord, sr, false, func(ctx context.Context) Result {
		coord.renewed() // a renewal on the stream
		return Succeeded("re_1")
	})
	s := attemptSpanOf(t, sr)
	checkAttemptSpan(t, s, OutcomeCompleted, "")
	if a := attrsOf(s.Attributes()); a["jobfence.result"].AsString() != "succeeded" || a["jobfence.writeback.replayed"].AsBool() {
		t.Errorf("result %v replayed %v, want succeeded, false", a["jobfence.result"], a["jobfence.writeback.replayed"])
	}
	if !run.handlerSpan.Equal(s.SpanContext()) {
		t.Errorf("the handler's context holds span %v, want the attempt span %v", run.handlerSpan, s.SpanContext())
	}
	checkCalls(t, coord.seen(), s, true, "Complete", "RenewLeases")
}

// The same with Claim calls and unary write-backs: the attempt span's
// context goes as traceparent and tracestate metadata (R35).
func TestAttemptSpanCarriedByUnaryCallMetadata_R35(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	coord := &traceCoordinator{job: tracedJob(traceGrantParent, 300*time.Millisecond), noWork: true}
	runTraced(t, coord, sr, true, func(ctx context.Context) Result {
		coord.renewed()
		return Escalate("a person must look")
	})
	s := attemptSpanOf(t, sr)
	checkAttemptSpan(t, s, OutcomeEscalated, "")
	checkCalls(t, coord.seen(), s, false, "Escalate", "RenewLeases")
}

// A write-back the fence refuses: outcome stale, an error status, and the
// receipt filed in the attempt span (R15, R35).
func TestAttemptSpanRecordsStaleWriteBack_R35(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	coord := &traceCoordinator{job: tracedJob(traceGrantParent, time.Minute), refuseWrite: true}
	runTraced(t, coord, sr, false, func(ctx context.Context) Result { return Succeeded("re_1") })
	s := attemptSpanOf(t, sr)
	checkAttemptSpan(t, s, OutcomeStale, ReasonStaleAttempt)
	checkCalls(t, coord.seen(), s, true, "Complete", "ReportObservation")
}

// A renewal that finds the grant gone cancels the handler: outcome
// grant_lost, an error status (R27, R35).
func TestAttemptSpanRecordsGrantLost_R35(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	coord := &traceCoordinator{job: tracedJob(traceGrantParent, 300*time.Millisecond), refuseWrite: true, refuseRenew: true}
	runTraced(t, coord, sr, false, func(ctx context.Context) Result {
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), ErrGrantLost) {
			return Unknown(context.Cause(ctx))
		}
		return Succeeded("re_1") // the answer of a request already sent: filed (R15)
	})
	s := attemptSpanOf(t, sr)
	checkAttemptSpan(t, s, OutcomeGrantLost, "grant_lost")
	checkCalls(t, coord.seen(), s, true, "RenewLeases", "Complete", "ReportObservation")
}

// A handler that fails leaves the outcome unknown: rescheduled, with an
// error status (R14, R35).
func TestAttemptSpanRecordsHandlerFailure_R35(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	coord := &traceCoordinator{job: tracedJob(traceGrantParent, time.Minute)}
	runTraced(t, coord, sr, false, func(ctx context.Context) Result { return Unknown(errors.New("connection reset")) })
	s := attemptSpanOf(t, sr)
	checkAttemptSpan(t, s, OutcomeRescheduled, "handler_error")
	if got := attrsOf(s.Attributes())["jobfence.result"].AsString(); got != "unknown" {
		t.Errorf("jobfence.result %q, want unknown", got)
	}
}

// A grant whose enqueue carried no trace context: the attempt span has no
// link, and is traced all the same.
func TestAttemptSpanWithoutEnqueueContext_R35(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	coord := &traceCoordinator{job: tracedJob("", time.Minute)}
	runTraced(t, coord, sr, false, func(ctx context.Context) Result { return Succeeded("re_1") })
	s := attemptSpanOf(t, sr)
	if len(s.Links()) != 0 {
		t.Errorf("links %v, want none", s.Links())
	}
	checkCalls(t, coord.seen(), s, true, "Complete")
}

// With no TracerProvider (and otel's global one never set) nothing is
// traced: the handler's context holds no span, and no call carries a trace
// context, on the stream or as metadata (R35: off when unset).
func TestNoTracerProviderSendsNoTraceContext_R35(t *testing.T) {
	for _, noStream := range []bool{false, true} {
		coord := &traceCoordinator{job: tracedJob(traceGrantParent, 300*time.Millisecond), noWork: noStream}
		run := runTraced(t, coord, nil, noStream, func(ctx context.Context) Result {
			coord.renewed()
			return Succeeded("re_1")
		})
		if run.handlerSpan.IsValid() {
			t.Errorf("noStream=%v: the handler's context holds span %v", noStream, run.handlerSpan)
		}
		calls := coord.seen()
		for _, c := range calls {
			if c.traceparent != "" || c.tracestate != "" {
				t.Errorf("noStream=%v: %s carries %q %q", noStream, c.method, c.traceparent, c.tracestate)
			}
		}
		if len(calls) < 2 {
			t.Errorf("noStream=%v: calls %+v, want a write-back and renewals", noStream, calls)
		}
	}
}

// What tracing off costs a job: the no-op span's start and end, a few small
// allocations beside a job's gRPC calls (hundreds each), and nothing for
// each call made without a span.
func TestTracingOffCostsLittle_R35(t *testing.T) {
	tr := newTracing(noop.NewTracerProvider(), "w")
	c := claimedFromProto(tracedJob(traceGrantParent, time.Minute), time.Now())
	ctx := context.Background()
	perJob := testing.AllocsPerRun(100, func() {
		_, at := tr.start(ctx, c)
		at.handled(Result{})
		at.end(Decision{Kind: DecideComplete}, false, nil)
	})
	if perJob > 10 {
		t.Errorf("an untraced attempt costs %v allocations, want at most 10", perJob)
	}
	perCall := testing.AllocsPerRun(100, func() {
		traceCall(ctx, &pb.WorkCall{})
		_ = traceMetadata(ctx)
	})
	if perCall != 0 {
		t.Errorf("an untraced call costs %v allocations, want 0", perCall)
	}
}

// A renewal of several jobs is made in a jobfence.renew span linked to
// each job's attempt span; of one job, in its attempt span.
func TestRenewalContext_R35(t *testing.T) {
	sr, tp := newRecorder()
	tr := newTracing(tp, "w")
	c := claimedFromProto(tracedJob(traceGrantParent, time.Minute), time.Now())
	ctx1, a1 := tr.start(context.Background(), c)
	ctx2, a2 := tr.start(context.Background(), c)
	s1, s2 := trace.SpanContextFromContext(ctx1), trace.SpanContextFromContext(ctx2)

	one, end := tr.renewContext(context.Background(), []trace.SpanContext{s1})
	end()
	if !trace.SpanContextFromContext(one).Equal(s1) {
		t.Errorf("a renewal of one job is made in %v, want its attempt span %v", trace.SpanContextFromContext(one), s1)
	}
	both, end := tr.renewContext(context.Background(), []trace.SpanContext{s1, s2})
	renew := trace.SpanContextFromContext(both)
	end()
	a1.end(Decision{Kind: DecideComplete}, false, nil)
	a2.end(Decision{Kind: DecideComplete}, false, nil)
	var found bool
	for _, s := range sr.Ended() {
		if s.Name() != RenewSpanName {
			continue
		}
		found = true
		if !s.SpanContext().Equal(renew) || len(s.Links()) != 2 || !s.Links()[0].SpanContext.Equal(s1) || !s.Links()[1].SpanContext.Equal(s2) {
			t.Errorf("renew span %v links %v; want the context the call is made in, linked to %v and %v",
				s.SpanContext(), s.Links(), s1, s2)
		}
	}
	if !found {
		t.Errorf("no %s span (spans: %v)", RenewSpanName, spanNames(sr))
	}
}

func TestGrantLinkIgnoresMalformedTraceparent_R35(t *testing.T) {
	for _, tp := range []string{"", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"} {
		if l, ok := grantLink(tp, ""); ok {
			t.Errorf("grantLink(%q) = %v, want none", tp, l)
		}
	}
}
