package server

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/tracing"
)

// Tracing (R35), when Options.TracerProvider is set. Every call has its
// server span (otelgrpc's stats handler: the caller's traceparent its
// parent); an enqueue's span carries the job and is what the job stores;
// each job granted, by a Claim or on a worker stream, is a jobfence.grant
// span and each write-back a jobfence.writeback span, both linked to the
// job's enqueue; each call a worker stream carries is a jobfence.stream_call
// span of its own, linked to the stream's. The shared transactions are the
// dispatcher's spans, linked to these. Nothing here reads a lease token.
// With no provider none of this runs: the handlers check s.tracer.

// statsHandler is otelgrpc's server handler on the coordinator's provider:
// W3C trace context alone, no metrics (Prometheus has them), and no spans
// for health checks and reflection.
func (s *Server) statsHandler() stats.Handler {
	return otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(s.opts.TracerProvider),
		otelgrpc.WithPropagators(tracing.Propagator()), otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
			return !strings.HasPrefix(info.FullMethodName, "/grpc.health.") &&
				!strings.HasPrefix(info.FullMethodName, "/grpc.reflection.")
		}))
}

// messaging are the attributes every messaging span of jobfence starts
// with: the system, the operation's type and name.
func messaging(op attribute.KeyValue, name string) []attribute.KeyValue {
	return []attribute.KeyValue{tracing.MessagingSystemKey.String(tracing.MessagingSystem), op,
		tracing.MessagingOpNameKey.String(name)}
}

// jobAttributes describe a job on a span: its id (as the message id too),
// provider (the destination), operation key (tracing.OperationKeyKey says
// why it is recorded) and, for grants and write-backs, attempt and next
// action.
func jobAttributes(j store.Job, withAttempt bool) []attribute.KeyValue {
	attrs := []attribute.KeyValue{tracing.MessageID(j.ID), tracing.JobIDKey.Int64(j.ID),
		tracing.MessagingDestKey.String(j.Provider), tracing.ProviderKey.String(j.Provider),
		tracing.OperationKeyKey.String(j.OperationKey)}
	if withAttempt {
		attrs = append(attrs, tracing.AttemptKey.Int64(j.Attempt), tracing.NextActionKey.String(string(j.NextAction)))
	}
	return attrs
}

// traceEnqueue describes an enqueue on its server span: a send of the job
// (new or the one on file, R1).
func (s *Server) traceEnqueue(ctx context.Context, p store.EnqueueParams, job store.Job, created bool, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(messaging(tracing.OpSend, "enqueue")...)
	if err != nil {
		span.SetAttributes(tracing.MessagingDestKey.String(p.Provider), tracing.ProviderKey.String(p.Provider),
			tracing.OperationKeyKey.String(p.OperationKey), tracing.ErrorTypeKey.String(errorReason(err)))
		return
	}
	span.SetAttributes(jobAttributes(job, false)...)
	span.SetAttributes(tracing.CreatedKey.Bool(created), tracing.StateKey.String(string(job.State)))
}

// traceGrants records one jobfence.grant span per job claimed, from began
// (the claim's start) to now: linked to the job's enqueue (R35). A Claim's
// grants are children of its call's span (a pull: receive); a worker
// stream's are roots of their own linked to the stream (pushed: process),
// so that a stream open for hours is not one trace of every job it ran.
func (s *Server) traceGrants(ctx context.Context, began time.Time, workerID string, claimed []store.ClaimedJob, stream bool) {
	if s.tracer == nil || len(claimed) == 0 {
		return
	}
	op, name := tracing.OpReceive, "claim"
	var streamLink []trace.Link
	if stream {
		op, name = tracing.OpProcess, "stream_grant"
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			streamLink = []trace.Link{{SpanContext: sc, Attributes: streamLinkAttrs}}
		}
	}
	for _, c := range claimed {
		links := streamLink
		if l, ok := tracing.EnqueueLink(c.Job.TraceParent, c.Job.TraceState); ok {
			links = append(links[:len(links):len(links)], l)
		}
		attrs := append(messaging(op, name), jobAttributes(c.Job, true)...)
		attrs = append(attrs, tracing.TakeoverKey.Bool(c.Takeover), tracing.WorkerIDKey.String(workerID))
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithTimestamp(began),
			trace.WithLinks(links...), trace.WithAttributes(attrs...)}
		if stream {
			opts = append(opts, trace.WithNewRoot())
		}
		_, span := s.tracer.Start(ctx, tracing.SpanGrant, opts...)
		span.End()
	}
}

var streamLinkAttrs = []attribute.KeyValue{tracing.LinkKind.String(tracing.LinkStream)}

// startWriteback starts the jobfence.writeback span of w, a child of the
// call's span (a settle of the attempt); endWriteback ends it.
func (s *Server) startWriteback(ctx context.Context, w store.Writeback) (context.Context, trace.Span) {
	name := strings.ToLower(rpcOf(w.Kind))
	if name == "resolvereview" {
		name = "resolve"
	}
	attrs := append(messaging(tracing.OpSettle, name), tracing.MessageID(w.JobID), tracing.JobIDKey.Int64(w.JobID),
		tracing.AttemptKey.Int64(w.Attempt), tracing.WritebackKey.String(string(w.Kind)))
	return s.tracer.Start(ctx, tracing.SpanWriteback, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...))
}

// endWriteback ends a write-back's span with what the write did: the job
// as it left it, linked to its enqueue (R35), or the reason it was refused.
func endWriteback(span trace.Span, res store.WriteResult, err error) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.SetAttributes(tracing.ErrorTypeKey.String(errorReason(err)))
		span.SetStatus(codes.Error, errorReason(err))
		return
	}
	j := res.Job
	span.SetAttributes(tracing.MessagingDestKey.String(j.Provider), tracing.ProviderKey.String(j.Provider),
		tracing.OperationKeyKey.String(j.OperationKey), tracing.NextActionKey.String(string(j.NextAction)),
		tracing.StateKey.String(string(j.State)), tracing.ReplayedKey.Bool(res.Replayed))
	if l, ok := tracing.EnqueueLink(j.TraceParent, j.TraceState); ok {
		span.AddLink(l)
	}
}

// startStreamCall starts the span of one call a worker stream carries: a
// SERVER span, as its unary twin would have, linked to the stream's span: a
// child of the worker's span the call names (WorkCall.traceparent, as a
// unary call's traceparent metadata would make it), else a root of its own.
func (s *Server) startStreamCall(ctx context.Context, c *pb.WorkCall) (context.Context, trace.Span) {
	method := "unknown"
	switch c.GetCall().(type) {
	case *pb.WorkCall_Complete:
		method = "Complete"
	case *pb.WorkCall_Reschedule:
		method = "Reschedule"
	case *pb.WorkCall_Escalate:
		method = "Escalate"
	case *pb.WorkCall_RenewLeases:
		method = "RenewLeases"
	case *pb.WorkCall_ReportObservation:
		method = "ReportObservation"
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(tracing.RPCMethodKey.String(pb.Coordinator_ServiceDesc.ServiceName + "/" + method))}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc, Attributes: streamLinkAttrs}))
	}
	parent := ctx
	if sc, ok := tracing.StoredContext(c.GetTraceparent(), c.GetTracestate()); ok {
		parent = trace.ContextWithRemoteSpanContext(ctx, sc)
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	return s.tracer.Start(parent, tracing.SpanStreamCall+" "+method, opts...)
}

// endStreamCall ends a stream call's span with its reply's refusal, if any,
// as error.type (the reason the unary call's status would carry).
func endStreamCall(span trace.Span, reply *pb.WorkReply) {
	if len(reply.GetError()) > 0 && span.IsRecording() {
		var st spb.Status
		if proto.Unmarshal(reply.GetError(), &st) == nil {
			span.SetAttributes(tracing.ErrorTypeKey.String(errorReason(status.FromProto(&st).Err())))
		}
	}
	span.End()
}

// errorReason is the ErrorInfo reason of a status error (STALE_ATTEMPT…),
// else its code: error.type on a span, never a message.
func errorReason(err error) string {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() != "" {
			return info.GetReason()
		}
	}
	return st.Code().String()
}
