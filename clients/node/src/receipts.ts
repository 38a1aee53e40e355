// Filing receipts (R15, R28): a provider's answer that a grant could not
// write is filed with ReportObservation, and one the coordinator cannot take
// now goes to the receipt spool, filed again later — after a restart too.

import { Code } from "@connectrpc/connect";
import type { Context } from "@opentelemetry/api";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";

import { isRetryableWrite, toCoordinatorError, type CoordinatorError } from "./errors.js";
import { jobIds, type Emit, type JobIds } from "./events.js";
import { ObservationOutcome, type ClaimedJob } from "./gen/jobfence/v1/coordinator_pb.js";
import { writeRetryDelayMs, type Settings } from "./options.js";
import type { WorkerCalls } from "./session.js";
import { ReceiptRefileIntervalMs, ReceiptSpool, type SpooledReceipt } from "./spool.js";
import { clip, grantFingerprint, type ProviderResult } from "./types.js";

/**
 * Refile timing (R28): passes kicked by a healed call are at least
 * RefileMinGapMs apart; the pass at the end of a drain is bounded by
 * FinalRefileTimeoutMs.
 */
export const RefileMinGapMs = 5_000;
export const FinalRefileTimeoutMs = 10_000;

/**
 * Receipts files the provider answers a Worker could not write (R15), with
 * the claim's lease token so that the coordinator marks them
 * attemptVerified (R25), and keeps the receipt spool (R28): a receipt the
 * coordinator cannot take now is appended to it, fsynced, and filed again
 * when the worker starts, every 30 s, and as soon as a call succeeds after
 * such a failure (`healed`). Without a spool (undefined) such a receipt is
 * only reported.
 */
export class Receipts {
  // backlog: the spool holds receipts the coordinator was away for, so that
  // the next successful call kicks a refile pass. refiling chains the
  // passes, one at a time. draining: no pass is kicked any more.
  private backlog = false;
  private refiling: Promise<void> = Promise.resolve();
  private lastRefile = 0;
  private refileTimer: NodeJS.Timeout | undefined;
  private kickTimer: NodeJS.Timeout | undefined;
  private draining = false;

  constructor(
    private readonly calls: WorkerCalls,
    private readonly spool: ReceiptSpool | undefined,
    private readonly settings: Pick<Settings, "workerId" | "writeRetries" | "writeRetryDelayMs">,
    private readonly emit: Emit,
  ) {
    if (spool !== undefined && spool.torn > 0) {
      emit({
        type: "spool_error", spool: spool.path,
        error: new Error(`cut off ${spool.torn} bytes of an unfinished last line: a crash in the middle of an append that was never acknowledged`),
      });
    }
  }

  /** path is the spool's path; undefined when it is off. */
  get path(): string | undefined {
    return this.spool?.path;
  }

  /** pending is how many receipts the spool holds now. */
  get pending(): number {
    return this.spool?.pending ?? 0;
  }

  /**
   * start files what a predecessor (or this worker) could not file, before
   * anything else (R28), and then every ReceiptRefileIntervalMs.
   */
  async start(): Promise<void> {
    if (this.spool === undefined) {
      return;
    }
    await this.refile();
    this.refileTimer = setInterval(() => void this.refile(), ReceiptRefileIntervalMs);
  }

  /** drain kicks no more refile passes: the worker stops. */
  drain(): void {
    this.draining = true;
  }

  /**
   * close ends the refiling once every job has written back: a last pass
   * for what the drain spooled (up to 10 s), then the spool is released;
   * an empty one is removed.
   */
  async close(): Promise<void> {
    if (this.spool === undefined) {
      return;
    }
    clearInterval(this.refileTimer);
    clearTimeout(this.kickTimer);
    if (this.spool.pending > 0) {
      await this.refile(AbortSignal.timeout(FinalRefileTimeoutMs));
    }
    await this.refiling;
    this.spool.close();
  }

  /**
   * file records a provider answer that this claim could not write (R15),
   * with the claim's lease token so that the coordinator marks it
   * attemptVerified (R25). It is deduplicated by the coordinator, so
   * repeating it after UNAVAILABLE is safe.
   */
  async file(claimed: ClaimedJob, answer: ProviderResult, detail: string, traceContext?: Context): Promise<void> {
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
      source: clip(`worker:${this.settings.workerId}`, 128),
      outcome: obs.outcome,
      providerRefundId: obs.providerRefundId,
      providerEventId: obs.providerEventId,
      detail: clip(obs.detail ? `${detail}: ${obs.detail}` : detail, 4096),
      spooledAt: "",
    };
    for (let retry = 0; ; retry++) {
      try {
        const resp = await this.calls.reportObservation(observationRequest(receipt), { traceContext });
        this.healed();
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
        if (isRetryableWrite(err) && retry < this.settings.writeRetries) {
          await sleep(writeRetryDelayMs(this.settings, retry));
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

  /**
   * healed asks for a refile pass when the spool holds receipts the
   * coordinator was away for: a call just succeeded, so it is back. Passes
   * kicked this way are at least RefileMinGapMs apart.
   */
  healed(): void {
    if (this.spool === undefined || !this.backlog || this.kickTimer !== undefined || this.draining) {
      return;
    }
    const wait = Math.max(0, this.lastRefile + RefileMinGapMs - performance.now());
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
}

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
