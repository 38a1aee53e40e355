// stream/*.json: each transcript plays this SDK's real Worker against a
// scripted coordinator (spec-coordinator.ts), a real gRPC server on a
// loopback port, step by step: what the worker must send, what the script
// sends, and what the Worker's handlers and run must do.

import assert from "node:assert/strict";

import { create, fromJson, toBinary, toJson, type JsonValue } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

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
  const cancelled = new Inbox<string>();
  const releases = new Map<string, () => void>();
  const run = (call: "refund" | "reconcile") => async (job: WorkerJob): Promise<ProviderResult> => {
    const id = job.jobId.toString();
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
    client, workerId, handlers, concurrency, renewLeases: renew, leaseMs, receiptSpool: "off",
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
    e.done();
    if (request !== undefined) {
      if ("start" in request) {
        stream = await coord.nextStream(within);
        assert.ok(stream !== undefined, `${what}: the worker opened no stream within ${within} ms`);
      }
      const m = await nextMessage(within, true, what);
      assert.ok(m !== Closed, `${what}: the worker half-closed the stream instead`);
      matches(toJson(WorkRequestSchema, m, jsonOptions), request, what);
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
