// A connection that goes silent without a close, against a real coordinator
// process on MariaDB through a proxy that blackholes it: the client's
// keepalive (DEFAULT_KEEPALIVE) finds it dead, the Worker's write-back cut
// with its stream is repeated on a new connection (R21), and the worker
// opens a new stream and takes more work.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Code } from "@connectrpc/connect";

import { CoordinatorClient, JobState, Worker, type Handlers, type WorkerEvent } from "../src/index.js";
import { eventually, refund, startBlackholeProxy, startCoordinators, testSpool } from "./harness.js";

// Top-level await: a missing MySQL fails the whole file loudly, never skips it.
const [coord] = await startCoordinators([]);
const admin = coord.client();

async function history(id: bigint): Promise<string[]> {
  const got = await admin.getJob({ job: { case: "jobId", value: id } });
  return got.events.map((e) => `${e.kind}@${e.attempt}`);
}

async function waitSucceeded(id: bigint, timeoutMs: number): Promise<void> {
  await eventually(async () => {
    const got = await admin.getJob({ job: { case: "jobId", value: id } });
    assert.equal(got.job!.state, JobState.SUCCEEDED, `job ${id}: ${JobState[got.job!.state]}`);
  }, timeoutMs);
}

describe("keepalive", () => {
  // A coordinator that vanishes without a FIN or RST (its host gone, a path
  // dropping every packet) is noticed by the connection's PINGs (10 s of
  // silence, then 5 s for the answer), not by the kernel's retransmission
  // timeout some 15 minutes later: the worker stream ends UNAVAILABLE, the
  // write-back it carried is answered UNAVAILABLE and repeated on a new
  // connection (R21), landing once under its grant (R9, R25), and the worker
  // opens a new stream with its free slot and is granted a job enqueued after
  // the blackhole (R18). The worker's calls time out only after a minute, so
  // nothing but the keepalive meets the bound.
  it("TestWorkerStreamOnABlackholedConnectionReconnects_R21: a silently dead connection is found by keepalive and the write-back repeated on a new one", { timeout: 90_000 }, async (t) => {
    const proxy = await startBlackholeProxy(coord.address);
    const client = new CoordinatorClient({ address: proxy.address, defaultTimeoutMs: 60_000 });
    const provider = refund().provider!;
    const first = (await admin.enqueueRefund(refund({ provider }))).job!;
    let started!: () => void;
    const holding = new Promise<void>((resolve) => (started = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const handlers: Handlers = {
      refund: async (j) => {
        if (j.jobId === first.id) {
          started();
          await released;
        }
        return { kind: "succeeded", providerRefundId: `re_${j.jobId}` };
      },
      reconcile: async (j) => ({ kind: "succeeded", providerRefundId: `re_${j.jobId}` }),
    };
    const events: Array<{ at: number; e: WorkerEvent }> = [];
    const worker = new Worker({
      client,
      workerId: "node-blackholed",
      provider,
      handlers,
      leaseMs: 30_000,
      renewIntervalMs: 200,
      providerCallTimeoutMs: 20_000,
      idlePollMs: 60_000,
      claimWaitMs: 0,
      claimErrorBackoffMs: 50,
      writeRetryDelayMs: 20,
      receiptSpool: testSpool("node-blackholed"),
      onEvent: (e) => events.push({ at: performance.now(), e }),
    });
    let secondId = 0n;
    let passed = false;
    worker.start();
    try {
      await Promise.race([holding, new Promise((_, reject) => setTimeout(() => reject(new Error("the job never reached the worker")), 20_000))]);
      // A renewal answered on the stream: the grant's acknowledgement went
      // before it, so the cut cannot take the acknowledgement along (the
      // coordinator would rightly hand the grant back).
      const renewedBy = performance.now() + 10_000;
      while (!events.some(({ e }) => e.type === "renewed")) {
        assert.ok(performance.now() < renewedBy, "the held job was not renewed within 10 s");
        await new Promise((r) => setTimeout(r, 20));
      }
      const blackholed = performance.now();
      proxy.blackhole();
      release(); // the write-back goes on the dead stream
      const second = (await admin.enqueueRefund(refund({ provider }))).job!;
      secondId = second.id;
      // Detection takes 5 to 15 s after the blackhole (the last read, then a
      // PING after 10 s and 5 s for its answer).
      const boundMs = 30_000;
      for (const j of [first, second]) {
        await waitSucceeded(j.id, Math.max(100, boundMs - (performance.now() - blackholed)));
      }
      const took = performance.now() - blackholed;
      const end = events.find((x) => x.e.type === "stream_ended");
      assert.ok(end !== undefined && end.e.type === "stream_ended", "the stream's end went unnoticed");
      t.diagnostic(`stream ended ${Math.round(end.at - blackholed)} ms after the blackhole (${end.e.error?.message}); ` +
        `both jobs done after ${Math.round(took)} ms`);
      assert.equal(end.e.error?.code, Code.Unavailable, end.e.error?.message);
      assert.deepEqual(await history(first.id), ["enqueued@0", "claimed@1", "completed@1"],
        "the grant held through the blackhole writes back once");
      assert.ok(proxy.accepted() >= 2, "no new connection after the blackhole");
      passed = true;
    } finally {
      if (!passed) {
        // A stream still on the dead connection would hold the drain forever.
        await proxy.close();
      }
      await worker.stop();
      client.close();
      await proxy.close();
    }
    // Each write-back landed once, the cut one not as a replay: it never
    // reached the coordinator before the repeat.
    const written = events.flatMap((x) => (x.e.type === "written" ? [[x.e.jobId, x.e.replayed]] : []));
    assert.deepEqual(written, [[first.id, false], [secondId, false]]);
    assert.deepEqual(events.filter((x) => x.e.type === "write_failed" || x.e.type === "stale"), []);
  });
});
