// A Worker's options: what it is given, its defaults, and their bounds.

import type { TracerProvider } from "@opentelemetry/api";

import type { CoordinatorClient } from "./client.js";
import type { WorkerEvent } from "./events.js";
import type { Handlers } from "./types.js";

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
  /**
   * Makes each job's attempt span (R35, README "Tracing"): a
   * `jobfence.attempt` span around the handler, linked to the trace context
   * of the job's enqueue, active while the handler runs (and in
   * `WorkerJob.traceContext`), and carried by every call the Worker makes
   * for the job. Default: the provider the application registered with
   * `@opentelemetry/api` (`trace.setGlobalTracerProvider`, or an SDK's
   * `register()`), a no-op until one is: without tracing nothing is
   * recorded and no call carries a trace context.
   */
  tracerProvider?: TracerProvider;
}

/**
 * Settings are a Worker's options with their defaults filled in and their
 * bounds checked (settingsOf). The client, the stream switch and the receipt
 * spool are the Worker's own business and not among them.
 */
export type Settings =
  Required<Omit<WorkerOptions, "leaseMs" | "provider" | "onEvent" | "client" | "handlers" | "receiptSpool" | "renewIntervalMs" | "noStream" | "tracerProvider">> &
  Pick<WorkerOptions, "leaseMs" | "provider" | "onEvent" | "handlers" | "renewIntervalMs">;

/**
 * settingsOf fills in the defaults of options and checks their bounds.
 * Throws RangeError for an option outside its bounds.
 */
export function settingsOf(options: WorkerOptions): Settings {
  const providerCallTimeoutMs = options.providerCallTimeoutMs ?? 10_000;
  const s: Settings = {
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
  if (!Number.isInteger(s.concurrency) || s.concurrency < 1 || s.concurrency > 100) {
    throw new RangeError(`concurrency must be 1..100, got ${s.concurrency}`);
  }
  if (!(s.claimWaitMs >= 0 && s.claimWaitMs <= 60_000)) {
    throw new RangeError(`claimWaitMs must be 0..60000, got ${s.claimWaitMs}`);
  }
  if (!(providerCallTimeoutMs > 0)) {
    throw new RangeError(`providerCallTimeoutMs must be positive, got ${providerCallTimeoutMs}`);
  }
  // R17: without renewal the provider call must end well inside the lease,
  // or every slow call turns into a takeover. A renewing worker keeps its
  // lease for as long as the call runs (R27 amends R17, R18).
  if (!s.renewLeases && s.leaseMs !== undefined && providerCallTimeoutMs >= s.leaseMs) {
    throw new RangeError(`providerCallTimeoutMs (${providerCallTimeoutMs}) must be shorter than leaseMs (${s.leaseMs}) ` +
      "when leases are not renewed");
  }
  const every = s.renewIntervalMs;
  if (every !== undefined && !(every > 0 && Number.isFinite(every))) {
    throw new RangeError(`renewIntervalMs must be positive, got ${every}`);
  }
  if (every !== undefined && s.leaseMs !== undefined && every >= s.leaseMs) {
    throw new RangeError(`renewIntervalMs (${every}) must be shorter than leaseMs (${s.leaseMs})`);
  }
  return s;
}

/**
 * writeRetryDelayMs is the wait before repeat number `retry` (from 0) of a
 * write-back or receipt: writeRetryDelayMs, doubling up to 2 s.
 */
export function writeRetryDelayMs(s: Pick<Settings, "writeRetryDelayMs">, retry: number): number {
  return Math.min(s.writeRetryDelayMs * 2 ** retry, 2_000);
}
