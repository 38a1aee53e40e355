package tracing

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

const validParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// R35: a traceparent is stored only in the W3C format of version 00; any
// other value is dropped, never an error.
func TestParseTraceParentKeepsOnlyValidVersion00_R35(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{validParent, true},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03", true},
		{"", false},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},       // another version
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},       // the invalid version
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},       // zero trace id
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},       // zero span id
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false},       // uppercase
		{"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", false},        // short trace id
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1", false},        // short flags
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", false}, // trailing
		{"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bg-01", false}, // not hex
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz", false},
	} {
		sc, ok := ParseTraceParent(tc.in)
		if ok != tc.ok {
			t.Errorf("ParseTraceParent(%q) ok = %v, want %v", tc.in, ok, tc.ok)
			continue
		}
		if ok && FormatTraceParent(sc) != tc.in {
			t.Errorf("FormatTraceParent(ParseTraceParent(%q)) = %q", tc.in, FormatTraceParent(sc))
		}
	}
}

// R35, with tracing off: the caller's traceparent and tracestate metadata
// are what the enqueue stores, when valid.
func TestEnqueueContextFromMetadataWhenOff_R35(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		md                    metadata.MD
		wantParent, wantState string
	}{
		{"none", metadata.MD{}, "", ""},
		{"valid", metadata.Pairs("traceparent", validParent, "tracestate", "vendor=v1,other=x"), validParent, "vendor=v1,other=x"},
		{"invalid parent", metadata.Pairs("traceparent", "00-zz", "tracestate", "vendor=v1"), "", ""},
		{"invalid state dropped alone", metadata.Pairs("traceparent", validParent, "tracestate", "=bad="), validParent, ""},
		{"two parents", metadata.Pairs("traceparent", validParent, "traceparent", validParent), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := metadata.NewIncomingContext(context.Background(), tc.md)
			parent, state := EnqueueContext(ctx)
			if parent != tc.wantParent || state != tc.wantState {
				t.Errorf("EnqueueContext = %q, %q; want %q, %q", parent, state, tc.wantParent, tc.wantState)
			}
		})
	}
}

// R35, with tracing on: the call's own sampled span is the enqueue's
// context, whatever the caller sent.
func TestEnqueueContextPrefersTheSampledServerSpan_R35(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", validParent))
	remote, _ := ParseTraceParent(validParent)
	ctx, span := tp.Tracer("t").Start(trace.ContextWithRemoteSpanContext(ctx, remote), "server")
	defer span.End()
	parent, _ := EnqueueContext(ctx)
	if want := FormatTraceParent(span.SpanContext()); parent != want {
		t.Fatalf("EnqueueContext = %q, want the server span's %q", parent, want)
	}
	if !strings.Contains(parent, remote.TraceID().String()) {
		t.Fatalf("the server span is not in the caller's trace: %q", parent)
	}

	// Not sampled: the caller's header, which names a span its trace has.
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	ctx2, span2 := never.Tracer("t").Start(metadata.NewIncomingContext(context.Background(),
		metadata.Pairs("traceparent", validParent)), "server")
	defer span2.End()
	if parent, _ := EnqueueContext(ctx2); parent != validParent {
		t.Fatalf("unsampled: EnqueueContext = %q, want the caller's %q", parent, validParent)
	}
}

// R35: every log line written inside a traced call carries its trace and
// span ids; others carry none.
func TestLogHandlerAddsTraceAndSpanIDs_R35(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewLogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "call")
	log.InfoContext(ctx, "inside")
	span.End()
	log.InfoContext(context.Background(), "outside")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	sc := span.SpanContext()
	if !strings.Contains(lines[0], `"trace_id":"`+sc.TraceID().String()+`"`) ||
		!strings.Contains(lines[0], `"span_id":"`+sc.SpanID().String()+`"`) || !strings.Contains(lines[0], `"component"`) {
		t.Errorf("line inside a span: %s", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("line outside a span: %s", lines[1])
	}
}

// R35: off when nothing is set — no exporter, no provider, the global one
// left the no-op it is.
func TestSetupIsOffWithoutConfiguration_R35(t *testing.T) {
	for _, env := range [][2]string{
		{"", ""},
		{"OTEL_TRACES_EXPORTER", "none"},
		{"OTEL_SDK_DISABLED", "true"},
		{"OTEL_SERVICE_NAME", "x"}, // a name alone exports nothing
	} {
		clearEnv(t)
		if env[0] != "" {
			t.Setenv(env[0], env[1])
		}
		if env[0] == "OTEL_SDK_DISABLED" {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		}
		tr, err := Setup(context.Background(), slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		if tr.Enabled() || tr.TracerProvider() != nil {
			t.Errorf("%s=%s: tracing on", env[0], env[1])
		}
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		_, span := otel.GetTracerProvider().Tracer("t").Start(context.Background(), "x")
		if span.IsRecording() || span.SpanContext().IsValid() {
			t.Errorf("%s=%s: the global tracer provider records", env[0], env[1])
		}
	}
}

// R35: a value the coordinator cannot use fails the start naming its
// variable.
func TestSetupNamesTheVariableItCannotUse_R35(t *testing.T) {
	for _, tc := range []struct{ env [][2]string }{
		{[][2]string{{"OTEL_TRACES_EXPORTER", "zipkin"}}},
		{[][2]string{{"OTEL_TRACES_EXPORTER", "otlp,console"}}},
		{[][2]string{{"OTEL_TRACES_EXPORTER", "otlp"}, {"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"}}},
		{[][2]string{{"OTEL_TRACES_EXPORTER", "otlp"}, {"OTEL_TRACES_SAMPLER", "sometimes"}}},
		{[][2]string{{"OTEL_TRACES_EXPORTER", "otlp"}, {"OTEL_TRACES_SAMPLER", "parentbased_traceidratio"},
			{"OTEL_TRACES_SAMPLER_ARG", "2"}}},
	} {
		clearEnv(t)
		for _, kv := range tc.env {
			t.Setenv(kv[0], kv[1])
		}
		tr, err := Setup(context.Background(), slog.Default())
		last := tc.env[len(tc.env)-1]
		if err == nil || !strings.Contains(err.Error(), last[0]) {
			t.Errorf("%v: error %v does not name %s", tc.env, err, last[0])
		}
		if tr != nil {
			tr.Shutdown(context.Background()) //nolint:errcheck
		}
	}
}

// R35: a parent-based sampler samples a span without a parent when a span
// it links to is sampled (a batch of sampled calls, the grant of a sampled
// enqueue), and follows its ratio otherwise.
func TestSamplerFollowsSampledLinks_R35(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	s, desc, err := samplerFromEnv()
	if err != nil || desc != "parentbased_traceidratio:0" {
		t.Fatal(desc, err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s), sdktrace.WithSpanProcessor(rec))
	sampled, _ := ParseTraceParent(validParent)
	unsampled, _ := ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	tr := tp.Tracer("t")
	_, root := tr.Start(context.Background(), "root")
	_, linkedSampled := tr.Start(context.Background(), "linked", trace.WithLinks(trace.Link{SpanContext: unsampled},
		trace.Link{SpanContext: sampled}))
	_, linkedUnsampled := tr.Start(context.Background(), "linked", trace.WithLinks(trace.Link{SpanContext: unsampled}))
	if root.IsRecording() || !linkedSampled.IsRecording() || linkedUnsampled.IsRecording() {
		t.Fatalf("root %v, linked to a sampled span %v, linked to unsampled %v", root.IsRecording(),
			linkedSampled.IsRecording(), linkedUnsampled.IsRecording())
	}
}

// clearEnv unsets every variable Setup reads, for the test.
func clearEnv(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(k, "")
	}
}

// R35: with tracing off, reading a call's trace context costs no
// allocation when the call carries none.
func TestEnqueueContextAllocatesNothingWithoutATraceparent_R35(t *testing.T) {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer x",
		"user-agent", "grpc-go", "content-type", "application/grpc"))
	if n := testing.AllocsPerRun(1000, func() { EnqueueContext(ctx) }); n != 0 {
		t.Fatalf("EnqueueContext allocates %v times per call without a traceparent", n)
	}
}
