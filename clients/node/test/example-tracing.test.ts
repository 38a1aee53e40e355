// The example worker's tracing set-up (examples/tracing.ts): the standard
// OTEL_* variables, off when nothing asks for it (R35).

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { trace } from "@opentelemetry/api";

import { DEFAULT_SERVICE_NAME, TracingConfigError, setupTracing } from "../examples/tracing.js";

const OTEL_VARS = ["OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
  "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_SERVICE_NAME",
  "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"];

/** setupWith runs setupTracing with exactly these OTEL_* variables set. */
async function setupWith(vars: Record<string, string>): ReturnType<typeof setupTracing> {
  const saved = Object.fromEntries(OTEL_VARS.map((k) => [k, process.env[k]]));
  for (const k of OTEL_VARS) {
    delete process.env[k];
  }
  Object.assign(process.env, vars);
  try {
    return await setupTracing();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) {
        delete process.env[k];
      } else {
        process.env[k] = v;
      }
    }
  }
}

describe("example worker tracing (R35)", () => {
  it("TestExampleTracingOffUnlessAsked_R35", async () => {
    for (const env of <Array<Record<string, string>>>[
      {},
      { OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" },
      { OTEL_TRACES_EXPORTER: "none", OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318" },
      { OTEL_SDK_DISABLED: "true", OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318" },
    ]) {
      const t = await setupWith(env);
      assert.equal(t.provider, undefined, JSON.stringify(env));
      assert.deepEqual(t.describe, { tracing: "off" });
    }
  });

  it("TestExampleTracingRefusesWhatItCannotUse_R35", async () => {
    await assert.rejects(setupWith({ OTEL_TRACES_EXPORTER: "zipkin" }), TracingConfigError);
    await assert.rejects(setupWith({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318", OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" }),
      TracingConfigError);
  });

  it("TestExampleTracingOnWithAnEndpoint_R35", async () => {
    for (const [protocol, env] of [
      ["http/protobuf", { OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318", OTEL_EXPORTER_OTLP_HEADERS: "api-key=secret-vendor-key" }],
      ["grpc", { OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4317", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc", OTEL_SERVICE_NAME: "refunds-eu" }],
    ] as const) {
      const t = await setupWith(env);
      try {
        assert.ok(t.provider !== undefined);
        assert.equal(t.describe["protocol"], protocol);
        assert.equal(t.describe["service_name"], "OTEL_SERVICE_NAME" in env ? "refunds-eu" : DEFAULT_SERVICE_NAME);
        assert.ok(!JSON.stringify(t.describe).includes("secret-vendor-key"), "the headers stay out of the log line");
      } finally {
        await t.shutdown();
        trace.disable();
      }
    }
  });
});
