package jobfence

import (
	"context"
	"errors"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// Tracing (R35): each job a Worker works is one attempt span, linked to the
// trace context its enqueue stored (ClaimedJob.TraceParent), and every call
// the Worker makes for the job carries the attempt span's context: a unary
// call as W3C traceparent and tracestate metadata, a call on the worker
// stream in the WorkCall's traceparent and tracestate fields. With no
// TracerProvider set (WorkerOptions.TracerProvider, or otel's global one)
// the spans are OpenTelemetry's no-op ones and nothing is recorded or sent.
// clients/go/README.md, "Tracing", says it for users.

// TracerName is the instrumentation scope of the SDK's spans.
const TracerName = "github.com/jobfence/jobfence/clients/go/jobfence"

// AttemptSpanName is the name of the span of one attempt: the same in the
// three SDKs, in the family of the coordinator's jobfence.grant and
// jobfence.writeback spans.
const AttemptSpanName = "jobfence.attempt"

// RenewSpanName is the span a renewal of several jobs' leases is made in,
// linked to each job's attempt span; a renewal of one job is made in its
// attempt span.
const RenewSpanName = "jobfence.renew"

// The outcomes of an attempt (the jobfence.outcome attribute of its span).
const (
	OutcomeCompleted   = "completed"    // Complete written (or replayed)
	OutcomeRescheduled = "rescheduled"  // Reschedule written
	OutcomeEscalated   = "escalated"    // Escalate written
	OutcomeStale       = "stale"        // the fence refused the write-back (STALE_ATTEMPT, JOB_NOT_RUNNING)
	OutcomeGrantLost   = "grant_lost"   // a renewal found the grant gone while the handler ran (R27)
	OutcomeWriteFailed = "write_failed" // the write-back failed otherwise; the lease lapses (R6)
)

// The attributes of the SDK's spans: the messaging conventions' where they
// fit (a job is a message, its provider the destination) and jobfence's own,
// named as the coordinator names them. The operation key is recorded, as
// the coordinator's spans record it: the business identifier people search
// by, not a credential (docs/DESIGN.md, R35 in the code). Never the lease
// token (R25), nor the order, payment or amount.
var (
	attrMessagingSystem = attribute.Key("messaging.system")
	attrOpType          = attribute.Key("messaging.operation.type")
	attrOpName          = attribute.Key("messaging.operation.name")
	attrDestination     = attribute.Key("messaging.destination.name")
	attrMessageID       = attribute.Key("messaging.message.id")
	attrErrorType       = attribute.Key("error.type")
	attrJobID           = attribute.Key("jobfence.job.id")
	attrOperationKey    = attribute.Key("jobfence.operation_key")
	attrAttempt         = attribute.Key("jobfence.attempt")
	attrProvider        = attribute.Key("jobfence.provider")
	attrNextAction      = attribute.Key("jobfence.next_action")
	attrTakeover        = attribute.Key("jobfence.takeover")
	attrCancelRequested = attribute.Key("jobfence.cancel_requested")
	attrWorkerID        = attribute.Key("jobfence.worker_id")
	attrOutcome         = attribute.Key("jobfence.outcome")
	attrResult          = attribute.Key("jobfence.result")
	attrReplayed        = attribute.Key("jobfence.writeback.replayed")
	attrRenewSize       = attribute.Key("jobfence.renew.size")
	attrLink            = attribute.Key("jobfence.link")
)

// w3c writes and reads the trace context the coordinator reads: W3C
// traceparent and tracestate alone, whatever propagator the application
// installed globally.
var w3c = propagation.TraceContext{}

// tracing is a Worker's tracer.
type tracing struct {
	tracer   trace.Tracer
	workerID string
}

func newTracing(tp trace.TracerProvider, workerID string) tracing {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tracing{tracer: tp.Tracer(TracerName), workerID: workerID}
}

// attemptSpan is the span of one attempt, and what the attempt learns on
// its way to the write-back.
type attemptSpan struct {
	span trace.Span
	// lost: a renewal found the grant gone while the handler ran.
	lost bool
	// handlerErr: the handler failed (an error, a panic, its deadline); its
	// error.type.
	handlerErr string
}

// enqueueLink is the attribute of an attempt span's link to its enqueue
// (shared: a link's attributes are only read).
var enqueueLink = []attribute.KeyValue{attrLink.String("enqueue")}

// grantLink is the link to the enqueue's trace context a grant carries;
// false when it carries none, or one that is not a valid W3C traceparent
// of version 00 (the only one the coordinator stores). A tracestate that
// does not parse is dropped alone.
func grantLink(traceparent, tracestate string) (trace.Link, bool) {
	// 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>
	if len(traceparent) != 55 || traceparent[:3] != "00-" || traceparent[35] != '-' || traceparent[52] != '-' {
		return trace.Link{}, false
	}
	tid, err := trace.TraceIDFromHex(traceparent[3:35])
	if err != nil {
		return trace.Link{}, false
	}
	sid, err := trace.SpanIDFromHex(traceparent[36:52])
	if err != nil {
		return trace.Link{}, false
	}
	flags, ok := hexByte(traceparent[53:55])
	if !ok {
		return trace.Link{}, false
	}
	cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags) & trace.FlagsSampled,
		Remote: true}
	if tracestate != "" {
		if ts, err := trace.ParseTraceState(tracestate); err == nil {
			cfg.TraceState = ts
		}
	}
	return trace.Link{SpanContext: trace.NewSpanContext(cfg), Attributes: enqueueLink}, true
}

// hexByte parses two lower-case hex digits.
func hexByte(s string) (byte, bool) {
	var b byte
	for i := 0; i < 2; i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			b = b<<4 | (c - '0')
		case c >= 'a' && c <= 'f':
			b = b<<4 | (c - 'a' + 10)
		default:
			return 0, false
		}
	}
	return b, true
}

// start starts the attempt span of c: a root of its own (an attempt is not
// part of whatever the worker's Run was called in), linked to the enqueue.
// ctx carries it from then on: the handler's context, and the calls made
// for the job.
func (t tracing) start(ctx context.Context, c ClaimedJob) (context.Context, *attemptSpan) {
	var span trace.Span
	if l, ok := grantLink(c.TraceParent, c.TraceState); ok {
		ctx, span = t.tracer.Start(ctx, AttemptSpanName, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithLinks(l))
	} else {
		ctx, span = t.tracer.Start(ctx, AttemptSpanName, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer))
	}
	if span.IsRecording() {
		span.SetAttributes(
			attrMessagingSystem.String("jobfence"),
			attrOpType.String("process"),
			attrOpName.String("attempt"),
			attrDestination.String(c.Job.Provider),
			attrMessageID.String(strconv.FormatInt(c.Job.ID, 10)),
			attrJobID.Int64(c.Job.ID),
			attrOperationKey.String(c.Job.OperationKey),
			attrAttempt.Int64(c.Attempt),
			attrProvider.String(c.Job.Provider),
			attrNextAction.String(string(c.NextAction)),
			attrTakeover.Bool(c.Takeover),
			attrCancelRequested.Bool(c.CancelRequested),
			attrWorkerID.String(t.workerID),
		)
	}
	return ctx, &attemptSpan{span: span}
}

// handled records what the handler returned.
func (a *attemptSpan) handled(res Result) {
	if a.span.IsRecording() {
		a.span.SetAttributes(attrResult.String(res.Kind.String()))
	}
}

// handlerFailed records that the handler failed: errType is
// "handler_error" (an error or a panic) or "provider_deadline".
func (a *attemptSpan) handlerFailed(errType string) { a.handlerErr = errType }

// grantLost records that a renewal found the grant gone (R27).
func (a *attemptSpan) grantLost() { a.lost = true }

// end ends the span with the write-back's outcome: the decision written
// (replayed or not), or err, the write-back's failure.
func (a *attemptSpan) end(d Decision, replayed bool, err error) {
	defer a.span.End()
	if !a.span.IsRecording() {
		return
	}
	var outcome, errType, desc string
	switch {
	case err == nil:
		switch d.Kind {
		case DecideComplete:
			outcome = OutcomeCompleted
		case DecideEscalate:
			outcome = OutcomeEscalated
		default:
			outcome = OutcomeRescheduled
		}
		a.span.SetAttributes(attrReplayed.Bool(replayed))
		if a.handlerErr != "" {
			errType, desc = a.handlerErr, "the provider call failed; outcome unknown"
		}
	case a.lost:
		outcome, errType, desc = OutcomeGrantLost, "grant_lost", "the grant was lost while the handler ran (R27)"
	case errors.Is(err, ErrFenced):
		outcome, errType, desc = OutcomeStale, errorType(err), "the write-back was refused by the fence"
	default:
		outcome, errType, desc = OutcomeWriteFailed, errorType(err), "the write-back failed; the lease lapses"
	}
	a.span.SetAttributes(attrOutcome.String(outcome))
	if errType != "" {
		a.span.SetAttributes(attrErrorType.String(errType))
		a.span.SetStatus(codes.Error, desc)
	}
}

// errorType names a coordinator error for error.type: its ErrorInfo reason
// (STALE_ATTEMPT, …), else its gRPC code's name (UNAVAILABLE, …). Never its
// message.
func errorType(err error) string {
	var e *Error
	if !errors.As(err, &e) {
		return "unknown"
	}
	if e.Reason != "" {
		return e.Reason
	}
	return codeName(e.Code)
}

// codeName is a gRPC code's canonical name, as the other SDKs write it.
func codeName(c grpccodes.Code) string {
	names := [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
		"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
		"OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}
	if int(c) < len(names) {
		return names[c]
	}
	return "UNKNOWN"
}

// renewContext is the context a renewal of the grants hs is made in: the
// one held grant's attempt span, or a jobfence.renew span linked to each
// held attempt span when it renews several (and any of them is recorded).
// end ends the renewal's own span, if any.
func (t tracing) renewContext(ctx context.Context, spans []trace.SpanContext) (context.Context, func()) {
	if len(spans) == 1 {
		if !spans[0].IsValid() {
			return ctx, func() {}
		}
		return trace.ContextWithSpanContext(ctx, spans[0]), func() {}
	}
	var links []trace.Link
	for _, sc := range spans {
		if sc.IsSampled() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attrLink.String("attempt")}})
		}
	}
	if len(links) == 0 {
		return ctx, func() {}
	}
	ctx, span := t.tracer.Start(ctx, RenewSpanName, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithLinks(links...), trace.WithAttributes(attrMessagingSystem.String("jobfence"),
			attrWorkerID.String(t.workerID), attrRenewSize.Int(len(spans))))
	return ctx, func() { span.End() }
}

// mdCarrier is outgoing gRPC metadata as a propagation.TextMapCarrier.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// traceMetadata is ctx with the W3C trace context of its span in the
// outgoing metadata of a unary call (replacing any there); ctx itself when
// it carries no valid span context, which is what an untraced call costs.
func traceMetadata(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	md, ok := metadata.FromOutgoingContext(ctx)
	if ok {
		md = md.Copy()
	} else {
		md = metadata.MD{}
	}
	w3c.Inject(ctx, mdCarrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

// traceCall sets the WorkCall's traceparent and tracestate to the span
// context of ctx (the worker's span the call is made in); nothing when it
// has none.
func traceCall(ctx context.Context, c *pb.WorkCall) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	carrier := propagation.MapCarrier{}
	w3c.Inject(ctx, carrier)
	c.Traceparent, c.Tracestate = carrier["traceparent"], carrier["tracestate"]
}
