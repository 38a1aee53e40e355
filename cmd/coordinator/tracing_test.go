package main_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/otlptest"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// exported is a span the receiver got, with the service.name it came under.
type exported = otlptest.Span

// attrOf is the value of key among attrs, as text; "" when absent.
var attrOf = otlptest.Attr

// caller is one calling span of the test's own: the traceparent its calls
// carry.
type caller struct{ traceID, spanID string }

func newCaller(t *testing.T) caller {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return caller{hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])}
}

func (c caller) traceparent() string { return "00-" + c.traceID + "-" + c.spanID + "-01" }

func (c caller) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "traceparent", c.traceparent(), "tracestate", "jftest=r35")
}

func hexID(b []byte) string { return hex.EncodeToString(b) }

// linksOf are the links of s whose jobfence.link is kind, as "trace/span".
func linksOf(s *tracepb.Span, kind string) []string {
	var out []string
	for _, l := range s.GetLinks() {
		if attrOf(l.GetAttributes(), "jobfence.link") == kind {
			out = append(out, hexID(l.GetTraceId())+"/"+hexID(l.GetSpanId()))
		}
	}
	return out
}

func ref(s *tracepb.Span) string { return hexID(s.GetTraceId()) + "/" + hexID(s.GetSpanId()) }

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestTracingFollowsAJobFromEnqueueToEveryAttempt_R35 runs the coordinator
// binary on MySQL with the OTEL_* variables pointing at a real OTLP
// receiver, and calls it as producers and workers whose calls carry a
// traceparent: concurrent enqueues, claims and write-backs (so that shared
// transactions serve several calls), a stale write-back and a worker stream.
// After SIGTERM (the flush: the batch processor's delay is ten minutes) the
// receiver holds one trace from each enqueue to its attempts (R35): the
// enqueue's server span in the caller's trace and stored with the job; each
// grant and write-back linked to it; each shared transaction linked to the
// calls it served, its statements its children; the log lines of each call
// carrying its trace; and nowhere in the exported bytes a lease token, the
// DSN, or a value the SQL statements were given.
func TestTracingFollowsAJobFromEnqueueToEveryAttempt_R35(t *testing.T) {
	proctest.SkipShort(t, "coordinator")
	recv := otlptest.Start(t)
	dsn := testdb.MySQL(t)
	p := proctest.Start(t, bin.coordinator, proctest.Options{
		Args: []string{"--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug"},
		Env: []string{"JOBFENCE_MYSQL_DSN=" + dsn, "OTEL_SDK_DISABLED=", "OTEL_TRACES_EXPORTER=",
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + recv.Addr, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_TRACES_SAMPLER=", "OTEL_TRACES_SAMPLER_ARG=",
			"OTEL_SERVICE_NAME=jobfence-r35-test", "OTEL_RESOURCE_ATTRIBUTES=deployment.environment.name=test",
			"OTEL_BSP_SCHEDULE_DELAY=600000"},
		Ready: "coordinator serving",
	})
	if rec, ok := p.WaitRecord(time.Second, func(r map[string]any) bool { return r["msg"] == "tracing" }); !ok ||
		rec["tracing"] != "on" || rec["protocol"] != "grpc" || rec["service_name"] != "jobfence-r35-test" {
		t.Fatalf("start-up tracing line: %v", rec)
	}
	c := dial(t, &process{Process: p, addr: p.Addr})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	secret := newCaller(t).traceID[:12] // marks the values the SQL statements are given
	const n = 10
	type enqueued struct {
		caller caller
		job    *pb.Job
	}
	enqueues := make([]enqueued, n)
	parallel(t, n, func(i int) error {
		enqueues[i].caller = newCaller(t)
		resp, err := c.EnqueueRefund(enqueues[i].caller.ctx(ctx), &pb.EnqueueRefundRequest{
			OperationKey: fmt.Sprintf("r35-%s-%d", secret, i), OrderId: "order-" + secret, PaymentId: "pay-" + secret,
			AmountMinor: 4242, Currency: "EUR", Provider: "acme"})
		enqueues[i].job = resp.GetJob()
		return err
	})
	byJob := map[int64]enqueued{}
	for _, e := range enqueues {
		byJob[e.job.GetId()] = e
	}

	// Claims, concurrent, until every job is granted.
	type grant struct {
		caller caller
		job    *pb.ClaimedJob
	}
	var mu sync.Mutex
	var grants []grant
	for len(grants) < n {
		parallel(t, n-len(grants), func(int) error {
			cl := newCaller(t)
			resp, err := c.Claim(cl.ctx(ctx), &pb.ClaimRequest{WorkerId: "w-r35", MaxJobs: 1, Provider: "acme",
				LeaseDuration: durationpb.New(5 * time.Minute)})
			mu.Lock()
			defer mu.Unlock()
			for _, j := range resp.GetJobs() {
				grants = append(grants, grant{cl, j})
			}
			return err
		})
	}
	var tokens []string
	for _, g := range grants {
		tokens = append(tokens, g.job.GetLeaseToken())
		if want := byJob[g.job.GetJob().GetId()].job.GetTraceparent(); g.job.GetTraceparent() != want || want == "" {
			t.Errorf("grant of job %d carries traceparent %q, its enqueue stored %q", g.job.GetJob().GetId(),
				g.job.GetTraceparent(), want)
		}
		if g.job.GetTracestate() != "jftest=r35" {
			t.Errorf("grant of job %d carries tracestate %q", g.job.GetJob().GetId(), g.job.GetTracestate())
		}
	}

	// A stale write-back: the current attempt, another token (R25).
	staleCaller := newCaller(t)
	_, err := c.Complete(staleCaller.ctx(ctx), &pb.CompleteRequest{JobId: grants[0].job.GetJob().GetId(),
		Attempt: grants[0].job.GetAttempt(), LeaseToken: strings.Repeat("A", 22), ProviderRefundId: "re-stale"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale Complete: %v", err)
	}
	completers := make([]caller, len(grants))
	parallel(t, len(grants), func(i int) error {
		completers[i] = newCaller(t)
		_, err := c.Complete(completers[i].ctx(ctx), &pb.CompleteRequest{JobId: grants[i].job.GetJob().GetId(),
			Attempt: grants[i].job.GetAttempt(), LeaseToken: grants[i].job.GetLeaseToken(),
			ProviderRefundId: fmt.Sprintf("re-%s-%d", secret, i)})
		return err
	})

	// A worker stream: its grant and its write-back.
	streamCaller, streamProducer := newCaller(t), newCaller(t)
	ws, err := c.Work(streamCaller.ctx(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Send(&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: &pb.WorkStart{WorkerId: "w-stream",
		Provider: "globex", Credits: 1, LeaseDuration: durationpb.New(5 * time.Minute)}}}); err != nil {
		t.Fatal(err)
	}
	streamEnq, err := c.EnqueueRefund(streamProducer.ctx(ctx), &pb.EnqueueRefundRequest{
		OperationKey: "r35-stream-" + secret, OrderId: "order-" + secret, PaymentId: "pay-" + secret,
		AmountMinor: 4242, Currency: "EUR", Provider: "globex"})
	if err != nil {
		t.Fatal(err)
	}
	var streamGrant *pb.ClaimedJob
	for streamGrant == nil {
		m, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if g := m.GetGrant(); g != nil && len(g.GetJobs()) > 0 {
			streamGrant = g.GetJobs()[0]
		}
	}
	tokens = append(tokens, streamGrant.GetLeaseToken())
	// A stale call first (another token), then the grant's write-back.
	if err := ws.Send(&pb.WorkRequest{Kind: &pb.WorkRequest_Call{Call: &pb.WorkCall{CallId: 2,
		Call: &pb.WorkCall_Complete{Complete: &pb.CompleteRequest{JobId: streamGrant.GetJob().GetId(),
			Attempt: streamGrant.GetAttempt(), LeaseToken: strings.Repeat("B", 22),
			ProviderRefundId: "re-stream-" + secret}}}}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r := m.GetReply(); r != nil {
			if len(r.GetError()) == 0 {
				t.Fatalf("stale stream Complete: %v", r)
			}
			break
		}
	}
	// The worker's attempt span this write-back is made in (R35): the
	// call's span is its child.
	const workerTrace, workerSpan = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
	if err := ws.Send(&pb.WorkRequest{Kind: &pb.WorkRequest_Call{Call: &pb.WorkCall{CallId: 1,
		Traceparent: "00-" + workerTrace + "-" + workerSpan + "-01",
		Call: &pb.WorkCall_Complete{Complete: &pb.CompleteRequest{JobId: streamGrant.GetJob().GetId(),
			Attempt: streamGrant.GetAttempt(), LeaseToken: streamGrant.GetLeaseToken(),
			ProviderRefundId: "re-stream-" + secret}}}}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r := m.GetReply(); r != nil {
			if len(r.GetError()) > 0 || r.GetComplete() == nil {
				t.Fatalf("stream Complete: %v", r)
			}
			break
		}
	}
	if err := ws.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := ws.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}

	p.Signal(syscall.SIGTERM) //nolint:errcheck
	if err := p.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	spans := recv.Spans()
	if len(spans) == 0 {
		t.Fatal("nothing exported by the shutdown's flush")
	}
	byRef := map[string]exported{}
	byName := map[string][]exported{}
	for _, s := range spans {
		byRef[ref(s.Span)] = s
		byName[s.GetName()] = append(byName[s.GetName()], s)
		if s.Service != "jobfence-r35-test" {
			t.Errorf("span %s under service.name %q", s.GetName(), s.Service)
		}
	}

	// The enqueues: server spans in the callers' traces, the job's stored
	// context theirs, described as sends.
	enqueueSpan := map[int64]exported{} // job id → the enqueue's server span
	for _, s := range byName["jobfence.v1.Coordinator/EnqueueRefund"] {
		if s.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("EnqueueRefund span kind %v", s.GetKind())
		}
		var id int64
		fmt.Sscan(attrOf(s.GetAttributes(), "jobfence.job.id"), &id) //nolint:errcheck
		enqueueSpan[id] = s
	}
	for _, e := range append(enqueues, enqueued{streamProducer, streamEnq.GetJob()}) {
		s, ok := enqueueSpan[e.job.GetId()]
		if !ok {
			t.Errorf("no EnqueueRefund span for job %d", e.job.GetId())
			continue
		}
		if hexID(s.GetTraceId()) != e.caller.traceID || hexID(s.GetParentSpanId()) != e.caller.spanID {
			t.Errorf("job %d: enqueue span %s/parent %s, want in the caller's trace %s under %s", e.job.GetId(),
				ref(s.Span), hexID(s.GetParentSpanId()), e.caller.traceID, e.caller.spanID)
		}
		if want := "00-" + hexID(s.GetTraceId()) + "-" + hexID(s.GetSpanId()) + "-01"; e.job.GetTraceparent() != want {
			t.Errorf("job %d stores traceparent %q, want its enqueue span's %q", e.job.GetId(), e.job.GetTraceparent(), want)
		}
		wantAttrs(t, s.Span, map[string]string{"messaging.system": "jobfence", "messaging.operation.type": "send",
			"messaging.operation.name": "enqueue", "messaging.message.id": fmt.Sprint(e.job.GetId()),
			"jobfence.enqueue.created": "true", "jobfence.operation_key": e.job.GetOperationKey()})
	}

	// The grants: children of their Claim's span, linked to the enqueue.
	grantSpans := map[string]exported{} // job id → the grant's span
	for _, s := range byName["jobfence.grant"] {
		grantSpans[attrOf(s.GetAttributes(), "jobfence.job.id")] = s
	}
	for _, g := range grants {
		id := g.job.GetJob().GetId()
		s, ok := grantSpans[fmt.Sprint(id)]
		if !ok {
			t.Errorf("no grant span for job %d", id)
			continue
		}
		parent, ok := byRef[hexID(s.GetTraceId())+"/"+hexID(s.GetParentSpanId())]
		if !ok || parent.GetName() != "jobfence.v1.Coordinator/Claim" || hexID(parent.GetTraceId()) != g.caller.traceID {
			t.Errorf("grant of job %d: parent %v, want the Claim's span in the claimer's trace", id, parent.GetName())
		}
		if !contains(linksOf(s.Span, "enqueue"), ref(enqueueSpan[id].Span)) {
			t.Errorf("grant of job %d does not link its enqueue %s: %v", id, ref(enqueueSpan[id].Span), s.GetLinks())
		}
		wantAttrs(t, s.Span, map[string]string{"messaging.system": "jobfence", "messaging.operation.type": "receive",
			"messaging.operation.name": "claim", "jobfence.attempt": "1", "jobfence.provider": "acme",
			"messaging.destination.name": "acme", "jobfence.next_action": "refund", "jobfence.takeover": "false",
			"jobfence.worker_id": "w-r35"})
		if s.GetKind() != tracepb.Span_SPAN_KIND_INTERNAL {
			t.Errorf("grant span kind %v", s.GetKind())
		}
	}

	// The write-backs: children of their call's span, linked to the
	// enqueue; the stale one refused with its reason.
	var stale int
	for _, s := range byName["jobfence.writeback"] {
		parent := byRef[hexID(s.GetTraceId())+"/"+hexID(s.GetParentSpanId())]
		var id int64
		fmt.Sscan(attrOf(s.GetAttributes(), "jobfence.job.id"), &id) //nolint:errcheck
		if attrOf(s.GetAttributes(), "error.type") != "" {
			stale++
			wantAttrs(t, s.Span, map[string]string{"error.type": "STALE_ATTEMPT"})
			if s.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
				t.Errorf("stale write-back's status %v", s.GetStatus())
			}
			continue
		}
		if parent.GetName() != "jobfence.v1.Coordinator/Complete" && parent.GetName() != "jobfence.stream_call Complete" {
			t.Errorf("write-back of job %d under %q", id, parent.GetName())
		}
		if !contains(linksOf(s.Span, "enqueue"), ref(enqueueSpan[id].Span)) {
			t.Errorf("write-back of job %d does not link its enqueue", id)
		}
		wantAttrs(t, s.Span, map[string]string{"messaging.operation.type": "settle", "messaging.operation.name": "complete",
			"jobfence.writeback.kind": "completed", "jobfence.state": "succeeded", "jobfence.attempt": "1"})
	}
	if stale != 2 || len(byName["jobfence.writeback"]) != n+3 {
		t.Errorf("%d write-back spans (%d stale), want %d (2 stale)", len(byName["jobfence.writeback"]), stale, n+3)
	}
	for _, s := range byName["jobfence.writeback"] {
		if hexID(s.GetTraceId()) == staleCaller.traceID && attrOf(s.GetAttributes(), "error.type") == "" {
			t.Error("the unary stale write-back's span says nothing of its refusal")
		}
	}

	// The stream: its grant a root of its own, linked to the stream and
	// the enqueue; its call a span of its own linked to the stream.
	streamSpans := byName["jobfence.v1.Coordinator/Work"]
	if len(streamSpans) != 1 || hexID(streamSpans[0].GetTraceId()) != streamCaller.traceID {
		t.Fatalf("Work spans %v", streamSpans)
	}
	sg := grantSpans[fmt.Sprint(streamGrant.GetJob().GetId())]
	if sg.Span == nil || len(sg.GetParentSpanId()) != 0 || !contains(linksOf(sg.Span, "stream"), ref(streamSpans[0].Span)) ||
		!contains(linksOf(sg.Span, "enqueue"), ref(enqueueSpan[streamEnq.GetJob().GetId()].Span)) {
		t.Errorf("stream grant span %v: want a root linked to the stream and its enqueue", sg.Span)
	} else {
		wantAttrs(t, sg.Span, map[string]string{"messaging.operation.type": "process", "messaging.operation.name": "stream_grant",
			"jobfence.provider": "globex"})
	}
	calls := byName["jobfence.stream_call Complete"]
	refused := 0
	for _, call := range calls {
		if call.GetKind() != tracepb.Span_SPAN_KIND_SERVER || !contains(linksOf(call.Span, "stream"), ref(streamSpans[0].Span)) {
			t.Errorf("stream call span %v", call)
		}
		if attrOf(call.GetAttributes(), "error.type") == "STALE_ATTEMPT" {
			refused++
			if len(call.GetParentSpanId()) != 0 {
				t.Errorf("a stream call without a traceparent has a parent: %v", call)
			}
		} else if hex.EncodeToString(call.GetTraceId()) != workerTrace || hex.EncodeToString(call.GetParentSpanId()) != workerSpan {
			t.Errorf("stream call span %v: want a child of the worker's span its WorkCall named", call)
		}
	}
	if len(calls) != 2 || refused != 1 {
		t.Errorf("%d stream call spans, %d refused; want 2, 1 refused", len(calls), refused)
	}

	// The shared transactions: each a root linked to the calls it served,
	// at least one serving several; the statements their children.
	// (A worker stream's claims are its claimer's: the stream's span. An
	// enqueue's transaction serves the waiting claims it hands its jobs to,
	// a long poll's or a stream's, as well as its enqueues.)
	for kind, served := range map[string][]string{"enqueue": {"jobfence.v1.Coordinator/EnqueueRefund",
		"jobfence.v1.Coordinator/Claim", "jobfence.v1.Coordinator/Work"},
		"claim": {"jobfence.v1.Coordinator/Claim", "jobfence.v1.Coordinator/Work"}, "write": {"jobfence.writeback"}} {
		most := 0
		for _, b := range byName["jobfence.batch "+kind] {
			if len(b.GetParentSpanId()) != 0 {
				t.Errorf("batch %s has a parent", kind)
			}
			calls := linksOf(b.Span, "call")
			for _, l := range calls {
				if s, ok := byRef[l]; ok && !contains(served, s.GetName()) {
					t.Errorf("batch %s links a %s", kind, s.GetName())
				}
				if s, ok := byRef[l]; ok && !contains(linksOf(s.Span, "batch"), ref(b.Span)) {
					t.Errorf("a call batch %s served does not link it back", kind)
				}
			}
			most = max(most, len(calls))
			if attrOf(b.GetAttributes(), "jobfence.batch.size") == "" {
				t.Errorf("batch %s without its size", kind)
			}
		}
		if most < 2 {
			t.Errorf("no %s transaction linked several calls (most: %d)", kind, most)
		}
	}
	statements := map[string]bool{}
	for _, s := range spans {
		if attrOf(s.GetAttributes(), "db.system.name") == "" {
			continue
		}
		statements[s.GetName()] = true
		parent := byRef[hexID(s.GetTraceId())+"/"+hexID(s.GetParentSpanId())]
		if !strings.HasPrefix(parent.GetName(), "jobfence.batch ") || s.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
			t.Errorf("statement %s (kind %v) under %q", s.GetName(), s.GetKind(), parent.GetName())
		}
		wantAttrs(t, s.Span, map[string]string{"db.system.name": "mysql", "db.query.summary": s.GetName()})
	}
	for _, want := range []string{"BEGIN", "INSERT refund_jobs", "UPDATE refund_jobs", "COMMIT"} {
		if !statements[want] {
			t.Errorf("no %q statement span among %v", want, statements)
		}
	}

	// The logs: the lines written inside the calls carry their trace.
	logged := map[string]bool{}
	for _, r := range p.Records() {
		if r["msg"] == "finished call" && r["grpc.method"] == "EnqueueRefund" {
			id, _ := r["trace_id"].(string)
			logged[id] = true
			if r["span_id"] == nil {
				t.Errorf("finished call line without span_id: %v", r)
			}
		}
	}
	for _, e := range enqueues {
		if !logged[e.caller.traceID] {
			t.Errorf("no EnqueueRefund log line with the caller's trace_id %s", e.caller.traceID)
		}
	}

	// Nothing secret in the exported bytes.
	raw := recv.Bytes()
	for _, tok := range tokens {
		if tok == "" || bytes.Contains(raw, []byte(tok)) {
			t.Errorf("a lease token (%q) is in the exported spans", tok)
		}
	}
	dbName := dsn[strings.LastIndex(dsn, "/")+1:]
	if i := strings.IndexByte(dbName, '?'); i >= 0 {
		dbName = dbName[:i]
	}
	for _, leak := range []string{dsn, dbName, "order-" + secret, "pay-" + secret, "re-" + secret, "4242", "WHERE", "VALUES"} {
		if bytes.Contains(raw, []byte(leak)) {
			t.Errorf("%q (the DSN, its database, or a statement's value or text) is in the exported spans", leak)
		}
	}
}

// wantAttrs checks attributes of s.
func wantAttrs(t *testing.T, s *tracepb.Span, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := attrOf(s.GetAttributes(), k); got != v {
			t.Errorf("span %s: %s = %q, want %q", s.GetName(), k, got, v)
		}
	}
}

// parallel runs f(0..n-1) at once and fails t on an error.
func parallel(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	start := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		go func() { <-start; errs <- f(i) }()
	}
	close(start)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestTracingOffExportsNothingAndStillStoresTheCallersTrace_R35: with no
// OTEL_* variable, OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true (an
// endpoint set or not), the coordinator says tracing is off, exports
// nothing and its log lines carry no trace; an enqueue still stores the
// caller's traceparent and tracestate, which every grant hands on (R35).
func TestTracingOffExportsNothingAndStillStoresTheCallersTrace_R35(t *testing.T) {
	proctest.SkipShort(t, "coordinator")
	recv := otlptest.Start(t)
	endpoint := "OTEL_EXPORTER_OTLP_ENDPOINT=http://" + recv.Addr
	unset := []string{"OTEL_SDK_DISABLED=", "OTEL_TRACES_EXPORTER=", "OTEL_EXPORTER_OTLP_ENDPOINT=",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_BSP_SCHEDULE_DELAY=10"}
	for name, env := range map[string][]string{
		"nothing set":   nil,
		"exporter none": {"OTEL_TRACES_EXPORTER=none", endpoint},
		"sdk disabled":  {"OTEL_SDK_DISABLED=true", endpoint},
	} {
		t.Run(name, func(t *testing.T) {
			p := proctest.Start(t, bin.coordinator, proctest.Options{
				Args:  []string{"--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug", "--sqlite", t.TempDir() + "/j.db"},
				Env:   append(append([]string{}, unset...), env...),
				Ready: "coordinator serving",
			})
			if rec, ok := p.WaitRecord(time.Second, func(r map[string]any) bool { return r["msg"] == "tracing" }); !ok ||
				rec["tracing"] != "off" {
				t.Fatalf("start-up tracing line: %v", rec)
			}
			c := dial(t, &process{Process: p, addr: p.Addr})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			producer := newCaller(t)
			enq, err := c.EnqueueRefund(producer.ctx(ctx), &pb.EnqueueRefundRequest{OperationKey: "r35-off",
				OrderId: "o", PaymentId: "p", AmountMinor: 1, Currency: "EUR", Provider: "acme"})
			if err != nil {
				t.Fatal(err)
			}
			if enq.GetJob().GetTraceparent() != producer.traceparent() {
				t.Errorf("stored traceparent %q, want the caller's %q", enq.GetJob().GetTraceparent(), producer.traceparent())
			}
			// A malformed one is dropped, the enqueue served.
			bad := metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+strings.Repeat("0", 32)+"-00f067aa0ba902b7-01")
			badEnq, err := c.EnqueueRefund(bad, &pb.EnqueueRefundRequest{OperationKey: "r35-off-bad",
				OrderId: "o", PaymentId: "p", AmountMinor: 1, Currency: "EUR", Provider: "acme"})
			if err != nil || badEnq.GetJob().GetTraceparent() != "" {
				t.Errorf("enqueue with an invalid traceparent: %v, stored %q", err, badEnq.GetJob().GetTraceparent())
			}
			claimed, err := c.Claim(newCaller(t).ctx(ctx), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1,
				LeaseDuration: durationpb.New(time.Minute)})
			if err != nil || len(claimed.GetJobs()) != 1 {
				t.Fatalf("Claim = %v, %v", claimed, err)
			}
			if g := claimed.GetJobs()[0]; g.GetTraceparent() != producer.traceparent() || g.GetTracestate() != "jftest=r35" {
				t.Errorf("grant carries %q %q, want the producer's trace context", g.GetTraceparent(), g.GetTracestate())
			}
			p.Signal(syscall.SIGTERM) //nolint:errcheck
			if err := p.Wait(t, 30*time.Second); err != nil {
				t.Fatalf("exit after SIGTERM: %v", err)
			}
			if n := len(recv.Spans()); n != 0 {
				t.Errorf("%d spans exported with tracing off", n)
			}
			for _, r := range p.Records() {
				if r["trace_id"] != nil {
					t.Errorf("a log line carries a trace with tracing off: %v", r)
				}
			}
		})
	}
}
