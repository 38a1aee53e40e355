// R35 in the TypeScript SDK: a Worker against a scripted coordinator (a real
// gRPC server on a loopback socket) that grants one job whose enqueue
// carried a trace context, and records the trace context of every call it
// is sent: the WorkCall's fields on the worker stream, metadata on unary
// calls. Spans go to the SDK's InMemorySpanExporter.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create, toBinary } from "@bufbuild/protobuf";
import { anyPack, timestampFromMs } from "@bufbuild/protobuf/wkt";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { SpanKind, SpanStatusCode, context as otelContext, trace, type TracerProvider } from "@opentelemetry/api";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from "@opentelemetry/sdk-trace-base";

import { ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../src/gen/google/rpc/status_pb.js";
import {
  ATTEMPT_SPAN_NAME,
  CoordinatorClient,
  ErrorReason,
  GrantLostError,
  JobState,
  NextAction,
  RENEW_SPAN_NAME,
  Worker,
  WorkReplySchema,
  type ClaimedJob,
  type ProviderResult,
  type WorkerJob,
  type WorkRequest,
} from "../src/index.js";
import { Tracing, grantLink } from "../src/tracing.js";
import { Closed, ScriptedCoordinator, type ScriptedStream } from "./spec-coordinator.js";

const GRANT_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const GRANT_TRACESTATE = "vendor=opaque,other=1";
const TOKEN = "tok-secret-0123456789ab"; // the grant's lease token: never in a span (R25)

/** claimedJob is job 7, attempt 1, granted now with a lease of leaseMs. */
function claimedJob(traceparent: string, leaseMs: number): ClaimedJob {
  const now = Date.now();
  return {
    $typeName: "jobfence.v1.ClaimedJob",
    job: {
      $typeName: "jobfence.v1.Job", id: 7n, operationKey: "op-traced", orderId: "ord-1", paymentId: "pay-1",
      amountMinor: 4200n, currency: "EUR", provider: "acme", state: JobState.RUNNING, attempt: 1n,
      nextAction: NextAction.REFUND, providerRefundId: "", workerId: "", lastReason: "", attentionReason: "",
      traceparent,
    },
    attempt: 1n, leaseToken: TOKEN, nextAction: NextAction.REFUND, takeover: false, observations: [],
    observationCount: 0n, cancelRequested: false, traceparent, tracestate: GRANT_TRACESTATE,
    claimedAt: timestampFromMs(now), leaseUntil: timestampFromMs(now + leaseMs),
  } as ClaimedJob;
}

/** A call the scripted coordinator was sent for the job. */
interface SeenCall {
  method: string;
  onStream: boolean;
  traceparent: string;
  tracestate: string;
}

interface Scenario {
  traceparent?: string;
  leaseMs?: number;
  noStream?: boolean;
  refuseWrite?: boolean; // write-backs answered STALE_ATTEMPT
  refuseRenew?: boolean; // renewals answered STALE_ATTEMPT
  traced?: boolean; // a TracerProvider for the Worker; default true
  handler: (job: WorkerJob) => Promise<ProviderResult>;
}

interface Run {
  spans: ReadableSpan[];
  calls: SeenCall[];
  handlerContext: { active: string | undefined; job: string | undefined };
}

const staleStatus = () => create(StatusSchema, {
  code: 9, // FAILED_PRECONDITION
  message: "stale attempt",
  details: [anyPack(ErrorInfoSchema, create(ErrorInfoSchema, {
    domain: "jobfence", reason: "STALE_ATTEMPT", metadata: { job_id: "7", attempt: "1", current_attempt: "2" },
  }))],
});

/** run runs a Worker until its one job is written back and its attempt span ended. */
async function run(s: Scenario): Promise<Run> {
  const coord = await ScriptedCoordinator.start();
  coord.withoutStream = s.noStream === true;
  const job = claimedJob(s.traceparent ?? GRANT_TRACEPARENT, s.leaseMs ?? 60_000);
  let granted = false;
  const renewals = (grants: Array<{ job_id: string; attempt: string }>) => ({
    renewals: grants.map((g) => s.refuseRenew
      ? { jobId: BigInt(g.job_id), attempt: BigInt(g.attempt), refused: ErrorReason.STALE_ATTEMPT, message: "taken over",
        metadata: { job_id: "7", attempt: "1", current_attempt: "2" } }
      : { jobId: BigInt(g.job_id), attempt: BigInt(g.attempt), leaseUntil: timestampFromMs(Date.now() + 1000) }),
  });
  coord.unary = (c) => {
    switch (c.method) {
      case "Claim":
        if (granted) {
          return new Promise((resolve) => setTimeout(() => resolve({ jobs: [] }), 50));
        }
        granted = true;
        return { jobs: [job] };
      case "RenewLeases":
        return renewals((c.json as { grants: Array<{ job_id: string; attempt: string }> }).grants);
      case "ReportObservation":
        return { observation: { id: 1n } };
      default:
        if (s.refuseWrite) {
          throw new Error("the unary stale answer is not scripted here");
        }
        return { job: job.job };
    }
  };
  const streamCalls: SeenCall[] = [];
  if (s.noStream !== true) {
    void (async () => {
      const st = await coord.nextStream(5_000);
      assert.ok(st !== undefined, "the worker opened no stream");
      await serveStream(st, job, s, renewals, streamCalls);
    })();
  }

  const exporter = new InMemorySpanExporter();
  const provider: TracerProvider | undefined = s.traced === false
    ? undefined
    : new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const handlerContext: Run["handlerContext"] = { active: undefined, job: undefined };
  let done!: () => void;
  const ended = new Promise<void>((resolve) => {
    done = resolve;
  });
  const client = new CoordinatorClient({ address: coord.address });
  const worker = new Worker({
    client,
    workerId: "w-trace",
    receiptSpool: "off",
    noStream: s.noStream,
    claimWaitMs: 0,
    idlePollMs: 50,
    writeRetries: 0,
    tracerProvider: provider,
    handlers: {
      refund: async (j) => {
        handlerContext.active = trace.getSpanContext(otelContext.active())?.spanId;
        handlerContext.job = trace.getSpanContext(j.traceContext)?.spanId;
        return s.handler(j);
      },
      reconcile: async () => ({ kind: "pending" }),
    },
    onEvent: (e) => {
      if (e.type === "written" || e.type === "write_failed" || e.type === "observation" || e.type === "observation_failed") {
        setTimeout(done, 50); // the span ends right after
      }
    },
  });
  const started = worker.start();
  await Promise.race([ended, new Promise((_, reject) => setTimeout(() => reject(new Error("the job was not written back")), 10_000))]);
  await worker.stop();
  await started;
  // Every answer sent before the connection closes (as cancel.test does).
  await new Promise((r) => setTimeout(r, 100));
  client.close();
  await coord.close();
  const calls = [...streamCalls, ...coord.unaryCalls.map((c) => ({
    method: c.method, onStream: false, traceparent: c.traceparent ?? "", tracestate: c.tracestate ?? "",
  }))];
  return { spans: exporter.getFinishedSpans(), calls, handlerContext };
}

// serveStream plays the coordinator's side of the worker stream: the grant,
// then an answer to each call, recording its trace context.
async function serveStream(st: ScriptedStream, job: ClaimedJob, s: Scenario,
  renewals: (g: Array<{ job_id: string; attempt: string }>) => unknown, calls: SeenCall[]): Promise<void> {
  const first = await st.next(5_000);
  assert.ok(first !== undefined && first !== Closed && first.kind.case === "start");
  st.send({ kind: { case: "grant", value: { jobs: [job] } } });
  for (;;) {
    const m: WorkRequest | typeof Closed | undefined = await st.next(60_000);
    if (m === undefined || m === Closed) {
      st.end();
      return;
    }
    if (m.kind.case !== "call") {
      continue;
    }
    const call = m.kind.value;
    const method = call.call.case ?? "";
    calls.push({ method: method.charAt(0).toUpperCase() + method.slice(1), onStream: true, traceparent: call.traceparent,
      tracestate: call.tracestate });
    let result: unknown;
    let error: Uint8Array | undefined;
    switch (call.call.case) {
      case "renewLeases": {
        const grants = call.call.value.grants.map((g) => ({ job_id: g.jobId.toString(), attempt: g.attempt.toString() }));
        result = { case: "renewLeases", value: renewals(grants) };
        break;
      }
      case "reportObservation":
        result = { case: "reportObservation", value: { observation: { id: 1n } } };
        break;
      case "complete":
      case "reschedule":
      case "escalate":
        if (s.refuseWrite) {
          error = toBinary(StatusSchema, staleStatus());
        } else {
          result = { case: call.call.case, value: { job: job.job } };
        }
        break;
    }
    const reply = create(WorkReplySchema, { callId: call.callId, result: result as never, error });
    st.send({ kind: { case: "reply", value: reply } });
  }
}

function attemptSpan(spans: ReadableSpan[]): ReadableSpan {
  const found = spans.filter((s) => s.name === ATTEMPT_SPAN_NAME);
  assert.equal(found.length, 1, `ended ${ATTEMPT_SPAN_NAME} spans: ${spans.map((s) => s.name).join(", ")}`);
  return found[0]!;
}

/** checkAttemptSpan: what every attempt span of job 7 carries (R35), and no lease token anywhere (R25). */
function checkAttemptSpan(s: ReadableSpan, outcome: string, errorType: string | undefined): void {
  assert.equal(s.kind, SpanKind.CONSUMER);
  assert.equal(s.parentSpanContext, undefined, "the attempt span is a root, linked to the enqueue");
  assert.equal(s.links.length, 1, "one link, to the enqueue");
  const l = s.links[0]!;
  assert.equal(l.context.traceId, "4bf92f3577b34da6a3ce929d0e0e4736");
  assert.equal(l.context.spanId, "00f067aa0ba902b7");
  assert.equal(l.context.traceFlags, 1);
  assert.equal(l.context.traceState?.serialize(), GRANT_TRACESTATE);
  assert.equal(l.attributes?.["jobfence.link"], "enqueue");
  const want: Record<string, unknown> = {
    "messaging.system": "jobfence", "messaging.operation.type": "process", "messaging.operation.name": "attempt",
    "messaging.destination.name": "acme", "messaging.message.id": "7", "jobfence.job.id": 7, "jobfence.attempt": 1,
    "jobfence.provider": "acme", "jobfence.next_action": "refund", "jobfence.takeover": false,
    "jobfence.cancel_requested": false, "jobfence.worker_id": "w-trace", "jobfence.outcome": outcome,
    "jobfence.operation_key": "op-traced",
  };
  for (const [k, v] of Object.entries(want)) {
    assert.equal(s.attributes[k], v, `attribute ${k}`);
  }
  if (errorType === undefined) {
    assert.notEqual(s.status.code, SpanStatusCode.ERROR);
  } else {
    assert.equal(s.status.code, SpanStatusCode.ERROR);
    assert.equal(s.attributes["error.type"], errorType);
  }
  noToken(s);
}

function noToken(s: ReadableSpan): void {
  const text = JSON.stringify({ name: s.name, a: s.attributes, l: s.links, e: s.events, st: s.status });
  assert.ok(!text.includes(TOKEN), "the lease token is in the span (R25)");
}

/** checkCalls: every call made for the job carries the attempt span's trace context (R35). */
function checkCalls(calls: SeenCall[], s: ReadableSpan, onStream: boolean, methods: string[]): void {
  const want = `00-${s.spanContext().traceId}-${s.spanContext().spanId}-01`;
  for (const c of calls) {
    if (c.method === "Claim") {
      assert.equal(c.traceparent, "", "a Claim is made in no span");
      continue;
    }
    assert.equal(c.traceparent, want, `${c.method} (on stream ${c.onStream}) carries the attempt span's traceparent`);
    assert.equal(c.onStream, onStream, `${c.method} on the stream: ${JSON.stringify(calls)}`);
  }
  for (const m of methods) {
    assert.ok(calls.some((c) => c.method === m), `a ${m} call (calls: ${JSON.stringify(calls)})`);
  }
}

describe("tracing (R35)", () => {
  it("TestAttemptSpanLinkedToEnqueueAndCarriedByWorkCalls_R35", async () => {
    const r = await run({
      leaseMs: 300,
      handler: async () => {
        await new Promise((resolve) => setTimeout(resolve, 250)); // a renewal or two on the stream
        return { kind: "succeeded", providerRefundId: "re_1" };
      },
    });
    const s = attemptSpan(r.spans);
    checkAttemptSpan(s, "completed", undefined);
    assert.equal(s.attributes["jobfence.result"], "succeeded");
    assert.equal(s.attributes["jobfence.writeback.replayed"], false);
    assert.equal(r.handlerContext.job, s.spanContext().spanId, "job.traceContext holds the attempt span");
    checkCalls(r.calls, s, true, ["Complete", "RenewLeases"]);
  });

  it("TestAttemptSpanCarriedByUnaryCallMetadata_R35", async () => {
    const r = await run({
      noStream: true,
      leaseMs: 300,
      handler: async () => {
        await new Promise((resolve) => setTimeout(resolve, 250));
        return { kind: "escalate", reason: "a person must look" };
      },
    });
    const s = attemptSpan(r.spans);
    checkAttemptSpan(s, "escalated", undefined);
    checkCalls(r.calls, s, false, ["Escalate", "RenewLeases"]);
  });

  it("TestAttemptSpanRecordsStaleWriteBack_R35", async () => {
    const r = await run({ refuseWrite: true, handler: async () => ({ kind: "succeeded", providerRefundId: "re_1" }) });
    const s = attemptSpan(r.spans);
    checkAttemptSpan(s, "stale", "STALE_ATTEMPT");
    checkCalls(r.calls, s, true, ["Complete", "ReportObservation"]);
  });

  it("TestAttemptSpanRecordsGrantLost_R35", async () => {
    const r = await run({
      leaseMs: 300,
      refuseWrite: true,
      refuseRenew: true,
      handler: async (job) => {
        await new Promise((resolve) => job.signal.addEventListener("abort", resolve, { once: true }));
        assert.ok(job.signal.reason instanceof GrantLostError);
        return { kind: "succeeded", providerRefundId: "re_1" }; // a request already sent: its answer is filed (R15)
      },
    });
    const s = attemptSpan(r.spans);
    checkAttemptSpan(s, "grant_lost", "grant_lost");
    checkCalls(r.calls, s, true, ["RenewLeases", "Complete", "ReportObservation"]);
  });

  it("TestAttemptSpanRecordsHandlerFailure_R35", async () => {
    const r = await run({ handler: async () => { throw new Error("connection reset"); } });
    const s = attemptSpan(r.spans);
    checkAttemptSpan(s, "rescheduled", "handler_error");
    assert.equal(s.attributes["jobfence.result"], "unknown");
  });

  it("TestAttemptSpanWithoutEnqueueContext_R35", async () => {
    const r = await run({ traceparent: "", handler: async () => ({ kind: "succeeded", providerRefundId: "re_1" }) });
    const s = attemptSpan(r.spans);
    assert.equal(s.links.length, 0);
    checkCalls(r.calls, s, true, ["Complete"]);
  });

  it("TestNoTracerProviderSendsNoTraceContext_R35", async () => {
    for (const noStream of [false, true]) {
      const r = await run({
        traced: false,
        noStream,
        leaseMs: 300,
        handler: async () => {
          await new Promise((resolve) => setTimeout(resolve, 250));
          return { kind: "succeeded", providerRefundId: "re_1" };
        },
      });
      assert.equal(r.spans.length, 0);
      assert.ok(r.handlerContext.job === undefined || r.handlerContext.job === "0000000000000000",
        `no valid span in job.traceContext: ${r.handlerContext.job}`);
      assert.ok(r.calls.length >= 2, `a write-back and renewals: ${JSON.stringify(r.calls)}`);
      for (const c of r.calls) {
        assert.equal(c.traceparent, "", `noStream=${noStream}: ${c.method} carries no traceparent`);
        assert.equal(c.tracestate, "", `noStream=${noStream}: ${c.method} carries no tracestate`);
      }
    }
  });

  it("TestHandlerRunsInAttemptSpanWithContextManager_R35", async () => {
    // Where the application registered a context manager (an SDK's
    // register() does), the handler's active context holds the attempt
    // span: an instrumented HTTP client's span is its child.
    const manager = new AsyncLocalStorageContextManager().enable();
    otelContext.setGlobalContextManager(manager);
    try {
      const r = await run({ handler: async () => ({ kind: "succeeded", providerRefundId: "re_1" }) });
      assert.equal(r.handlerContext.active, attemptSpan(r.spans).spanContext().spanId);
    } finally {
      otelContext.disable();
    }
  });

  it("TestRenewalContext_R35", () => {
    const exporter = new InMemorySpanExporter();
    const tracing = new Tracing(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }), "w");
    const a1 = tracing.start(claimedJob(GRANT_TRACEPARENT, 60_000), false);
    const a2 = tracing.start(claimedJob(GRANT_TRACEPARENT, 60_000), false);
    const one = tracing.renewContext([a1.context]);
    one.end();
    assert.equal(trace.getSpanContext(one.context!)?.spanId, trace.getSpanContext(a1.context)?.spanId);
    const both = tracing.renewContext([a1.context, a2.context]);
    const renew = trace.getSpanContext(both.context!)!;
    both.end();
    const spans = exporter.getFinishedSpans().filter((s) => s.name === RENEW_SPAN_NAME);
    assert.equal(spans.length, 1);
    assert.equal(spans[0]!.spanContext().spanId, renew.spanId);
    assert.deepEqual(spans[0]!.links.map((l) => l.context.spanId),
      [trace.getSpanContext(a1.context)!.spanId, trace.getSpanContext(a2.context)!.spanId]);
  });

  it("TestGrantLinkIgnoresMalformedTraceparent_R35", () => {
    for (const tp of ["", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]) {
      assert.equal(grantLink(tp, ""), undefined, tp);
    }
    assert.equal(grantLink(GRANT_TRACEPARENT, "")?.context.spanId, "00f067aa0ba902b7");
  });
});
