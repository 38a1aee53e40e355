// The Worker runtime end to end against a real coordinator, with a small
// in-test fake payment provider.

import assert from "node:assert/strict";
import { after, describe, it } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";

import {
  ClaimOutcomeUnknownError,
  JobState,
  NextAction,
  ObservationOutcome,
  Worker,
  WriteOutcomeUnknownError,
  type CoordinatorClient,
  type Handlers,
  type Job,
  type ProviderResult,
  type WorkerEvent,
  type WorkerJob,
  type WorkerOptions,
} from "../src/index.js";
import { ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { eventually, refund, startCoordinator, testSpool, type Coordinator } from "./harness.js";
import { WorkTap } from "./work-tap.js";


// Top-level await: a missing MySQL fails the whole file loudly, never skips it.
const coord: Coordinator = await startCoordinator();
const admin: CoordinatorClient = coord.client();
after(async () => {
  await coord.stop();
});

/**
 * FakeProvider keeps refunds by Idempotency-Key, as a real provider would: a
 * second send with the same key returns the first refund (R1).
 */
class FakeProvider {
  readonly refunds = new Map<string, { id: string; status: "succeeded" | "pending" }>();
  readonly sends = new Map<string, number>();
  pendingFirst = false;

  refund(key: string): ProviderResult {
    this.sends.set(key, (this.sends.get(key) ?? 0) + 1);
    let r = this.refunds.get(key);
    if (!r) {
      r = { id: `re_${this.refunds.size + 1}`, status: this.pendingFirst ? "pending" : "succeeded" };
      this.refunds.set(key, r);
    }
    return r.status === "succeeded" ? { kind: "succeeded", providerRefundId: r.id } : { kind: "pending", retryAfterMs: 0 };
  }

  lookup(key: string): ProviderResult {
    const r = this.refunds.get(key);
    if (!r) {
      return { kind: "not_found" };
    }
    return r.status === "succeeded" ? { kind: "succeeded", providerRefundId: r.id } : { kind: "pending", retryAfterMs: 0 };
  }

  settle(key: string): void {
    this.refunds.get(key)!.status = "succeeded";
  }
}

function providerHandlers(p: FakeProvider, seen?: WorkerJob[]): Handlers {
  return {
    async refund(job) {
      seen?.push(job);
      return p.refund(job.operationKey);
    },
    async reconcile(job) {
      seen?.push(job);
      return p.lookup(job.operationKey);
    },
  };
}

function newWorker(opts: Partial<WorkerOptions> & Pick<WorkerOptions, "handlers" | "provider">, events: WorkerEvent[] = []): Worker {
  return new Worker({
    client: admin,
    workerId: "node-worker",
    leaseMs: 30_000,
    providerCallTimeoutMs: 5_000,
    idlePollMs: 50,
    claimErrorBackoffMs: 50,
    unknownOutcomeDelayMs: 0,
    writeRetryDelayMs: 20,
    receiptSpool: testSpool("node-worker"),
    onEvent: (e) => events.push(e),
    ...opts,
  });
}

async function enqueue(n: number, provider: string): Promise<Job[]> {
  const jobs: Job[] = [];
  for (let i = 0; i < n; i++) {
    jobs.push((await admin.enqueueRefund(refund({ provider }))).job!);
  }
  return jobs;
}

async function getJob(id: bigint) {
  return admin.getJob({ job: { case: "jobId", value: id } });
}

async function waitState(id: bigint, state: JobState): Promise<Awaited<ReturnType<typeof getJob>>> {
  let got!: Awaited<ReturnType<typeof getJob>>;
  await eventually(async () => {
    got = await getJob(id);
    assert.equal(got.job!.state, state, `job ${id}: ${JobState[got.job!.state]}, last reason ${got.job!.lastReason}`);
  });
  return got;
}

function uniqueProvider(): string {
  return refund().provider!;
}

describe("Worker", () => {
  it("TestWorkerClaimsOnlyWhatItCanStart_R18: completes every job within the concurrency bound", async () => {
    const provider = uniqueProvider();
    const jobs = await enqueue(5, provider);
    const fake = new FakeProvider();
    let gateOpen!: () => void;
    const gate = new Promise<void>((r) => (gateOpen = r));
    let running = 0;
    let maxRunning = 0;
    const claims: Array<{ maxJobs: number; inFlight: number }> = [];
    let worker!: Worker;
    const tap = new WorkTap(); // the worker stream, the Worker's default: credits instead of max_jobs
    const client = coord.client({
      interceptors: [(next) => async (req) => {
        if (req.method.name === "Claim") {
          claims.push({ maxJobs: (req.message as unknown as { maxJobs: number }).maxJobs, inFlight: worker.inFlight });
        }
        return next(req);
      }, tap.interceptor],
    });
    worker = newWorker({
      client,
      provider,
      concurrency: 2,
      handlers: {
        async refund(job) {
          running++;
          maxRunning = Math.max(maxRunning, running);
          await gate;
          running--;
          return fake.refund(job.operationKey);
        },
        reconcile: async (job) => fake.lookup(job.operationKey),
      },
    });
    worker.start();
    await eventually(() => assert.equal(running, 2));
    // R18: the other three stay ready; nothing is claimed to be held.
    const states = await coord.sql(`SELECT state, attempt, COUNT(*) FROM refund_jobs WHERE provider = '${provider}' GROUP BY state, attempt ORDER BY state`);
    assert.equal(states.trim(), "ready\t0\t3\nrunning\t1\t2");
    gateOpen();
    for (const j of jobs) {
      const got = await waitState(j.id, JobState.SUCCEEDED);
      assert.equal(got.job!.providerRefundId, fake.refunds.get(j.operationKey)!.id);
      assert.equal(got.job!.attempt, 1n);
    }
    await worker.stop();
    assert.equal(maxRunning, 2);
    for (const c of claims) {
      assert.ok(c.maxJobs >= 1 && c.maxJobs + c.inFlight <= 2, `claim of ${c.maxJobs} with ${c.inFlight} in flight`);
    }
    assert.deepEqual(tap.starts().map((st) => st.credits), [2], "the stream opened with the free slots as credits");
    assert.ok([...fake.sends.values()].every((n) => n === 1), "one send per operation_key");
  });

  it("TestWorkerPendingIsNotSuccess_R4_R14: pending reschedules a reconcile, which completes", async () => {
    const provider = uniqueProvider();
    const [job] = await enqueue(1, provider);
    const fake = new FakeProvider();
    fake.pendingFirst = true;
    const seen: WorkerJob[] = [];
    const handlers = providerHandlers(fake, seen);
    const worker = newWorker({
      provider,
      handlers: {
        refund: handlers.refund,
        async reconcile(job) {
          fake.settle(job.operationKey); // the provider finished meanwhile
          return handlers.reconcile(job);
        },
      },
    });
    worker.start();
    const got = await waitState(job!.id, JobState.SUCCEEDED);
    await worker.stop();
    assert.deepEqual(seen.map((j) => [NextAction[j.nextAction], j.attempt, j.operationKey]), [
      ["REFUND", 1n, job!.operationKey],
      ["RECONCILE", 2n, job!.operationKey],
    ]);
    const resched = got.events.find((e) => e.kind === "rescheduled")!;
    assert.equal(resched.nextAction, NextAction.RECONCILE);
    assert.equal(resched.attempt, 1n);
    assert.equal(fake.sends.get(job!.operationKey), 1);
  });

  it("TestWorkerNoRecordResendsInsideWindow_R14_R22: a safe provider gets a same-key resend", async () => {
    const provider = uniqueProvider();
    const [job] = await enqueue(1, provider);
    // The first holder's send may or may not have reached the provider: the
    // job comes back for RECONCILE.
    const first = (await admin.claim({ workerId: "first", maxJobs: 1, provider })).jobs[0]!;
    await admin.reschedule({ jobId: job!.id, attempt: first.attempt, leaseToken: first.leaseToken, reason: "socket timeout" });

    const fake = new FakeProvider();
    const seen: WorkerJob[] = [];
    const worker = newWorker({ provider, sameKeyResendSafe: (p) => p === provider, handlers: providerHandlers(fake, seen) });
    worker.start();
    const got = await waitState(job!.id, JobState.SUCCEEDED);
    await worker.stop();
    assert.deepEqual(seen.map((j) => [NextAction[j.nextAction], j.attempt]), [["RECONCILE", 2n], ["REFUND", 3n]]);
    assert.ok(seen.every((j) => j.operationKey === job!.operationKey), "R1: the same key on every send");
    const resched = got.events.filter((e) => e.kind === "rescheduled");
    assert.equal(resched.at(-1)!.nextAction, NextAction.REFUND);
    assert.match(resched.at(-1)!.reason, /no record/);
  });

  for (const [name, safe, windowPassed, why] of [
    ["TestWorkerNoRecordEscalatesWithoutGuarantee_R16", false, false, /does not guarantee same-key resends/],
    ["TestWorkerNoRecordEscalatesAfterWindow_R14_R22", true, true, /retention window has passed/],
  ] as const) {
    it(`${name}: a "no record" goes to manual review`, async () => {
      const provider = uniqueProvider();
      const [job] = await enqueue(1, provider);
      const first = (await admin.claim({ workerId: "first", maxJobs: 1, provider })).jobs[0]!;
      await admin.reschedule({ jobId: job!.id, attempt: first.attempt, leaseToken: first.leaseToken, reason: "socket timeout" });
      if (windowPassed) {
        // Test data: the key went out two days ago; retention is 24 h.
        await coord.sql(`UPDATE refund_jobs SET first_sent_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY WHERE id = ${job!.id}`);
      }
      const fake = new FakeProvider();
      const seen: WorkerJob[] = [];
      const worker = newWorker({ provider, sameKeyResendSafe: safe, handlers: providerHandlers(fake, seen) });
      worker.start();
      const got = await waitState(job!.id, JobState.MANUAL_REVIEW);
      await worker.stop();
      assert.match(got.job!.lastReason, why);
      assert.deepEqual(seen.map((j) => NextAction[j.nextAction]), ["RECONCILE"]);
      assert.equal(fake.sends.size, 0, "nothing was resent");
    });
  }

  it("TestWorkerRefusesResendPastWindow_R14_R22: a resend decided inside the window is not sent once it has closed", async () => {
    const provider = uniqueProvider();
    const [job] = await enqueue(1, provider);
    // A reconcile found no record and chose a same-key resend (REFUND)…
    const first = (await admin.claim({ workerId: "first", maxJobs: 1, provider })).jobs[0]!;
    await admin.reschedule({ jobId: job!.id, attempt: first.attempt, leaseToken: first.leaseToken, nextAction: NextAction.REFUND, reason: "no record; resend" });
    // …but the job waited (a backlog, an empty budget) until the provider's
    // retention window closed. Test data: the key went out two days ago.
    await coord.sql(`UPDATE refund_jobs SET first_sent_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY WHERE id = ${job!.id}`);
    const fake = new FakeProvider();
    const seen: WorkerJob[] = [];
    const events: WorkerEvent[] = [];
    const worker = newWorker({ provider, sameKeyResendSafe: true, handlers: providerHandlers(fake, seen) }, events);
    worker.start();
    const got = await waitState(job!.id, JobState.MANUAL_REVIEW);
    await worker.stop();
    assert.deepEqual(seen, [], "the provider was not called");
    assert.equal(fake.sends.size, 0, "nothing was resent: the provider would have made a second refund");
    assert.match(got.job!.lastReason, /resend refused before sending/);
    assert.ok(events.some((e) => e.type === "resend_refused" && e.jobId === job!.id));
  });

  it("TestWorkerProviderDeadline_R14_R15_T3: an unknown outcome reconciles and the late answer is filed", async () => {
    const provider = uniqueProvider();
    const [job] = await enqueue(1, provider);
    const fake = new FakeProvider();
    let aborted = false;
    const events: WorkerEvent[] = [];
    const worker = newWorker(
      {
        provider,
        providerCallTimeoutMs: 200,
        handlers: {
          async refund(j) {
            j.signal.addEventListener("abort", () => (aborted = true));
            const answer = fake.refund(j.operationKey); // the refund is made…
            await new Promise((r) => setTimeout(r, 700)); // …but the reply is slow
            return answer;
          },
          reconcile: async (j) => fake.lookup(j.operationKey),
        },
      },
      events,
    );
    worker.start();
    const got = await waitState(job!.id, JobState.SUCCEEDED);
    await eventually(() => assert.ok(events.some((e) => e.type === "observation")));
    await worker.stop();

    assert.equal(aborted, true);
    assert.equal(fake.sends.get(job!.operationKey), 1, "T3: no second refund");
    assert.equal(got.job!.attempt, 2n);
    assert.equal(got.job!.providerRefundId, fake.refunds.get(job!.operationKey)!.id);
    const resched = got.events.find((e) => e.kind === "rescheduled")!;
    assert.equal(resched.nextAction, NextAction.RECONCILE);
    assert.match(resched.reason, /deadline/);
    const obs = (await getJob(job!.id)).observations;
    assert.equal(obs.length, 1);
    assert.equal(obs[0]!.outcome, ObservationOutcome.SUCCEEDED);
    assert.equal(obs[0]!.reportedAttempt, 1n);
    assert.match(obs[0]!.detail, /after the provider-call deadline/);
  });

  it("TestWorkerHandlerErrorReconciles_R14: a thrown provider error leaves the outcome unknown", async () => {
    const provider = uniqueProvider();
    const [job] = await enqueue(1, provider);
    const fake = new FakeProvider();
    const seen: WorkerJob[] = [];
    const events: WorkerEvent[] = [];
    const worker = newWorker(
      {
        provider,
        handlers: {
          async refund(j) {
            seen.push(j);
            fake.refund(j.operationKey);
            throw new Error("socket hang up");
          },
          reconcile: async (j) => (seen.push(j), fake.lookup(j.operationKey)),
        },
      },
      events,
    );
    worker.start();
    const got = await waitState(job!.id, JobState.SUCCEEDED);
    await worker.stop();
    assert.deepEqual(seen.map((j) => NextAction[j.nextAction]), ["REFUND", "RECONCILE"]);
    assert.match(got.events.find((e) => e.kind === "rescheduled")!.reason, /socket hang up/);
    assert.ok(events.some((e) => e.type === "handler_error"));
  });

  it("TestWorkerActsOnNothingAfterClaimOutcomeUnknown_R7: the job returns only through a takeover", async () => {
    const provider = uniqueProvider();
    const [job] = await enqueue(1, provider);
    let cut = true;
    const client = coord.client({
      interceptors: [(next) => async (req) => {
        const res = await next(req); // the claim commits at the coordinator…
        if (req.method.name === "Claim" && cut) {
          cut = false; // …and its answer is replaced by an unknown outcome
          throw new ConnectError("test: claim outcome unknown", Code.Unavailable, undefined, [
            { desc: ErrorInfoSchema, value: { domain: "jobfence", reason: "CLAIM_OUTCOME_UNKNOWN" } },
          ]);
        }
        return res;
      }],
    });
    const fake = new FakeProvider();
    fake.refund(job!.operationKey); // the provider holds the refund already
    const seen: WorkerJob[] = [];
    const events: WorkerEvent[] = [];
    // Claim calls: this is R7 for a Claim's answer (a stream's grant is
    // committed before it is sent, and one it could not deliver is handed
    // back by the coordinator).
    const worker = newWorker({ client, provider, noStream: true, handlers: providerHandlers(fake, seen) }, events);
    worker.start();
    await eventually(() => assert.ok(events.some((e) => e.type === "claim_failed")));
    const failed = events.find((e) => e.type === "claim_failed")!;
    assert.ok(failed.type === "claim_failed" && failed.error instanceof ClaimOutcomeUnknownError);
    // The claim did commit, yet the worker acts on nothing.
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(seen.length, 0);
    const held = await getJob(job!.id);
    assert.equal(held.job!.state, JobState.RUNNING);
    assert.equal(held.job!.attempt, 1n);

    await coord.expireLease(job!.id);
    const got = await waitState(job!.id, JobState.SUCCEEDED);
    await worker.stop();
    assert.deepEqual(seen.map((j) => [NextAction[j.nextAction], j.attempt, j.takeover]), [["RECONCILE", 2n, true]]);
    assert.equal(fake.sends.get(job!.operationKey), 1);
    assert.deepEqual(got.events.map((e) => e.kind), ["enqueued", "claimed", "taken_over", "completed"]);
  });

  for (const noStream of [false, true]) {
    it(`TestWorkerRepeatsWriteAfterLostReply_R21: WRITE_OUTCOME_UNKNOWN is retried and answered replayed (${noStream ? "unary calls" : "worker stream"})`, async () => {
      const provider = uniqueProvider();
      const [job] = await enqueue(1, provider);
      let cut = true;
      // The reply is lost after the commit: of the unary call, or of the
      // call on the worker stream.
      const tap = new WorkTap();
      tap.dropReply("complete", 1, Code.Unavailable, "WRITE_OUTCOME_UNKNOWN");
      const client = coord.client({
        interceptors: [(next) => async (req) => {
          const res = await next(req);
          if (req.method.name === "Complete" && cut) {
            cut = false;
            throw new ConnectError("test: write outcome unknown", Code.Unavailable, undefined, [
              { desc: ErrorInfoSchema, value: { domain: "jobfence", reason: "WRITE_OUTCOME_UNKNOWN" } },
            ]);
          }
          return res;
        }, tap.interceptor],
      });
      const events: WorkerEvent[] = [];
      const worker = newWorker({ client, provider, noStream, handlers: providerHandlers(new FakeProvider()) }, events);
      worker.start();
      const got = await waitState(job!.id, JobState.SUCCEEDED);
      await eventually(() => assert.ok(events.some((e) => e.type === "written")));
      await worker.stop();
      const retry = events.find((e) => e.type === "write_retry");
      assert.ok(retry && retry.type === "write_retry" && retry.error instanceof WriteOutcomeUnknownError);
      const written = events.find((e) => e.type === "written");
      assert.ok(written && written.type === "written" && written.replayed);
      assert.equal(got.events.filter((e) => e.kind === "completed").length, 1);
      assert.equal(tap.calls("complete").length, noStream ? 0 : 2, "where the write and its repeat went");
    });
  }

  for (const noStream of [false, true]) {
    it(`TestWorkerStopDrains: stop() claims nothing more and waits for in-flight jobs (${noStream ? "unary calls" : "worker stream"})`, async () => {
      const provider = uniqueProvider();
      const jobs = await enqueue(3, provider);
      const fake = new FakeProvider();
      let gateOpen!: () => void;
      const gate = new Promise<void>((r) => (gateOpen = r));
      let started = 0;
      let claimsAfterStop = 0;
      let stopping = false;
      const client = coord.client({
        interceptors: [(next) => async (req) => {
          if (req.method.name === "Claim" && stopping) {
            claimsAfterStop++;
          }
          return next(req);
        }],
      });
      const worker = newWorker({
        client,
        provider,
        noStream,
        concurrency: 2,
        handlers: {
          async refund(j) {
            started++;
            await gate;
            return fake.refund(j.operationKey);
          },
          reconcile: async (j) => fake.lookup(j.operationKey),
        },
      });
      worker.start();
      await eventually(() => assert.equal(started, 2));
      stopping = true;
      let stopped = false;
      const stop = worker.stop().then(() => (stopped = true));
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(stopped, false, "stop() waits for in-flight jobs");
      gateOpen();
      await stop;
      assert.equal(worker.inFlight, 0);
      assert.equal(claimsAfterStop, 0);
      const states = await Promise.all(jobs.map(async (j) => (await getJob(j.id)).job!));
      assert.deepEqual(states.map((j) => JobState[j.state]).sort(), ["READY", "SUCCEEDED", "SUCCEEDED"]);
      assert.equal(states.find((j) => j.state === JobState.READY)!.attempt, 0n);
    });
  }

  it("TestWorkerLongPoll: a parked claim receives a new job, and stop() cancels a parked claim", async () => {
    const provider = uniqueProvider();
    let claimCalls = 0;
    const client = coord.client({
      interceptors: [(next) => async (req) => {
        if (req.method.name === "Claim") {
          claimCalls++;
        }
        return next(req);
      }],
    });
    const events: WorkerEvent[] = [];
    // Polling alone would not claim again for a minute.
    let claimsWhenClaimed = 0;
    // Claim calls: the long poll is theirs (the worker stream waits as long
    // as it is open).
    const worker = newWorker({
      client,
      provider,
      noStream: true,
      claimWaitMs: 30_000,
      idlePollMs: 60_000,
      handlers: providerHandlers(new FakeProvider()),
      onEvent: (e) => {
        if (e.type === "claimed") {
          claimsWhenClaimed = claimCalls;
        }
        events.push(e);
      },
    });
    worker.start();
    await eventually(() => assert.equal(claimCalls, 1));
    await new Promise((r) => setTimeout(r, 100)); // parked at the coordinator
    const [job] = await enqueue(1, provider);
    await waitState(job!.id, JobState.SUCCEEDED);
    assert.equal(events.filter((e) => e.type === "claimed").length, 1);
    assert.equal(claimsWhenClaimed, 1, "the first, parked claim received the job");
    // The parked claim took the job; the next one parks again.
    await eventually(() => assert.equal(claimCalls, 2));

    await worker.stop(); // returns without waiting out the 30 s poll
    assert.ok(!events.some((e) => e.type === "claim_failed"));
  });

  it("rejects a provider-call deadline that does not fit in the lease of a worker that does not renew (R17, R27)", () => {
    const handlers = providerHandlers(new FakeProvider());
    assert.throws(() => new Worker({ client: admin, workerId: "w", handlers, leaseMs: 5_000, providerCallTimeoutMs: 5_000, renewLeases: false }), RangeError);
    assert.throws(() => new Worker({ client: admin, workerId: "w", handlers, concurrency: 0 }), RangeError);
  });
});
