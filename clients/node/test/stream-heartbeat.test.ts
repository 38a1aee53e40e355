// The worker stream's heartbeats against a stand-in coordinator that serves
// only Work (over plaintext HTTP/2, through the client's own transport): an
// open stream that has nothing else to send sends a WorkCredit of 0 credits
// every STREAM_HEARTBEAT_MS, and nothing once it is half-closed. The
// coordinator offers work only to a stream that spoke within the last 3 s,
// so a frozen process is granted nothing it cannot start.

import assert from "node:assert/strict";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { after, describe, it } from "node:test";

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import {
  Coordinator,
  CoordinatorClient,
  NextAction,
  Worker,
  WorkResponseSchema,
  type Handlers,
  type WorkRequest,
  type WorkResponse,
} from "../src/index.js";
import { STREAM_HEARTBEAT_MS, WorkSession } from "../src/session.js";
import { eventually } from "./harness.js";

type ResponseInit = MessageInitShape<typeof WorkResponseSchema>;

/** FakeStream is one worker stream as the stand-in serves it. */
class FakeStream {
  /** Every message the worker sent, with when it arrived (performance.now()). */
  readonly requests: Array<{ at: number; m: WorkRequest }> = [];
  halfClosed = false;
  ended = false;
  private readonly out: Array<WorkResponse | "end"> = [];
  private wakeOut: (() => void) | undefined;

  /** heartbeats lists when each heartbeat (a WorkCredit of 0 credits) arrived. */
  heartbeats(): number[] {
    return this.requests.flatMap((r) => (r.m.kind.case === "credit" && r.m.kind.value.credits === 0 ? [r.at] : []));
  }

  /** credits lists the credits given back, heartbeats left out. */
  credits(): number[] {
    return this.requests.flatMap((r) => (r.m.kind.case === "credit" && r.m.kind.value.credits !== 0 ? [r.m.kind.value.credits] : []));
  }

  send(m: ResponseInit): void {
    this.out.push(create(WorkResponseSchema, m));
    this.kick();
  }

  /** end ends the stream cleanly, after what was sent. */
  end(): void {
    this.out.push("end");
    this.kick();
  }

  got(m: WorkRequest): void {
    this.requests.push({ at: performance.now(), m });
    if (m.kind.case === "call") {
      // Every call succeeds, with an empty response of its kind.
      const { callId, call } = m.kind.value;
      this.send({ kind: { case: "reply", value: { callId, result: { case: call.case!, value: {} } as never } } });
    }
  }

  async *responses(): AsyncGenerator<WorkResponse> {
    for (;;) {
      const m = this.out.shift();
      if (m === "end") {
        return;
      }
      if (m !== undefined) {
        yield m;
        continue;
      }
      await new Promise<void>((r) => (this.wakeOut = r));
    }
  }

  private kick(): void {
    const w = this.wakeOut;
    this.wakeOut = undefined;
    w?.();
  }
}

const streams: FakeStream[] = [];
const server = http2.createServer(connectNodeAdapter({
  routes: (router) => router.service(Coordinator, {
    async *work(requests: AsyncIterable<WorkRequest>) {
      const st = new FakeStream();
      streams.push(st);
      void (async () => {
        for await (const m of requests) {
          st.got(m);
        }
        st.halfClosed = true;
      })().catch(() => undefined);
      try {
        yield* st.responses();
      } finally {
        st.ended = true;
      }
    },
  }),
}));
await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
const address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
const clients: CoordinatorClient[] = [];
after(async () => {
  for (const c of clients) c.close();
  await new Promise<void>((r) => server.close(() => r()));
});

function client(): CoordinatorClient {
  const c = new CoordinatorClient({ address });
  clients.push(c);
  return c;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function newWorker(workerId: string, handlers: Handlers, concurrency = 1): Worker {
  return new Worker({
    client: client(),
    workerId,
    handlers,
    concurrency,
    receiptSpool: "off",
    renewLeases: false,
    leaseMs: 30_000,
    providerCallTimeoutMs: 5_000,
  });
}

const succeed: Handlers = {
  refund: async (j) => ({ kind: "succeeded", providerRefundId: `re_${j.jobId}` }),
  reconcile: async (j) => ({ kind: "succeeded", providerRefundId: `re_${j.jobId}` }),
};

describe("worker stream heartbeats", () => {
  it("an idle stream sends a heartbeat (credits 0) every second, and none after the half-close", { timeout: 20_000 }, async () => {
    const worker = newWorker("idle", succeed);
    const n = streams.length;
    worker.start();
    let stopped: Promise<void> | undefined;
    try {
      await eventually(() => assert.equal(streams.length, n + 1, "the worker opened its stream"));
      const st = streams[n]!;
      await eventually(() => assert.ok(st.requests.length > 0, "its WorkStart"));
      const opened = st.requests[0]!.at;
      await eventually(() => assert.ok(st.heartbeats().length >= 2, "two heartbeats"), 2_500);
      const beats = st.heartbeats();
      const gaps = beats.map((b, i) => b - (i === 0 ? opened : beats[i - 1]!));
      assert.ok(gaps.every((g) => g >= 0.8 * STREAM_HEARTBEAT_MS), `heartbeats too often: ${gaps.join(", ")} ms`);
      assert.deepEqual(st.credits(), []);
      // The drain half-closes the stream; the stand-in keeps it open, and the
      // worker sends nothing more on it.
      stopped = worker.stop();
      await eventually(() => assert.ok(st.halfClosed, "stop() half-closed the stream"));
      const sent = st.requests.length;
      await sleep(1.5 * STREAM_HEARTBEAT_MS);
      assert.equal(st.requests.length, sent, "a message after the half-close");
      assert.equal(st.ended, false);
      st.end();
      await stopped;
    } finally {
      streams[n]?.end();
      await (stopped ?? worker.stop());
    }
    assert.equal(streams.length, n + 1, "one stream");
  });

  it("heartbeats go on while every slot's handler waits on its provider", { timeout: 20_000 }, async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let started = false;
    const worker = newWorker("held", {
      refund: async (j) => {
        started = true;
        await gate;
        return { kind: "succeeded", providerRefundId: `re_${j.jobId}` };
      },
      reconcile: succeed.reconcile,
    });
    const n = streams.length;
    worker.start();
    try {
      await eventually(() => assert.ok(streams[n] !== undefined && streams[n].requests.length > 0, "the worker's stream"));
      const st = streams[n]!;
      st.send({
        kind: {
          case: "grant",
          value: { jobs: [{ job: { id: 1n, operationKey: "op-1", provider: "acme" }, attempt: 1n, leaseToken: "tok-1", nextAction: NextAction.REFUND }] },
        },
      });
      await eventually(() => assert.ok(started, "the job's handler"));
      const held = performance.now();
      await eventually(() => assert.ok(st.heartbeats().filter((t) => t > held).length >= 2, "two heartbeats while it waits"), 2_500);
      release();
      await eventually(() => assert.deepEqual(st.credits(), [1], "the freed slot's credit"));
      const done = worker.stop();
      await eventually(() => assert.ok(st.halfClosed));
      st.end();
      await done;
    } finally {
      release();
      streams[n]?.end();
      await worker.stop();
    }
  });

  it("a stream that sends something at least every second sends no heartbeat", { timeout: 20_000 }, async () => {
    const session = new WorkSession(client(), { workerId: "busy", provider: "", leaseMs: undefined }, 0, {
      granted: () => assert.fail("no grants"), retryAfter: () => undefined, dropped: () => undefined,
    });
    const n = streams.length;
    const served = session.serve();
    try {
      await eventually(() => assert.ok(streams[n] !== undefined && streams[n].requests.length > 0, "the stream"));
      const st = streams[n]!;
      for (let i = 0; i < 6; i++) {
        await sleep(0.4 * STREAM_HEARTBEAT_MS);
        session.freed();
      }
      await eventually(() => assert.equal(st.credits().length, 6));
      assert.deepEqual(st.heartbeats(), [], "a heartbeat between credits");
      await eventually(() => assert.equal(st.heartbeats().length, 1, "a heartbeat once it fell silent"), 2_000);
      session.closeSend();
      await eventually(() => assert.ok(st.halfClosed));
      st.end();
      assert.deepEqual(await served, { error: undefined, received: false });
    } finally {
      session.closeSend();
      streams[n]?.end();
      await served;
    }
  });
});
