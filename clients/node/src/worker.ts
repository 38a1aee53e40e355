// Worker: the lifecycle of a worker — start, stop, its slots — and where its
// grants come from: the worker stream (session.ts) or Claim calls. Each
// granted job runs in a slot of its own (job.ts).

import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { performance } from "node:perf_hooks";

import type { CoordinatorClient } from "./client.js";
import { toCoordinatorError } from "./errors.js";
import { emitter, jobIds, type Emit } from "./events.js";
import type { ClaimedJob } from "./gen/jobfence/v1/coordinator_pb.js";
import { JobRunner } from "./job.js";
import { settingsOf, type Settings, type WorkerOptions } from "./options.js";
import { Receipts } from "./receipts.js";
import { Renewer } from "./renewer.js";
import { WorkSession, type WorkerCalls } from "./session.js";
import { ReceiptSpool, ReceiptSpoolOff, defaultReceiptSpool } from "./spool.js";
import { Tracing } from "./tracing.js";

/**
 * Worker runs the claim → provider call → fenced write-back loop.
 *
 * - It is granted only as many jobs as it has free slots (R18): no batch is
 *   claimed to be held in memory. The grants come on the worker stream,
 *   which also carries its write-backs, renewals and receipts, or from
 *   Claim calls (`noStream`, or a coordinator without the stream).
 * - While a handler runs, it renews the job's lease (R27, `renewLeases`), and
 *   aborts the handler's signal with a GrantLostError once a renewal says the
 *   grant is lost.
 * - It dispatches by next_action: REFUND to handlers.refund, anything else to
 *   handlers.reconcile (R14); a job whose cancel was requested goes to
 *   handlers.reconcile whatever its grant says, and is never sent (R32).
 * - Before a same-key resend it checks the coordinator's resend_deadline
 *   again and escalates instead when the window has closed (R14, R16, R22).
 * - It turns the answer into Complete, Reschedule or Escalate carrying the
 *   claimed grant — attempt and lease token (R9, R25) — via decideReconcile.
 *   The token stays inside the Worker: handlers get the claim without it
 *   (WorkerJob.claimed), events carry only its fingerprint (`grant`).
 * - A write rejected by the fence (STALE_ATTEMPT, JOB_NOT_RUNNING) is never
 *   repeated: the provider's answer is filed with ReportObservation (R15),
 *   with the claim's lease token, so the coordinator stores it with
 *   attemptVerified (R25).
 * - A receipt the coordinator cannot take now is spooled to a local file and
 *   filed later, after a restart too (R28, `receiptSpool`).
 * - A failed claim, CLAIM_OUTCOME_UNKNOWN included, grants nothing: nothing is
 *   acted on (R7).
 * - A write-back is repeated only after UNAVAILABLE (WRITE_OUTCOME_UNKNOWN,
 *   DATABASE_UNAVAILABLE, transport) or a cut deadline; the same write is
 *   idempotent for its attempt and `replayed: true` is success (R21).
 *
 * The Worker owns the lifecycle — start, stop, the slots, the claim loop and
 * the stream loop; the run of one job is a JobRunner's (job.ts), renewal a
 * Renewer's (renewer.ts), receipts and the spool a Receipts' (receipts.ts),
 * the stream a WorkSession's (session.ts).
 */
export class Worker {
  private readonly client: CoordinatorClient;
  private readonly settings: Settings;
  private readonly emit: Emit;
  // The worker stream; undefined with noStream. calls is where the
  // write-backs, renewals and receipts go: the session (on its stream while
  // one is open, else unary), or the client.
  private readonly session: WorkSession | undefined;
  private readonly calls: WorkerCalls;
  private readonly renewer: Renewer;
  private readonly receipts: Receipts;
  private readonly jobs: JobRunner;
  // The part of a Claim's deadline beyond its long poll.
  private readonly claimTimeoutMs = 10_000;
  private readonly active = new Set<Promise<void>>();
  private wakers: Array<() => void> = [];
  private stopping = false;
  // Cancels a parked long-poll Claim on stop().
  private readonly stopSignal = new AbortController();
  private loopDone: Promise<void> | undefined;

  /**
   * Throws RangeError for options outside their bounds; ReceiptSpoolLockedError
   * when another worker holds the receipt spool; the file system's error when
   * the spool cannot be created or opened.
   */
  constructor(options: WorkerOptions) {
    this.client = options.client;
    this.settings = settingsOf(options);
    this.emit = emitter(this.settings.onEvent);
    if (options.noStream === true) {
      this.calls = this.client;
    } else {
      this.session = new WorkSession(this.client, {
        workerId: this.settings.workerId, provider: this.settings.provider ?? "", leaseMs: this.settings.leaseMs,
      }, this.settings.concurrency, {
        granted: (jobs) => {
          this.receipts.healed();
          this.startJobs(jobs);
        },
        retryAfter: (retryAfterMs) => this.emit({ type: "budget_exhausted", retryAfterMs }),
        dropped: (jobs) => this.emit({ type: "grants_dropped", grants: jobs.flatMap((c) => (c.job === undefined ? [] : [jobIds(c)])) }),
      });
      this.calls = this.session;
    }
    const spool = options.receiptSpool === ReceiptSpoolOff
      ? undefined
      : ReceiptSpool.open(options.receiptSpool || defaultReceiptSpool(this.settings.workerId));
    this.receipts = new Receipts(this.calls, spool, this.settings, this.emit);
    const tracing = new Tracing(options.tracerProvider, this.settings.workerId);
    this.renewer = new Renewer(this.calls, this.settings, this.emit, () => this.receipts.healed(), tracing);
    this.jobs = new JobRunner(this.settings, this.calls, this.renewer, this.receipts, this.emit, tracing);
  }

  /** receiptSpool is the spool's path; undefined when it is off. */
  get receiptSpool(): string | undefined {
    return this.receipts.path;
  }

  /** spooledReceipts is how many receipts the spool holds now. */
  get spooledReceipts(): number {
    return this.receipts.pending;
  }

  /** inFlight is the number of jobs being handled now. */
  get inFlight(): number {
    return this.active.size;
  }

  /** start begins claiming. Throws if the worker was already started. */
  start(): void {
    if (this.loopDone !== undefined) {
      throw new Error("worker already started");
    }
    this.loopDone = this.run();
  }

  private async run(): Promise<void> {
    // R28: what a predecessor (or this worker) could not file goes first,
    // then every 30 s and as soon as a failure heals.
    await this.receipts.start();
    if (this.session !== undefined && (await this.streamLoop(this.session)) === "stopped") {
      return;
    }
    await this.claimLoop();
  }

  /**
   * stop drains the worker: it claims nothing more and resolves once every
   * in-flight job has written back. The worker stream is half-closed: the
   * coordinator grants nothing more, answers the calls sent on it and ends
   * it; a grant already on its way is not started (it can no longer be
   * acknowledged: the coordinator hands it back, `grants_dropped`), and the
   * write-backs after that go as unary calls. A long-poll Claim still
   * waiting at the coordinator is cancelled; jobs a finished claim granted
   * are handled.
   * Answers that arrived after their provider-call deadline are filed for up
   * to lateAnswerGraceMs more. Then the receipt spool gets a last refile pass
   * (up to 10 s) and is released; an empty one is removed. stop() before
   * start() releases the spool.
   */
  async stop(): Promise<void> {
    this.stopping = true;
    this.receipts.drain();
    this.wake();
    // R7: a cancelled claim grants nothing the worker acts on; should the
    // cancel land inside the claim's own commit, the job returns through a
    // takeover after its lease.
    this.stopSignal.abort();
    this.session?.closeSend();
    await this.loopDone;
    while (this.active.size > 0) {
      await Promise.allSettled([...this.active]);
    }
    // Every handler has returned: nothing is held, nothing renewed.
    await this.renewer.stop();
    await this.jobs.lateAnswers(this.settings.lateAnswerGraceMs);
    await this.receipts.close();
  }

  private async claimLoop(): Promise<void> {
    while (!this.stopping) {
      const free = this.settings.concurrency - this.active.size;
      if (free <= 0) {
        await this.sleep(1_000); // woken as soon as a job finishes
        continue;
      }
      let jobs: ClaimedJob[];
      let retryAfterMs = 0;
      const started = performance.now();
      try {
        // R18: ask only for what can start now.
        const wait = this.settings.claimWaitMs;
        const resp = await this.client.claim(
          {
            workerId: this.settings.workerId,
            maxJobs: free,
            leaseDuration: this.settings.leaseMs === undefined ? undefined : durationFromMs(this.settings.leaseMs),
            provider: this.settings.provider ?? "",
            wait: wait > 0 ? durationFromMs(wait) : undefined,
          },
          // The call's deadline lies beyond the long poll.
          { timeoutMs: wait + this.claimTimeoutMs, signal: this.stopSignal.signal },
        );
        jobs = resp.jobs;
        if (resp.retryAfter !== undefined) {
          // R19: due work waits on the provider's outbound budget.
          retryAfterMs = Number(resp.retryAfter.seconds) * 1000 + resp.retryAfter.nanos / 1e6;
        }
      } catch (err) {
        if (this.stopping) {
          break; // the long poll was cancelled by stop()
        }
        // R7: a failed claim, CLAIM_OUTCOME_UNKNOWN included, grants nothing.
        // A job it did commit comes back through a takeover after its lease.
        this.emit({ type: "claim_failed", error: toCoordinatorError(err) });
        await this.sleep(this.settings.claimErrorBackoffMs);
        continue;
      }
      this.receipts.healed();
      this.startJobs(jobs);
      if (retryAfterMs > 0) {
        this.emit({ type: "budget_exhausted", retryAfterMs });
      }
      if (jobs.length === 0) {
        await this.sleep(Math.max(retryAfterMs, this.settings.idlePollMs - (performance.now() - started)));
      }
    }
  }

  // streamLoop keeps the worker stream open while the worker runs, opening
  // it again after it ended, and returns "stopped" once the stream the drain
  // half-closed has ended; "unsupported" when the coordinator has no worker
  // stream, so that the worker claims with Claim calls instead.
  private async streamLoop(session: WorkSession): Promise<"stopped" | "unsupported"> {
    const first = this.settings.claimErrorBackoffMs;
    let backoffMs = first;
    while (!this.stopping) {
      const end = await session.serve();
      if (end.error?.code === Code.Unimplemented) {
        this.emit({ type: "stream_unsupported", error: end.error });
        return "unsupported";
      }
      if (this.stopping) {
        break;
      }
      if (end.received || end.error === undefined) {
        backoffMs = first; // it was open, or the coordinator is stopping: not a failure to open
      }
      const retryInMs = Math.round(backoffMs * (0.5 + Math.random()));
      this.emit({ type: "stream_ended", error: end.error, retryInMs });
      await pause(retryInMs, this.stopSignal.signal);
      backoffMs = Math.min(2 * backoffMs, Math.max(first, MaxStreamBackoffMs));
    }
    return "stopped";
  }

  // startJobs runs granted jobs, each in a slot of its own; a slot that
  // frees is a credit for the worker stream.
  private startJobs(jobs: ClaimedJob[]): void {
    const claimedAt = performance.now();
    for (const claimed of jobs) {
      const run = this.jobs.run(claimed, claimedAt).finally(() => {
        this.active.delete(run);
        this.session?.freed();
        this.wake();
      });
      this.active.add(run);
    }
  }

  private sleep(ms: number): Promise<void> {
    if (this.stopping || ms <= 0) {
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      const waker = (): void => done();
      this.wakers.push(waker);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
    });
  }

  private wake(): void {
    const w = this.wakers;
    this.wakers = [];
    for (const f of w) {
      f();
    }
  }
}

/**
 * MaxStreamBackoffMs bounds the wait before the worker stream opens again,
 * unless claimErrorBackoffMs is longer.
 */
export const MaxStreamBackoffMs = 5_000;

// pause waits ms, or less when signal aborts.
function pause(ms: number, signal: AbortSignal): Promise<void> {
  if (signal.aborted) {
    return Promise.resolve();
  }
  return new Promise((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}
