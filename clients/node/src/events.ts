// What a Worker reports (M1): one WorkerEvent per thing it did, each about a
// job naming it by JobIds — the grant's fingerprint, never its lease token
// (R25) — so that an event can be logged whole.

import type { WriteDecision } from "./decide.js";
import type { CoordinatorError, FencedWriteError } from "./errors.js";
import type { ClaimedJob, NextAction, ObservationOutcome } from "./gen/jobfence/v1/coordinator_pb.js";
import { grantFingerprint } from "./types.js";

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
  | ({ type: "claimed"; nextAction: NextAction; takeover: boolean; cancelRequested: boolean } & JobIds)
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

/** Emit reports one WorkerEvent. */
export type Emit = (event: WorkerEvent) => void;

/**
 * emitter is the Emit of a Worker: it hands each event to `onEvent`, and a
 * listener that throws never breaks the fencing protocol.
 */
export function emitter(onEvent: ((event: WorkerEvent) => void) | undefined): Emit {
  return (event) => {
    try {
      onEvent?.(event);
    } catch {
      // A failing listener must not break the fencing protocol.
    }
  };
}

/** jobIds names the job and its grant in events: the fingerprint, never the lease token (R25). */
export function jobIds(claimed: ClaimedJob): JobIds {
  const job = claimed.job!;
  return { jobId: job.id, attempt: claimed.attempt, grant: grantFingerprint(claimed.leaseToken), operationKey: job.operationKey };
}
