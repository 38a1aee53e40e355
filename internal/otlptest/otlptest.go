// Package otlptest is what a collector would receive, for tests: the OTLP
// trace service of the OpenTelemetry protos on a real gRPC server on
// loopback, keeping every export request.
package otlptest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Receiver is the trace service; Addr is where it listens (host:port).
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	Addr string
	mu   sync.Mutex
	reqs []*collectortrace.ExportTraceServiceRequest
	raw  bytes.Buffer // every request, serialized, one after another
}

// Start serves a Receiver on a free loopback port until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Addr: lis.Addr().String()}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, r)
	go gs.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(gs.Stop)
	return r
}

// Export keeps req.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (
	*collectortrace.ExportTraceServiceResponse, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	r.raw.Write(b)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// Span is a span received, with the service.name it came under.
type Span struct {
	*tracepb.Span
	Service string
}

// Spans is every span received so far, in the order received.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Span
	for _, req := range r.reqs {
		for _, rs := range req.GetResourceSpans() {
			service := Attr(rs.GetResource().GetAttributes(), "service.name")
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					out = append(out, Span{s, service})
				}
			}
		}
	}
	return out
}

// Bytes is every request received, serialized, one after another: what
// crossed the wire, to search for what must not have.
func (r *Receiver) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.raw.Bytes())
}

// Attr is the value of key among attrs, as text (Value); "" when absent.
func Attr(attrs []*commonpb.KeyValue, key string) string {
	for _, a := range attrs {
		if a.GetKey() == key {
			return Value(a.GetValue())
		}
	}
	return ""
}

// Value is v as text.
func Value(v *commonpb.AnyValue) string {
	switch v := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return v.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(v.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(v.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(v.DoubleValue)
	}
	return fmt.Sprint(v)
}
