// R25, a grant is a capability: every claim or takeover mints a lease token,
// and a write-back needs the token of the job's current grant, not just its
// attempt. Against a real coordinator on real MariaDB: the forged write of a
// stale worker that "retries with the current attempt", an attempt the
// database never granted, observations verified by the token, and the Worker
// sending the token while keeping it out of everything it emits.

import assert from "node:assert/strict";
import { after, describe, it } from "node:test";
import { inspect } from "node:util";

import { Code, type Interceptor } from "@connectrpc/connect";

import {
  FencedWriteError,
  JobState,
  NextAction,
  ObservationOutcome,
  StaleAttemptError,
  Worker,
  grantFingerprint,
  type ClaimResponse,
  type ClaimedJob,
  type CoordinatorClient,
  type Job,
  type WorkerEvent,
  type WorkerJob,
} from "../src/index.js";
import { eventually, refund, startCoordinator, testSpool, type Coordinator } from "./harness.js";
import { WorkTap, methodOf } from "./work-tap.js";

// Top-level await: a missing MySQL fails the whole file loudly, never skips it.
const coord: Coordinator = await startCoordinator();
const client: CoordinatorClient = coord.client();
after(async () => {
  await coord.stop();
});

const tokenShape = /^[A-Za-z0-9_-]{22}$/;

async function claimOne(c: CoordinatorClient, worker: string, job: Job): Promise<ClaimedJob> {
  const resp = await c.claim({ workerId: worker, maxJobs: 1, provider: job.provider, leaseDuration: { seconds: 30n } });
  assert.equal(resp.jobs.length, 1, `${worker} claimed ${resp.jobs.length} jobs`);
  assert.equal(resp.jobs[0]!.job!.id, job.id);
  return resp.jobs[0]!;
}

/** everything renders a value the ways a logger might: JSON and util.inspect, all the way down. */
function everything(v: unknown): string {
  const json = JSON.stringify(v, (_k, x: unknown) => (typeof x === "bigint" ? x.toString() : x));
  return `${json}\n${inspect(v, { depth: Infinity, showHidden: true, getters: true })}`;
}

function assertSecret(haystack: string, tokens: string[], where: string): void {
  for (const t of tokens) {
    assert.ok(t.length > 0, "a token to look for");
    assert.ok(!haystack.includes(t), `${where} contains a lease token`);
  }
}

/** history lists the job's events as the database keeps them, with each grant's fingerprint. */
async function history(jobId: bigint): Promise<string[][]> {
  const rows = await coord.sql(
    `SELECT attempt, kind, worker_id, LOWER(HEX(LEFT(lease_token_hash, 6))) FROM refund_job_events WHERE job_id = ${jobId} ORDER BY id`,
  );
  return rows.split("\n").filter((l) => l !== "").map((l) => l.split("\t"));
}

async function ledgerRows(jobId: bigint): Promise<string> {
  return (await coord.sql(`SELECT provider_refund_id, attempt FROM refund_ledger WHERE job_id = ${jobId}`)).trim();
}

/** staleUnder checks a rejection: STALE_ATTEMPT naming where the job stands now, and no token in it. */
function staleUnder(currentAttempt: bigint, currentState: JobState, secrets: string[]) {
  return (err: unknown): boolean => {
    assert.ok(err instanceof StaleAttemptError, String(err));
    assert.ok(err instanceof FencedWriteError);
    assert.equal(err.code, Code.FailedPrecondition);
    assert.equal(err.reason, "STALE_ATTEMPT");
    assert.equal(err.currentAttempt, currentAttempt);
    assert.equal(err.currentState, currentState);
    assertSecret(everything(err) + err.message + JSON.stringify(err.metadata), secrets, "the error");
    return true;
  };
}

describe("lease tokens (R25)", () => {
  it("TestForgedWriteWithTheCurrentAttempt_R25: a stale worker retrying with the current attempt is STALE_ATTEMPT and writes nothing", async () => {
    const workerA = coord.client();
    const workerB = coord.client();
    const job = (await client.enqueueRefund(refund())).job!;

    // A claims attempt 1; its lease runs out (test data, never a clock move)
    // and B takes the job over under attempt 2.
    const a = await claimOne(workerA, "worker-a", job);
    assert.equal(a.attempt, 1n);
    assert.match(a.leaseToken, tokenShape);
    await coord.expireLease(job.id);
    const b = await claimOne(workerB, "worker-b", job);
    assert.equal(b.attempt, 2n);
    assert.equal(b.takeover, true);
    assert.equal(b.nextAction, NextAction.RECONCILE);
    assert.match(b.leaseToken, tokenShape);
    assert.notEqual(b.leaseToken, a.leaseToken, "every grant mints its own token");
    const secrets = [a.leaseToken, b.leaseToken];

    // The database's history keeps each grant's fingerprint, the same one
    // grantFingerprint computes (and the Go SDK, and the workers' logs).
    assert.match(grantFingerprint(a.leaseToken), /^[0-9a-f]{12}$/);
    assert.deepEqual(await history(job.id), [
      ["0", "enqueued", "", ""],
      ["1", "claimed", "worker-a", grantFingerprint(a.leaseToken)],
      ["2", "taken_over", "worker-b", grantFingerprint(b.leaseToken)],
    ]);

    // A's late write under its own attempt: stale, and the error tells it
    // the current attempt is 2.
    let told: StaleAttemptError | undefined;
    await assert.rejects(
      workerA.complete({ jobId: job.id, attempt: a.attempt, leaseToken: a.leaseToken, providerRefundId: "re_A" }),
      (err) => {
        staleUnder(2n, JobState.RUNNING, secrets)(err);
        told = err as StaleAttemptError;
        return true;
      },
    );
    assert.equal(told!.attempt, 1n);

    // A "retries with the current attempt" it was just told: with its own
    // token, and with none. Every write-back is refused the same way.
    const forged: Array<[string, () => Promise<unknown>]> = [
      ["complete with A's token", () =>
        workerA.complete({ jobId: job.id, attempt: told!.currentAttempt, leaseToken: a.leaseToken, providerRefundId: "re_A" })],
      ["complete without a token", () =>
        workerA.complete({ jobId: job.id, attempt: told!.currentAttempt, leaseToken: "", providerRefundId: "re_A" })],
      ["reschedule with A's token", () =>
        workerA.reschedule({ jobId: job.id, attempt: told!.currentAttempt, leaseToken: a.leaseToken, reason: "socket timeout" })],
      ["reschedule without a token", () =>
        workerA.reschedule({ jobId: job.id, attempt: told!.currentAttempt, leaseToken: "", reason: "socket timeout" })],
      ["escalate with A's token", () =>
        workerA.escalate({ jobId: job.id, attempt: told!.currentAttempt, leaseToken: a.leaseToken, reason: "confused" })],
      ["escalate without a token", () =>
        workerA.escalate({ jobId: job.id, attempt: told!.currentAttempt, leaseToken: "", reason: "confused" })],
    ];
    for (const [name, write] of forged) {
      await assert.rejects(write(), (err) => {
        assert.ok(err instanceof StaleAttemptError, `${name}: ${String(err)}`);
        assert.equal(err.attempt, 2n, name);
        return staleUnder(2n, JobState.RUNNING, secrets)(err);
      });
    }

    // Nothing was written: the job still runs under B, with no refund id and
    // no ledger row, and its history has no write-back.
    const held = await client.getJob({ job: { case: "jobId", value: job.id } });
    assert.equal(held.job!.state, JobState.RUNNING);
    assert.equal(held.job!.attempt, 2n);
    assert.equal(held.job!.workerId, "worker-b");
    assert.equal(held.job!.providerRefundId, "");
    assert.deepEqual(held.events.map((e) => e.kind), ["enqueued", "claimed", "taken_over"]);
    assert.equal(await ledgerRows(job.id), "");

    // B, the holder, completes; its repeat (a lost reply) is a replay.
    const done = await workerB.complete({ jobId: job.id, attempt: b.attempt, leaseToken: b.leaseToken, providerRefundId: "re_B" });
    assert.equal(done.replayed, false);
    assert.equal(done.job!.state, JobState.SUCCEEDED);
    const again = await workerB.complete({ jobId: job.id, attempt: b.attempt, leaseToken: b.leaseToken, providerRefundId: "re_B" });
    assert.equal(again.replayed, true);
    assert.equal(again.job!.providerRefundId, "re_B");

    // A replay needs the grant's token too: A copying B's write is stale.
    await assert.rejects(
      workerA.complete({ jobId: job.id, attempt: b.attempt, leaseToken: a.leaseToken, providerRefundId: "re_B" }),
      staleUnder(2n, JobState.SUCCEEDED, secrets),
    );

    const got = await client.getJob({ job: { case: "jobId", value: job.id } });
    assert.equal(got.job!.providerRefundId, "re_B");
    assert.deepEqual(got.events.map((e) => [e.kind, e.attempt, e.workerId]), [
      ["enqueued", 0n, ""],
      ["claimed", 1n, "worker-a"],
      ["taken_over", 2n, "worker-b"],
      ["completed", 2n, "worker-b"],
    ]);
    assert.equal(await ledgerRows(job.id), "re_B\t2");
    // The token is only ever in the claim's answer: not in GetJob, not in
    // the coordinator's logs.
    assertSecret(everything(got) + everything(held), secrets, "GetJob");
    assertSecret(JSON.stringify(coord.logs), secrets, "the coordinator's logs");
  });

  it("TestAttemptNeverGrantedIsStale_R25_R26: a write under an attempt the database never granted is STALE_ATTEMPT", async () => {
    // As after a lossy failover: the worker holds a grant this database has
    // no record of. Here, a guessed next attempt with a real token.
    const job = (await client.enqueueRefund(refund())).job!;
    const a = await claimOne(client, "worker-a", job);
    for (const attempt of [a.attempt + 1n, a.attempt + 5n]) {
      await assert.rejects(
        client.complete({ jobId: job.id, attempt, leaseToken: a.leaseToken, providerRefundId: "re_ghost" }),
        staleUnder(a.attempt, JobState.RUNNING, [a.leaseToken]),
      );
    }
    assert.equal((await client.getJob({ job: { case: "jobId", value: job.id } })).job!.state, JobState.RUNNING);
    const done = await client.complete({ jobId: job.id, attempt: a.attempt, leaseToken: a.leaseToken, providerRefundId: "re_real" });
    assert.equal(done.job!.state, JobState.SUCCEEDED);
  });

  it("TestObservationVerifiedByLeaseToken_R25_R15: a receipt with its grant's token is attemptVerified, one without is filed anyway", async () => {
    const job = (await client.enqueueRefund(refund())).job!;
    const a = await claimOne(client, "worker-a", job);
    await coord.expireLease(job.id);
    const b = await claimOne(client, "worker-b", job);

    const report = (n: string, attempt: bigint, leaseToken?: string) =>
      client.reportObservation({
        job: { case: "jobId", value: job.id },
        attempt,
        ...(leaseToken === undefined ? {} : { leaseToken }),
        source: `test:${n}`,
        outcome: ObservationOutcome.SUCCEEDED,
        providerRefundId: `re_${n}`,
        providerEventId: `evt_${n}`,
      });
    const verified = await report("a", a.attempt, a.leaseToken); // the stale holder of attempt 1, with its token
    assert.equal(verified.duplicate, false);
    assert.equal(verified.observation!.reportedAttempt, 1n);
    assert.equal(verified.observation!.jobAttempt, 2n);
    assert.equal(verified.observation!.attemptVerified, true);
    const unverified = await report("claims-a", a.attempt); // says attempt 1, shows nothing
    assert.equal(unverified.observation!.attemptVerified, false);
    const webhook = await report("webhook", 0n);
    assert.equal(webhook.observation!.attemptVerified, false);

    const got = await client.getJob({ job: { case: "jobId", value: job.id } });
    assert.deepEqual(got.observations.map((o) => [o.source, o.reportedAttempt, o.attemptVerified]), [
      ["test:a", 1n, true],
      ["test:claims-a", 1n, false],
      ["test:webhook", 0n, false],
    ]);
    assert.equal(got.job!.state, JobState.RUNNING, "R15: observations never change the job");
    assertSecret(everything(got), [a.leaseToken, b.leaseToken], "GetJob");
  });

  it("TestWorkerSendsTheLeaseToken_R25: every write-back carries the claim's token; no handler, event or log payload sees it", async () => {
    const provider = refund().provider!;
    const jobs: Job[] = [];
    for (let i = 0; i < 3; i++) {
      jobs.push((await client.enqueueRefund(refund({ provider }))).job!);
    }
    // What went over the wire, seen below the SDK: unary calls, and the
    // calls and grants of the worker stream, the Worker's by default.
    const granted = new Map<bigint, string>(); // job id → token from Claim or a stream's grant
    const sent: Array<{ method: string; jobId: bigint; attempt: bigint; leaseToken: string }> = [];
    const tap = new WorkTap();
    tap.onSent = (m) => {
      if (m.kind.case === "call" && m.kind.value.call.case !== "renewLeases" && m.kind.value.call.case !== undefined) {
        const c = m.kind.value.call;
        const r = c.value as { jobId?: bigint; job?: { value?: unknown }; attempt: bigint; leaseToken: string };
        sent.push({ method: methodOf(c.case), jobId: r.jobId ?? (r.job?.value as bigint), attempt: r.attempt, leaseToken: r.leaseToken });
      }
    };
    tap.onReceived = (m) => {
      for (const c of m.kind.case === "grant" ? m.kind.value.jobs : []) {
        granted.set(c.job!.id, c.leaseToken);
      }
    };
    const wire: Interceptor = (next) => async (req) => {
      if (req.method.name !== "Claim" && !req.stream) {
        const m = req.message as unknown as { jobId?: bigint; job?: { value?: unknown }; attempt: bigint; leaseToken: string };
        sent.push({ method: req.method.name, jobId: m.jobId ?? (m.job?.value as bigint), attempt: m.attempt, leaseToken: m.leaseToken });
      }
      const res = await next(req);
      if (req.method.name === "Claim" && !res.stream) {
        for (const c of (res.message as unknown as ClaimResponse).jobs) {
          granted.set(c.job!.id, c.leaseToken);
        }
      }
      return res;
    };
    const seen: WorkerJob[] = [];
    const events: WorkerEvent[] = [];
    let n = 0;
    const worker = new Worker({
      client: coord.client({ interceptors: [wire, tap.interceptor] }),
      workerId: "node-token-worker",
      receiptSpool: testSpool("node-token-worker"),
      provider,
      concurrency: 2,
      leaseMs: 30_000,
      providerCallTimeoutMs: 5_000,
      idlePollMs: 50,
      handlers: {
        async refund(job) {
          seen.push(job);
          // One refund pending: a Reschedule carries the token too.
          return ++n === 1 ? { kind: "pending", retryAfterMs: 0 } : { kind: "succeeded", providerRefundId: `re_${job.jobId}` };
        },
        async reconcile(job) {
          seen.push(job);
          return { kind: "succeeded", providerRefundId: `re_${job.jobId}` };
        },
      },
      onEvent: (e) => events.push(e),
    });
    worker.start();
    try {
      for (const j of jobs) {
        await eventually(async () => {
          assert.equal((await client.getJob({ job: { case: "jobId", value: j.id } })).job!.state, JobState.SUCCEEDED);
        });
      }
    } finally {
      await worker.stop(); // also on failure: a running worker would keep the test process alive
    }

    // The wire: each write-back carried a token minted for that very job.
    const writes = sent.filter((s) => ["Complete", "Reschedule", "Escalate"].includes(s.method));
    assert.deepEqual(writes.map((w) => w.method).sort(), ["Complete", "Complete", "Complete", "Reschedule"]);
    assert.equal(tap.calls("complete").length + tap.calls("reschedule").length, 4, "on the worker stream, the Worker's default");
    for (const w of writes) {
      assert.match(w.leaseToken, tokenShape, `${w.method} of job ${w.jobId} carried a token`);
    }
    const tokens = new Set(writes.map((w) => w.leaseToken));
    assert.equal(tokens.size, 4, "one grant per write-back: three claims and the pending job's reconcile");
    const byGrant = new Map<string, { jobId: bigint; attempt: bigint }>();
    for (const j of jobs) {
      for (const [attempt, , , fp] of (await history(j.id)).filter((h) => h[1] === "claimed" || h[1] === "taken_over")) {
        byGrant.set(fp!, { jobId: j.id, attempt: BigInt(attempt!) });
      }
    }
    for (const w of writes) {
      // The write's (job, attempt, token) is a grant the history recorded.
      assert.deepEqual(byGrant.get(grantFingerprint(w.leaseToken)), { jobId: w.jobId, attempt: w.attempt }, `${w.method} of job ${w.jobId}`);
    }
    const secrets = [...tokens, ...granted.values()];

    // Handlers get the claim without its token, and its fingerprint.
    assert.equal(seen.length, 4);
    for (const job of seen) {
      assert.ok(!("leaseToken" in job.claimed), "a handler's claim has no lease token");
      assert.match(job.grant, /^[0-9a-f]{12}$/);
      assert.ok(byGrant.has(job.grant), "the handler's grant is one the history recorded");
      assert.equal(job.claimed.attempt, job.attempt);
      assert.equal(job.claimed.job!.id, job.jobId);
    }
    assertSecret(everything(seen.map(({ signal: _s, ...rest }) => rest)), secrets, "what handlers saw");

    // Events name the grant by its fingerprint, and never hold the token,
    // however they are logged.
    const jobEvents = events.filter((e) => e.type !== "claim_failed");
    assert.deepEqual([...new Set(jobEvents.map((e) => e.type))].sort(), ["claimed", "written"]);
    for (const e of jobEvents) {
      assert.ok("grant" in e && byGrant.get(e.grant)?.jobId === e.jobId && byGrant.get(e.grant)?.attempt === e.attempt,
        `${e.type} of job ${"jobId" in e ? e.jobId : "?"}: grant ${"grant" in e ? e.grant : "missing"}`);
    }
    assertSecret(everything(events), secrets, "the worker's events");
  });
});
