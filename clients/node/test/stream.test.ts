// The worker stream (Coordinator.Work) through the Worker and on its own,
// against real coordinator processes on MariaDB: grants pushed against
// credits, calls answered as their unary calls to the error, a call cut off
// with its stream repeated once (R21), reconnecting after the coordinator
// restarts, the drain's half-close, and the fallbacks to Claim calls.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";

import {
  CoordinatorError,
  InvalidArgumentError,
  JobNotRunningError,
  JobState,
  NotFoundError,
  ObservationOutcome,
  StaleAttemptError,
  Worker,
  type ClaimedJob,
  type CoordinatorClient,
  type Handlers,
  type Job,
  type ProviderResult,
  type WorkerEvent,
  type WorkerOptions,
} from "../src/index.js";
import { WorkSession } from "../src/session.js";
import { describeError, eventually, refund, startCoordinators, testSpool, type Coordinator } from "./harness.js";
import { WorkTap } from "./work-tap.js";

// Top-level await: a missing MySQL fails the whole file loudly, never skips it.
// The first coordinator's metrics show what it served; the second is
// restarted by a test.
const [coord, restarted] = await startCoordinators(["--metrics-listen", "127.0.0.1:0"], []);
const admin: CoordinatorClient = coord.client();

/** Unary counts the unary calls a client made, by method. */
function unaryCounter(): { interceptor: Interceptor; count: (method: string) => number } {
  const calls = new Map<string, number>();
  return {
    interceptor: (next) => async (req) => {
      if (!req.stream) {
        calls.set(req.method.name, (calls.get(req.method.name) ?? 0) + 1);
      }
      return next(req);
    },
    count: (method) => calls.get(method) ?? 0,
  };
}

/** watched is a client of c with a tap on its worker streams and a count of its unary calls. */
function watched(c: Coordinator, extra: Interceptor[] = []) {
  const tap = new WorkTap();
  const unary = unaryCounter();
  const client = c.client({ interceptors: [...extra, unary.interceptor, tap.interceptor] });
  return { client, tap, unary };
}

const succeed: Handlers = {
  refund: async (j) => ({ kind: "succeeded", providerRefundId: `re_${j.jobId}` }),
  reconcile: async (j) => ({ kind: "succeeded", providerRefundId: `re_${j.jobId}` }),
};

function newWorker(opts: Partial<WorkerOptions> & Pick<WorkerOptions, "client" | "provider">, events: WorkerEvent[]): Worker {
  const workerId = opts.workerId ?? "streamer";
  return new Worker({
    workerId,
    handlers: succeed,
    leaseMs: 30_000,
    providerCallTimeoutMs: 5_000,
    // Polling would not claim again for a minute: whatever arrives sooner
    // was pushed.
    idlePollMs: 60_000,
    claimWaitMs: 0,
    claimErrorBackoffMs: 50,
    writeRetryDelayMs: 20,
    receiptSpool: testSpool(workerId),
    onEvent: (e) => events.push(e),
    ...opts,
  });
}

async function enqueue(c: CoordinatorClient, n: number, provider: string): Promise<Job[]> {
  const jobs: Job[] = [];
  for (let i = 0; i < n; i++) {
    jobs.push((await c.enqueueRefund(refund({ provider }))).job!);
  }
  return jobs;
}

async function history(c: CoordinatorClient, id: bigint): Promise<string[]> {
  const got = await c.getJob({ job: { case: "jobId", value: id } });
  return got.events.map((e) => `${e.kind}@${e.attempt}`);
}

async function waitSucceeded(c: CoordinatorClient, id: bigint, timeoutMs = 15_000): Promise<void> {
  await eventually(async () => {
    const got = await c.getJob({ job: { case: "jobId", value: id } });
    assert.equal(got.job!.state, JobState.SUCCEEDED, `job ${id}: ${JobState[got.job!.state]}, last reason ${got.job!.lastReason}`);
  }, timeoutMs);
}

/** workJobs starts worker, enqueues n jobs for provider, waits until each succeeded and stops the worker. */
async function workJobs(worker: Worker, n: number, provider: string): Promise<void> {
  worker.start();
  try {
    for (const j of await enqueue(admin, n, provider)) {
      await waitSucceeded(admin, j.id);
    }
  } finally {
    await worker.stop();
  }
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe("the worker stream through the Worker", () => {
  it("TestWorkerTakesGrantsFromTheStream: jobs enqueued while it waits are pushed, worked and written back on one stream, without a Claim", { timeout: 60_000 }, async () => {
    const provider = refund().provider!;
    const { client, tap, unary } = watched(coord);
    const events: WorkerEvent[] = [];
    const claimsBefore = await coord.metric("grpc_server_handled_total", { grpc_method: "Claim" });
    const worker = newWorker({ client, provider, concurrency: 4 }, events);
    worker.start();
    let jobs: Job[] = [];
    try {
      await eventually(async () => assert.equal(await coord.metric("jobfence_worker_streams"), 1, "the worker's stream is open"));
      jobs = await enqueue(admin, 10, provider);
      for (const j of jobs) {
        await waitSucceeded(admin, j.id);
      }
    } finally {
      await worker.stop();
    }
    assert.equal(unary.count("Claim"), 0, "no Claim call: every grant came on the stream");
    assert.equal(await coord.metric("grpc_server_handled_total", { grpc_method: "Claim" }), claimsBefore, "the coordinator served no Claim");
    assert.equal(tap.opened, 1, "one stream");
    assert.deepEqual(tap.starts().map((s) => [s.workerId, s.provider, s.credits, Number(s.leaseDuration?.seconds)]),
      [["streamer", provider, 4, 30]], "opened with every slot as credits, the filter and the lease");
    // R18: never more grants than credits; a credit back for each job done.
    const granted = tap.received.flatMap((m) => (m.kind.case === "grant" ? m.kind.value.jobs : []));
    assert.deepEqual(granted.map((c) => c.job!.id).sort(), jobs.map((j) => j.id).sort(), "each job granted once");
    // (Heartbeats, credits 0, left out.)
    const credits = tap.sent.flatMap((m) => (m.kind.case === "credit" && m.kind.value.credits !== 0 ? [m.kind.value.credits] : []));
    assert.ok(credits.length >= 6 && credits.every((n) => n === 1), `a credit per freed slot: ${credits.join(",")}`);
    // Whenever a grant arrived, the coordinator had been given at least as
    // many credits as it had granted jobs.
    let given = 0;
    let used = 0;
    for (const e of tap.log) {
      if ("sent" in e && e.sent.kind.case === "start") given += e.sent.kind.value.credits;
      if ("sent" in e && e.sent.kind.case === "credit") given += e.sent.kind.value.credits;
      if ("received" in e && e.received.kind.case === "grant") used += e.received.kind.value.jobs.length;
      assert.ok(used <= given, `${used} jobs granted against ${given} credits`);
    }
    // The write-backs went on the stream, none as unary calls.
    assert.equal(tap.calls("complete").length, 10);
    assert.equal(unary.count("Complete"), 0);
    for (const j of jobs) {
      assert.deepEqual(await history(admin, j.id), ["enqueued@0", "claimed@1", "completed@1"]);
    }
    assert.ok(!events.some((e) => e.type === "stream_ended" || e.type === "claim_failed"), "the stream never ended while the worker ran");
    await eventually(async () => assert.equal(await coord.metric("jobfence_worker_streams"), 0, "stop() ended the stream"));
  });

  it("TestWorkerStreamCutAfterWriteBackRepeatsIt_R21: a write-back served and cut off with its stream is repeated, lands once, and the worker takes work on a new stream", { timeout: 60_000 }, async () => {
    const provider = refund().provider!;
    const { client, tap, unary } = watched(coord);
    tap.cutAfter("complete", 1);
    const events: WorkerEvent[] = [];
    const worker = newWorker({ client, provider, workerId: "cut" }, events);
    worker.start();
    let first!: Job;
    let second!: Job;
    try {
      [first] = await enqueue(admin, 1, provider);
      await waitSucceeded(admin, first!.id);
      await eventually(() => assert.ok(events.some((e) => e.type === "written")));
      await eventually(() => assert.equal(tap.opened, 2, "a second stream"));
      [second] = await enqueue(admin, 1, provider);
      await waitSucceeded(admin, second!.id);
    } finally {
      await worker.stop();
    }
    assert.deepEqual(await history(admin, first.id), ["enqueued@0", "claimed@1", "completed@1"], "the repeat wrote nothing more");
    const retry = events.find((e) => e.type === "write_retry");
    assert.ok(retry?.type === "write_retry" && retry.error.code === Code.Unavailable, "the cut call answered UNAVAILABLE and repeated");
    const written = events.filter((e) => e.type === "written");
    assert.equal(written.length, 2);
    assert.ok(written[0]!.type === "written" && written[0]!.jobId === first.id && written[0]!.replayed, "the repeat is a replay (R21)");
    const ended = events.find((e) => e.type === "stream_ended");
    assert.ok(ended?.type === "stream_ended" && ended.error?.code === Code.Unavailable);
    assert.equal(unary.count("Claim"), 0, "both jobs came on streams");
    assert.equal(tap.calls("complete").length + unary.count("Complete"), 3, "two writes, one repeated");
  });

  it("TestWorkerStreamSurvivesCoordinatorRestart_R21: a write-back in flight when the coordinator dies lands once after it is back, and the worker takes more work on a new stream", { timeout: 60_000 }, async () => {
    const c = restarted;
    const provider = refund().provider!;
    const { client, tap, unary } = watched(c);
    const events: WorkerEvent[] = [];
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let started = 0;
    const worker = newWorker({
      client,
      provider,
      workerId: "survivor",
      concurrency: 2,
      writeRetries: 40,
      writeRetryDelayMs: 50,
      handlers: {
        refund: async (j) => (started++, await gate, { kind: "succeeded", providerRefundId: `re_${j.jobId}` } satisfies ProviderResult),
        reconcile: succeed.reconcile,
      },
    }, events);
    const cAdmin = c.client();
    worker.start();
    let first!: Job;
    try {
      [first] = await enqueue(cAdmin, 1, provider);
      await eventually(() => assert.equal(started, 1));
      // Frozen, the coordinator reads nothing: the write-back is sent on the
      // stream and no answer comes. Then it dies with it.
      c.signal("SIGSTOP");
      release();
      await eventually(() => assert.equal(tap.calls("complete").length, 1, "the complete went on the stream"));
      await sleep(100);
      await c.restart();
      await waitSucceeded(cAdmin, first!.id, 30_000);
      await eventually(() => assert.ok(tap.opened >= 2, "the worker opened its stream again"), 15_000);
      const more = await enqueue(cAdmin, 2, provider);
      for (const j of more) {
        await waitSucceeded(cAdmin, j.id);
      }
    } finally {
      release();
      c.signal("SIGCONT");
      await worker.stop();
    }
    assert.deepEqual(await history(cAdmin, first.id), ["enqueued@0", "claimed@1", "completed@1"], "one completion");
    const retries = events.filter((e) => e.type === "write_retry");
    assert.ok(retries.length >= 1 && retries.every((e) => e.type === "write_retry" && e.error.code === Code.Unavailable),
      "the write-back cut off with the stream was repeated after UNAVAILABLE");
    assert.ok(events.some((e) => e.type === "stream_ended"), "the worker saw its stream end");
    assert.equal(events.filter((e) => e.type === "written").length, 3);
    assert.ok(!events.some((e) => e.type === "write_failed" || e.type === "stale"));
    assert.equal(unary.count("Claim"), 0, "every grant came on a stream, before and after the restart");
    assert.equal(tap.starts().at(-1)!.workerId, "survivor");
  });

  it("TestWorkerStreamDrainHalfCloses: stop() half-closes the stream; nothing more is granted, the calls it carries are answered, and write-backs after it go as unary calls", { timeout: 60_000 }, async () => {
    const provider = refund().provider!;
    const { client, tap, unary } = watched(coord);
    const events: WorkerEvent[] = [];
    const gates = new Map<bigint, () => void>();
    const worker = newWorker({
      client,
      provider,
      workerId: "drainer",
      concurrency: 2,
      handlers: {
        refund: async (j) => {
          await new Promise<void>((r) => gates.set(j.jobId, r));
          return { kind: "succeeded", providerRefundId: `re_${j.jobId}` };
        },
        reconcile: succeed.reconcile,
      },
    }, events);
    worker.start();
    let stop: Promise<unknown> | undefined;
    let stopped = false;
    let jobs: Job[] = [];
    try {
      jobs = await enqueue(admin, 3, provider);
      await eventually(() => assert.equal(gates.size, 2));
      const [a, b] = [...gates.keys()];
      // Frozen, the coordinator keeps the stream open in its half-closed
      // state: A's write-back is on it, unanswered.
      coord.signal("SIGSTOP");
      gates.get(a!)!();
      await eventually(() => assert.equal(tap.calls("complete").length, 1, "A's complete went on the stream"));
      stop = worker.stop().then(() => (stopped = true));
      await eventually(() => assert.equal(tap.halfClosed, 1, "the stream was half-closed"));
      // B finishes during the drain: its write-back is a unary call, made
      // while the stream still waits for A's answer.
      gates.get(b!)!();
      await eventually(() => assert.equal(unary.count("Complete"), 1, "B's complete went as a unary call"));
      assert.equal(tap.calls("complete").length, 1);
      await sleep(200);
      assert.equal(stopped, false, "stop() waits for the stream to end and the jobs in flight");
      coord.signal("SIGCONT");
      await stop;
    } finally {
      coord.signal("SIGCONT");
      for (const open of gates.values()) open();
      await (stop ?? worker.stop());
    }
    await eventually(async () => assert.equal(await coord.metric("jobfence_worker_streams"), 0, "the coordinator ended the stream"));
    const states = await Promise.all(jobs.map(async (j) => (await admin.getJob({ job: { case: "jobId", value: j.id } })).job!));
    assert.deepEqual(states.map((j) => JobState[j.state]).sort(), ["READY", "SUCCEEDED", "SUCCEEDED"]);
    assert.equal(states.find((j) => j.state === JobState.READY)!.attempt, 0n, "nothing more was granted");
    assert.equal(events.filter((e) => e.type === "written").length, 2);
    assert.ok(!events.some((e) => e.type === "write_retry"), "A's call was answered on the half-closed stream, B's went unary at once");
    assert.equal(unary.count("Claim"), 0);
    assert.ok(!events.some((e) => e.type === "stream_ended"), "a drained stream is not opened again");
  });

  it("TestWorkerNoStreamClaims: noStream claims with Claim calls and writes back with unary calls", { timeout: 60_000 }, async () => {
    const provider = refund().provider!;
    const { client, tap, unary } = watched(coord);
    const events: WorkerEvent[] = [];
    const worker = newWorker({ client, provider, workerId: "unary", noStream: true, idlePollMs: 50 }, events);
    await workJobs(worker, 3, provider);
    assert.equal(tap.opened, 0, "no worker stream");
    assert.ok(unary.count("Claim") >= 1);
    assert.equal(unary.count("Complete"), 3);
  });

  it("TestWorkerFallsBackToClaimWithoutStream: a coordinator answering UNIMPLEMENTED for Work is claimed from with Claim calls, for good", { timeout: 60_000 }, async () => {
    const provider = refund().provider!;
    let works = 0;
    const noWork: Interceptor = (next) => async (req) => {
      if (req.method.name === "Work") {
        works++;
        throw new ConnectError("test: unknown service method Work", Code.Unimplemented);
      }
      return next(req);
    };
    const { client, unary } = watched(coord, [noWork]);
    const events: WorkerEvent[] = [];
    const worker = newWorker({ client, provider, workerId: "old-coordinator", idlePollMs: 50 }, events);
    await workJobs(worker, 3, provider);
    assert.equal(works, 1, "Work was tried once");
    const unsupported = events.filter((e) => e.type === "stream_unsupported");
    assert.equal(unsupported.length, 1);
    assert.ok(unsupported[0]!.type === "stream_unsupported" && unsupported[0]!.error.code === Code.Unimplemented);
    assert.ok(!events.some((e) => e.type === "stream_ended"));
    assert.ok(unary.count("Claim") >= 1);
    assert.equal(unary.count("Complete"), 3);
  });
});

describe("WorkSession calls", () => {
  it("TestStreamRepliesDecodeAsUnaryErrors_R24: a call answered on the stream rejects exactly as the unary call, by reason", { timeout: 60_000 }, async () => {
    const { client, tap, unary } = watched(coord);
    const plain = coord.client();
    const session = new WorkSession(client, { workerId: "errors", provider: "p-nothing-here", leaseMs: undefined }, 0, {
      granted: () => assert.fail("no credits, no grants"), retryAfter: () => undefined, dropped: () => undefined,
    });
    const served = session.serve();
    try {
      const req = refund();
      const job = (await admin.enqueueRefund(req)).job!;
      const a = (await admin.claim({ workerId: "A", maxJobs: 1, provider: req.provider! })).jobs[0]!;
      await coord.expireLease(job.id);
      const b = (await admin.claim({ workerId: "B", maxJobs: 1, provider: req.provider! })).jobs[0]!;
      assert.equal(b.attempt, 2n);
      const grant = (c: ClaimedJob) => ({ jobId: job.id, attempt: c.attempt, leaseToken: c.leaseToken });

      // STALE_ATTEMPT: A was taken over.
      const stale = { ...grant(a), providerRefundId: "re_A" };
      const staleErr = await sameError(session.complete(stale), plain.complete(stale));
      assert.ok(staleErr instanceof StaleAttemptError);
      assert.equal(staleErr.currentAttempt, 2n);
      assert.equal(staleErr.currentState, JobState.RUNNING);
      assert.equal(staleErr.attempt, 1n);

      // The holder's write lands on the stream; its repeat is a replay (R21).
      const done = { ...grant(b), providerRefundId: "re_B" };
      assert.equal((await session.complete(done)).replayed, false);
      assert.equal((await session.complete(done)).replayed, true);
      // JOB_NOT_RUNNING: another write of the same grant after it.
      const other = { ...grant(b), reason: "second thoughts" };
      assert.ok(await sameError(session.escalate(other), plain.escalate(other)) instanceof JobNotRunningError);
      const resched = { ...grant(b), reason: "again" };
      assert.ok(await sameError(session.reschedule(resched), plain.reschedule(resched)) instanceof JobNotRunningError);
      // INVALID_ARGUMENT, naming the field; NOT_FOUND.
      const bad = { ...grant(b), attempt: 0n, providerRefundId: "re" };
      const badErr = await sameError(session.complete(bad), plain.complete(bad));
      assert.ok(badErr instanceof InvalidArgumentError);
      assert.deepEqual(badErr.fields, ["attempt"]);
      const missing = { jobId: 999_999_999n, attempt: 1n, leaseToken: a.leaseToken, providerRefundId: "re" };
      assert.ok(await sameError(session.complete(missing), plain.complete(missing)) instanceof NotFoundError);
      // A renewal's refusal of one grant decodes as the unary one's.
      const [onStream] = await session.renewLeases([grant(a)]);
      const [asUnary] = await plain.renewLeases([grant(a)]);
      assert.ok(onStream?.kind === "refused" && asUnary?.kind === "refused");
      assert.ok(onStream.error instanceof StaleAttemptError);
      assert.deepEqual(describeError(onStream.error), describeError(asUnary.error));
      // A receipt, and its duplicate.
      const receipt = { job: { case: "jobId" as const, value: job.id }, attempt: a.attempt, leaseToken: a.leaseToken, source: "test:stream",
        outcome: ObservationOutcome.SUCCEEDED, providerRefundId: "re_A", providerEventId: "evt_stream" };
      const filed = await session.reportObservation(receipt);
      assert.equal(filed.duplicate, false);
      assert.equal(filed.observation!.attemptVerified, true);
      assert.equal((await session.reportObservation(receipt)).duplicate, true);

      // Every one of those went on the stream.
      assert.equal(tap.calls("complete").length, 5);
      assert.equal(tap.calls("escalate").length + tap.calls("reschedule").length + tap.calls("renewLeases").length, 3);
      assert.equal(tap.calls("reportObservation").length, 2);
      assert.equal(unary.count("Complete") + unary.count("Escalate") + unary.count("RenewLeases") + unary.count("ReportObservation"), 0);

      // Half-closed, the stream ends once it answered; calls go unary.
      session.closeSend();
      const end = await served;
      assert.deepEqual(end, { error: undefined, received: true });
      assert.equal(tap.halfClosed, 1);
      assert.equal((await session.complete(done)).replayed, true);
      assert.equal(unary.count("Complete"), 1, "after the half-close, a unary call");
      assert.equal(tap.calls("complete").length, 5);
    } finally {
      session.closeSend();
      await served;
    }
  });

  it("answers a call cut off with its stream UNAVAILABLE, and one without an answer in time DEADLINE_EXCEEDED", { timeout: 60_000 }, async () => {
    const { client, tap } = watched(coord);
    const req = refund();
    const job = (await admin.enqueueRefund(req)).job!;
    const a = (await admin.claim({ workerId: "A", maxJobs: 1, provider: req.provider! })).jobs[0]!;
    const grant = { jobId: job.id, attempt: a.attempt, leaseToken: a.leaseToken };

    tap.cutAfter("renewLeases", 1);
    const session = new WorkSession(client, { workerId: "cut-calls", provider: "p-nothing-here", leaseMs: undefined }, 0, {
      granted: () => assert.fail("no grants"), retryAfter: () => undefined, dropped: () => undefined,
    });
    const served = session.serve();
    const cut = await session.renewLeases([grant]).then(() => undefined, (e: unknown) => e);
    assert.ok(cut instanceof CoordinatorError && cut.code === Code.Unavailable, `cut call: ${String(cut)}`);
    const end = await served;
    assert.ok(end.error?.code === Code.Unavailable, "the stream ended with the cut");
    assert.equal(tap.calls("renewLeases").length, 1);

    // The coordinator frozen on a second stream: no answer within the deadline.
    const again = session.serve();
    try {
      const [renewed] = await session.renewLeases([grant]);
      assert.equal(renewed?.kind, "renewed", "a new stream answers");
      coord.signal("SIGSTOP");
      const late = await session.complete({ ...grant, providerRefundId: "re" }, { timeoutMs: 300 }).then(() => undefined, (e: unknown) => e);
      assert.ok(late instanceof CoordinatorError && late.code === Code.DeadlineExceeded, `late call: ${String(late)}`);
    } finally {
      coord.signal("SIGCONT");
      session.closeSend();
      await again;
    }
    assert.deepEqual(await history(admin, job.id), ["enqueued@0", "claimed@1", "completed@1"],
      "the call that outlived its deadline was served once the coordinator woke");
  });
});

// sameError awaits a call made on the stream and the same unary call, both
// rejecting, and asserts they rejected alike: class, code, reason, message,
// metadata and field violations (R24).
async function sameError(onStream: Promise<unknown>, asUnary: Promise<unknown>): Promise<CoordinatorError> {
  const [s, u] = await Promise.all([onStream.then(() => undefined, (e: unknown) => e), asUnary.then(() => undefined, (e: unknown) => e)]);
  assert.ok(s instanceof CoordinatorError, `the stream call rejected with a CoordinatorError, got ${String(s)}`);
  assert.ok(u instanceof CoordinatorError, `the unary call rejected with a CoordinatorError, got ${String(u)}`);
  assert.deepEqual(describeError(s), describeError(u));
  return s;
}

