package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// DefaultServiceName is service.name unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES names another.
const DefaultServiceName = "jobfence-coordinator"

// Tracing is the coordinator's tracing as the environment configured it:
// off (the zero value: no exporter, no provider, nothing spent) or a tracer
// provider exporting through the SDK's batch span processor.
type Tracing struct {
	sdk  *sdktrace.TracerProvider
	desc []any
}

// Enabled reports whether spans are recorded and exported.
func (t *Tracing) Enabled() bool { return t != nil && t.sdk != nil }

// TracerProvider is the provider to trace with; nil when tracing is off,
// which the server and the dispatcher take for "trace nothing".
func (t *Tracing) TracerProvider() trace.TracerProvider {
	if !t.Enabled() {
		return nil
	}
	return t.sdk
}

// Propagator is how the coordinator reads a caller's trace context: W3C
// trace context alone. Baggage is not read: a caller's baggage has no use
// here and would travel into every span.
func Propagator() propagation.TextMapPropagator { return propagation.TraceContext{} }

// Describe is the configuration in force, for the start-up log line: the
// exporter, its protocol and endpoint (without credentials; never the
// headers), the sampler and the service name.
func (t *Tracing) Describe() []any {
	if !t.Enabled() {
		return []any{"tracing", "off"}
	}
	return t.desc
}

// Shutdown flushes the spans still queued to the exporter and stops it,
// within ctx. It does nothing when tracing is off.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

// Setup configures tracing from the standard OTEL_* environment variables
// (docs/DEPLOY.md, "Tracing"). Tracing is off — Setup returns a Tracing
// that is not Enabled, installs nothing and costs nothing — when
// OTEL_SDK_DISABLED is true, when OTEL_TRACES_EXPORTER is none, and when
// neither OTEL_TRACES_EXPORTER nor an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set.
// Otherwise the exporter is the contrib autoexport's choice
// (OTEL_TRACES_EXPORTER: otlp, console; OTEL_EXPORTER_OTLP_PROTOCOL:
// http/protobuf, the default, or grpc), which with the SDK reads the other
// variables itself (endpoint, headers, timeout, certificates, the batch
// processor's OTEL_BSP_*, span limits). The sampler is OTEL_TRACES_SAMPLER's
// (sampler), the resource OTEL_SERVICE_NAME's and OTEL_RESOURCE_ATTRIBUTES'
// over jobfence's defaults. A value Setup cannot use fails it, naming the
// variable. Export errors go to log, as warnings.
//
// Setup sets no global: the caller installs the provider where it wants it
// (the coordinator: otel.SetTracerProvider, and the server's options).
func Setup(ctx context.Context, log *slog.Logger) (*Tracing, error) {
	if on, _ := strconv.ParseBool(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED"))); on {
		return &Tracing{}, nil
	}
	exporter := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
	endpoint := firstSet("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	switch {
	case exporter == "none":
		return &Tracing{}, nil
	case exporter == "" && endpoint == "":
		return &Tracing{}, nil
	case strings.Contains(exporter, ","):
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: name one exporter (otlp, console or none)", exporter)
	}
	sampler, samplerName, err := samplerFromEnv()
	if err != nil {
		return nil, err
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q, OTEL_EXPORTER_OTLP_PROTOCOL=%q: %w (exporters: otlp, console, "+
			"none; protocols: http/protobuf, grpc)", exporter, firstSet("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
			"OTEL_EXPORTER_OTLP_PROTOCOL"), err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(DefaultServiceName)),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME: over the defaults
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		exp.Shutdown(ctx) //nolint:errcheck // failing anyway
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: spans not exported", "error", err.Error())
	}))
	t := &Tracing{sdk: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithSampler(sampler))}
	if exporter == "" {
		exporter = "otlp"
	}
	t.desc = []any{"tracing", "on", "exporter", exporter, "sampler", samplerName}
	if exporter == "otlp" {
		protocol := firstSet("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
		if protocol == "" {
			protocol = "http/protobuf"
		}
		t.desc = append(t.desc, "protocol", protocol, "endpoint", redactEndpoint(endpoint))
	}
	if name, ok := res.Set().Value(semconv.ServiceNameKey); ok {
		t.desc = append(t.desc, "service_name", name.AsString())
	}
	return t, nil
}

// firstSet is the value of the first of keys that is set and not empty.
func firstSet(keys ...string) string {
	for _, k := range keys {
		if v := strings.TrimSpace(os.Getenv(k)); v != "" {
			return v
		}
	}
	return ""
}

// redactEndpoint is an endpoint for a log line: without a user and password,
// a query or a fragment; the exporter's default when empty.
func redactEndpoint(e string) string {
	if e == "" {
		return "default"
	}
	u, err := url.Parse(e)
	if err != nil || u.Host == "" {
		return "(set)"
	}
	return u.Scheme + "://" + u.Host + u.Path
}

// samplerFromEnv is the sampler OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG name, with the SDK's names and defaults
// (parentbased_always_on when unset; a ratio of 1 when the argument is
// unset), and jobfence's rule for spans without a parent: each parent-based
// sampler samples a root span that links to a sampled span (linkedSampler).
// An unknown name or a ratio outside 0..1 is an error: the SDK would fall
// back to another sampler with a warning.
func samplerFromEnv() (sdktrace.Sampler, string, error) {
	name := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		v, err := strconv.ParseFloat(arg, 64)
		if err != nil || v < 0 || v > 1 {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: the sampler %s takes a ratio from 0 to 1, e.g. 0.01",
				arg, name)
		}
		return v, nil
	}
	switch name {
	case "", "parentbased_always_on":
		return linkedSampler{sdktrace.ParentBased(sdktrace.AlwaysSample())}, "parentbased_always_on", nil
	case "parentbased_always_off":
		return linkedSampler{sdktrace.ParentBased(sdktrace.NeverSample())}, name, nil
	case "always_on":
		return sdktrace.AlwaysSample(), name, nil
	case "always_off":
		return sdktrace.NeverSample(), name, nil
	case "traceidratio", "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, "", err
		}
		desc := name + ":" + strconv.FormatFloat(r, 'g', -1, 64)
		if name == "traceidratio" {
			return sdktrace.TraceIDRatioBased(r), desc, nil
		}
		return linkedSampler{sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r))}, desc, nil
	default:
		return nil, "", fmt.Errorf("OTEL_TRACES_SAMPLER=%q: use one of parentbased_always_on (the default), "+
			"parentbased_traceidratio (with OTEL_TRACES_SAMPLER_ARG, e.g. 0.01), parentbased_always_off, always_on, "+
			"always_off, traceidratio", name)
	}
}

// linkedSampler is a parent-based sampler that also follows the links of a
// span without a parent: such a span is sampled when any span it links to
// was. jobfence's spans without a parent are the shared transactions (linked
// to the calls they served) and the grants and calls of worker streams
// (linked to the job's enqueue and to the stream): a sampled call then has
// its transaction in the trace store, and a sampled enqueue its grants,
// whatever the ratio.
type linkedSampler struct{ sdktrace.Sampler }

func (s linkedSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if parent := trace.SpanContextFromContext(p.ParentContext); !parent.IsValid() {
		for _, l := range p.Links {
			if l.SpanContext.IsSampled() {
				return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample}
			}
		}
	}
	return s.Sampler.ShouldSample(p)
}

func (s linkedSampler) Description() string { return "LinkedOrParent{" + s.Sampler.Description() + "}" }
