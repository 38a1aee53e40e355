// Package tracing is the coordinator's OpenTelemetry tracing (R35): the
// tracer provider the standard OTEL_* variables configure (Setup: off, and
// free, when none is set), the W3C trace context a job carries from its
// enqueue to every grant (EnqueueContext, ParseTraceParent, EnqueueLink),
// the attributes jobfence's spans share, and a log handler that puts the
// trace and span ids into every line written inside a traced call
// (NewLogHandler).
//
// What may never be in a span, a link or a log line it adds: a lease token
// (R25), a DSN, a SQL statement's parameters. The spans are built from named
// fields only (attrs.go); the database's spans name the kind of statement
// and its table, never its text.
package tracing

import (
	"context"
	"encoding/hex"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// The W3C trace context headers, as gRPC metadata keys.
const (
	TraceParentHeader = "traceparent"
	TraceStateHeader  = "tracestate"
)

// ParseTraceParent reads a W3C traceparent of version 00:
// "00-<32 hex trace id>-<16 hex span id>-<2 hex flags>", lowercase, with a
// trace id and a span id that are not all zeros. Anything else is not a
// trace context (ok false): a caller's malformed header is dropped, never an
// error.
func ParseTraceParent(s string) (sc trace.SpanContext, ok bool) {
	const n = 2 + 1 + 32 + 1 + 16 + 1 + 2
	if len(s) != n || s[0] != '0' || s[1] != '0' || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return sc, false
	}
	var tid trace.TraceID
	var sid trace.SpanID
	var flags [1]byte
	if !lowerHex(s[3:35]) || !lowerHex(s[36:52]) || !lowerHex(s[53:55]) {
		return sc, false
	}
	// The hex is checked: these cannot fail.
	hex.Decode(tid[:], []byte(s[3:35]))    //nolint:errcheck
	hex.Decode(sid[:], []byte(s[36:52]))   //nolint:errcheck
	hex.Decode(flags[:], []byte(s[53:55])) //nolint:errcheck
	if !tid.IsValid() || !sid.IsValid() {
		return sc, false
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid,
		TraceFlags: trace.TraceFlags(flags[0]), Remote: true}), true
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// FormatTraceParent is sc as a W3C traceparent of version 00; empty when sc
// is not valid.
func FormatTraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + hex.EncodeToString([]byte{byte(sc.TraceFlags())})
}

// EnqueueContext is the trace context an enqueue stores with its job (R35),
// as traceparent and tracestate; empty when there is none. In order:
//   - the call's own span (the server span otelgrpc started from the
//     caller's traceparent) when it is sampled: the grants' links then lead
//     to a span the trace has;
//   - else the caller's traceparent metadata, when valid: with tracing off
//     the coordinator exports nothing, but the producer's trace still
//     reaches every attempt of the job through the SDKs' links;
//   - else the call's span when it is valid (not sampled): its trace id
//     still ties the logs of the job's attempts together.
//
// A tracestate goes with the traceparent it came with, when it parses as
// one (trace.ParseTraceState); a malformed one is dropped alone.
func EnqueueContext(ctx context.Context) (parent, state string) {
	sc := trace.SpanContextFromContext(ctx)
	if sc.IsValid() && sc.IsSampled() {
		return FormatTraceParent(sc), sc.TraceState().String()
	}
	if vs := metadata.ValueFromIncomingContext(ctx, TraceParentHeader); len(vs) == 1 {
		if _, ok := ParseTraceParent(vs[0]); ok {
			return vs[0], incomingTraceState(ctx)
		}
	}
	if sc.IsValid() {
		return FormatTraceParent(sc), sc.TraceState().String()
	}
	return "", ""
}

// incomingTraceState is the call's tracestate metadata when it is one valid
// W3C tracestate (several headers are joined with commas, as HTTP does).
func incomingTraceState(ctx context.Context) string {
	vs := metadata.ValueFromIncomingContext(ctx, TraceStateHeader)
	if len(vs) == 0 {
		return ""
	}
	s := vs[0]
	for _, v := range vs[1:] {
		s += "," + v
	}
	ts, err := trace.ParseTraceState(s)
	if err != nil {
		return ""
	}
	return ts.String()
}

// StoredContext is a job's stored trace context (its traceparent and
// tracestate) as a remote span context; ok false when it has none or it does
// not parse.
func StoredContext(parent, state string) (trace.SpanContext, bool) {
	sc, ok := ParseTraceParent(parent)
	if !ok {
		return sc, false
	}
	if ts, err := trace.ParseTraceState(state); err == nil {
		sc = sc.WithTraceState(ts)
	}
	return sc, true
}

// EnqueueLink is the link from a grant or write-back span to the enqueue of
// its job (R35: a link, not a parent — attempts may run hours later, and
// many share one enqueue); ok false when the job carries no trace context.
func EnqueueLink(parent, state string) (trace.Link, bool) {
	sc, ok := StoredContext(parent, state)
	if !ok {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{LinkKind.String(LinkEnqueue)}}, true
}
