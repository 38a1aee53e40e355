// Lease renewal (R27, amends R18): one timer per Worker renews every job
// whose handler runs, in as few RenewLeases calls as the batch bound allows,
// and stops a handler whose grant a renewal says is lost.

import { timestampMs } from "@bufbuild/protobuf/wkt";
import type { Context } from "@opentelemetry/api";
import { Code } from "@connectrpc/connect";
import { performance } from "node:perf_hooks";

import { MaxRenewBatch, grantOf, type Renewal } from "./client.js";
import { CoordinatorError, FencedWriteError, GrantLostError, Reason, isRetryableWrite, toCoordinatorError } from "./errors.js";
import { jobIds, type Emit, type JobIds } from "./events.js";
import type { ClaimedJob } from "./gen/jobfence/v1/coordinator_pb.js";
import type { Settings } from "./options.js";
import type { WorkerCalls } from "./session.js";
import type { Tracing } from "./tracing.js";

/**
 * The renewal timing (R27): a lease is renewed every lease/RenewDivisor
 * unless the worker sets an interval, each interval drawn within
 * ±RenewJitter of it; after a call that failed in a way that may pass, the
 * next try comes lease/RenewRetryDivisor later.
 */
export const RenewDivisor = 3;
export const RenewJitter = 0.1;
export const RenewRetryDivisor = 10;

/** Held is a job whose handler runs, renewed by the Renewer's one timer (R27). */
export interface Held {
  claimed: ClaimedJob;
  ids: JobIds;
  // Aborts the handler's signal.
  abort: AbortController;
  // The lease the claim granted, and the time between two renewals.
  leaseMs: number;
  intervalMs: number;
  // performance.now() when the next renewal is due.
  due: number;
  // The job's attempt span (R35), which its renewals carry.
  traceContext: Context | undefined;
}

/**
 * Renewer keeps the leases of the jobs whose handler runs (R27). `hold`
 * starts renewing a job, `release` ends it; a renewal that says the grant
 * is lost aborts the handler's signal with a GrantLostError. `answered` is
 * told of every RenewLeases call that was answered: the coordinator is
 * back, if it was away.
 */
export class Renewer {
  // The jobs whose handler runs, by job id. renewing is the renewal pass in
  // flight; the timer is set only between passes, for the earliest due job.
  private readonly held = new Map<bigint, Held>();
  private timer: NodeJS.Timeout | undefined;
  private renewing: Promise<void> | undefined;

  constructor(
    private readonly calls: WorkerCalls,
    private readonly settings: Pick<Settings, "renewLeases" | "leaseMs" | "renewIntervalMs">,
    private readonly emit: Emit,
    private readonly answered: () => void,
    private readonly tracing?: Tracing,
  ) {}

  /**
   * hold starts renewing a job whose handler is about to run (R27): its
   * first renewal is due about a third of its lease after the claim
   * returned (claimedAt, performance.now()). Undefined when renewal is off
   * or the lease is unknown.
   */
  hold(claimed: ClaimedJob, abort: AbortController, claimedAt: number, traceContext?: Context): Held | undefined {
    const job = claimed.job!;
    const leaseMs = grantedLeaseMs(claimed) ?? this.settings.leaseMs;
    if (!this.settings.renewLeases || leaseMs === undefined) {
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
    const intervalMs = this.settings.renewIntervalMs ?? leaseMs / RenewDivisor;
    const h: Held = { claimed, ids: jobIds(claimed), abort, leaseMs, intervalMs, due: claimedAt + jitter(intervalMs), traceContext };
    this.held.set(job.id, h);
    this.schedule();
    return h;
  }

  /** release ends a job's renewals once its handler returned (R27). */
  release(h: Held | undefined): void {
    if (h !== undefined && this.held.get(h.claimed.job!.id) === h) {
      this.held.delete(h.claimed.job!.id);
    }
    if (this.held.size === 0) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
  }

  /** stop ends renewing, once every handler has returned: it waits for the pass in flight. */
  async stop(): Promise<void> {
    clearTimeout(this.timer);
    await this.renewing;
  }

  // schedule sets the one renewal timer for the earliest due job, unless a
  // pass is in flight (it schedules the next when it ends).
  private schedule(): void {
    if (this.renewing !== undefined) {
      return;
    }
    clearTimeout(this.timer);
    this.timer = undefined;
    if (this.held.size === 0) {
      return;
    }
    let next = Infinity;
    for (const h of this.held.values()) {
      next = Math.min(next, h.due);
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.renewing = this.renewDue().finally(() => {
        this.renewing = undefined;
        this.schedule();
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
    // R35: made in the one job's attempt span, or in a span linked to each.
    const traced = this.tracing?.renewContext(batch.map((h) => h.traceContext));
    try {
      renewals = await this.calls.renewLeases(batch.map((h) => grantOf(h.claimed)),
        { leaseMs: this.settings.leaseMs, timeoutMs, traceContext: traced?.context });
    } catch (e) {
      // Never an abort: the grant holds until a takeover commits (R8), and
      // a renewal after the lease ran out still lands until then (R27).
      const error = toCoordinatorError(e);
      this.failed(batch, error, isRetryableWrite(error));
      return;
    } finally {
      traced?.end();
    }
    this.answered();
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
      this.failed(undecided, undecidedError!, isRetryableWrite(undecidedError!));
    }
  }

  // failed schedules the next renewal of grants a call did not renew: a
  // tenth of the lease away when the failure may pass, the usual interval
  // otherwise (an older coordinator, a denied credential).
  private failed(batch: Held[], error: CoordinatorError, soon: boolean): void {
    const now = performance.now();
    const grants: JobIds[] = [];
    let retryInMs = Infinity;
    for (const h of batch) {
      if (this.held.get(h.claimed.job!.id) !== h) {
        continue;
      }
      const wait = jitter(soon ? h.leaseMs / RenewRetryDivisor : h.intervalMs);
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
  // provider. What it returns still goes through the write-back: the fence
  // refuses it and the answer is filed as an observation (R15).
  private loseGrant(h: Held, refusal: CoordinatorError): void {
    const job = h.claimed.job!;
    if (this.held.get(job.id) === h) {
      this.held.delete(job.id);
    }
    this.emit({ type: "grant_lost", ...h.ids, reason: refusal.reason ?? "", error: refusal });
    h.abort.abort(new GrantLostError(job.id, h.claimed.attempt, refusal));
  }
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
  return ms * (1 - RenewJitter + Math.random() * 2 * RenewJitter);
}
