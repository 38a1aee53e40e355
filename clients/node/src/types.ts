// The plain types a handler sees: the claim without its lease token (R25),
// the provider's answer, the job as handed to a handler, and the grant's
// non-secret fingerprint.

import type { Context } from "@opentelemetry/api";
import { createHash } from "node:crypto";

import type { ClaimedJob, Job, NextAction } from "./gen/jobfence/v1/coordinator_pb.js";

/**
 * ClaimedJobView is a claimed job without its lease token (R25): what the
 * Worker hands to handlers (`WorkerJob.claimed`), and all that the decision
 * helpers (`decideReconcile`, `resendAllowed`, `sendsAgain`,
 * `coordinatorNow`) read. A ClaimedJob is one too.
 */
export type ClaimedJobView = Omit<ClaimedJob, "leaseToken">;

/**
 * ProviderResult is what a refund or reconcile handler learned from the
 * payment provider, asked with the job's operation_key (R1, R14).
 *
 * - `succeeded`: the provider says the refund was made.
 * - `pending`: accepted but not finished; never a success (R4).
 * - `not_found`: the provider has no record, which does not prove nothing
 *   happened (R14).
 * - `failed`: the provider rejected the refund for good.
 * - `not_sent`: the request provably never reached the provider (refused
 *   before sending, rate limited at the door); the same action may run again.
 * - `escalate`: the handler wants a person to look.
 *
 * A handler that throws, or outlives the provider-call deadline, leaves the
 * outcome unknown: the job is rescheduled for RECONCILE (R14).
 */
export type ProviderResult =
  | { kind: "succeeded"; providerRefundId: string; providerEventId?: string; detail?: string }
  | { kind: "pending"; retryAfterMs?: number; detail?: string }
  | { kind: "not_found"; detail?: string }
  | { kind: "failed"; reason: string }
  | { kind: "not_sent"; reason: string; retryAfterMs?: number }
  | { kind: "escalate"; reason: string };

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
  /**
   * True when a cancel was requested of the job after it may have been sent
   * (R32: the grant's `cancelRequested`, or `job.cancelRequestedAt` set).
   * The Worker then calls only the `reconcile` handler, whatever
   * `nextAction` says, and whatever it answers the job is never sent again:
   * `succeeded` completes it (the cancel came too late, the coordinator
   * records it); `pending` or a throw reconciles later; `not_found` or
   * `failed` escalates it, since only a person may close a maybe-sent refund
   * as cancelled. Read it to log it, or to skip what only a send needs.
   */
  readonly cancelRequested: boolean;
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
  /**
   * The OpenTelemetry context of this attempt's span (R35,
   * `WorkerOptions.tracerProvider`): the handler runs with it active, so
   * the spans of an instrumented HTTP client are its children where a
   * context manager is registered (an SDK's `register()` does it); pass it
   * explicitly (`context.with(job.traceContext, …)`) where none is. The
   * enqueue's own trace context is `claimed.traceparent`.
   */
  readonly traceContext: Context;
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
 * grantFingerprint names a grant without revealing its lease token (R25): the
 * first 6 bytes of the SHA-256 of the token, as 12 lower-case hex digits — the
 * same value as the Go SDK's `LeaseToken.Fingerprint()` and as the prefix of
 * the hash the coordinator keeps in the job's history
 * (`refund_job_events.lease_token_hash`). It is what the Worker puts in its
 * events, under the key `grant`, next to jobId and attempt; log it, never the
 * token. Returns "" for no token (a coordinator older than lease tokens).
 *
 * The fingerprint identifies a grant; it cannot be turned back into the token
 * and never lets anyone write.
 */
export function grantFingerprint(leaseToken: string): string {
  if (leaseToken === "") {
    return "";
  }
  return createHash("sha256").update(leaseToken, "utf8").digest().subarray(0, 6).toString("hex");
}

// withoutToken is the claim as a handler sees it: everything but the lease
// token (R25), which only the Worker's write-backs and observations carry.
export function withoutToken(claimed: ClaimedJob): ClaimedJobView {
  const { leaseToken: _secret, ...view } = claimed;
  return view;
}

// clip bounds a free-text field to the length the coordinator accepts.
export function clip(s: string, max: number): string {
  return s.length <= max ? s : s.slice(0, max);
}
