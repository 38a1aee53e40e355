// R27 through the Worker, against a real coordinator on MariaDB: a worker
// renews the leases of the jobs whose handlers run, in one RenewLeases call
// per tick, so a handler longer than the lease is never taken over; a grant
// lost meanwhile aborts the handler's signal with a GrantLostError, and what
// the handler still returns is refused by the fence and filed as an
// observation (R15); GRANT_TOO_OLD and failed renewals abort nothing (R8).

import assert from "node:assert/strict";
import { inspect } from "node:util";
import { describe, it } from "node:test";

import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import {
  GrantLostError,
  GrantTooOldError,
  JobState,
  ObservationOutcome,
  Reason,
  StaleAttemptError,
  Worker,
  type ClaimResponse,
  type ClaimedJob,
  type CoordinatorClient,
  type Handlers,
  type Job,
  type ProviderResult,
  type WorkerEvent,
  type WorkerOptions,
} from "../src/index.js";
import { eventually, refund, startCoordinators, testSpool, type Coordinator } from "./harness.js";
import { WorkTap, statusBytes } from "./work-tap.js";

// Top-level await: a missing MySQL fails the whole file loudly, never skips it.
// The first coordinator's metrics show what it saw; the second lets one grant
// live 2 s (--max-grant-age).
const [coord, short] = await startCoordinators(["--metrics-listen", "127.0.0.1:0"], ["--max-grant-age", "2s"]);
const admin: CoordinatorClient = coord.client();
const shortAdmin: CoordinatorClient = short.client();

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
}

/** renewedByCoordinator reads jobfence_lease_renewals_total{result="renewed"} from the coordinator's metrics. */
async function renewedByCoordinator(c: Coordinator): Promise<number> {
  let listen = "";
  await eventually(() => {
    const rec = c.logs.find((r) => r["msg"] === "metrics serving");
    assert.ok(rec, "the coordinator logged its metrics address");
    listen = String(rec["listen"]);
  });
  const text = await (await fetch(`http://${listen}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
  const m = /^jobfence_lease_renewals_total\{result="renewed"\} (\S+)$/m.exec(text);
  return m ? Number(m[1]) : 0;
}

/** RenewCall is one RenewLeases call a worker's client made. */
interface RenewCall {
  at: number;
  grants: Array<{ jobId: bigint; attempt: bigint; leaseToken: string }>;
}

/**
 * watchedClient records the worker's RenewLeases calls and the lease tokens
 * its grants carried, as unary calls and on the worker stream (the Worker's
 * default); fail(n) makes the next n RenewLeases calls fail with
 * UNAVAILABLE, as a coordinator that cannot be reached would.
 */
function watchedClient(c: Coordinator): { client: CoordinatorClient; renewals: RenewCall[]; tokens: string[]; fail: (n: number) => void } {
  const renewals: RenewCall[] = [];
  const tokens: string[] = [];
  let failing = 0;
  const record = (grants: RenewCall["grants"]): void => {
    renewals.push({ at: performance.now(), grants: grants.map((g) => ({ jobId: g.jobId, attempt: g.attempt, leaseToken: g.leaseToken })) });
  };
  const tap = new WorkTap();
  tap.onSent = (m) => {
    if (m.kind.case === "call" && m.kind.value.call.case === "renewLeases") {
      record(m.kind.value.call.value.grants);
    }
  };
  tap.onReceived = (m) => {
    if (m.kind.case === "grant") {
      tokens.push(...m.kind.value.jobs.map((j) => j.leaseToken));
    }
  };
  tap.refusal = (call) => {
    if (call.call.case !== "renewLeases" || failing <= 0) {
      return undefined;
    }
    failing--;
    return statusBytes(Code.Unavailable, "test: coordinator unreachable");
  };
  const client = c.client({
    interceptors: [(next) => async (req) => {
      if (req.method.name === "RenewLeases" && !req.stream) {
        record((req.message as unknown as { grants: RenewCall["grants"] }).grants);
        if (failing > 0) {
          failing--;
          throw new ConnectError("test: coordinator unreachable", Code.Unavailable);
        }
      }
      const res = await next(req);
      if (req.method.name === "Claim" && !res.stream) {
        tokens.push(...(res.message as unknown as ClaimResponse).jobs.map((j) => j.leaseToken));
      }
      return res;
    }, tap.interceptor],
  });
  return { client, renewals, tokens, fail: (n) => (failing = n) };
}

function newWorker(opts: Partial<WorkerOptions> & Pick<WorkerOptions, "client" | "handlers" | "provider" | "workerId">, events: WorkerEvent[]): Worker {
  return new Worker({
    leaseMs: 2_000,
    providerCallTimeoutMs: 20_000, // longer than the lease: renewal keeps it (R27)
    idlePollMs: 50,
    claimWaitMs: 0,
    writeRetryDelayMs: 20,
    receiptSpool: testSpool(opts.workerId),
    onEvent: (e) => events.push(e),
    ...opts,
  });
}

const notExpected: Handlers["reconcile"] = () => Promise.reject(new Error("not expected"));

async function getJob(c: CoordinatorClient, id: bigint) {
  return c.getJob({ job: { case: "jobId", value: id } });
}

function kinds(got: Awaited<ReturnType<typeof getJob>>): Array<[string, bigint]> {
  return got.events.map((e) => [e.kind, e.attempt]);
}

/** noToken asserts that no event carries one of the lease tokens (R25), in any rendering. */
function assertNoToken(events: WorkerEvent[], tokens: string[]): void {
  assert.ok(tokens.length > 0);
  const rendered = JSON.stringify(events, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v)) +
    inspect(events, { depth: Infinity, showHidden: true });
  for (const t of tokens) {
    assert.ok(!rendered.includes(t), "no event carries a lease token");
  }
}

describe("lease renewal through the Worker (R27)", () => {
  it("TestWorkerRenewsLongHandler_R27: a 2 s lease and a 6 s handler finish under the first grant, with no takeover", async () => {
    const req = refund();
    const job = (await admin.enqueueRefund(req)).job!;
    const { client, renewals, tokens } = watchedClient(coord);
    const renewedBefore = await renewedByCoordinator(coord);
    const events: WorkerEvent[] = [];
    let returnedAt = 0;
    let aborted = false;
    const worker = newWorker({
      client,
      workerId: "renewer",
      provider: req.provider!,
      handlers: {
        async refund(j) {
          j.signal.addEventListener("abort", () => (aborted = true));
          await sleep(6_000); // three leases long
          returnedAt = performance.now();
          return { kind: "succeeded", providerRefundId: "re_long" };
        },
        reconcile: notExpected,
      },
    }, events);
    // A rival ready to take the job over the moment its lease runs out (R6).
    const rivalCalls: string[] = [];
    const rival = newWorker({
      client: admin,
      workerId: "rival",
      provider: req.provider!,
      handlers: {
        refund: async (j) => (rivalCalls.push(`refund ${j.attempt}`), { kind: "not_sent", reason: "rival" }),
        reconcile: async (j) => (rivalCalls.push(`reconcile ${j.attempt}`), { kind: "not_found" }),
      },
    }, []);
    worker.start();
    let claimed!: Job;
    let leaseAtClaim!: Date;
    try {
      await eventually(() => assert.ok(events.some((e) => e.type === "claimed")));
      rival.start();
      const held = await getJob(admin, job.id);
      claimed = held.job!;
      leaseAtClaim = timestampDate(claimed.leaseUntil!);
      await sleep(3_000);
      // Half way: still the first grant, its lease moved on (the database's clock, R12).
      const mid = (await getJob(admin, job.id)).job!;
      assert.deepEqual([JobState[mid.state], mid.attempt], ["RUNNING", 1n], `job ${job.id}, last reason ${mid.lastReason}`);
      assert.ok(timestampDate(mid.leaseUntil!).getTime() > leaseAtClaim.getTime() + 1_000,
        `lease until ${timestampDate(mid.leaseUntil!).toISOString()}, claimed until ${leaseAtClaim.toISOString()}`);
      await eventually(async () => assert.equal((await getJob(admin, job.id)).job!.state, JobState.SUCCEEDED), 10_000);
    } finally {
      await worker.stop();
      await rival.stop();
    }

    const got = await getJob(admin, job.id);
    assert.equal(got.job!.attempt, 1n, "the attempt stays 1: a renewal never bumps it (R27)");
    assert.equal(got.job!.providerRefundId, "re_long");
    assert.deepEqual(kinds(got), [["enqueued", 0n], ["claimed", 1n], ["completed", 1n]], "one claim, no taken_over");
    assert.deepEqual(rivalCalls, [], "the rival never got the job");
    assert.equal(aborted, false);
    assert.ok(!events.some((e) => e.type === "grant_lost" || e.type === "grant_too_old" || e.type === "stale"));

    // Renewed about every third of the lease, each call carrying the grant
    // as claimed: attempt 1 and its token (R25); none after the handler returned.
    assert.ok(renewals.length >= 6, `${renewals.length} RenewLeases calls in 6 s with a 2 s lease`);
    for (const r of renewals) {
      assert.deepEqual(r.grants, [{ jobId: job.id, attempt: 1n, leaseToken: tokens[0]! }]);
      assert.ok(r.at <= returnedAt, "no renewal after the handler returned");
    }
    const gaps = renewals.slice(1).map((r, i) => r.at - renewals[i]!.at);
    const typical = median(gaps);
    assert.ok(typical > 540 && typical < 900, `gaps between renewals, a third of 2 s ±10 %: ${gaps.map(Math.round).join(", ")}`);
    // A call still in flight when the handler returned is answered, and the
    // answer ignored: the job is no longer held.
    const renewed = events.filter((e) => e.type === "renewed").length;
    assert.ok(renewed === renewals.length || renewed === renewals.length - 1, `${renewed} renewed events, ${renewals.length} calls`);
    assert.ok((await renewedByCoordinator(coord)) - renewedBefore >= renewed, "the coordinator renewed every one");
    assertNoToken(events, tokens);
  });

  it("TestWorkerRenewsHeldJobsInOneCall_R27: the jobs a worker holds are renewed together, one RenewLeases call per tick", async () => {
    const provider = refund().provider!;
    const jobs: Job[] = [];
    for (let i = 0; i < 3; i++) {
      jobs.push((await admin.enqueueRefund(refund({ provider }))).job!);
    }
    const { client, renewals } = watchedClient(coord);
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    const events: WorkerEvent[] = [];
    const worker = newWorker({
      client,
      workerId: "batcher",
      provider,
      concurrency: 3,
      handlers: {
        refund: async (j) => (await gate, { kind: "succeeded", providerRefundId: `re_${j.jobId}` }),
        reconcile: notExpected,
      },
    }, events);
    worker.start();
    try {
      await eventually(() => assert.equal(renewals.length >= 2, true), 10_000);
    } finally {
      open();
      await worker.stop();
    }
    const ids = jobs.map((j) => j.id).sort();
    for (const r of renewals.slice(0, 2)) {
      assert.deepEqual(r.grants.map((g) => g.jobId).sort(), ids, "every held job in the one call");
    }
    for (const j of jobs) {
      const got = await getJob(admin, j.id);
      assert.deepEqual(kinds(got), [["enqueued", 0n], ["claimed", 1n], ["completed", 1n]]);
    }
  });

  it("TestWorkerGrantLostAbortsHandler_R27_R15: a takeover aborts the handler's signal within a renewal interval; nothing it writes lands, its answer is an observation", async () => {
    const req = refund();
    const job = (await admin.enqueueRefund(req)).job!;
    const { client, renewals, tokens } = watchedClient(coord);
    const events: WorkerEvent[] = [];
    const sends: string[] = [];
    let started!: () => void;
    const handlerStarted = new Promise<void>((r) => (started = r));
    let abortedAt = 0;
    let abortReason: unknown;
    const worker = newWorker({
      client,
      workerId: "A",
      provider: req.provider!,
      handlers: {
        async refund(j) {
          sends.push("refund"); // the provider made the refund…
          const answer: ProviderResult = { kind: "succeeded", providerRefundId: "re_A", providerEventId: "evt_A" };
          started();
          // …and the handler waits on a slow second call, cancelled by the signal.
          await new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, 15_000);
            j.signal.addEventListener("abort", () => {
              abortedAt = performance.now();
              abortReason = j.signal.reason;
              clearTimeout(timer);
              resolve();
            });
          });
          if (!j.signal.aborted) {
            sends.push("status"); // only for a grant still held
          }
          return answer;
        },
        reconcile: notExpected,
      },
    }, events);
    worker.start();
    let b!: ClaimedJob;
    let takenOverAt = 0;
    try {
      await handlerStarted;
      // The lease is expired in test data (T1: never by moving a clock) and
      // B takes over; a renewal landing in between extends the lease again
      // (R8: it is still A's grant), so expire and claim until B has it.
      await eventually(async () => {
        await coord.expireLease(job.id);
        const got = await admin.claim({ workerId: "B", maxJobs: 1, provider: req.provider! });
        assert.equal(got.jobs.length, 1);
        b = got.jobs[0]!;
        takenOverAt = performance.now();
      });
      assert.equal(b.attempt, 2n);
      assert.equal(b.takeover, true);
      await eventually(() => assert.ok(abortedAt > 0, "the handler's signal was aborted"), 5_000);
      // B reconciles, finds the refund made and completes under attempt 2.
      await admin.complete({ jobId: job.id, attempt: b.attempt, leaseToken: b.leaseToken, providerRefundId: "re_A" });
      await eventually(() => assert.ok(events.some((e) => e.type === "observation")), 10_000);
    } finally {
      await worker.stop();
    }

    // Within about one renewal interval (a third of 2 s, +10 %), plus the
    // call, and some slack for a busy machine.
    const lostAfter = abortedAt - takenOverAt;
    assert.ok(lostAfter < 1_500, `the signal was aborted ${Math.round(lostAfter)} ms after the takeover committed`);
    assert.ok(abortReason instanceof GrantLostError, `abort reason ${String(abortReason)}`);
    assert.equal(abortReason.name, "GrantLostError");
    assert.equal(abortReason.reason, Reason.StaleAttempt);
    assert.equal(abortReason.jobId, job.id);
    assert.equal(abortReason.attempt, 1n);
    assert.equal(abortReason.currentAttempt, 2n);
    assert.ok(abortReason.refusal instanceof StaleAttemptError);
    assert.deepEqual(sends, ["refund"], "nothing new went to the provider after the grant was lost");
    const lost = events.filter((e) => e.type === "grant_lost");
    assert.equal(lost.length, 1);
    assert.ok(lost[0]!.type === "grant_lost" && lost[0]!.reason === Reason.StaleAttempt && lost[0]!.attempt === 1n);
    assert.ok(!renewals.some((r) => r.at > abortedAt), "A renewed the lost grant no more");

    // Nothing A wrote landed: its Complete was refused by the fence (R9, R25)
    // and its answer is on file as a verified observation (R15).
    const stale = events.find((e) => e.type === "stale");
    assert.ok(stale && stale.type === "stale" && stale.error instanceof StaleAttemptError && stale.decision.kind === "complete");
    assert.ok(!events.some((e) => e.type === "written"));
    const got = await getJob(admin, job.id);
    assert.equal(got.job!.state, JobState.SUCCEEDED);
    assert.equal(got.job!.attempt, 2n);
    assert.deepEqual(got.events.map((e) => [e.kind, e.attempt, e.workerId]), [
      ["enqueued", 0n, ""], ["claimed", 1n, "A"], ["taken_over", 2n, "B"], ["completed", 2n, "B"],
    ]);
    assert.equal(got.observations.length, 1);
    const o = got.observations[0]!;
    assert.equal(o.source, "worker:A");
    assert.equal(o.outcome, ObservationOutcome.SUCCEEDED);
    assert.equal(o.providerRefundId, "re_A");
    assert.equal(o.reportedAttempt, 1n);
    assert.equal(o.attemptVerified, true);
    assertNoToken(events, [...tokens, b.leaseToken]);
  });

  it("TestWorkerRenewalFailureNeverAborts_R27_R8: failed renewals are repeated at a tenth of the lease and the job finishes under its grant", async () => {
    const req = refund();
    const job = (await admin.enqueueRefund(req)).job!;
    const { client, renewals, tokens, fail } = watchedClient(coord);
    fail(3);
    const events: WorkerEvent[] = [];
    let aborted = false;
    const worker = newWorker({
      client,
      workerId: "flaky",
      provider: req.provider!,
      handlers: {
        async refund(j) {
          j.signal.addEventListener("abort", () => (aborted = true));
          await sleep(2_500);
          return { kind: "succeeded", providerRefundId: "re_flaky" };
        },
        reconcile: notExpected,
      },
    }, events);
    worker.start();
    try {
      await eventually(async () => assert.equal((await getJob(admin, job.id)).job!.state, JobState.SUCCEEDED), 10_000);
    } finally {
      await worker.stop();
    }
    const failed = events.filter((e) => e.type === "renewal_failed");
    assert.equal(failed.length, 3);
    for (const f of failed) {
      assert.ok(f.type === "renewal_failed" && f.error.code === Code.Unavailable);
      assert.ok(f.retryInMs >= 180 && f.retryInMs <= 220, `retry in ${f.retryInMs} ms: a tenth of the 2 s lease`);
      assert.deepEqual(f.grants.map((g) => [g.jobId, g.attempt]), [[job.id, 1n]]);
    }
    const gaps = renewals.slice(1, 4).map((r, i) => r.at - renewals[i]!.at);
    assert.ok(median(gaps) < 450, `repeats sooner after a failure, a tenth of the lease: ${gaps.map(Math.round).join(", ")}`);
    assert.ok(events.some((e) => e.type === "renewed"), "renewed once the coordinator answered again");
    assert.equal(aborted, false, "a failed renewal never aborts the handler");
    const got = await getJob(admin, job.id);
    assert.deepEqual(kinds(got), [["enqueued", 0n], ["claimed", 1n], ["completed", 1n]]);
    assertNoToken(events, tokens);
  });

  it("checks the lease options: without renewal the provider call must fit in the lease (R17); with it, it may not (R27)", () => {
    const handlers: Handlers = { refund: notExpected, reconcile: notExpected };
    const base = { client: admin, workerId: "w", handlers, receiptSpool: "off" };
    assert.throws(() => new Worker({ ...base, leaseMs: 5_000, providerCallTimeoutMs: 5_000, renewLeases: false }), RangeError);
    assert.doesNotThrow(() => new Worker({ ...base, leaseMs: 5_000, providerCallTimeoutMs: 60_000 }));
    assert.doesNotThrow(() => new Worker({ ...base, leaseMs: 5_000, providerCallTimeoutMs: 60_000, renewLeases: true, renewIntervalMs: 1_000 }));
    assert.throws(() => new Worker({ ...base, leaseMs: 5_000, renewIntervalMs: 5_000 }), RangeError);
    assert.throws(() => new Worker({ ...base, renewIntervalMs: 0 }), RangeError);
  });
});

describe("GRANT_TOO_OLD through the Worker (R27)", () => {
  it("TestWorkerGrantTooOldRunsOn_R27_R8: renewals stop at the grant's age bound, the handler is not aborted and its late write lands", async () => {
    const req = refund();
    const job = (await shortAdmin.enqueueRefund(req)).job!;
    const { client, renewals } = watchedClient(short);
    const events: WorkerEvent[] = [];
    let aborted = false;
    let tooOldAt = 0;
    const worker = newWorker({
      client,
      workerId: "old",
      onEvent: (e) => {
        events.push(e);
        if (e.type === "grant_too_old") tooOldAt = performance.now();
      },
      provider: req.provider!,
      leaseMs: 1_000,
      handlers: {
        async refund(j) {
          j.signal.addEventListener("abort", () => (aborted = true));
          await sleep(3_000);
          return { kind: "succeeded", providerRefundId: "re_old" };
        },
        reconcile: notExpected,
      },
    }, events);
    worker.start();
    try {
      await eventually(async () => assert.equal((await getJob(shortAdmin, job.id)).job!.state, JobState.SUCCEEDED), 10_000);
    } finally {
      await worker.stop();
    }
    const old = events.filter((e) => e.type === "grant_too_old");
    assert.equal(old.length, 1);
    const e = old[0]!;
    assert.ok(e.type === "grant_too_old" && e.error.reason === Reason.GrantTooOld && e.grantExpiresAt !== undefined);
    assert.ok(e.error instanceof GrantTooOldError, "decoded by its reason (R24)");
    assert.equal(e.error.jobId, job.id);
    // Renewed until the bound, then no more.
    const renewed = events.filter((x) => x.type === "renewed").length;
    assert.ok(renewed >= 3, `${renewed} renewals`);
    assert.ok(!renewals.some((r) => r.at > tooOldAt), "no renewal after GRANT_TOO_OLD");
    assert.equal(aborted, false, "GRANT_TOO_OLD aborts nothing: the grant holds until a takeover commits (R8)");
    assert.ok(!events.some((x) => x.type === "grant_lost"));
    // Nobody took it over: the holder's late write lands under attempt 1 (R8, T2).
    const got = await getJob(shortAdmin, job.id);
    assert.deepEqual(kinds(got), [["enqueued", 0n], ["claimed", 1n], ["completed", 1n]]);
    assert.equal(got.job!.providerRefundId, "re_old");
    const w = events.find((x) => x.type === "written");
    assert.ok(w && w.type === "written" && w.decision.kind === "complete");
  });
});
