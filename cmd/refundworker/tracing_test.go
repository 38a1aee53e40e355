package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// The example worker's tracing follows the standard OTEL_* variables, as the
// coordinator's does: off when nothing asks for it (R35: off when unset).
func TestTracingFromEnvironment_R35(t *testing.T) {
	clear := func(t *testing.T) {
		for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
			"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"} {
			t.Setenv(k, "")
		}
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string // "off", "on", or an error's text
	}{
		{"nothing set", nil, "off"},
		{"exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "off"},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "off"},
		{"protocol alone", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "off"},
		{"endpoint alone", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "on"},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, "on"},
		{"exporter otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, "on"},
		{"exporter unknown", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin"},
		{"protocol unknown", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			tr, err := setupTracing(context.Background())
			switch {
			case tc.want == "off" || tc.want == "on":
				if err != nil {
					t.Fatal(err)
				}
				defer tr.shutdown(nil)
				if on := tr.provider() != nil; on != (tc.want == "on") {
					t.Errorf("tracing on=%v, want %s (%v)", on, tc.want, tr.describe())
				}
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// The start-up line names the configuration, never the headers (a vendor's
// key), and the service name defaults to jobfence-refundworker.
func TestTracingDescriptionKeepsHeadersOut_R35(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=secret-vendor-key")
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	tr, err := setupTracing(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.shutdown(nil)
	desc := fmt.Sprint(tr.describe()...)
	if strings.Contains(desc, "secret-vendor-key") || !strings.Contains(desc, defaultServiceName) {
		t.Errorf("description %q: want the default service name and no header", desc)
	}
	t.Setenv("OTEL_SERVICE_NAME", "refunds-eu")
	tr2, err := setupTracing(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.shutdown(nil)
	if desc := fmt.Sprint(tr2.describe()...); !strings.Contains(desc, "refunds-eu") {
		t.Errorf("description %q: want OTEL_SERVICE_NAME's refunds-eu", desc)
	}
}
