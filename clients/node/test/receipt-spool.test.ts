// R28 through the Worker, against a real coordinator on MariaDB: a receipt
// the coordinator cannot take is spooled, survives the worker, and is filed
// by the next worker on the spool before its first claim — once, verified.

import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { after, describe, it } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";

import {
  JobState,
  ObservationOutcome,
  ReceiptSpoolLockedError,
  Worker,
  type CoordinatorClient,
  type Job,
  type ProviderResult,
  type WorkerEvent,
  type WorkerOptions,
} from "../src/index.js";
import { encodeReceipt } from "../src/spool.js";
import { eventually, refund, startCoordinator, testSpool, type Coordinator } from "./harness.js";
import { WorkTap } from "./work-tap.js";

// Top-level await: a missing MySQL fails the whole file loudly, never skips it.
const coord: Coordinator = await startCoordinator();
const admin: CoordinatorClient = coord.client();
after(async () => {
  await coord.stop();
});

// The coordinator's database refuses new receipts as a read-only server
// does (1290, a demoted primary): ReportObservation answers UNAVAILABLE
// (DATABASE_UNAVAILABLE) while everything else is served.
const refuseReceipts = `CREATE TRIGGER test_refuse_receipts BEFORE INSERT ON refund_observations FOR EACH ROW
SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1290, MESSAGE_TEXT = 'The MariaDB server is running with the --read-only option'`;

function worker(opts: Partial<WorkerOptions> & Pick<WorkerOptions, "provider" | "receiptSpool">, events: WorkerEvent[]): Worker {
  return new Worker({
    client: admin,
    workerId: "spooler",
    leaseMs: 30_000,
    providerCallTimeoutMs: 20_000,
    idlePollMs: 50,
    writeRetries: 2,
    writeRetryDelayMs: 10,
    handlers: { refund: () => Promise.reject(new Error("not expected")), reconcile: () => Promise.reject(new Error("not expected")) },
    onEvent: (e) => events.push(e),
    ...opts,
  });
}

// goStale runs worker A until its provider call hangs, lets B take the job
// over and complete it, and returns A and a release handing A the answer: A's
// write-back is then stale and it files the answer (R15).
async function goStale(spool: string, events: WorkerEvent[], opts: Partial<WorkerOptions> = {}): Promise<{
  job: Job; a: Worker; release: () => void;
}> {
  const req = refund();
  const job = (await admin.enqueueRefund(req)).job!;
  let release!: (r: ProviderResult) => void;
  const held = new Promise<ProviderResult>((resolve) => (release = resolve));
  const a = worker({ workerId: "A", provider: req.provider!, receiptSpool: spool, handlers: {
    refund: () => held, reconcile: () => Promise.reject(new Error("not expected")) }, ...opts }, events);
  a.start();
  await eventually(() => assert.ok(events.some((e) => e.type === "claimed")));
  await coord.expireLease(job.id);
  const b = (await admin.claim({ workerId: "B", maxJobs: 1, provider: req.provider! })).jobs[0]!;
  await admin.complete({ jobId: job.id, attempt: b.attempt, leaseToken: b.leaseToken, providerRefundId: "re_late" });
  return { job, a, release: () => release({ kind: "succeeded", providerRefundId: "re_late" }) };
}

async function receiptsOf(job: Job) {
  const got = await admin.getJob({ job: { case: "jobId", value: job.id } });
  assert.equal(got.job!.state, JobState.SUCCEEDED);
  return got.observations;
}

function assertOneVerifiedReceipt(obs: Awaited<ReturnType<typeof receiptsOf>>): void {
  assert.equal(obs.length, 1, "exactly one receipt on file");
  const o = obs[0]!;
  assert.equal(o.source, "worker:A", "the receipt keeps its own source");
  assert.equal(o.reportedAttempt, 1n);
  assert.equal(o.jobAttempt, 2n);
  assert.equal(o.outcome, ObservationOutcome.SUCCEEDED);
  assert.equal(o.providerRefundId, "re_late");
  assert.equal(o.attemptVerified, true, "filed with the grant's lease token (R25)");
}

describe("receipt spool through the Worker (R28)", () => {
  it("spools a receipt the coordinator cannot take; the next worker files it before claiming, once", async () => {
    const spool = testSpool("A");
    const events: WorkerEvent[] = [];
    const { job, a, release } = await goStale(spool, events);
    await coord.sql(refuseReceipts);
    try {
      release();
      await eventually(() => assert.ok(events.some((e) => e.type === "spooled")), 20_000);
    } finally {
      release();
      await a.stop(); // its last pass is refused too: the receipt stays spooled
      await coord.sql("DROP TRIGGER IF EXISTS test_refuse_receipts");
    }
    assert.ok(events.some((e) => e.type === "stale"));
    assert.ok(!events.some((e) => e.type === "observation_failed"));
    const lines = readFileSync(spool, "utf8").trim().split("\n");
    assert.equal(lines.length, 1);
    const line = JSON.parse(lines[0]!) as Record<string, string>;
    assert.equal(line["operation_key"], job.operationKey);
    assert.equal(line["attempt"], "1");
    assert.equal(line["source"], "worker:A");
    const token = line["lease_token"]!;
    assert.ok(token.length >= 22);
    const rendered = JSON.stringify(events, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v));
    assert.ok(!rendered.includes(token), "no event carries the lease token");
    assert.deepEqual(await receiptsOf(job), []);

    // The next worker on the spool: it files the receipt before its first
    // claim, or before it opens its worker stream.
    let claims = 0;
    let claimsAtRefile = -1;
    const next: WorkerEvent[] = [];
    const counting = coord.client({ interceptors: [(call) => async (req) => {
      if (req.method.name === "Claim" || req.method.name === "Work") claims++;
      return call(req);
    }] });
    const a2 = worker({ client: counting, workerId: "A2", provider: "p-nothing-here", receiptSpool: spool,
      onEvent: (e) => {
        next.push(e);
        if (e.type === "refiled") claimsAtRefile = claims;
      } }, next);
    a2.start();
    try {
      await eventually(() => assert.ok(next.some((e) => e.type === "refiled")), 20_000);
    } finally {
      await a2.stop();
    }
    assert.equal(claimsAtRefile, 0, "refiled before the first claim");
    const refiled = next.find((e) => e.type === "refiled");
    assert.ok(refiled && refiled.type === "refiled" && !refiled.duplicate && refiled.attemptVerified);
    assertOneVerifiedReceipt(await receiptsOf(job));
    assert.ok(!existsSync(spool), "an empty spool is removed on stop");

    // A crash after filing and before the rewrite leaves the receipt in the
    // spool: filed again, kept once.
    writeFileSync(spool, `${lines[0]}\n`, { mode: 0o600 });
    const again: WorkerEvent[] = [];
    const a3 = worker({ workerId: "A3", provider: "p-nothing-here", receiptSpool: spool }, again);
    a3.start();
    try {
      await eventually(() => assert.ok(again.some((e) => e.type === "refiled")), 20_000);
    } finally {
      await a3.stop();
    }
    const dup = again.find((e) => e.type === "refiled");
    assert.ok(dup && dup.type === "refiled" && dup.duplicate, "the coordinator deduplicates the refile");
    assertOneVerifiedReceipt(await receiptsOf(job));
  });

  it("does not spool a permanent refusal, and drops one met when refiling", async () => {
    const spool = testSpool("A");
    const events: WorkerEvent[] = [];
    // Refused as a unary call and on the worker stream alike.
    const tap = new WorkTap();
    tap.refuse("reportObservation", 100, Code.PermissionDenied);
    const denied = coord.client({ interceptors: [(call) => async (req) => {
      if (req.method.name === "ReportObservation") throw new ConnectError("test: not a worker", Code.PermissionDenied);
      return call(req);
    }, tap.interceptor] });
    const { a, release } = await goStale(spool, events, { client: denied });
    try {
      release();
      await eventually(() => assert.ok(events.some((e) => e.type === "observation_failed")), 20_000);
    } finally {
      release();
      await a.stop();
    }
    assert.ok(!events.some((e) => e.type === "spooled"));
    assert.ok(!existsSync(spool), "nothing was spooled");
    assert.equal(tap.calls("reportObservation").length, 1, "refused once on the stream, never repeated");

    // A spooled receipt of a job this coordinator does not know: NOT_FOUND is
    // final, the receipt is reported and leaves the spool.
    writeFileSync(spool, `${encodeReceipt({
      jobId: 999_999n, operationKey: "no-such-refund", attempt: 1n, leaseToken: "", source: "worker:gone",
      outcome: ObservationOutcome.SUCCEEDED, providerRefundId: "re_x", providerEventId: "", detail: "", spooledAt: "",
    })}\n`, { mode: 0o600 });
    const next: WorkerEvent[] = [];
    const w = worker({ provider: "p-nothing-here", receiptSpool: spool }, next);
    w.start();
    try {
      await eventually(() => assert.ok(next.some((e) => e.type === "observation_failed")), 20_000);
    } finally {
      await w.stop();
    }
    const failed = next.find((e) => e.type === "observation_failed");
    assert.ok(failed && failed.type === "observation_failed" && failed.error.code === Code.NotFound);
    assert.ok(!existsSync(spool));
  });

  it("refuses a second worker on one spool until the first lets go", async () => {
    const spool = testSpool("w");
    const first = worker({ provider: "p-nothing-here", receiptSpool: spool }, []);
    assert.throws(() => worker({ provider: "p-nothing-here", receiptSpool: spool }, []), ReceiptSpoolLockedError);
    await first.stop(); // never started: releases the spool
    const second = worker({ provider: "p-nothing-here", receiptSpool: spool }, []);
    await second.stop();
    const off = worker({ provider: "p-nothing-here", receiptSpool: "off" }, []);
    assert.equal(off.receiptSpool, undefined);
    await off.stop();
  });
});
