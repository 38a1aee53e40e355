// stream/*.json: each transcript plays this SDK's real Worker against a
// scripted coordinator (spec-coordinator.ts), a real gRPC server on a
// loopback port, step by step: what the worker must send, what the script
// sends, and what the Worker's handlers and run must do.

import assert from "node:assert/strict";

import { create, fromJson, toBinary, toJson, type JsonValue } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { SpanKind, SpanStatusCode, isSpanContextValid, trace } from "@opentelemetry/api";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from "@opentelemetry/sdk-trace-base";

import { StatusSchema } from "../src/gen/google/rpc/status_pb.js";
import {
  ClaimResponseSchema,
  ClaimedJobSchema,
  CoordinatorClient,
  WorkRequestSchema,
  WorkResponseSchema,
  Worker,
  type ClaimResponse,
  type ClaimedJob,
  type Handlers,
  type ProviderResult,
  type WorkRequest,
  type WorkerJob,
} from "../src/index.js";
import { Closed, ScriptedCoordinator, type ScriptedStream, type UnaryCall } from "./spec-coordinator.js";
import { resultOf } from "./spec-decide.js";
import { codes, statusOf } from "./spec-errors.js";
import { Fields } from "./spec-read.js";

const defaultWithinMs = 5_000;
const jsonOptions = { useProtoFieldName: true, alwaysEmitImplicit: true } as const;

/** A handler call the Worker made. */
interface HandlerCall {
  jobId: string;
  call: "refund" | "reconcile";
}

/** Inbox hands events to the transcript as they happen, each read once. */
class Inbox<T> {
  readonly unread: T[] = [];
  private wake: (() => void) | undefined;

  push(v: T): void {
    this.unread.push(v);
    this.wake?.();
  }

  /** next takes the first unread event that matches, waiting up to timeoutMs for one. */
  async next(timeoutMs: number, what: string, match: (v: T) => boolean = () => true): Promise<T> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const i = this.unread.findIndex(match);
      if (i >= 0) {
        return this.unread.splice(i, 1)[0]!;
      }
      const left = deadline - performance.now();
      assert.ok(left > 0, `${what}: nothing within ${timeoutMs} ms; unread: ${JSON.stringify(this.unread)}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.wake = () => {
          clearTimeout(timer);
          this.wake = undefined;
          resolve();
        };
      });
    }
  }
}

export async function runStream(v: Fields): Promise<void> {
  const worker = v.fields("worker")!;
  const workerId = worker.str("worker_id")!;
  const concurrency = worker.int("concurrency");
  const renew = worker.bool("renew");
  const leaseMs = worker.int("lease_ms");
  const tracing = worker.bool("tracing") === true;
  worker.done();
  const coordSpec = v.fields("coordinator");
  const work = coordSpec?.str("work");
  coordSpec?.done();
  assert.ok(work === undefined || work === "unimplemented", `${v.where}.coordinator.work: ${work}`);
  const jobsSpec = v.fields("jobs")!;
  const jobs = new Map<string, ClaimedJob>();
  for (const id of jobsSpec.keys()) {
    jobs.set(id, fromJson(ClaimedJobSchema, jobsSpec.raw(id) as JsonValue));
  }
  jobsSpec.done();
  const handlerSpec = v.fields("handlers")!;
  const handlerOf = new Map<string, { result: ProviderResult | Error; until: string | undefined }>();
  for (const id of handlerSpec.keys()) {
    const h = handlerSpec.fields(id)!;
    const result = resultOf(h.fields("result")!);
    const until = h.str("until");
    assert.ok(until === undefined || until === "released" || until === "cancelled", `${h.where}.until: ${until}`);
    h.done();
    handlerOf.set(id, { result, until });
  }
  handlerSpec.done();
  const steps = v.list("steps")!;
  v.done();

  const coord = await ScriptedCoordinator.start();
  coord.withoutStream = work === "unimplemented";
  // A Claim waits for the step that answers it (unary_reply); every other
  // unary call is an empty success.
  const claims: Array<{ call: UnaryCall; answer: (r: ClaimResponse) => void }> = [];
  coord.unary = (call) => call.method !== "Claim" ? {} : new Promise<ClaimResponse>((answer) => claims.push({ call, answer }));
  const client = new CoordinatorClient({ address: coord.address });
  const handlerCalls = new Inbox<HandlerCall>();
  // R35: spans recorded in memory when the transcript traces, and the
  // traceparent of the span each job's handler ran in ("$attempt:<id>").
  const exporter = new InMemorySpanExporter();
  const tracerProvider = tracing ? new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }) : undefined;
  const attempts = new Map<string, string>();
  const cancelled = new Inbox<string>();
  const releases = new Map<string, () => void>();
  const run = (call: "refund" | "reconcile") => async (job: WorkerJob): Promise<ProviderResult> => {
    const id = job.jobId.toString();
    const sc = trace.getSpanContext(job.traceContext);
    if (sc !== undefined && isSpanContextValid(sc)) {
      attempts.set(id, `00-${sc.traceId}-${sc.spanId}-0${sc.traceFlags & 1}`);
    }
    handlerCalls.push({ jobId: id, call });
    const h = handlerOf.get(id);
    assert.ok(h !== undefined, `the transcript has no handler for job ${id}`);
    if (h.until === "released") {
      await new Promise<void>((resolve) => releases.set(id, resolve));
    } else if (h.until === "cancelled") {
      await new Promise<void>((resolve) => {
        if (job.signal.aborted) {
          resolve();
        }
        job.signal.addEventListener("abort", () => resolve(), { once: true });
      });
      cancelled.push(id);
    }
    if (h.result instanceof Error) {
      throw h.result;
    }
    return h.result;
  };
  const handlers: Handlers = { refund: run("refund"), reconcile: run("reconcile") };
  const w = new Worker({
    client, workerId, handlers, concurrency, renewLeases: renew, leaseMs, receiptSpool: "off", tracerProvider,
  });
  let stopped: Promise<void> | undefined;
  let stream: ScriptedStream | undefined;
  let unaryRead = 0;
  const labels = new Map<string, bigint>();

  try {
    w.start();
    for (const [i, step] of steps.entries()) {
      const what = `step ${i + 1}`;
      const expect = step.fields("expect");
      const send = step.fields("send");
      const act = step.str("do");
      const within = step.int("within_ms") ?? defaultWithinMs;
      const label = step.str("as");
      const jobId = step.str("job_id");
      step.done();
      if (expect !== undefined) {
        await expectStep(expect, within, label, `${what} (expect ${expect.keys().join(", ")})`);
      } else if (send !== undefined) {
        sendStep(send, what);
      } else if (act === "stop") {
        stopped = w.stop();
        stopped.catch(() => undefined);
      } else if (act === "release") {
        const release = releases.get(jobId ?? "");
        assert.ok(release !== undefined, `${what}: no handler of job ${jobId} waits to be released`);
        release();
      } else {
        assert.fail(`${what}: a step this runner does not know: ${JSON.stringify(step.keys())}`);
      }
    }
  } finally {
    for (const release of releases.values()) {
      release();
    }
    for (const c of claims) {
      c.answer(create(ClaimResponseSchema));
    }
    stream?.end();
    await Promise.race([stopped ?? w.stop(), new Promise((r) => setTimeout(r, 5_000))]);
    client.close();
    await coord.close();
  }

  async function expectStep(e: Fields, within: number, label: string | undefined, what: string): Promise<void> {
    const request = e.raw("request") as Record<string, unknown> | undefined;
    const heartbeat = e.bool("heartbeat");
    const halfClose = e.bool("half_close");
    const unary = e.fields("unary");
    const handler = e.fields("handler");
    const handlerCancelled = e.str("handler_cancelled");
    const ran = e.str("run");
    const nothingMore = e.bool("nothing_more");
    const span = e.fields("span");
    e.done();
    if (request !== undefined) {
      if ("start" in request) {
        stream = await coord.nextStream(within);
        assert.ok(stream !== undefined, `${what}: the worker opened no stream within ${within} ms`);
      }
      const m = await nextMessage(within, true, what);
      assert.ok(m !== Closed, `${what}: the worker half-closed the stream instead`);
      matches(toJson(WorkRequestSchema, m, jsonOptions), withAttempts(request, attempts, what), what);
      if (label !== undefined) {
        assert.ok(m.kind.case === "call", `${what}: "as" names a call`);
        labels.set(label, m.kind.value.callId);
      }
    }
    if (heartbeat === true) {
      const m = await nextMessage(within, false, what);
      assert.ok(m !== Closed && isHeartbeat(m), `${what}: a heartbeat, got ${describe(m)}`);
    }
    if (halfClose === true) {
      const m = await nextMessage(within, true, what);
      assert.ok(m === Closed, `${what}: the half-close, got ${describe(m)}`);
    }
    if (unary !== undefined) {
      const method = unary.str("method")!;
      const req = unary.raw("request");
      unary.done();
      const deadline = performance.now() + within;
      while (coord.unaryCalls.length <= unaryRead && performance.now() < deadline) {
        await new Promise((r) => setTimeout(r, 10));
      }
      const call = coord.unaryCalls[unaryRead];
      assert.ok(call !== undefined, `${what}: no unary call within ${within} ms`);
      unaryRead++;
      assert.equal(call.method, method, `${what}: the unary call`);
      if (req !== undefined) {
        matches(call.json, req, what);
      }
    }
    if (handler !== undefined) {
      const want = { jobId: handler.str("job_id")!, call: handler.str("call")! };
      handler.done();
      // By job: jobs granted together start in any order.
      const got = await handlerCalls.next(within, what, (c) => c.jobId === want.jobId);
      assert.deepEqual(got, want, `${what}: the handler call`);
    }
    if (handlerCancelled !== undefined) {
      assert.equal(await cancelled.next(within, what), handlerCancelled, `${what}: the handler cancelled`);
    }
    if (ran !== undefined) {
      assert.equal(ran, "returned", `${what}: run ${ran} is not one this runner knows`);
      // TypeScript's Worker runs until stop()'s promise resolves: the drain
      // done, the stream ended.
      assert.ok(stopped !== undefined, `${what}: the run returns only after a stop step`);
      const done = await Promise.race([stopped.then(() => true), new Promise<false>((r) => setTimeout(() => r(false), within))]);
      assert.ok(done, `${what}: the Worker's run did not return within ${within} ms`);
    }
    if (span !== undefined) {
      await expectSpan(span, within, what);
    }
    if (nothingMore === true) {
      await new Promise((r) => setTimeout(r, 200));
      assert.deepEqual(handlerCalls.unread, [], `${what}: handler calls unread`);
      assert.deepEqual(coord.unaryCalls.slice(unaryRead).map((c) => c.method), [], `${what}: unary calls unread`);
      const unread: string[] = [];
      for (let m = await stream?.next(0); m !== undefined; m = await stream?.next(0)) {
        if (m === Closed || !isHeartbeat(m)) {
          unread.push(describe(m));
        }
      }
      assert.deepEqual(unread, [], `${what}: stream messages unread`);
      assert.equal(await coord.nextStream(0), undefined, `${what}: a stream opened again`);
    }
  }

  // expectSpan waits for the ended attempt span of the step's job and
  // checks what the step pins, and that no span carries the grant's lease
  // token (R25, R35).
  async function expectSpan(e: Fields, within: number, what: string): Promise<void> {
    assert.ok(tracerProvider !== undefined, `${what}: a span expected of a worker without tracing`);
    const jobId = e.str("job_id")!;
    const name = e.str("name");
    const kind = e.str("kind");
    const root = e.bool("root");
    const links = e.list("links");
    const attributes = e.raw("attributes");
    const status = e.str("status");
    e.done();
    const deadline = performance.now() + within;
    let s: ReadableSpan | undefined;
    for (;;) {
      s = exporter.getFinishedSpans().find((x) => String(x.attributes["jobfence.job.id"]) === jobId);
      if (s !== undefined) {
        break;
      }
      assert.ok(performance.now() < deadline, `${what}: no ended span of job ${jobId} within ${within} ms`);
      await new Promise((r) => setTimeout(r, 5));
    }
    const token = jobs.get(jobId)?.leaseToken ?? "";
    assert.ok(token === "" || !JSON.stringify({ n: s.name, a: s.attributes, l: s.links.map((l) => l.attributes), st: s.status })
      .includes(token), `${what}: the span carries the grant's lease token (R25)`);
    if (name !== undefined) {
      assert.equal(s.name, name, `${what}: name`);
    }
    if (kind !== undefined) {
      assert.equal(SpanKind[s.kind].toLowerCase(), kind, `${what}: kind`);
    }
    if (root !== undefined) {
      assert.equal(s.parentSpanContext === undefined, root, `${what}: root`);
    }
    if (links !== undefined) {
      assert.equal(s.links.length, links.length, `${what}: links`);
      links.forEach((wl, i) => {
        const l = s.links[i]!;
        const tp = wl.str("traceparent");
        const ts = wl.str("tracestate");
        const la = wl.raw("attributes");
        wl.done();
        assert.equal(`00-${l.context.traceId}-${l.context.spanId}-0${l.context.traceFlags & 1}`, tp, `${what}: links[${i}]`);
        if (ts !== undefined) {
          assert.equal(l.context.traceState?.serialize() ?? "", ts, `${what}: links[${i}].tracestate`);
        }
        if (la !== undefined) {
          matches(l.attributes ?? {}, la, what, `links[${i}].attributes`);
        }
      });
    }
    if (attributes !== undefined) {
      matches(s.attributes, attributes, what, "attributes");
    }
    if (status !== undefined) {
      const got = s.status.code === SpanStatusCode.ERROR ? "error" : s.status.code === SpanStatusCode.OK ? "ok" : "unset";
      assert.equal(got, status, `${what}: status`);
    }
  }

  // nextMessage is the worker's next message on the current stream, or
  // Closed after its half-close; heartbeats skipped when skip.
  async function nextMessage(within: number, skip: boolean, what: string): Promise<WorkRequest | typeof Closed> {
    assert.ok(stream !== undefined, `${what}: no stream is open`);
    const deadline = performance.now() + within;
    for (;;) {
      const m = await stream.next(Math.max(0, deadline - performance.now()));
      assert.ok(m !== undefined, `${what}: nothing from the worker within ${within} ms`);
      if (skip && m !== Closed && isHeartbeat(m)) {
        continue;
      }
      return m;
    }
  }

  function sendStep(s: Fields, what: string): void {
    const grant = s.strs("grant");
    const replyTo = s.str("reply_to");
    const response = s.raw("response") as Record<string, unknown> | undefined;
    const error = s.fields("error");
    const end = s.fields("end");
    const unaryReply = s.fields("unary_reply");
    s.done();
    if (unaryReply !== undefined) {
      const r = unaryReply.raw("response");
      unaryReply.done();
      // The oldest Claim a step expected and nothing answered yet.
      const expected = new Set(coord.unaryCalls.slice(0, unaryRead));
      const i = claims.findIndex((c) => expected.has(c.call));
      assert.ok(i >= 0, `${what}: no Claim expected and waiting for its answer`);
      claims.splice(i, 1)[0]!.answer(fromJson(ClaimResponseSchema, (r ?? {}) as JsonValue));
      return;
    }
    assert.ok(stream !== undefined, `${what}: no stream is open`);
    if (grant !== undefined) {
      stream.send({
        kind: {
          case: "grant",
          value: {
            jobs: grant.map((id) => {
              const c = jobs.get(id);
              assert.ok(c !== undefined, `${what}: no job ${id} in the transcript`);
              return c;
            }),
          },
        },
      });
    }
    if (replyTo !== undefined) {
      const callId = labels.get(replyTo);
      assert.ok(callId !== undefined, `${what}: no call labelled ${replyTo}`);
      const reply = { ...((response?.["reply"] as object | undefined) ?? {}), call_id: callId.toString() };
      const m = fromJson(WorkResponseSchema, { reply } as JsonValue);
      assert.ok(m.kind.case === "reply");
      if (error !== undefined) {
        m.kind.value.error = toBinary(StatusSchema, statusOf(error));
      }
      stream.send(m);
    } else if (response !== undefined) {
      stream.send(fromJson(WorkResponseSchema, response as JsonValue));
    }
    if (end !== undefined) {
      const name = end.str("code") ?? "OK";
      const message = end.str("message") ?? "";
      end.done();
      if (name === "OK") {
        stream.end();
      } else {
        const code = codes[name];
        assert.ok(code !== undefined, `${what}: ${name} is not a gRPC code this runner knows`);
        stream.end(new ConnectError(message, code as Code));
      }
    }
  }
}

// withAttempts is want with every string "$attempt:<job id>" replaced by the
// traceparent of the span that job's handler ran in (R35).
function withAttempts(want: unknown, attempts: Map<string, string>, what: string): unknown {
  if (typeof want === "string" && want.startsWith("$attempt:")) {
    const tp = attempts.get(want.slice("$attempt:".length));
    assert.ok(tp !== undefined, `${what}: ${want}: the job's handler ran in no span`);
    return tp;
  }
  if (Array.isArray(want)) {
    return want.map((w) => withAttempts(w, attempts, what));
  }
  if (typeof want === "object" && want !== null) {
    return Object.fromEntries(Object.entries(want).map(([k, v]) => [k, withAttempts(v, attempts, what)]));
  }
  return want;
}

function isHeartbeat(m: WorkRequest): boolean {
  return m.kind.case === "credit" && m.kind.value.credits === 0;
}

function describe(m: WorkRequest | typeof Closed | undefined): string {
  return m === Closed ? "the half-close" : m === undefined ? "nothing" : JSON.stringify(toJson(WorkRequestSchema, m, jsonOptions));
}

// matches checks that got holds every field of want (see the README: a
// subset match; lists the same length, element by element).
function matches(got: unknown, want: unknown, what: string, at = ""): void {
  if (Array.isArray(want)) {
    assert.ok(Array.isArray(got), `${what}: ${at || "the message"} is a list in ${JSON.stringify(got)}`);
    assert.equal(got.length, want.length, `${what}: ${at} has ${want.length} elements, got ${JSON.stringify(got)}`);
    want.forEach((w, i) => matches(got[i], w, what, `${at}[${i}]`));
    return;
  }
  if (typeof want === "object" && want !== null) {
    assert.ok(typeof got === "object" && got !== null && !Array.isArray(got), `${what}: ${at || "the message"} is not an object: ${JSON.stringify(got)}`);
    for (const [k, w] of Object.entries(want)) {
      const g = (got as Record<string, unknown>)[k];
      assert.ok(g !== undefined, `${what}: ${at ? `${at}.` : ""}${k} is missing in ${JSON.stringify(got)}`);
      matches(g, w, what, at ? `${at}.${k}` : k);
    }
    return;
  }
  assert.equal(got, want, `${what}: ${at}`);
}
