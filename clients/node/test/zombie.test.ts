// T1 and T2 from Node: a zombie client writes late after a takeover, and a
// late holder whose lease ran out while nobody took over.

import assert from "node:assert/strict";
import { after, describe, it } from "node:test";

import { inspect } from "node:util";

import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";

import {
  JobState,
  NextAction,
  ObservationOutcome,
  StaleAttemptError,
  Worker,
  grantFingerprint,
  type ClaimResponse,
  type ClaimedJob,
  type ProviderResult,
  type WorkerEvent,
} from "../src/index.js";
import { eventually, refund, startCoordinator, testSpool, type Coordinator } from "./harness.js";
import { WorkTap, methodOf } from "./work-tap.js";


// Top-level await: a missing MySQL fails the whole file loudly, never skips it.
const coord: Coordinator = await startCoordinator();
after(async () => {
  await coord.stop();
});

describe("zombie writes", () => {
  it("TestZombieLateWritesAffectNothing_T1: stale complete, reschedule and escalate are rejected and the receipt is filed", async () => {
    const zombie = coord.client();
    const b = coord.client();
    const req = refund();
    const job = (await zombie.enqueueRefund(req)).job!;
    const a = (await zombie.claim({ workerId: "zombie-a", maxJobs: 1, provider: req.provider!, leaseDuration: { seconds: 1n } })).jobs[0]!;
    assert.equal(a.attempt, 1n);

    // A hangs on the provider; its lease runs out (test data, never a clock
    // move) and B takes over.
    await coord.expireLease(job.id);
    const taken = (await b.claim({ workerId: "worker-b", maxJobs: 1, provider: req.provider! })).jobs;
    assert.equal(taken.length, 1);
    const bj = taken[0]!;
    assert.equal(bj.attempt, 2n);
    assert.equal(bj.takeover, true);
    assert.equal(bj.nextAction, NextAction.RECONCILE);
    assert.equal(bj.job!.operationKey, req.operationKey, "R1: the key never changes");
    assert.deepEqual(timestampDate(bj.resendDeadline!), timestampDate(a.resendDeadline!), "R22: the window is the job's");

    // B's reconcile finds the refund made and completes under attempt 2.
    await b.complete({ jobId: job.id, attempt: bj.attempt, leaseToken: bj.leaseToken, providerRefundId: "re_B" });

    // A wakes up: every late write carries attempt 1 and changes nothing.
    const late: Array<[string, () => Promise<unknown>]> = [
      ["complete", () => zombie.complete({ jobId: job.id, attempt: a.attempt, leaseToken: a.leaseToken, providerRefundId: "re_A" })],
      ["reschedule", () => zombie.reschedule({ jobId: job.id, attempt: a.attempt, leaseToken: a.leaseToken, when: { case: "delay", value: { seconds: 5n } }, reason: "socket timeout" })],
      ["escalate", () => zombie.escalate({ jobId: job.id, attempt: a.attempt, leaseToken: a.leaseToken, reason: "confused" })],
    ];
    for (const [name, write] of late) {
      await assert.rejects(write(), (err) => {
        assert.ok(err instanceof StaleAttemptError, `${name}: ${String(err)}`);
        assert.equal(err.code, Code.FailedPrecondition);
        assert.equal(err.reason, "STALE_ATTEMPT");
        assert.equal(err.jobId, job.id);
        assert.equal(err.attempt, 1n);
        assert.equal(err.currentAttempt, 2n);
        assert.equal(err.currentState, JobState.SUCCEEDED);
        return true;
      });
    }

    // R15: A files what it finally heard; kept, never applied.
    const obs = await zombie.reportObservation({
      job: { case: "jobId", value: job.id },
      attempt: a.attempt,
      source: "worker:zombie-a",
      outcome: ObservationOutcome.SUCCEEDED,
      providerRefundId: "re_A",
    });
    assert.equal(obs.duplicate, false);
    assert.equal(obs.observation!.reportedAttempt, 1n);
    assert.equal(obs.observation!.jobAttempt, 2n);

    const got = await b.getJob({ job: { case: "jobId", value: job.id } });
    assert.equal(got.job!.state, JobState.SUCCEEDED);
    assert.equal(got.job!.attempt, 2n);
    assert.equal(got.job!.providerRefundId, "re_B");
    // R34: a receipt of another refund id after the success changes no state
    // but puts the job on the attention list, an entry of its own in the
    // history.
    assert.deepEqual(got.events.map((e) => [e.kind, e.attempt]), [
      ["enqueued", 0n],
      ["claimed", 1n],
      ["taken_over", 2n],
      ["completed", 2n],
      ["attention", 2n],
    ]);
    assert.deepEqual(got.events.slice(1, 4).map((e) => e.workerId), ["zombie-a", "worker-b", "worker-b"]);
    assert.ok(got.job!.attentionSince !== undefined, "on the attention list");
    assert.match(got.job!.attentionReason, /^receipt_after_success/);
    assert.equal(got.observations.length, 1);
    assert.equal(got.observations[0]!.providerRefundId, "re_A");
  });

  it("TestLeaseExpiredNobodyTookOver_T2: a late complete still lands and nobody can take the job over (R8)", async () => {
    const c = coord.client();
    const req = refund();
    const job = (await c.enqueueRefund(req)).job!;
    const a = (await c.claim({ workerId: "slow-a", maxJobs: 1, provider: req.provider!, leaseDuration: { seconds: 1n } })).jobs[0]!;
    await new Promise((r) => setTimeout(r, 1_200)); // a real 1 s lease runs out
    const done = await c.complete({ jobId: job.id, attempt: a.attempt, leaseToken: a.leaseToken, providerRefundId: "re_late" });
    assert.equal(done.replayed, false);
    assert.equal(done.job!.state, JobState.SUCCEEDED);
    const b = await c.claim({ workerId: "worker-b", maxJobs: 10, provider: req.provider! });
    assert.equal(b.jobs.length, 0);
  });

  it("TestWorkerZombieFilesObservationAndNeverRetries_T1_R15_R25: the Worker's stale write becomes a verified observation", async () => {
    const req = refund();
    const calls: string[] = [];
    const granted: string[] = []; // the zombie's lease tokens, as Claim returned them
    const sentTokens = new Map<string, string>(); // method → the lease token it carried
    // The Worker's calls and grants on its worker stream, as the unary ones.
    const tap = new WorkTap();
    tap.onSent = (m) => {
      if (m.kind.case === "call" && m.kind.value.call.case !== undefined) {
        const method = methodOf(m.kind.value.call.case);
        calls.push(method);
        sentTokens.set(method, (m.kind.value.call.value as { leaseToken?: string }).leaseToken ?? "");
      }
    };
    tap.onReceived = (m) => {
      if (m.kind.case === "grant") {
        granted.push(...m.kind.value.jobs.map((j) => j.leaseToken));
      }
    };
    const zombieClient = coord.client({
      interceptors: [(next) => async (r) => {
        calls.push(r.method.name);
        if (!r.stream && r.method.name !== "Claim") {
          sentTokens.set(r.method.name, (r.message as unknown as { leaseToken: string }).leaseToken);
        }
        const res = await next(r);
        if (r.method.name === "Claim" && !res.stream) {
          granted.push(...(res.message as unknown as ClaimResponse).jobs.map((j) => j.leaseToken));
        }
        return res;
      }, tap.interceptor],
    });
    const b = coord.client();
    const job = (await b.enqueueRefund(req)).job!;

    let release!: (r: ProviderResult) => void;
    const held = new Promise<ProviderResult>((resolve) => (release = resolve));
    const events: WorkerEvent[] = [];
    const worker = new Worker({
      client: zombieClient,
      workerId: "zombie-worker",
      receiptSpool: testSpool("zombie-worker"),
      provider: req.provider!,
      leaseMs: 30_000,
      providerCallTimeoutMs: 20_000,
      idlePollMs: 50,
      handlers: {
        refund: () => held, // hangs on the provider
        reconcile: () => Promise.reject(new Error("not expected")),
      },
      onEvent: (e) => events.push(e),
    });
    worker.start();
    let bj!: ClaimedJob;
    try {
      await eventually(() => assert.ok(events.some((e) => e.type === "claimed")));

      await coord.expireLease(job.id);
      bj = (await b.claim({ workerId: "worker-b", maxJobs: 1, provider: req.provider! })).jobs[0]!;
      assert.equal(bj.attempt, 2n);
      await b.complete({ jobId: job.id, attempt: bj.attempt, leaseToken: bj.leaseToken, providerRefundId: "re_B" });

      // The provider finally answers the zombie.
      release({ kind: "succeeded", providerRefundId: "re_A", providerEventId: "evt_A" });
      await eventually(() => assert.ok(events.some((e) => e.type === "observation")));
    } finally {
      release({ kind: "succeeded", providerRefundId: "re_A", providerEventId: "evt_A" });
      await worker.stop(); // also on failure: a running worker would keep the test process alive
    }

    const stale = events.find((e) => e.type === "stale");
    assert.ok(stale && stale.type === "stale" && stale.error instanceof StaleAttemptError);
    assert.equal(stale.error.currentAttempt, 2n);
    assert.equal(calls.filter((m) => m === "Complete").length, 1, "a stale write is never retried");
    assert.ok(!events.some((e) => e.type === "written"));

    const got = await b.getJob({ job: { case: "jobId", value: job.id } });
    assert.equal(got.job!.state, JobState.SUCCEEDED);
    assert.equal(got.job!.providerRefundId, "re_B");
    assert.equal(got.events.filter((e) => e.kind === "completed").length, 1);
    assert.equal(got.observations.length, 1);
    const o = got.observations[0]!;
    assert.equal(o.source, "worker:zombie-worker");
    assert.equal(o.outcome, ObservationOutcome.SUCCEEDED);
    assert.equal(o.providerRefundId, "re_A");
    assert.equal(o.providerEventId, "evt_A");
    assert.equal(o.reportedAttempt, 1n);
    assert.equal(o.jobAttempt, 2n);

    // R25: the zombie's write-back and its receipt carried its own grant's
    // token; the coordinator verified the receipt with it.
    assert.equal(granted.length, 1);
    const zombieToken = granted[0]!;
    assert.equal(sentTokens.get("Complete"), zombieToken);
    assert.equal(sentTokens.get("ReportObservation"), zombieToken);
    assert.equal(o.attemptVerified, true, "the receipt came with the lease token of attempt 1");
    const filed = events.find((e) => e.type === "observation");
    assert.ok(filed && filed.type === "observation" && filed.attemptVerified);
    // Its events name the grant by fingerprint, never by token.
    for (const e of events.filter((e) => e.type !== "claim_failed")) {
      assert.ok("grant" in e && e.grant === grantFingerprint(zombieToken), `${e.type}: grant`);
    }
    assert.notEqual(grantFingerprint(zombieToken), grantFingerprint(bj.leaseToken));
    const rendered = JSON.stringify(events, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v)) +
      inspect(events, { depth: Infinity, showHidden: true });
    assert.ok(!rendered.includes(zombieToken) && !rendered.includes(bj.leaseToken), "no lease token in the worker's events");
  });
});
