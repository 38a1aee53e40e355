package jobfence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// A transcript of stream/*.json: a Worker of this SDK against a scripted
// coordinator, a real gRPC server on a real socket that does what the
// steps say and checks what the worker sends.
type streamTranscript struct {
	Spec    string   `json:"spec"`
	Version int      `json:"version"`
	Name    string   `json:"name"`
	Rules   []string `json:"rules"`
	Note    string   `json:"note"`
	Worker  struct {
		WorkerID    string `json:"worker_id"`
		Concurrency int    `json:"concurrency"`
		Renew       bool   `json:"renew"`
		LeaseMs     int64  `json:"lease_ms"`
		// Tracing gives the Worker a TracerProvider recording in memory
		// (R35): the steps' span expectations read it.
		Tracing bool `json:"tracing"`
	} `json:"worker"`
	// Coordinator.Work "unimplemented": a coordinator without the worker
	// stream; the worker claims with Claim calls, which the steps answer.
	Coordinator struct {
		Work string `json:"work"`
	} `json:"coordinator"`
	Jobs     map[string]json.RawMessage `json:"jobs"`
	Handlers map[string]struct {
		Result specResult `json:"result"`
		Until  string     `json:"until"`
	} `json:"handlers"`
	Steps []struct {
		Expect   *streamExpect `json:"expect"`
		As       string        `json:"as"`
		WithinMs int64         `json:"within_ms"`
		Send     *struct {
			Grant    []string        `json:"grant"`
			ReplyTo  string          `json:"reply_to"`
			Response json.RawMessage `json:"response"`
			Error    *specStatus     `json:"error"`
			End      *specStatus     `json:"end"`
			// UnaryReply answers the oldest Claim the steps expected and
			// have not answered yet.
			UnaryReply *struct {
				Response json.RawMessage `json:"response"`
			} `json:"unary_reply"`
		} `json:"send"`
		Do    string `json:"do"`
		JobID string `json:"job_id"`
	} `json:"steps"`
}

type streamExpect struct {
	Request   map[string]any `json:"request"`
	Heartbeat bool           `json:"heartbeat"`
	HalfClose bool           `json:"half_close"`
	Unary     *struct {
		Method  string         `json:"method"`
		Request map[string]any `json:"request"`
	} `json:"unary"`
	Handler *struct {
		JobID string `json:"job_id"`
		Call  string `json:"call"`
	} `json:"handler"`
	HandlerCancelled string      `json:"handler_cancelled"`
	Run              string      `json:"run"`
	NothingMore      bool        `json:"nothing_more"`
	Span             *spanExpect `json:"span"`
}

// spanExpect is an attempt span as a step expects it (R35): the ended span
// of the job's attempt.
type spanExpect struct {
	JobID string `json:"job_id"`
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	Root  *bool  `json:"root"`
	Links []struct {
		Traceparent string         `json:"traceparent"`
		Tracestate  *string        `json:"tracestate"`
		Attributes  map[string]any `json:"attributes"`
	} `json:"links"`
	Attributes map[string]any `json:"attributes"`
	Status     string         `json:"status"`
}

// streamEvent is what a scripted stream read: a request, or its end.
type streamEvent struct {
	req *pb.WorkRequest
	err error // io.EOF: half-closed
}

type scriptedStream struct {
	in  chan streamEvent
	out chan any // *pb.WorkResponse, or *status.Status to end the stream
}

type unaryCall struct {
	method string
	req    proto.Message
	claim  chan *pb.ClaimResponse // Claim only: the steps' answer
}

// scriptedCoordinator serves Work as the transcript says and answers the
// unary write-backs, renewals and receipts with success.
type scriptedCoordinator struct {
	pb.UnimplementedCoordinatorServer
	noWork  bool
	streams chan *scriptedStream
	unary   chan unaryCall
}

// Claim waits for the steps' answer.
func (c *scriptedCoordinator) Claim(ctx context.Context, r *pb.ClaimRequest) (*pb.ClaimResponse, error) {
	u := unaryCall{"Claim", r, make(chan *pb.ClaimResponse, 1)}
	c.unary <- u
	select {
	case resp := <-u.claim:
		return resp, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (c *scriptedCoordinator) Work(srv pb.Coordinator_WorkServer) error {
	if c.noWork {
		return status.Error(codes.Unimplemented, "unknown method Work for service jobfence.v1.Coordinator")
	}
	s := &scriptedStream{in: make(chan streamEvent, 1000), out: make(chan any, 100)}
	c.streams <- s
	go func() {
		for {
			m, err := srv.Recv()
			if err != nil {
				s.in <- streamEvent{err: err}
				return
			}
			s.in <- streamEvent{req: m}
		}
	}()
	for {
		select {
		case m := <-s.out:
			switch m := m.(type) {
			case *status.Status:
				return m.Err()
			case *pb.WorkResponse:
				if err := srv.Send(m); err != nil {
					return err
				}
			}
		case <-srv.Context().Done():
			return srv.Context().Err()
		}
	}
}

func (c *scriptedCoordinator) Complete(_ context.Context, r *pb.CompleteRequest) (*pb.CompleteResponse, error) {
	c.unary <- unaryCall{"Complete", r, nil}
	return &pb.CompleteResponse{}, nil
}

func (c *scriptedCoordinator) Reschedule(_ context.Context, r *pb.RescheduleRequest) (*pb.RescheduleResponse, error) {
	c.unary <- unaryCall{"Reschedule", r, nil}
	return &pb.RescheduleResponse{}, nil
}

func (c *scriptedCoordinator) Escalate(_ context.Context, r *pb.EscalateRequest) (*pb.EscalateResponse, error) {
	c.unary <- unaryCall{"Escalate", r, nil}
	return &pb.EscalateResponse{}, nil
}

func (c *scriptedCoordinator) RenewLeases(_ context.Context, r *pb.RenewLeasesRequest) (*pb.RenewLeasesResponse, error) {
	c.unary <- unaryCall{"RenewLeases", r, nil}
	return &pb.RenewLeasesResponse{}, nil
}

func (c *scriptedCoordinator) ReportObservation(_ context.Context, r *pb.ReportObservationRequest) (*pb.ReportObservationResponse, error) {
	c.unary <- unaryCall{"ReportObservation", r, nil}
	return &pb.ReportObservationResponse{}, nil
}

// asJSON is m as the spec writes messages: protojson with the proto's
// field names.
func asJSON(t *testing.T, m proto.Message) map[string]any {
	t.Helper()
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// subset reports whether every field of want is in got with the same
// value; lists match element by element, with the same length.
func subset(want, got any) bool {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range w {
			if !subset(v, g[k]) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !subset(w[i], g[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(want, got)
}

// runStreamTranscript plays a transcript: the runner's Worker against the
// scripted coordinator, step by step.
func runStreamTranscript(t *testing.T, raw json.RawMessage) {
	var tr streamTranscript
	if err := strictJSON(raw, &tr); err != nil {
		t.Fatal(err)
	}
	jobs := map[string]*pb.ClaimedJob{}
	for id, j := range tr.Jobs {
		c := &pb.ClaimedJob{}
		if err := protojson.Unmarshal(j, c); err != nil {
			t.Fatalf("jobs.%s: %v", id, err)
		}
		jobs[id] = c
	}

	coord := &scriptedCoordinator{streams: make(chan *scriptedStream, 10), unary: make(chan unaryCall, 100)}
	switch tr.Coordinator.Work {
	case "":
	case "unimplemented":
		coord.noWork = true
	default:
		t.Fatalf("coordinator.work %q", tr.Coordinator.Work)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterCoordinatorServer(srv, coord)
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	defer srv.Stop()

	type handlerEvent struct {
		jobID, call string
		cancelled   bool
	}
	handled := make(chan handlerEvent, 100)
	// attempts: the traceparent of the span each job's handler ran in
	// ("$attempt:<job id>" in the steps), R35.
	var attemptsMu sync.Mutex
	attempts := map[string]string{}
	var spans *tracetest.SpanRecorder
	var tp trace.TracerProvider
	if tr.Worker.Tracing {
		spans = tracetest.NewSpanRecorder()
		tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	}
	done := make(chan struct{})
	defer close(done)
	var releaseMu sync.Mutex
	release := map[string]chan struct{}{}
	releaseOf := func(id string) chan struct{} {
		releaseMu.Lock()
		defer releaseMu.Unlock()
		if release[id] == nil {
			release[id] = make(chan struct{})
		}
		return release[id]
	}
	handle := func(ctx context.Context, c ClaimedJob, call string) Result {
		id := jobIDString(c.Job.ID)
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			attemptsMu.Lock()
			attempts[id] = "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
			attemptsMu.Unlock()
		}
		handled <- handlerEvent{jobID: id, call: call}
		h, ok := tr.Handlers[id]
		if !ok {
			t.Errorf("no handler scripted for job %s", id)
			return Result{}
		}
		switch h.Until {
		case "":
		case "released":
			select {
			case <-releaseOf(id):
			case <-done:
			}
		case "cancelled":
			select {
			case <-ctx.Done():
				handled <- handlerEvent{jobID: id, cancelled: true}
			case <-done:
			}
		default:
			t.Errorf("handlers.%s.until %q", id, h.Until)
		}
		return h.Result.result(t)
	}

	client, err := Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	w, err := NewWorker(client, HandlerFuncs{
		RefundFunc:    func(ctx context.Context, c ClaimedJob) Result { return handle(ctx, c, "refund") },
		ReconcileFunc: func(ctx context.Context, c ClaimedJob) Result { return handle(ctx, c, "reconcile") },
	}, WorkerOptions{WorkerID: tr.Worker.WorkerID, Concurrency: tr.Worker.Concurrency, Lease: ms(tr.Worker.LeaseMs),
		NoLeaseRenewal: !tr.Worker.Renew, ReceiptSpool: ReceiptSpoolOff, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { ran <- w.Run(ctx) }()
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		w.Shutdown(sctx) //nolint:errcheck // the transcript has failed already if this matters
	}()

	// nextHandled waits for the handler event want matches; events of
	// other jobs seen meanwhile wait for their own expectations, since jobs
	// granted together run in any order.
	var early []handlerEvent
	nextHandled := func(match func(handlerEvent) bool, timeout <-chan time.Time) (handlerEvent, bool) {
		for i, h := range early {
			if match(h) {
				early = append(early[:i], early[i+1:]...)
				return h, true
			}
		}
		for {
			select {
			case h := <-handled:
				if match(h) {
					return h, true
				}
				early = append(early, h)
			case <-timeout:
				return handlerEvent{}, false
			}
		}
	}
	var cur *scriptedStream
	calls := map[string]uint64{}
	var claims []unaryCall // expected, not answered yet
	for i, step := range tr.Steps {
		within := 5 * time.Second
		if step.WithinMs > 0 {
			within = ms(step.WithinMs)
		}
		timeout := time.NewTimer(within)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("step %d: "+format, append([]any{i + 1}, args...)...)
		}
		switch {
		case step.Expect != nil:
			e := step.Expect
			switch {
			case e.Request != nil || e.Heartbeat || e.HalfClose:
				if _, start := e.Request["start"]; start {
					select {
					case cur = <-coord.streams:
					case <-timeout.C:
						fail("no worker stream opened within %s", within)
					}
				}
				if cur == nil {
					fail("no worker stream yet")
				}
				for {
					var ev streamEvent
					select {
					case ev = <-cur.in:
					case <-timeout.C:
						fail("nothing within %s; want %+v", within, *e)
					}
					if ev.err != nil {
						if e.HalfClose && errors.Is(ev.err, io.EOF) {
							break
						}
						fail("the stream ended (%v); want %+v", ev.err, *e)
					}
					heartbeat := ev.req.GetCredit() != nil && ev.req.GetCredit().GetCredits() == 0
					if heartbeat && !e.Heartbeat {
						continue
					}
					if e.Heartbeat {
						if !heartbeat {
							fail("%v; want a heartbeat", ev.req)
						}
						break
					}
					if e.HalfClose {
						fail("%v; want the half-close", ev.req)
					}
					got := asJSON(t, ev.req)
					if call, ok := got["call"].(map[string]any); ok {
						delete(call, "call_id")
					}
					attemptsMu.Lock()
					want, err := withAttempts(e.Request, attempts)
					attemptsMu.Unlock()
					if err != nil {
						fail("%v", err)
					}
					if !subset(want, got) {
						fail("the worker sent\n%v\nwant\n%v", got, want)
					}
					if step.As != "" {
						calls[step.As] = ev.req.GetCall().GetCallId()
					}
					break
				}
			case e.Unary != nil:
				select {
				case u := <-coord.unary:
					if got := asJSON(t, u.req); u.method != e.Unary.Method || !subset(e.Unary.Request, got) {
						fail("unary %s %v; want %s %v", u.method, got, e.Unary.Method, e.Unary.Request)
					}
					if u.claim != nil {
						claims = append(claims, u)
					}
				case <-timeout.C:
					fail("no unary call within %s; want %s", within, e.Unary.Method)
				}
			case e.Handler != nil:
				h, ok := nextHandled(func(h handlerEvent) bool { return !h.cancelled && h.jobID == e.Handler.JobID }, timeout.C)
				switch {
				case !ok:
					fail("no handler call within %s; want %+v (seen %+v)", within, *e.Handler, early)
				case h.call != e.Handler.Call:
					fail("handler %+v; want %+v", h, *e.Handler)
				}
			case e.HandlerCancelled != "":
				if _, ok := nextHandled(func(h handlerEvent) bool { return h.cancelled && h.jobID == e.HandlerCancelled },
					timeout.C); !ok {
					fail("job %s's handler not cancelled within %s (seen %+v)", e.HandlerCancelled, within, early)
				}
			case e.Run == "returned":
				select {
				case err := <-ran:
					if err != nil {
						fail("Run: %v", err)
					}
				case <-timeout.C:
					fail("Run did not return within %s", within)
				}
			case e.NothingMore:
				if len(early) > 0 {
					fail("handler %+v; want nothing more", early)
				}
				select {
				case h := <-handled:
					fail("handler %+v; want nothing more", h)
				case u := <-coord.unary:
					fail("unary %s; want nothing more", u.method)
				default:
				}
				if cur != nil {
					for {
						select {
						case ev := <-cur.in:
							if ev.req != nil && (ev.req.GetCredit() == nil || ev.req.GetCredit().GetCredits() != 0) {
								fail("%v; want nothing more", ev.req)
							}
							continue
						default:
						}
						break
					}
				}
			case e.Span != nil:
				if spans == nil {
					fail("a span expected of a worker without tracing")
				}
				var s sdktrace.ReadOnlySpan
				for s == nil {
					for _, r := range spans.Ended() {
						for _, kv := range r.Attributes() {
							if kv.Key == "jobfence.job.id" && jobIDString(kv.Value.AsInt64()) == e.Span.JobID {
								s = r
							}
						}
					}
					if s != nil {
						break
					}
					select {
					case <-timeout.C:
						fail("no ended span of job %s within %s", e.Span.JobID, within)
					case <-time.After(5 * time.Millisecond):
					}
				}
				if why := spanMismatch(s, e.Span, jobs[e.Span.JobID].GetLeaseToken()); why != "" {
					fail("job %s's span: %s", e.Span.JobID, why)
				}
			default:
				fail("an expect of nothing this runner knows: %+v", *e)
			}
		case step.Send != nil && step.Send.UnaryReply != nil:
			if len(claims) == 0 {
				fail("a unary reply, and no Claim waits for one")
			}
			resp := &pb.ClaimResponse{}
			if err := protojson.Unmarshal(step.Send.UnaryReply.Response, resp); err != nil {
				fail("unary_reply: %v", err)
			}
			claims[0].claim <- resp
			claims = claims[1:]
		case step.Send != nil:
			if cur == nil {
				fail("no worker stream to send on")
			}
			s := step.Send
			switch {
			case s.Grant != nil:
				g := &pb.WorkGrant{}
				for _, id := range s.Grant {
					j, ok := jobs[id]
					if !ok {
						fail("grant of job %s, which jobs does not have", id)
					}
					g.Jobs = append(g.Jobs, j)
				}
				cur.out <- &pb.WorkResponse{Kind: &pb.WorkResponse_Grant{Grant: g}}
			case s.ReplyTo != "":
				id, ok := calls[s.ReplyTo]
				if !ok {
					fail("reply to %q, a call not seen", s.ReplyTo)
				}
				m := &pb.WorkResponse{}
				if s.Response != nil {
					if err := protojson.Unmarshal(s.Response, m); err != nil {
						fail("response: %v", err)
					}
				}
				if m.GetReply() == nil {
					m.Kind = &pb.WorkResponse_Reply{Reply: &pb.WorkReply{}}
				}
				m.GetReply().CallId = id
				if s.Error != nil {
					b, err := proto.Marshal(s.Error.status(t).Proto())
					if err != nil {
						t.Fatal(err)
					}
					m.GetReply().Error = b
				}
				cur.out <- m
			case s.Response != nil:
				m := &pb.WorkResponse{}
				if err := protojson.Unmarshal(s.Response, m); err != nil {
					fail("response: %v", err)
				}
				cur.out <- m
			case s.End != nil:
				cur.out <- s.End.status(t)
			default:
				fail("a send of nothing")
			}
		case step.Do == "stop":
			go w.Shutdown(context.Background()) //nolint:errcheck // Run's return is what the transcript checks
		case step.Do == "release":
			close(releaseOf(step.JobID))
		default:
			fail("a step that does nothing this runner knows")
		}
		timeout.Stop()
	}
}

// withAttempts is want with every string "$attempt:<job id>" replaced by
// the traceparent of the span that job's handler ran in (R35). Errors: a
// job whose handler ran in no span.
func withAttempts(want any, attempts map[string]string) (any, error) {
	switch w := want.(type) {
	case string:
		if id, ok := strings.CutPrefix(w, "$attempt:"); ok {
			tp, ok := attempts[id]
			if !ok {
				return nil, fmt.Errorf("%s: job %s's handler ran in no span", w, id)
			}
			return tp, nil
		}
		return w, nil
	case map[string]any:
		out := map[string]any{}
		for k, v := range w {
			r, err := withAttempts(v, attempts)
			if err != nil {
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(w))
		for i, v := range w {
			r, err := withAttempts(v, attempts)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	return want, nil
}

// spanMismatch says how s differs from what want pins ("" when it does
// not), and fails a span carrying the grant's lease token anywhere (R25).
func spanMismatch(s sdktrace.ReadOnlySpan, want *spanExpect, token string) string {
	attrs := func(kvs []attribute.KeyValue) map[string]any {
		m := map[string]any{}
		for _, kv := range kvs {
			v := kv.Value.AsInterface()
			if i, ok := v.(int64); ok {
				v = float64(i) // as JSON reads a number
			}
			m[string(kv.Key)] = v
		}
		return m
	}
	text := fmt.Sprint(s.Name(), s.Attributes(), s.Status().Description)
	for _, l := range s.Links() {
		text += fmt.Sprint(l.Attributes)
	}
	switch {
	case token != "" && strings.Contains(text, token):
		return "it carries the grant's lease token (R25)"
	case want.Name != "" && s.Name() != want.Name:
		return fmt.Sprintf("name %q, want %q", s.Name(), want.Name)
	case want.Kind != "" && s.SpanKind().String() != want.Kind:
		return fmt.Sprintf("kind %s, want %s", s.SpanKind(), want.Kind)
	case want.Root != nil && s.Parent().IsValid() == *want.Root:
		return fmt.Sprintf("parent %v, want root=%v", s.Parent(), *want.Root)
	case want.Links != nil && len(s.Links()) != len(want.Links):
		return fmt.Sprintf("links %v, want %d", s.Links(), len(want.Links))
	case !subset(want.Attributes, attrs(s.Attributes())):
		return fmt.Sprintf("attributes %v, want %v", attrs(s.Attributes()), want.Attributes)
	}
	for i, wl := range want.Links {
		l := s.Links()[i]
		sc := l.SpanContext
		got := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
		switch {
		case got != wl.Traceparent:
			return fmt.Sprintf("links[%d] %s, want %s", i, got, wl.Traceparent)
		case wl.Tracestate != nil && sc.TraceState().String() != *wl.Tracestate:
			return fmt.Sprintf("links[%d] tracestate %q, want %q", i, sc.TraceState(), *wl.Tracestate)
		case !subset(wl.Attributes, attrs(l.Attributes)):
			return fmt.Sprintf("links[%d] attributes %v, want %v", i, attrs(l.Attributes), wl.Attributes)
		}
	}
	status := map[otelcodes.Code]string{otelcodes.Unset: "unset", otelcodes.Error: "error", otelcodes.Ok: "ok"}[s.Status().Code]
	if want.Status != "" && status != want.Status {
		return fmt.Sprintf("status %s (%s), want %s", status, s.Status().Description, want.Status)
	}
	return ""
}

func jobIDString(id int64) string {
	b, _ := json.Marshal(id)
	return string(b)
}
