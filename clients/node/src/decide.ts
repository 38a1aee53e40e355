// What a provider answer means for the job: the fenced write to make.

import { timestampDate } from "@bufbuild/protobuf/wkt";

import { NextAction } from "./gen/jobfence/v1/coordinator_pb.js";
import type { ClaimedJobView, ProviderResult } from "./types.js";

/** WriteDecision is the fenced write-back to make under the claimed attempt. */
export type WriteDecision =
  | { kind: "complete"; providerRefundId: string }
  | { kind: "reschedule"; nextAction: NextAction; delayMs: number; reason: string }
  | { kind: "escalate"; reason: string };

/** DecisionPolicy holds what the decision needs besides the answer. */
export interface DecisionPolicy {
  /**
   * Whether this provider guarantees that a resend with the same
   * Idempotency-Key and the same body is safe (R14). Without that guarantee
   * a "no record" always escalates (R16).
   */
  sameKeyResendSafe: boolean;
  /**
   * The current time on the coordinator's clock, to compare with the job's
   * resend_deadline (R12, R22). Worker estimates it from the claim; see
   * coordinatorNow.
   */
  now: Date;
  /** How long before resend_deadline a resend is no longer started. Default 60 s. */
  resendMarginMs?: number;
  /** Delay before reconciling a pending refund again, when the answer names none. Default 30 s. */
  pendingDelayMs?: number;
  /** Delay before repeating an action whose request was not sent. Default 5 s. */
  notSentDelayMs?: number;
}

/** MaxDelayMs is the longest delay Reschedule accepts: 30 days. */
export const MaxDelayMs = 30 * 24 * 3600 * 1000;

/**
 * decideReconcile turns a provider answer into the fenced write for the
 * claimed job (R14, R16):
 *
 * - refunded → complete with the provider's refund id;
 * - pending → reschedule another RECONCILE (R4);
 * - no record → reschedule a REFUND (a same-key resend) only if the provider
 *   guarantees same-key resends and the coordinator's resend_deadline is not
 *   yet reached (R22); otherwise escalate to manual review;
 * - rejected → escalate: the API has no failed state, a person decides;
 * - not sent → reschedule the same action;
 * - escalate → escalate.
 *
 * A job whose cancel was requested (`cancelRequested`, R32) is never sent
 * again, whatever the provider says and whatever the policy allows:
 *
 * - refunded → complete: the cancel came too late (the coordinator records it);
 * - pending → reschedule another RECONCILE, as above;
 * - no record → escalate, even inside the resend window: only a person may
 *   close a maybe-sent refund as cancelled;
 * - rejected → escalate: a person closes it as cancelled;
 * - anything else → as above, but a reschedule to REFUND becomes one to
 *   RECONCILE.
 *
 * It is pure: the caller makes the write, carrying the claim's attempt and
 * lease token (R9, R25).
 */
export function decideReconcile(result: ProviderResult, claimed: ClaimedJobView, policy: DecisionPolicy): WriteDecision {
  if (!cancelRequested(claimed)) {
    return decideTable(result, claimed, policy);
  }
  // R32: no record and a rejection, which the table may answer with a
  // resend or leave to a person as a failure, are for a person to close as
  // cancelled; whatever else it answers never sends.
  switch (result.kind) {
    case "not_found":
      return {
        kind: "escalate",
        reason: withDetail("cancel requested (R32): reconcile found no record at the provider; the refund may still " +
          "have been sent, so it is never sent again: only a person may close it as cancelled", result.detail),
      };
    case "failed":
      return {
        kind: "escalate",
        reason: `cancel requested (R32): provider rejected the refund: ${result.reason || "no reason given"}; ` +
          "a person closes it as cancelled",
      };
  }
  return neverSent(claimed, decideTable(result, claimed, policy));
}

/**
 * neverSent is decision d for the claimed job, except that a reschedule to
 * REFUND of a job whose cancel was requested becomes one to RECONCILE (R32).
 */
function neverSent(claimed: ClaimedJobView, d: WriteDecision): WriteDecision {
  if (d.kind !== "reschedule" || d.nextAction !== NextAction.REFUND || !cancelRequested(claimed)) {
    return d;
  }
  return { ...d, nextAction: NextAction.RECONCILE, reason: `${d.reason}; cancel requested (R32): reconcile, never send` };
}

/**
 * cancelRequested reports whether a cancel was requested of the claimed job
 * after it may have been sent (R32): the grant's `cancelRequested`, or the
 * job's `cancelRequestedAt`. Such a job is only ever reconciled: the Worker
 * calls the reconcile handler whatever the grant's next action, and never
 * writes back a reschedule that would send it.
 */
export function cancelRequested(claimed: ClaimedJobView): boolean {
  return claimed.cancelRequested || claimed.job?.cancelRequestedAt !== undefined;
}

/**
 * sends reports whether the claimed job's handler call is `refund`, the one
 * that sends: a REFUND action of a job whose cancel was not requested.
 * Anything else asks the provider first with `reconcile` (R14), and so does
 * a job whose cancel was requested, whatever its grant's action says (R32:
 * no grant of it should carry REFUND).
 */
export function sends(claimed: ClaimedJobView): boolean {
  return claimed.nextAction === NextAction.REFUND && !cancelRequested(claimed);
}

// decideTable is decideReconcile's table for a job whose cancel was not requested.
function decideTable(result: ProviderResult, claimed: ClaimedJobView, policy: DecisionPolicy): WriteDecision {
  switch (result.kind) {
    case "succeeded":
      if (result.providerRefundId === "") {
        return { kind: "escalate", reason: "provider reported the refund made but gave no refund id" };
      }
      return { kind: "complete", providerRefundId: result.providerRefundId };
    case "pending":
      return {
        kind: "reschedule",
        nextAction: NextAction.RECONCILE,
        delayMs: clampDelay(result.retryAfterMs ?? policy.pendingDelayMs ?? 30_000),
        reason: withDetail("provider: refund pending", result.detail),
      };
    case "not_found":
      return decideNoRecord(claimed, policy, result.detail);
    case "failed":
      return { kind: "escalate", reason: `provider rejected the refund: ${result.reason || "no reason given"}` };
    case "not_sent":
      return {
        kind: "reschedule",
        nextAction: claimed.nextAction === NextAction.REFUND ? NextAction.REFUND : NextAction.RECONCILE,
        delayMs: clampDelay(result.retryAfterMs ?? policy.notSentDelayMs ?? 5_000),
        reason: `request not sent: ${result.reason}`,
      };
    case "escalate":
      // Escalate requires a reason; a person reads it.
      return { kind: "escalate", reason: result.reason || "escalated by the handler" };
  }
}

/**
 * resendAllowed reports whether a same-key resend is safe now (R14, R16,
 * R22): never once a cancel was requested (R32); otherwise when the provider
 * guarantees same-key resends and the coordinator's resend_deadline lies
 * more than the margin ahead. An unset resend_deadline means the key never
 * went out, so sending is a first send.
 */
export function resendAllowed(claimed: ClaimedJobView, policy: DecisionPolicy): boolean {
  if (cancelRequested(claimed)) {
    return false;
  }
  if (claimed.resendDeadline === undefined) {
    return true;
  }
  if (!policy.sameKeyResendSafe) {
    return false;
  }
  const deadline = timestampDate(claimed.resendDeadline).getTime();
  return policy.now.getTime() + (policy.resendMarginMs ?? 60_000) < deadline;
}

/**
 * sendsAgain reports whether a REFUND under this claim would be a same-key
 * resend: the operation key first went out under an earlier claim
 * (job.first_sent_at precedes claimed_at). A first send, whose own claim set
 * first_sent_at, is not a resend.
 */
export function sendsAgain(claimed: ClaimedJobView): boolean {
  const first = claimed.job?.firstSentAt;
  const at = claimed.claimedAt ?? claimed.job?.updatedAt;
  if (first === undefined || at === undefined) {
    return false;
  }
  return first.seconds < at.seconds || (first.seconds === at.seconds && first.nanos < at.nanos);
}

/**
 * coordinatorNow estimates the coordinator's clock (R12): the claim's
 * database time (claimed_at) plus the time elapsed since the claim's answer
 * arrived, measured on a monotonic clock. A worker's wall clock is never used.
 */
export function coordinatorNow(claimed: ClaimedJobView, elapsedSinceClaimMs: number): Date | undefined {
  const at = claimed.claimedAt ?? claimed.job?.updatedAt;
  if (at === undefined) {
    return undefined;
  }
  return new Date(timestampDate(at).getTime() + Math.max(0, elapsedSinceClaimMs));
}

function decideNoRecord(claimed: ClaimedJobView, policy: DecisionPolicy, detail: string | undefined): WriteDecision {
  if (resendAllowed(claimed, policy)) {
    return {
      kind: "reschedule",
      nextAction: NextAction.REFUND,
      delayMs: 0,
      reason: withDetail("reconcile: no record at provider; same-key resend inside the retention window (R14)", detail),
    };
  }
  const why = policy.sameKeyResendSafe
    ? "the provider's idempotency-key retention window has passed"
    : "the provider does not guarantee same-key resends";
  return { kind: "escalate", reason: withDetail(`reconcile: no record at provider and ${why} (R14, R16)`, detail) };
}

function clampDelay(ms: number): number {
  if (!Number.isFinite(ms) || ms < 0) {
    return 0;
  }
  return Math.min(Math.round(ms), MaxDelayMs);
}

function withDetail(reason: string, detail: string | undefined): string {
  return detail ? `${reason}: ${detail}` : reason;
}
