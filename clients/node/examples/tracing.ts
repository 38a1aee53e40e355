// The example worker's tracing (R35), configured as the OpenTelemetry
// ecosystem expects, by the standard OTEL_* environment variables, with the
// same rules as the coordinator (docs/DEPLOY.md, "Tracing"):
//
//   - off when OTEL_SDK_DISABLED is true, when OTEL_TRACES_EXPORTER is none,
//     and when neither OTEL_TRACES_EXPORTER nor an OTLP endpoint
//     (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set:
//     no SDK is loaded, no provider registered, and the Worker's spans are
//     @opentelemetry/api's no-ops;
//   - otherwise spans go over OTLP, by OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
//     OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf (the default) or grpc. The
//     exporters read the endpoint, OTEL_EXPORTER_OTLP_HEADERS, the timeout and
//     certificates themselves, the SDK the sampler (OTEL_TRACES_SAMPLER,
//     OTEL_TRACES_SAMPLER_ARG) and the batch processor's OTEL_BSP_*; the
//     resource is OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES over
//     service.name=jobfence-refund-worker.
//
// The provider is registered globally (NodeTracerProvider.register()): its
// AsyncLocalStorage context manager keeps the attempt span active in the
// handler, so an instrumented HTTP client's spans would be its children.
// The SDK packages are the example's (devDependencies), loaded only when
// tracing is on; the worker library itself needs @opentelemetry/api alone.

import type { TracerProvider } from "@opentelemetry/api";

/** ExampleTracing is the worker's tracing as the environment configured it. */
export interface ExampleTracing {
  /** The Worker's tracerProvider; undefined when tracing is off. */
  provider: TracerProvider | undefined;
  /** The configuration in force, for the start-up log line: never the headers. */
  describe: Record<string, string>;
  /** shutdown flushes the spans still queued and stops the exporter. */
  shutdown(): Promise<void>;
}

/** TracingConfigError: an OTEL_* value the example cannot use, named. */
export class TracingConfigError extends Error {}

export const DEFAULT_SERVICE_NAME = "jobfence-refund-worker";

const off: ExampleTracing = { provider: undefined, describe: { tracing: "off" }, shutdown: async () => {} };

/**
 * setupTracing reads the OTEL_* variables of the process's environment (the
 * SDK's exporters and resource detector read it too); throws
 * TracingConfigError for a value it cannot use.
 */
export async function setupTracing(): Promise<ExampleTracing> {
  const env = process.env;
  const get = (k: string): string => (env[k] ?? "").trim();
  const exporter = get("OTEL_TRACES_EXPORTER").toLowerCase();
  const endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") + get("OTEL_EXPORTER_OTLP_ENDPOINT");
  if (get("OTEL_SDK_DISABLED").toLowerCase() === "true" || exporter === "none" || (exporter === "" && endpoint === "")) {
    return off;
  }
  if (exporter !== "" && exporter !== "otlp") {
    throw new TracingConfigError(`OTEL_TRACES_EXPORTER=${exporter}: refund-worker exports over OTLP only (otlp, or none)`);
  }
  const protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") || get("OTEL_EXPORTER_OTLP_PROTOCOL") || "http/protobuf";
  let spanExporter;
  switch (protocol) {
    case "http/protobuf":
      spanExporter = new (await import("@opentelemetry/exporter-trace-otlp-proto")).OTLPTraceExporter();
      break;
    case "grpc":
      spanExporter = new (await import("@opentelemetry/exporter-trace-otlp-grpc")).OTLPTraceExporter();
      break;
    default:
      throw new TracingConfigError(`OTEL_EXPORTER_OTLP_PROTOCOL=${protocol}: want http/protobuf or grpc`);
  }
  const { BatchSpanProcessor, NodeTracerProvider } = await import("@opentelemetry/sdk-trace-node");
  const { defaultResource, detectResources, envDetector, resourceFromAttributes } = await import("@opentelemetry/resources");
  const resource = defaultResource()
    .merge(resourceFromAttributes({ "service.name": DEFAULT_SERVICE_NAME }))
    .merge(detectResources({ detectors: [envDetector] }));
  const provider = new NodeTracerProvider({ resource, spanProcessors: [new BatchSpanProcessor(spanExporter)] });
  provider.register();
  return {
    provider,
    describe: {
      tracing: "on", exporter: "otlp", protocol, sampler: get("OTEL_TRACES_SAMPLER") || "parentbased_always_on",
      service_name: String(resource.attributes["service.name"] ?? ""),
    },
    shutdown: () => provider.shutdown(),
  };
}
