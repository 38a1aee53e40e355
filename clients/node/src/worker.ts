// Worker: claims what it can start now, calls the user's provider handlers and
// writes the outcome back under the claimed grant (attempt and lease token).

import { durationFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { performance } from "node:perf_hooks";

import { MaxRenewBatch, grantOf, type CoordinatorClient, type Renewal } from "./client.js";
import { coordinatorNow, decideReconcile, resendAllowed, sendsAgain, type ProviderResult, type WriteDecision } from "./decide.js";
import { CoordinatorError, FencedWriteError, GrantLostError, Reason, isRetryableWrite, toCoordinatorError } from "./errors.js";
import { NextAction, ObservationOutcome, type ClaimedJob, type Job } from "./gen/jobfence/v1/coordinator_pb.js";
import { grantFingerprint, type ClaimedJobView } from "./grant.js";
import { ReceiptRefileIntervalMs, ReceiptSpool, ReceiptSpoolOff, defaultReceiptSpool, type SpooledReceipt } from "./spool.js";
import { WorkSession, type WorkerCalls } from "./stream.js";

/** WorkerJob is one claimed job as a handler sees it. */
export interface WorkerJob {
  readonly jobId: bigint;
  /**
   * The generation of this claim, for logs next to operationKey (R3).
   * Never send it to the provider (R2).
   */
  readonly attempt: bigint;
  /**
   * The grant's fingerprint (R25): 12 hex digits naming this claim's lease
   * token without revealing it (`grantFingerprint`). Safe to log, next to
   * jobId and attempt. The token itself stays inside the Worker, which sends
   * it with every write-back: a handler never sees it.
   */
  readonly grant: string;
  /** The refund's business key: send it as the provider's Idempotency-Key (R1). */
  readonly operationKey: string;
  readonly nextAction: NextAction;
  /** True when this claim took the job over from an expired lease (R6). */
  readonly takeover: boolean;
  /** The job as claimed: order, payment, amount, currency, provider… */
  readonly job: Job;
  /**
   * The claim, including receipts already filed for the job (R15), less its
   * lease token (R25): the Worker keeps the token and sends it with every
   * write-back, so a handler can neither leak it nor need it.
   */
  readonly claimed: ClaimedJobView;
  /**
   * Aborted when the provider-call deadline passes, and when the Worker
   * learns that this grant is lost (R27: a renewal answered STALE_ATTEMPT,
   * JOB_NOT_RUNNING or NOT_FOUND; `signal.reason` is then a GrantLostError):
   * cancel the request and send nothing new to the provider. An answer
   * already received is still worth returning: it is filed as an
   * observation when the fence refuses the write-back (R15).
   */
  readonly signal: AbortSignal;
  /** The provider-call timeout in milliseconds. */
  readonly timeoutMs: number;
}

/**
 * Handlers call the payment provider. `refund` sends the refund with
 * operationKey as Idempotency-Key; `reconcile` asks the provider what
 * happened under operationKey (R14). Both answer with a ProviderResult; a
 * throw means the outcome is unknown.
 */
export interface Handlers {
  refund(job: WorkerJob): Promise<ProviderResult>;
  reconcile(job: WorkerJob): Promise<ProviderResult>;
}

/**
 * JobIds name the job and grant an event is about. `grant` is the grant's
 * fingerprint (R25, `grantFingerprint`): log it next to jobId and attempt, as
 * the Go worker logs `grant`. The lease token itself is in no event.
 */
export interface JobIds {
  jobId: bigint;
  attempt: bigint;
  /** The fingerprint of the claim's lease token; "" from a coordinator older than tokens. */
  grant: string;
  operationKey: string;
}

/**
 * WorkerEvent reports what the worker did, for logs and metrics (M1). Every
 * event about a job carries its JobIds, the grant fingerprint included, and
 * never the lease token (R25): an event can be logged whole.
 */
export type WorkerEvent =
  | ({ type: "claimed"; nextAction: NextAction; takeover: boolean } & JobIds)
  | { type: "claim_failed"; error: CoordinatorError }
  | {
      /**
       * The worker stream ended while the worker runs: `error` says why (a
       * lost connection, a stream that could not open), undefined when the
       * coordinator ended it cleanly (it is stopping). It opens again in
       * `retryInMs`, with every free slot as credits. Calls it carried and
       * had no answer for are answered UNAVAILABLE and repeated (R21); a
       * grant it may have been sending grants nothing to act on (R7).
       */
      type: "stream_ended";
      error: CoordinatorError | undefined;
      retryInMs: number;
    }
  | {
      /**
       * Grants the worker stream delivered after the drain's half-close: they
       * can no longer be acknowledged, so they are not started and nothing is
       * written for them; the coordinator hands them back when the stream
       * ends, due now under their own grants (R25).
       */
      type: "grants_dropped";
      grants: JobIds[];
    }
  | {
      /**
       * The coordinator has no worker stream (UNIMPLEMENTED): the worker
       * claims with Claim calls from now on, as with `noStream`.
       */
      type: "stream_unsupported";
      error: CoordinatorError;
    }
  | {
      /**
       * R19: jobs are due but their providers' outbound budgets allow none
       * now; work is offered again (on the stream) or claimed again after
       * `retryAfterMs`.
       */
      type: "budget_exhausted";
      retryAfterMs: number;
    }
  | ({ type: "handler_error"; error: unknown } & JobIds)
  | ({ type: "provider_deadline" } & JobIds)
  | ({ type: "resend_refused"; reason: string } & JobIds)
  | ({ type: "written"; decision: WriteDecision; replayed: boolean } & JobIds)
  | ({ type: "write_retry"; error: CoordinatorError; retry: number } & JobIds)
  | ({ type: "write_failed"; error: CoordinatorError } & JobIds)
  | ({ type: "stale"; error: FencedWriteError; decision: WriteDecision } & JobIds)
  | ({
      /** The lease of a job whose handler runs was renewed (R27). */
      type: "renewed";
      leaseUntil: Date;
      grantExpiresAt: Date | undefined;
      /** A receipt of success or failure was filed for the job during this grant (R28). */
      receiptFiledAt: Date | undefined;
    } & JobIds)
  | ({
      /**
       * A renewal said the grant is gone (STALE_ATTEMPT, JOB_NOT_RUNNING or
       * NOT_FOUND, R27): the handler's signal was aborted with a
       * GrantLostError; its answer, if it returns one, is filed as an
       * observation when the fence refuses the write-back (R15).
       */
      type: "grant_lost";
      reason: string;
      error: CoordinatorError;
    } & JobIds)
  | ({
      /**
       * GRANT_TOO_OLD (R27): the grant reached the coordinator's
       * --max-grant-age and is renewed no more. The handler runs on: the
       * grant stays valid until a takeover commits after its lease runs out
       * (R8).
       */
      type: "grant_too_old";
      grantExpiresAt: Date | undefined;
      error: CoordinatorError;
    } & JobIds)
  | {
      /**
       * A RenewLeases call failed (UNAVAILABLE, a cut deadline, a transport
       * error), or left these grants undecided: they are renewed again in
       * `retryInMs` (a tenth of the lease after a failure that may pass).
       * Handlers are never aborted for it.
       */
      type: "renewal_failed";
      error: CoordinatorError;
      grants: JobIds[];
      retryInMs: number;
    }
  | ({
      type: "observation";
      outcome: ObservationOutcome;
      providerRefundId: string;
      duplicate: boolean;
      /** The coordinator verified the claim's lease token with the receipt (R25). */
      attemptVerified: boolean;
    } & JobIds)
  | ({
      type: "observation_failed";
      error: CoordinatorError;
      /** Why the receipt was not spooled either, when the error may pass and spooling failed (R28). */
      spoolError?: unknown;
    } & JobIds)
  | ({
      /** The coordinator could not take the receipt now; it is in the receipt spool, filed later (R28). */
      type: "spooled";
      error: CoordinatorError;
      spool: string;
      outcome: ObservationOutcome;
      providerRefundId: string;
    } & JobIds)
  | ({
      /** A spooled receipt was filed; `duplicate` when the coordinator had it already (a lost reply). */
      type: "refiled";
      duplicate: boolean;
      attemptVerified: boolean;
      outcome: ObservationOutcome;
      providerRefundId: string;
    } & JobIds)
  | {
      /** The spool itself: unreadable lines kept, a rewrite that failed (R28). Nothing is lost. */
      type: "spool_error";
      spool: string;
      error: unknown;
    };

/** WorkerOptions configures a Worker. */
export interface WorkerOptions {
  client: CoordinatorClient;
  /** Recorded in the job history; 1..128 characters. */
  workerId: string;
  handlers: Handlers;
  /** How many jobs may be in flight at once (1..100). Default 1. */
  concurrency?: number;
  /**
   * The lease to ask for (1 s..15 min), in claims and renewals; the
   * coordinator's default when unset (R17).
   */
  leaseMs?: number;
  /** Claim only jobs of this provider. */
  provider?: string;
  /**
   * Turn the worker stream off: claim with Claim calls (long polls of
   * `claimWaitMs`, or polls every `idlePollMs`) and write back with unary
   * calls. By default the worker opens one stream (Coordinator.Work), on
   * which the coordinator pushes grants as slots free up — at once when a
   * job is enqueued on the same coordinator — never more than the free
   * slots (R18); the write-backs, renewals and receipts go on it, answered
   * exactly as the unary calls (the same errors, R24), and a call cut off
   * with its stream is repeated (R21), on the next stream or as a unary
   * call. Each grant is acknowledged as soon as it is read, before its jobs
   * start: the coordinator hands back a grant left unacknowledged for 5 s,
   * so a worker that stops reading holds no job. A stream that ends is
   * opened again after `claimErrorBackoffMs`, doubling up to 5 s
   * (`stream_ended`). A coordinator without the stream (UNIMPLEMENTED) is
   * claimed from as with `noStream` (`stream_unsupported`). Default false.
   */
  noStream?: boolean;
  /**
   * The provider-call deadline: a handler still running after it is aborted
   * and the outcome counts as unknown. Default 10 s. Without renewal
   * (`renewLeases: false`) it must be shorter than the lease (R17); a
   * renewing worker may wait out provider calls longer than the lease (R27
   * amends R17, R18), up to the coordinator's --max-grant-age.
   */
  providerCallTimeoutMs?: number;
  /**
   * Renew the lease of every job while its handler runs (R27, amends R18).
   * One timer per worker renews all held jobs that are due in one
   * RenewLeases call (batches of up to 100), each about every
   * `renewIntervalMs`; a job is renewed no more once its handler returns or
   * its provider-call deadline passes. When a renewal says the grant is lost
   * (STALE_ATTEMPT: taken over; JOB_NOT_RUNNING; NOT_FOUND), the handler's
   * signal is aborted with a GrantLostError (`grant_lost`); what it still
   * returns goes the usual way: the fence refuses the write-back and the
   * answer is filed as an observation (R15). GRANT_TOO_OLD (the grant reached
   * the coordinator's --max-grant-age) stops the job's renewals and aborts
   * nothing (`grant_too_old`): the grant is valid until a takeover commits
   * (R8). A failed RenewLeases call aborts nothing either; it is repeated at
   * a tenth of the lease (`renewal_failed`). Default true.
   */
  renewLeases?: boolean;
  /**
   * How often a held job's lease is renewed, ±10 % jitter. Default a third
   * of the job's lease, as the claim granted it (its leaseUntil − claimedAt,
   * both the coordinator's clock, R12). Must be shorter than `leaseMs`.
   */
  renewIntervalMs?: number;
  /**
   * Whether the provider guarantees same-key, same-body resends are safe
   * (R14); per provider name when a function. Default false: a "no record"
   * reconcile escalates (R16).
   */
  sameKeyResendSafe?: boolean | ((provider: string) => boolean);
  /** No resend is started this close to the resend_deadline. Default 60 s. */
  resendMarginMs?: number;
  /** Delay before reconciling a job whose outcome is unknown. Default 5 s. */
  unknownOutcomeDelayMs?: number;
  /** Delay before reconciling a pending refund when the answer names none. Default 30 s. */
  pendingDelayMs?: number;
  /**
   * Long poll: how long an idle Claim may wait at the coordinator for work
   * (0..60 s); new jobs then start within milliseconds of their enqueue.
   * 0 polls instead. Default 10 s. Only for Claim calls (`noStream`): the
   * worker stream waits as long as it is open.
   */
  claimWaitMs?: number;
  /**
   * The least time between two claims that found nothing (when long polling,
   * counted from the start of the claim, so a coordinator that answers at
   * once, e.g. while draining, is not hammered). Default 1 s. Only for
   * Claim calls (`noStream`).
   */
  idlePollMs?: number;
  /**
   * Wait after a failed claim. Default 1 s. The first wait before the
   * worker stream opens again after it ended, doubling while it cannot be
   * opened, up to 5 s (or this, when longer), ±50 % jitter.
   */
  claimErrorBackoffMs?: number;
  /** How often a write-back is repeated after UNAVAILABLE or a cut deadline. Default 6. */
  writeRetries?: number;
  /** First delay between write-back repeats, doubling up to 2 s. Default 100 ms. */
  writeRetryDelayMs?: number;
  /** How long stop() waits for answers that arrive after their deadline, to file them. Default providerCallTimeoutMs. */
  lateAnswerGraceMs?: number;
  /** Receives every WorkerEvent. */
  onEvent?: (event: WorkerEvent) => void;
  /**
   * The receipt spool (R28): a file keeping the receipts this worker could
   * not file. A provider's answer whose ReportObservation failed in a way that
   * may succeed later (UNAVAILABLE, DATABASE_* included, DEADLINE_EXCEEDED, a
   * transport error, UNAUTHENTICATED, INTERNAL), after the worker's own
   * repeats (`writeRetries`), is appended to it as one JSON line, fsynced
   * before the worker moves on, and filed again: when the worker starts
   * (before it opens its stream or claims), every 30 s, and as soon as a
   * call succeeds after such a failure. The coordinator deduplicates a
   * receipt filed twice. A permanent refusal (INVALID_ARGUMENT, NOT_FOUND,
   * PERMISSION_DENIED…) is reported
   * (`observation_failed`), not spooled. The
   * file holds lease tokens: it is created 0600 in a 0700 folder, and no event
   * carries a token. Bounded by MaxSpooledReceipts and MaxReceiptSpoolBytes;
   * past them a receipt is reported only (`observation_failed` with
   * `spoolError`).
   *
   * Default: `defaultReceiptSpool(workerId)`, named after the worker id under
   * `$XDG_CACHE_HOME` or `~/.cache`, in `jobfence/` — the Go SDK's file for the
   * same id. A restarted worker files its predecessor's receipts only if it
   * opens the same file: keep its workerId (or receiptSpool) stable. `"off"`:
   * no spool; a receipt the coordinator does not take is only reported. The
   * constructor locks the spool (`<path>.lock`, with this pid; stale once that
   * process is gone), so that two workers with the same id on one machine
   * never share it; `stop()` releases it.
   */
  receiptSpool?: string;
}

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
 *   handlers.reconcile (R14).
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
 */
export class Worker {
  private readonly client: CoordinatorClient;
  // The worker stream; undefined with noStream. calls is where the
  // write-backs, renewals and receipts go: the session (on its stream while
  // one is open, else unary), or the client.
  private readonly session: WorkSession | undefined;
  private readonly calls: WorkerCalls;
  // The part of a Claim's deadline beyond its long poll.
  private readonly claimTimeoutMs = 10_000;
  private readonly opts:
    Required<Omit<WorkerOptions, "leaseMs" | "provider" | "onEvent" | "client" | "handlers" | "receiptSpool" | "renewIntervalMs" | "noStream">> &
    Pick<WorkerOptions, "leaseMs" | "provider" | "onEvent" | "handlers" | "renewIntervalMs">;
  // The jobs whose handler runs, by job id, renewed by one timer (R27).
  // renewing is the renewal pass in flight; the timer is set only between
  // passes, for the earliest due job.
  private readonly held = new Map<bigint, Held>();
  private renewTimer: NodeJS.Timeout | undefined;
  private renewing: Promise<void> | undefined;
  // The receipt spool (R28); undefined when off. backlog: it holds receipts
  // the coordinator was away for, so that the next successful call kicks a
  // refile pass. refiling chains the passes, one at a time.
  private readonly spool: ReceiptSpool | undefined;
  private backlog = false;
  private refiling: Promise<void> = Promise.resolve();
  private lastRefile = 0;
  private refileTimer: NodeJS.Timeout | undefined;
  private kickTimer: NodeJS.Timeout | undefined;
  private readonly active = new Set<Promise<void>>();
  private readonly late = new Set<Promise<void>>();
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
    const providerCallTimeoutMs = options.providerCallTimeoutMs ?? 10_000;
    this.client = options.client;
    this.opts = {
      workerId: options.workerId,
      handlers: options.handlers,
      concurrency: options.concurrency ?? 1,
      leaseMs: options.leaseMs,
      provider: options.provider,
      providerCallTimeoutMs,
      sameKeyResendSafe: options.sameKeyResendSafe ?? false,
      resendMarginMs: options.resendMarginMs ?? 60_000,
      unknownOutcomeDelayMs: options.unknownOutcomeDelayMs ?? 5_000,
      pendingDelayMs: options.pendingDelayMs ?? 30_000,
      claimWaitMs: options.claimWaitMs ?? 10_000,
      idlePollMs: options.idlePollMs ?? 1_000,
      claimErrorBackoffMs: options.claimErrorBackoffMs ?? 1_000,
      writeRetries: options.writeRetries ?? 6,
      writeRetryDelayMs: options.writeRetryDelayMs ?? 100,
      lateAnswerGraceMs: options.lateAnswerGraceMs ?? providerCallTimeoutMs,
      renewLeases: options.renewLeases ?? true,
      renewIntervalMs: options.renewIntervalMs,
      onEvent: options.onEvent,
    };
    if (!Number.isInteger(this.opts.concurrency) || this.opts.concurrency < 1 || this.opts.concurrency > 100) {
      throw new RangeError(`concurrency must be 1..100, got ${this.opts.concurrency}`);
    }
    if (!(this.opts.claimWaitMs >= 0 && this.opts.claimWaitMs <= 60_000)) {
      throw new RangeError(`claimWaitMs must be 0..60000, got ${this.opts.claimWaitMs}`);
    }
    if (!(providerCallTimeoutMs > 0)) {
      throw new RangeError(`providerCallTimeoutMs must be positive, got ${providerCallTimeoutMs}`);
    }
    // R17: without renewal the provider call must end well inside the lease,
    // or every slow call turns into a takeover. A renewing worker keeps its
    // lease for as long as the call runs (R27 amends R17, R18).
    if (!this.opts.renewLeases && this.opts.leaseMs !== undefined && providerCallTimeoutMs >= this.opts.leaseMs) {
      throw new RangeError(`providerCallTimeoutMs (${providerCallTimeoutMs}) must be shorter than leaseMs (${this.opts.leaseMs}) ` +
        "when leases are not renewed");
    }
    const every = this.opts.renewIntervalMs;
    if (every !== undefined && !(every > 0 && Number.isFinite(every))) {
      throw new RangeError(`renewIntervalMs must be positive, got ${every}`);
    }
    if (every !== undefined && this.opts.leaseMs !== undefined && every >= this.opts.leaseMs) {
      throw new RangeError(`renewIntervalMs (${every}) must be shorter than leaseMs (${this.opts.leaseMs})`);
    }
    if (options.noStream === true) {
      this.calls = this.client;
    } else {
      this.session = new WorkSession(this.client, {
        workerId: this.opts.workerId, provider: this.opts.provider ?? "", leaseMs: this.opts.leaseMs,
      }, this.opts.concurrency);
      this.calls = this.session;
    }
    if (options.receiptSpool !== ReceiptSpoolOff) {
      this.spool = ReceiptSpool.open(options.receiptSpool || defaultReceiptSpool(this.opts.workerId));
      if (this.spool.torn > 0) {
        this.emit({
          type: "spool_error", spool: this.spool.path,
          error: new Error(`cut off ${this.spool.torn} bytes of an unfinished last line: a crash in the middle of an append that was never acknowledged`),
        });
      }
    }
  }

  /** receiptSpool is the spool's path; undefined when it is off. */
  get receiptSpool(): string | undefined {
    return this.spool?.path;
  }

  /** spooledReceipts is how many receipts the spool holds now. */
  get spooledReceipts(): number {
    return this.spool?.pending ?? 0;
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
    if (this.spool !== undefined) {
      // R28: what a predecessor (or this worker) could not file goes first,
      // then every 30 s and as soon as a failure heals.
      await this.refile();
      this.refileTimer = setInterval(() => void this.refile(), ReceiptRefileIntervalMs);
    }
    if (this.session !== undefined && (await this.streamLoop(this.session)) === "stopped") {
      return;
    }
    await this.loop();
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
    clearTimeout(this.renewTimer);
    await this.renewing;
    if (this.late.size > 0) {
      await Promise.race([Promise.allSettled([...this.late]), delay(this.opts.lateAnswerGraceMs)]);
    }
    if (this.spool !== undefined) {
      clearInterval(this.refileTimer);
      clearTimeout(this.kickTimer);
      // A last pass for what the drain spooled, bounded.
      if (this.spool.pending > 0) {
        await this.refile(AbortSignal.timeout(finalRefileTimeoutMs));
      }
      await this.refiling;
      this.spool.close();
    }
  }

  private async loop(): Promise<void> {
    while (!this.stopping) {
      const free = this.opts.concurrency - this.active.size;
      if (free <= 0) {
        await this.sleep(1_000); // woken as soon as a job finishes
        continue;
      }
      let jobs: ClaimedJob[];
      let retryAfterMs = 0;
      const started = performance.now();
      try {
        // R18: ask only for what can start now.
        const wait = this.opts.claimWaitMs;
        const resp = await this.client.claim(
          {
            workerId: this.opts.workerId,
            maxJobs: free,
            leaseDuration: this.opts.leaseMs === undefined ? undefined : durationFromMs(this.opts.leaseMs),
            provider: this.opts.provider ?? "",
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
        await this.sleep(this.opts.claimErrorBackoffMs);
        continue;
      }
      this.kickRefile();
      this.startJobs(jobs);
      if (retryAfterMs > 0) {
        this.emit({ type: "budget_exhausted", retryAfterMs });
      }
      if (jobs.length === 0) {
        await this.sleep(Math.max(retryAfterMs, this.opts.idlePollMs - (performance.now() - started)));
      }
    }
  }

  // streamLoop keeps the worker stream open while the worker runs, opening
  // it again after it ended, and returns "stopped" once the stream the drain
  // half-closed has ended; "unsupported" when the coordinator has no worker
  // stream, so that the worker claims with Claim calls instead.
  private async streamLoop(session: WorkSession): Promise<"stopped" | "unsupported"> {
    const first = this.opts.claimErrorBackoffMs;
    let backoffMs = first;
    while (!this.stopping) {
      const end = await session.serve(
        (jobs) => {
          this.kickRefile();
          this.startJobs(jobs);
        },
        (retryAfterMs) => this.emit({ type: "budget_exhausted", retryAfterMs }),
        (jobs) => this.emit({ type: "grants_dropped", grants: jobs.flatMap((c) => (c.job === undefined ? [] : [jobIds(c)])) }),
      );
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
      backoffMs = Math.min(2 * backoffMs, Math.max(first, maxStreamBackoffMs));
    }
    return "stopped";
  }

  // startJobs runs granted jobs, each in a slot of its own; a slot that
  // frees is a credit for the worker stream.
  private startJobs(jobs: ClaimedJob[]): void {
    const claimedAt = performance.now();
    for (const claimed of jobs) {
      const run = this.runJob(claimed, claimedAt).finally(() => {
        this.active.delete(run);
        this.session?.freed();
        this.wake();
      });
      this.active.add(run);
    }
  }

  private async runJob(claimed: ClaimedJob, claimedAt: number): Promise<void> {
    const job = claimed.job;
    if (job === undefined) {
      return; // never sent by the coordinator; nothing to act on
    }
    const ids = jobIds(claimed);
    this.emit({ type: "claimed", ...ids, nextAction: claimed.nextAction, takeover: claimed.takeover });

    if (claimed.nextAction === NextAction.REFUND && sendsAgain(claimed) && this.resendSafe(job.provider)) {
      // R14, R22: the reconcile that chose this same-key resend checked the
      // window, but the job may have waited since (a backlog, an empty
      // provider budget). Past the window the provider has forgotten the key
      // and the resend would be a second refund: check again before anything
      // leaves, against the coordinator's clock (R12).
      const now = coordinatorNow(claimed, performance.now() - claimedAt);
      if (now === undefined || !resendAllowed(claimed, { sameKeyResendSafe: true, now, resendMarginMs: this.opts.resendMarginMs })) {
        const reason = "same-key resend refused before sending: the provider's idempotency-key retention window has passed " +
          "or is about to (R14, R16, R22)";
        this.emit({ type: "resend_refused", ...ids, reason });
        await this.writeBack(claimed, { kind: "escalate", reason }, undefined);
        return;
      }
    }

    const abort = new AbortController();
    const held = this.hold(claimed, abort, claimedAt);
    const view: WorkerJob = {
      ...ids,
      nextAction: claimed.nextAction,
      takeover: claimed.takeover,
      job,
      claimed: withoutToken(claimed),
      signal: abort.signal,
      timeoutMs: this.opts.providerCallTimeoutMs,
    };
    // R14: only a REFUND action sends; anything else asks first.
    const handler = claimed.nextAction === NextAction.REFUND ? this.opts.handlers.refund : this.opts.handlers.reconcile;
    const settled = Promise.resolve()
      .then(() => handler.call(this.opts.handlers, view))
      .then((result): Settled => ({ ok: true, result }), (error: unknown): Settled => ({ ok: false, error }));

    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<"deadline">((resolve) => {
      timer = setTimeout(() => resolve("deadline"), this.opts.providerCallTimeoutMs);
    });
    const first = await Promise.race([settled, deadline]);
    clearTimeout(timer);
    // The handler returned, or the worker stops waiting for it: the grant
    // is renewed no more (R27); the write-back decides what it still may do.
    this.release(held);

    let answer: ProviderResult | undefined;
    let decision: WriteDecision;
    if (first === "deadline") {
      abort.abort(new Error(`provider call deadline of ${this.opts.providerCallTimeoutMs} ms exceeded`));
      this.emit({ type: "provider_deadline", ...ids });
      decision = this.unknownOutcome("provider call deadline exceeded; outcome unknown");
      // R15: an answer arriving after the deadline is a receipt: file it, never
      // write with it.
      const filing = settled.then(async (s) => {
        if (s.ok && isProviderResult(s.result)) {
          await this.fileObservation(claimed, s.result, "answer arrived after the provider-call deadline");
        }
      });
      const tracked = filing.finally(() => this.late.delete(tracked));
      this.late.add(tracked);
    } else if (!first.ok) {
      this.emit({ type: "handler_error", ...ids, error: first.error });
      decision = this.unknownOutcome(`provider call failed; outcome unknown: ${errorText(first.error)}`);
    } else if (!isProviderResult(first.result)) {
      this.emit({ type: "handler_error", ...ids, error: new TypeError("handler returned no ProviderResult") });
      decision = this.unknownOutcome("handler returned no valid result; outcome unknown");
    } else {
      answer = first.result;
      decision = decideReconcile(answer, claimed, {
        sameKeyResendSafe: this.resendSafe(job.provider),
        now: coordinatorNow(claimed, performance.now() - claimedAt) ?? new Date(),
        resendMarginMs: this.opts.resendMarginMs,
        pendingDelayMs: this.opts.pendingDelayMs,
        notSentDelayMs: this.opts.unknownOutcomeDelayMs,
      });
    }
    await this.writeBack(claimed, decision, answer);
  }

  // hold starts renewing a job whose handler is about to run (R27): its
  // first renewal is due about a third of its lease after the claim
  // returned. Undefined when renewal is off or the lease is unknown.
  private hold(claimed: ClaimedJob, abort: AbortController, claimedAt: number): Held | undefined {
    const job = claimed.job!;
    const leaseMs = grantedLeaseMs(claimed) ?? this.opts.leaseMs;
    if (!this.opts.renewLeases || leaseMs === undefined) {
      return undefined;
    }
    const older = this.held.get(job.id);
    if (older !== undefined && older.claimed.attempt < claimed.attempt) {
      // This worker took its own job over: that takeover's commit ended the
      // older grant (R8), whatever its renewal would have said.
      this.loseGrant(older, new FencedWriteError(
        `job ${job.id} was taken over by this worker's own claim of attempt ${claimed.attempt}`,
        Code.FailedPrecondition, Reason.StaleAttempt,
        { job_id: job.id.toString(), attempt: older.claimed.attempt.toString(), current_attempt: claimed.attempt.toString() },
      ));
    }
    const intervalMs = this.opts.renewIntervalMs ?? leaseMs / 3;
    const h: Held = { claimed, ids: jobIds(claimed), abort, leaseMs, intervalMs, due: claimedAt + jitter(intervalMs) };
    this.held.set(job.id, h);
    this.scheduleRenewals();
    return h;
  }

  // release ends a job's renewals once its handler returned (R27).
  private release(h: Held | undefined): void {
    if (h !== undefined && this.held.get(h.claimed.job!.id) === h) {
      this.held.delete(h.claimed.job!.id);
    }
    if (this.held.size === 0) {
      clearTimeout(this.renewTimer);
      this.renewTimer = undefined;
    }
  }

  // scheduleRenewals sets the one renewal timer for the earliest due job,
  // unless a pass is in flight (it schedules the next when it ends).
  private scheduleRenewals(): void {
    if (this.renewing !== undefined) {
      return;
    }
    clearTimeout(this.renewTimer);
    this.renewTimer = undefined;
    if (this.held.size === 0) {
      return;
    }
    let next = Infinity;
    for (const h of this.held.values()) {
      next = Math.min(next, h.due);
    }
    this.renewTimer = setTimeout(() => {
      this.renewTimer = undefined;
      this.renewing = this.renewDue().finally(() => {
        this.renewing = undefined;
        this.scheduleRenewals();
      });
    }, Math.max(0, next - performance.now()));
  }

  // renewDue renews every held job that is due, or due within a fifth of
  // its interval (the width of its jitter: jobs claimed together stay
  // together), in as few RenewLeases calls as the batch bound allows (R27).
  private async renewDue(): Promise<void> {
    const now = performance.now();
    const due = [...this.held.values()].filter((h) => h.due <= now + h.intervalMs / 5);
    const batches: Held[][] = [];
    for (let i = 0; i < due.length; i += MaxRenewBatch) {
      batches.push(due.slice(i, i + MaxRenewBatch));
    }
    await Promise.all(batches.map((b) => this.renewBatch(b)));
  }

  private async renewBatch(batch: Held[]): Promise<void> {
    const sent = performance.now();
    // A renewal that takes longer than the interval is as good as failed:
    // the next one is tried sooner.
    const timeoutMs = Math.ceil(Math.min(10_000, Math.max(1_000, Math.min(...batch.map((h) => h.intervalMs)))));
    let renewals: Renewal[];
    try {
      renewals = await this.calls.renewLeases(batch.map((h) => grantOf(h.claimed)), { leaseMs: this.opts.leaseMs, timeoutMs });
    } catch (e) {
      // Never an abort: the grant holds until a takeover commits (R8), and
      // a renewal after the lease ran out still lands until then (R27).
      const error = toCoordinatorError(e);
      this.renewalFailed(batch, error, isRetryableWrite(error));
      return;
    }
    this.kickRefile();
    const undecided: Held[] = [];
    let undecidedError: CoordinatorError | undefined;
    for (const [i, h] of batch.entries()) {
      if (this.held.get(h.claimed.job!.id) !== h) {
        continue; // the handler returned meanwhile
      }
      const r = renewals[i];
      if (r === undefined || r.jobId !== h.claimed.job!.id || r.attempt !== h.claimed.attempt) {
        undecided.push(h);
        undecidedError ??= new CoordinatorError("RenewLeases answered out of order", Code.Internal, undefined, {});
        continue;
      }
      if (r.kind === "renewed") {
        h.due = sent + jitter(h.intervalMs);
        this.emit({ type: "renewed", ...h.ids, leaseUntil: r.leaseUntil, grantExpiresAt: r.grantExpiresAt, receiptFiledAt: r.receiptFiledAt });
        continue;
      }
      switch (r.reason) {
        case Reason.StaleAttempt:
        case Reason.JobNotRunning:
        case Reason.NotFound:
          this.loseGrant(h, r.error);
          continue;
        case Reason.GrantTooOld:
          // R27: renew no more; the lease runs out and the job is taken over
          // as usual. Until that takeover commits the grant may still write
          // (R8), so the handler runs on.
          this.held.delete(h.claimed.job!.id);
          this.emit({ type: "grant_too_old", ...h.ids, grantExpiresAt: r.grantExpiresAt, error: r.error });
          continue;
        default:
          // Not decided for this grant (DATABASE_UNAVAILABLE,
          // WRITE_OUTCOME_UNKNOWN, a reason newer than this SDK): again.
          undecided.push(h);
          undecidedError ??= r.error;
      }
    }
    if (undecided.length > 0) {
      this.renewalFailed(undecided, undecidedError!, isRetryableWrite(undecidedError!));
    }
  }

  // renewalFailed schedules the next renewal of grants a call did not
  // renew: a tenth of the lease away when the failure may pass, the usual
  // interval otherwise (an older coordinator, a denied credential).
  private renewalFailed(batch: Held[], error: CoordinatorError, soon: boolean): void {
    const now = performance.now();
    const grants: JobIds[] = [];
    let retryInMs = Infinity;
    for (const h of batch) {
      if (this.held.get(h.claimed.job!.id) !== h) {
        continue;
      }
      const wait = jitter(soon ? h.leaseMs / 10 : h.intervalMs);
      h.due = now + wait;
      retryInMs = Math.min(retryInMs, wait);
      grants.push(h.ids);
    }
    if (grants.length > 0) {
      this.emit({ type: "renewal_failed", error, grants, retryInMs: Math.round(retryInMs) });
    }
  }

  // loseGrant stops a handler whose grant is gone (R27): its signal is
  // aborted with a GrantLostError, so that it sends nothing new to the
  // provider. What it returns still goes through writeBack: the fence
  // refuses it and the answer is filed as an observation (R15).
  private loseGrant(h: Held, refusal: CoordinatorError): void {
    const job = h.claimed.job!;
    if (this.held.get(job.id) === h) {
      this.held.delete(job.id);
    }
    this.emit({ type: "grant_lost", ...h.ids, reason: refusal.reason ?? "", error: refusal });
    h.abort.abort(new GrantLostError(job.id, h.claimed.attempt, refusal));
  }

  // writeBack makes the fenced write under the claimed grant: its attempt
  // and its lease token (R9, R25).
  private async writeBack(claimed: ClaimedJob, decision: WriteDecision, answer: ProviderResult | undefined): Promise<void> {
    const job = claimed.job!;
    const ids = jobIds(claimed);
    const grant = { jobId: job.id, attempt: claimed.attempt, leaseToken: claimed.leaseToken };
    const write = (): Promise<{ replayed: boolean }> => {
      switch (decision.kind) {
        case "complete":
          return this.calls.complete({ ...grant, providerRefundId: decision.providerRefundId });
        case "reschedule":
          return this.calls.reschedule({
            ...grant,
            nextAction: decision.nextAction,
            when: { case: "delay", value: durationFromMs(decision.delayMs) },
            reason: clip(decision.reason, 1024),
          });
        case "escalate":
          return this.calls.escalate({ ...grant, reason: clip(decision.reason, 1024) });
      }
    };
    for (let retry = 0; ; retry++) {
      try {
        const resp = await write();
        this.kickRefile();
        this.emit({ type: "written", ...ids, decision, replayed: resp.replayed });
        return;
      } catch (e) {
        const err = toCoordinatorError(e);
        if (err instanceof FencedWriteError) {
          // R9, R21: the fence said no; repeating cannot change that. Keep the
          // provider's answer as evidence for the current holder (R15).
          this.emit({ type: "stale", ...ids, error: err, decision });
          if (answer !== undefined) {
            await this.fileObservation(claimed, answer, `write-back rejected with ${err.reason}`);
          }
          return;
        }
        if (isRetryableWrite(err) && retry < this.opts.writeRetries) {
          // R21: the same write under the same attempt is idempotent.
          this.emit({ type: "write_retry", ...ids, error: err, retry: retry + 1 });
          await delay(Math.min(this.opts.writeRetryDelayMs * 2 ** retry, 2_000));
          continue;
        }
        // Give up: the lease lapses and a takeover reconciles (R6, R14). The
        // receipt is kept if the coordinator takes it (R15).
        this.emit({ type: "write_failed", ...ids, error: err });
        if (answer !== undefined) {
          await this.fileObservation(claimed, answer, `write-back failed: ${err.message}`);
        }
        return;
      }
    }
  }

  // fileObservation records a provider answer that this claim could not
  // write (R15), with the claim's lease token so that the coordinator marks
  // it attemptVerified (R25). It is deduplicated by the coordinator, so
  // repeating it after UNAVAILABLE is safe.
  private async fileObservation(claimed: ClaimedJob, answer: ProviderResult, detail: string): Promise<void> {
    const job = claimed.job!;
    const ids = jobIds(claimed);
    const obs = observationOf(answer);
    if (obs === undefined) {
      return; // no word from the provider to keep
    }
    // By operation key, not id: a database that lost recent commits in a
    // failover may give the lost job's id to another refund, while the key is
    // this refund's own (R1, R26).
    const receipt: SpooledReceipt = {
      jobId: job.id,
      operationKey: job.operationKey,
      attempt: claimed.attempt,
      leaseToken: claimed.leaseToken,
      source: clip(`worker:${this.opts.workerId}`, 128),
      outcome: obs.outcome,
      providerRefundId: obs.providerRefundId,
      providerEventId: obs.providerEventId,
      detail: clip(obs.detail ? `${detail}: ${obs.detail}` : detail, 4096),
      spooledAt: "",
    };
    for (let retry = 0; ; retry++) {
      try {
        const resp = await this.calls.reportObservation(observationRequest(receipt));
        this.kickRefile();
        this.emit({
          type: "observation",
          ...ids,
          outcome: obs.outcome,
          providerRefundId: obs.providerRefundId,
          duplicate: resp.duplicate,
          attemptVerified: resp.observation?.attemptVerified ?? false,
        });
        return;
      } catch (e) {
        const err = toCoordinatorError(e);
        if (isRetryableWrite(err) && retry < this.opts.writeRetries) {
          await delay(Math.min(this.opts.writeRetryDelayMs * 2 ** retry, 2_000));
          continue;
        }
        if (this.spool === undefined || !refileLater(err)) {
          this.emit({ type: "observation_failed", ...ids, error: err });
          return;
        }
        // R28: durable before the worker moves on.
        try {
          this.spool.append({ ...receipt, spooledAt: new Date().toISOString() });
        } catch (spoolError) {
          this.emit({ type: "observation_failed", ...ids, error: err, spoolError });
          return;
        }
        this.backlog = true;
        this.emit({
          type: "spooled", ...ids, error: err, spool: this.spool.path, outcome: obs.outcome, providerRefundId: obs.providerRefundId,
        });
        return;
      }
    }
  }

  // kickRefile asks for a refile pass when the spool holds receipts the
  // coordinator was away for: a call just succeeded, so it is back. Passes
  // kicked this way are at least refileMinGapMs apart.
  private kickRefile(): void {
    if (this.spool === undefined || !this.backlog || this.kickTimer !== undefined || this.stopping) {
      return;
    }
    const wait = Math.max(0, this.lastRefile + refileMinGapMs - performance.now());
    this.kickTimer = setTimeout(() => {
      this.kickTimer = undefined;
      void this.refile();
    }, wait);
  }

  // refile files every spooled receipt again, exactly as first tried, so that
  // the coordinator deduplicates one that had landed (R15, R28), and then
  // rewrites the spool without the receipts filed or refused for good. It
  // stops at the first failure that says the coordinator is away; the rest
  // waits for the next pass. Lines this version cannot read are kept. Passes
  // run one at a time.
  private refile(signal?: AbortSignal): Promise<void> {
    const pass = this.refiling.then(() => this.refilePass(signal));
    this.refiling = pass.catch(() => undefined);
    return this.refiling;
  }

  private async refilePass(signal: AbortSignal | undefined): Promise<void> {
    const spool = this.spool!;
    this.lastRefile = performance.now();
    if (spool.pending === 0) {
      this.backlog = false;
      return;
    }
    let snap: ReturnType<ReceiptSpool["snapshot"]>;
    try {
      snap = spool.snapshot();
    } catch (error) {
      this.emit({ type: "spool_error", spool: spool.path, error });
      return;
    }
    const keep: string[] = [];
    let settled = 0;
    let unreadable = 0;
    let away = false;
    for (const line of snap.lines) {
      const r = line.receipt;
      if (r === undefined || away) {
        unreadable += r === undefined ? 1 : 0;
        keep.push(line.raw);
        continue;
      }
      const ids: JobIds = { jobId: r.jobId, attempt: r.attempt, grant: grantFingerprint(r.leaseToken), operationKey: r.operationKey };
      try {
        const resp = await this.calls.reportObservation(observationRequest(r), signal === undefined ? undefined : { signal });
        settled++;
        this.emit({
          type: "refiled", ...ids, duplicate: resp.duplicate, attemptVerified: resp.observation?.attemptVerified ?? false,
          outcome: r.outcome, providerRefundId: r.providerRefundId,
        });
      } catch (e) {
        const err = toCoordinatorError(e);
        if (!refileLater(err)) {
          settled++;
          this.emit({ type: "observation_failed", ...ids, error: err });
          continue;
        }
        keep.push(line.raw);
        away = coordinatorAway(err);
      }
    }
    if (unreadable > 0) {
      this.emit({
        type: "spool_error", spool: spool.path,
        error: new Error(`${unreadable} lines this version cannot read are kept as they are; file them by hand`),
      });
    }
    if (settled > 0) {
      try {
        spool.rewrite(snap.upTo, keep);
      } catch (error) {
        // The old file stands: what was filed is filed again next time, and
        // deduplicated.
        this.emit({ type: "spool_error", spool: spool.path, error });
      }
    }
    this.backlog = away;
  }

  // unknownOutcome: a request may have reached the provider; the next holder
  // asks before anything else (R14).
  private unknownOutcome(reason: string): WriteDecision {
    return { kind: "reschedule", nextAction: NextAction.RECONCILE, delayMs: this.opts.unknownOutcomeDelayMs, reason };
  }

  private resendSafe(provider: string): boolean {
    const s = this.opts.sameKeyResendSafe;
    return typeof s === "function" ? s(provider) : s;
  }

  private emit(event: WorkerEvent): void {
    try {
      this.opts.onEvent?.(event);
    } catch {
      // A failing listener must not break the fencing protocol.
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

type Settled = { ok: true; result: unknown } | { ok: false; error: unknown };

// Held is a job whose handler runs, renewed by the worker's one timer (R27).
interface Held {
  claimed: ClaimedJob;
  ids: JobIds;
  // Aborts the handler's signal.
  abort: AbortController;
  // The lease the claim granted, and the time between two renewals.
  leaseMs: number;
  intervalMs: number;
  // performance.now() when the next renewal is due.
  due: number;
}

// grantedLeaseMs is the lease a claim granted: its leaseUntil − claimedAt,
// both the coordinator's clock (R12). Undefined when either is missing.
function grantedLeaseMs(claimed: ClaimedJob): number | undefined {
  if (claimed.leaseUntil === undefined || claimed.claimedAt === undefined) {
    return undefined;
  }
  const ms = timestampMs(claimed.leaseUntil) - timestampMs(claimed.claimedAt);
  return ms > 0 ? ms : undefined;
}

// jitter spreads renewals by ±10 %, so that workers started together do not
// renew in step.
function jitter(ms: number): number {
  return ms * (0.9 + Math.random() * 0.2);
}

// jobIds names the job and its grant in events: the fingerprint, never the
// lease token (R25).
function jobIds(claimed: ClaimedJob): JobIds {
  const job = claimed.job!;
  return { jobId: job.id, attempt: claimed.attempt, grant: grantFingerprint(claimed.leaseToken), operationKey: job.operationKey };
}

// withoutToken is the claim as a handler sees it: everything but the lease
// token (R25), which only the Worker's write-backs and observations carry.
function withoutToken(claimed: ClaimedJob): ClaimedJobView {
  const { leaseToken: _secret, ...view } = claimed;
  return view;
}

// maxStreamBackoffMs bounds the wait before the worker stream opens again,
// unless claimErrorBackoffMs is longer.
const maxStreamBackoffMs = 5_000;

// Refile timing: passes kicked by a healed call are at least refileMinGapMs
// apart; the pass at the end of stop() is bounded by finalRefileTimeoutMs.
const refileMinGapMs = 5_000;
const finalRefileTimeoutMs = 10_000;

// observationRequest is the ReportObservation of a receipt, field for field
// as first tried: the same dedupe key (R15) and the grant's token (R25). By
// operation key when it has one, as the Worker files (R1, R26).
function observationRequest(r: SpooledReceipt) {
  return {
    job: r.operationKey !== ""
      ? { case: "operationKey" as const, value: r.operationKey }
      : { case: "jobId" as const, value: r.jobId },
    attempt: r.attempt,
    leaseToken: r.leaseToken,
    source: r.source,
    outcome: r.outcome,
    providerRefundId: r.providerRefundId,
    providerEventId: r.providerEventId,
    detail: r.detail,
  };
}

/**
 * refileLater reports whether a ReportObservation that failed with err may
 * succeed when made again later (R28): nothing answered (transport, a cut
 * deadline), UNAVAILABLE (DATABASE_* included), a credential being rotated,
 * an internal error a fixed coordinator may not have, RESOURCE_EXHAUSTED (an
 * earlier coordinator's OBSERVATION_LIMIT included). INVALID_ARGUMENT,
 * NOT_FOUND, PERMISSION_DENIED and the other refusals of the request itself
 * are permanent.
 */
export function refileLater(err: CoordinatorError): boolean {
  switch (err.code) {
    case Code.InvalidArgument:
    case Code.NotFound:
    case Code.PermissionDenied:
    case Code.FailedPrecondition:
    case Code.AlreadyExists:
    case Code.OutOfRange:
    case Code.Unimplemented:
      return false;
    // ResourceExhausted included: OBSERVATION_LIMIT comes from coordinators of
    // earlier releases only, and is kept in the spool until one that keeps
    // such a receipt aside takes it (R28: none is dropped for a per-job limit).
  }
  return true;
}

// coordinatorAway: err says the coordinator cannot take any receipt now, so
// a refile pass stops instead of trying the rest.
function coordinatorAway(err: CoordinatorError): boolean {
  return [Code.Unavailable, Code.DeadlineExceeded, Code.Canceled, Code.Unauthenticated, Code.Unknown].includes(err.code);
}

function observationOf(answer: ProviderResult):
  | { outcome: ObservationOutcome; providerRefundId: string; providerEventId: string; detail: string | undefined }
  | undefined {
  switch (answer.kind) {
    case "succeeded":
      return {
        outcome: ObservationOutcome.SUCCEEDED,
        providerRefundId: answer.providerRefundId,
        providerEventId: answer.providerEventId ?? "",
        detail: answer.detail,
      };
    case "pending":
      return { outcome: ObservationOutcome.PENDING, providerRefundId: "", providerEventId: "", detail: answer.detail };
    case "not_found":
      return { outcome: ObservationOutcome.NOT_FOUND, providerRefundId: "", providerEventId: "", detail: answer.detail };
    case "failed":
      return { outcome: ObservationOutcome.FAILED, providerRefundId: "", providerEventId: "", detail: answer.reason };
    case "not_sent":
    case "escalate":
      return undefined;
  }
}

const resultKinds = new Set(["succeeded", "pending", "not_found", "failed", "not_sent", "escalate"]);

function isProviderResult(v: unknown): v is ProviderResult {
  return typeof v === "object" && v !== null && resultKinds.has((v as { kind?: unknown }).kind as string);
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function clip(s: string, max: number): string {
  return s.length <= max ? s : s.slice(0, max);
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

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
