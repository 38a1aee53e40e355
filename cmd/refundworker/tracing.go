package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// defaultServiceName is service.name unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES names another.
const defaultServiceName = "jobfence-refundworker"

// tracing is the worker's tracing as the environment configured it: off
// (nil sdk: the Worker gets no TracerProvider and otel's global one stays a
// no-op) or the OpenTelemetry SDK exporting over OTLP (R35).
type tracing struct {
	sdk  *sdktrace.TracerProvider
	desc []any
}

// setupTracing configures tracing from the standard OTEL_* variables, as the
// coordinator does (docs/DEPLOY.md, "Tracing"): off when OTEL_SDK_DISABLED
// is true, when OTEL_TRACES_EXPORTER is none, and when neither
// OTEL_TRACES_EXPORTER nor an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set. Otherwise spans go over OTLP,
// by OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL
// (http/protobuf, the default, or grpc); the exporters read the endpoint,
// headers, timeout and certificates themselves, the SDK the sampler
// (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG) and the batch processor's
// OTEL_BSP_* variables, and the resource is OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES over service.name=jobfence-refundworker.
// Errors: an exporter or protocol it does not know, naming the variable.
func setupTracing(ctx context.Context) (*tracing, error) {
	env := func(k string) string { return strings.TrimSpace(os.Getenv(k)) }
	exporter := strings.ToLower(env("OTEL_TRACES_EXPORTER"))
	endpoint := env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") + env("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch {
	case strings.EqualFold(env("OTEL_SDK_DISABLED"), "true"), exporter == "none", exporter == "" && endpoint == "":
		return &tracing{}, nil
	case exporter != "" && exporter != "otlp":
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%s: refundworker exports over OTLP only (otlp, or none)", exporter)
	}
	protocol := env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = env("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case "", "http/protobuf":
		protocol = "http/protobuf"
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: want http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", defaultServiceName)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil {
		return nil, fmt.Errorf("tracing: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	service, _ := res.Set().Value("service.name")
	sampler := env("OTEL_TRACES_SAMPLER")
	if sampler == "" {
		sampler = "parentbased_always_on"
	}
	return &tracing{
		sdk: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)),
		// Never the headers: they may hold a vendor's key.
		desc: []any{"tracing", "on", "exporter", "otlp", "protocol", protocol, "sampler", sampler,
			"service_name", service.AsString()},
	}, nil
}

// provider is the Worker's TracerProvider: nil when tracing is off.
func (t *tracing) provider() *sdktrace.TracerProvider { return t.sdk }

// describe is the configuration in force, for the start-up log line.
func (t *tracing) describe() []any {
	if t.sdk == nil {
		return []any{"tracing", "off"}
	}
	return t.desc
}

// shutdown flushes the spans still queued, for up to 5 s; a failure is
// logged, never returned: the refunds are done.
func (t *tracing) shutdown(log *slog.Logger) {
	if t.sdk == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.sdk.Shutdown(ctx); err != nil && log != nil {
		log.Warn("tracing: spans not exported", "error", err)
	}
}
