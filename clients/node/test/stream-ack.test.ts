// The worker stream's acknowledgements (WorkStart.acknowledges), against a
// real coordinator process on MariaDB: every grant is acknowledged as it is
// read, before its jobs start, so a handler that runs past the coordinator's
// 5 s acknowledgement timeout keeps its job; and a grant read after the
// drain's half-close, which can no longer be acknowledged, is not started:
// the coordinator hands it back.

import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { describe, it } from "node:test";

import type { Interceptor, StreamRequest, StreamResponse } from "@connectrpc/connect";

import {
  JobState,
  Worker,
  type CoordinatorClient,
  type Handlers,
  type Job,
  type WorkerEvent,
  type WorkRequest,
  type WorkResponse,
} from "../src/index.js";
import { eventually, refund, startCoordinators, testSpool } from "./harness.js";
import { WorkTap } from "./work-tap.js";

const [coord] = await startCoordinators(["--metrics-listen", "127.0.0.1:0"]);
const admin: CoordinatorClient = coord.client();

// The coordinator's acknowledgement timeout (server.StreamAckTimeout).
const ACK_TIMEOUT_MS = 5_000;

async function detail(id: bigint) {
  return admin.getJob({ job: { case: "jobId", value: id } });
}

function history(d: Awaited<ReturnType<typeof detail>>): string[] {
  return d.events.map((e) => `${e.kind}@${e.attempt}`);
}

/**
 * GrantHold is a client interceptor that holds the next grant on a worker
 * stream back until the worker has half-closed that stream, so that the
 * grant reaches a draining worker.
 */
class GrantHold {
  /** Resolves with the held grant's job ids once it waits. */
  readonly held: Promise<bigint[]>;
  private armed = false;
  private onHeld!: (ids: bigint[]) => void;

  constructor() {
    this.held = new Promise((r) => (this.onHeld = r));
  }

  arm(): void {
    this.armed = true;
  }

  readonly interceptor: Interceptor = (next) => async (req) => {
    if (!req.stream || req.method.name !== "Work") {
      return next(req);
    }
    let halfClosed!: () => void;
    const closed = new Promise<void>((r) => (halfClosed = r));
    const upstream = req.message as AsyncIterable<WorkRequest>;
    async function* outbound(): AsyncGenerator<WorkRequest> {
      yield* upstream;
      halfClosed();
    }
    const res = await next({ ...(req as StreamRequest), message: outbound() });
    const coordinator = res.message as AsyncIterable<WorkResponse>;
    const hold = this;
    async function* inbound(): AsyncGenerator<WorkResponse> {
      for await (const m of coordinator) {
        if (m.kind.case === "grant" && hold.armed) {
          hold.armed = false;
          hold.onHeld(m.kind.value.jobs.map((c) => c.job!.id));
          let timer: NodeJS.Timeout | undefined;
          await Promise.race([closed, new Promise((r) => (timer = setTimeout(r, 30_000)))]); // the test failed: let it go
          clearTimeout(timer);
        }
        yield m;
      }
    }
    return { ...(res as StreamResponse), message: inbound() } as StreamResponse;
  };
}

describe("the worker stream's acknowledgements", () => {
  it("TestWorkerStreamAcknowledgesEachGrantBeforeItsHandlerRuns_R25: one WorkAck per grant at once, and handlers that outlast the ack timeout keep their jobs", { timeout: 60_000 }, async () => {
    const provider = refund().provider!;
    const tap = new WorkTap();
    const grantedAt: number[] = [];
    const ackedAt: number[] = [];
    tap.onReceived = (m) => m.kind.case === "grant" && grantedAt.push(performance.now());
    tap.onSent = (m) => m.kind.case === "ack" && ackedAt.push(performance.now());
    const slowMs = ACK_TIMEOUT_MS + 2_000;
    const slow = async (signal: AbortSignal): Promise<void> => {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, slowMs); // a provider call this slow
        signal.addEventListener("abort", () => (clearTimeout(timer), resolve()), { once: true });
      });
    };
    const handlers: Handlers = {
      refund: async (j) => (await slow(j.signal), { kind: "succeeded", providerRefundId: `re_${j.jobId}` }),
      reconcile: async (j) => (await slow(j.signal), { kind: "succeeded", providerRefundId: `re_${j.jobId}` }),
    };
    const events: WorkerEvent[] = [];
    // A 30 s lease: the first renewal (R27), which also shows the coordinator
    // the grant, comes ~10 s in, too late to save an unacknowledged one.
    const worker = new Worker({
      client: coord.client({ interceptors: [tap.interceptor] }), workerId: "acker", provider, concurrency: 3, handlers,
      leaseMs: 30_000, providerCallTimeoutMs: 20_000, idlePollMs: 60_000, claimWaitMs: 0,
      receiptSpool: testSpool("acker"), onEvent: (e) => events.push(e),
    });
    const handedBack = await coord.metric("jobfence_grants_handed_back_total");
    worker.start();
    const jobs: Job[] = [];
    try {
      await eventually(() => assert.equal(tap.starts().length, 1, "the worker's stream is open"));
      for (let i = 0; i < 3; i++) {
        jobs.push((await admin.enqueueRefund(refund({ provider }))).job!);
      }
      for (const j of jobs) {
        // Written back, or handed back (ready again after a claim).
        await eventually(async () => {
          const d = (await detail(j.id)).job!;
          assert.ok(d.state === JobState.SUCCEEDED || d.state === JobState.READY && d.attempt > 0n, `job ${j.id} ${JobState[d.state]}`);
        }, 20_000);
        const d = await detail(j.id);
        assert.deepEqual(history(d), ["enqueued@0", "claimed@1", "completed@1"],
          `job ${j.id} must complete under its first grant (last reason ${d.job!.lastReason})`);
      }
    } finally {
      await worker.stop();
    }
    assert.equal(await coord.metric("jobfence_grants_handed_back_total"), handedBack, "no grant handed back");
    assert.ok(!events.some((e) => e.type === "stale" || e.type === "write_failed" || e.type === "renewed"),
      "nothing refused, and no renewal showed a grant");
    const starts = tap.starts();
    assert.equal(starts.length, 1);
    assert.equal(starts[0]!.acknowledges, true, "the WorkStart says the worker acknowledges");
    // One WorkAck per WorkGrant, naming its jobs with their attempt and
    // lease token (R25), sent within moments of the grant's arrival.
    const grants = tap.received.flatMap((m) => (m.kind.case === "grant" ? [m.kind.value.jobs] : []));
    const acks = tap.sent.flatMap((m) => (m.kind.case === "ack" ? [m.kind.value.grants] : []));
    assert.equal(acks.length, grants.length, `${acks.length} acks for ${grants.length} grants`);
    grants.forEach((g, i) => {
      assert.deepEqual(acks[i]!.map((r) => [r.jobId, r.attempt, r.leaseToken]), g.map((c) => [c.job!.id, c.attempt, c.leaseToken]));
      const took = ackedAt[i]! - grantedAt[i]!;
      assert.ok(took < ACK_TIMEOUT_MS / 2, `grant ${i} acknowledged ${Math.round(took)} ms after it arrived`);
    });
  });

  it("TestWorkerStreamLeavesAGrantReadDuringItsDrainUnstarted_R25: a grant that arrives after the half-close is not started; the coordinator hands it back", { timeout: 60_000 }, async () => {
    const provider = refund().provider!;
    const tap = new WorkTap();
    const hold = new GrantHold();
    const handled: bigint[] = [];
    const ok = async (j: { jobId: bigint }) => (handled.push(j.jobId), { kind: "succeeded" as const, providerRefundId: `re_${j.jobId}` });
    const events: WorkerEvent[] = [];
    const worker = new Worker({
      client: coord.client({ interceptors: [hold.interceptor, tap.interceptor] }), workerId: "drainer", provider,
      handlers: { refund: ok, reconcile: ok }, leaseMs: 30_000, idlePollMs: 60_000, claimWaitMs: 0,
      receiptSpool: testSpool("drainer"), onEvent: (e) => events.push(e),
    });
    const handedBack = await coord.metric("jobfence_grants_handed_back_total");
    worker.start();
    let stopped: Promise<void> | undefined;
    try {
      await eventually(() => assert.equal(tap.starts().length, 1, "the worker's stream is open"));
      hold.arm();
      const job = (await admin.enqueueRefund(refund({ provider }))).job!;
      let timer: NodeJS.Timeout | undefined;
      const held = await Promise.race([hold.held, new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), 20_000)))]);
      clearTimeout(timer);
      assert.deepEqual(held, [job.id], "the job's grant is held");
      stopped = worker.stop(); // the drain half-closes the stream; then the grant goes on
      await stopped;
      await eventually(async () => assert.equal((await detail(job.id)).job!.state, JobState.READY, "handed back"), 20_000);
      const d = await detail(job.id);
      assert.deepEqual(history(d), ["enqueued@0", "claimed@1", "rescheduled@1"]);
      assert.match(d.job!.lastReason, /acknowledged/, "the coordinator's hand-back of an unacknowledged grant");
      assert.deepEqual(handled, [], "the draining worker handled nothing");
      assert.ok(!events.some((e) => e.type === "claimed" || e.type === "written" || e.type === "stale"), "nothing acted on");
      const dropped = events.filter((e) => e.type === "grants_dropped");
      assert.deepEqual(dropped.map((e) => e.type === "grants_dropped" && e.grants.map((g) => [g.jobId, g.attempt])), [[[job.id, 1n]]]);
      assert.equal(tap.sent.filter((m) => m.kind.case === "ack").length, 0, "no ack after the half-close");
      assert.equal(await coord.metric("jobfence_grants_handed_back_total"), handedBack + 1);
    } finally {
      await (stopped ?? worker.stop());
    }
  });
});
