// The grant's lease token (R25) and its non-secret fingerprint.

import { createHash } from "node:crypto";

import type { ClaimedJob } from "./gen/jobfence/v1/coordinator_pb.js";

/**
 * ClaimedJobView is a claimed job without its lease token (R25): what the
 * Worker hands to handlers (`WorkerJob.claimed`), and all that the decision
 * helpers (`decideReconcile`, `resendAllowed`, `sendsAgain`,
 * `coordinatorNow`) read. A ClaimedJob is one too.
 */
export type ClaimedJobView = Omit<ClaimedJob, "leaseToken">;

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
