// Typed errors decoded from the coordinator's google.rpc.ErrorInfo (R24).
//
// The coordinator attaches an ErrorInfo{domain: "jobfence", reason, metadata}
// to every error it returns; this module turns it into one class per reason.
// Callers branch with `instanceof`, never on message text.

import { fromBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, decodeBinaryHeader, encodeBinaryHeader } from "@connectrpc/connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";

import { BadRequestSchema, ErrorInfoSchema, type ErrorInfo } from "./gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "./gen/google/rpc/status_pb.js";
import { ErrorReason, JobState, JobStateSchema } from "./gen/jobfence/v1/coordinator_pb.js";

/** ErrorDomain is the ErrorInfo domain of every error the coordinator returns. */
export const ErrorDomain = "jobfence";

/** reasonName is the ErrorInfo reason of r: the proto value's name without its ERROR_REASON_ prefix. */
function reasonName(r: ErrorReason): string {
  return ErrorReason[r];
}

/**
 * Reason lists the ErrorInfo reasons of the API (R24), taken from the
 * proto's ErrorReason, the one list of them.
 */
export const Reason = {
  StaleAttempt: reasonName(ErrorReason.STALE_ATTEMPT),
  JobNotRunning: reasonName(ErrorReason.JOB_NOT_RUNNING),
  JobNotInReview: reasonName(ErrorReason.JOB_NOT_IN_REVIEW),
  Unauthenticated: reasonName(ErrorReason.UNAUTHENTICATED),
  PermissionDenied: reasonName(ErrorReason.PERMISSION_DENIED),
  OperationKeyConflict: reasonName(ErrorReason.OPERATION_KEY_CONFLICT),
  ClaimOutcomeUnknown: reasonName(ErrorReason.CLAIM_OUTCOME_UNKNOWN),
  WriteOutcomeUnknown: reasonName(ErrorReason.WRITE_OUTCOME_UNKNOWN),
  DatabaseUnavailable: reasonName(ErrorReason.DATABASE_UNAVAILABLE),
  DatabaseFull: reasonName(ErrorReason.DATABASE_FULL),
  DatabaseAccessDenied: reasonName(ErrorReason.DATABASE_ACCESS_DENIED),
  ObservationLimit: reasonName(ErrorReason.OBSERVATION_LIMIT),
  NotFound: reasonName(ErrorReason.NOT_FOUND),
  InvalidArgument: reasonName(ErrorReason.INVALID_ARGUMENT),
  GrantTooOld: reasonName(ErrorReason.GRANT_TOO_OLD),
  TooManyCalls: reasonName(ErrorReason.TOO_MANY_CALLS),
  JobNotCancellable: reasonName(ErrorReason.JOB_NOT_CANCELLABLE),
  CancelRequested: reasonName(ErrorReason.CANCEL_REQUESTED),
  NotOnAttentionList: reasonName(ErrorReason.NOT_ON_ATTENTION_LIST),
} as const;

/**
 * CoordinatorError is the base of every error a CoordinatorClient call
 * rejects with. `code` is the gRPC status code (connect's Code has the same
 * numbers); `reason` and `metadata` come from the ErrorInfo, when the
 * coordinator sent one (transport failures carry none).
 */
export class CoordinatorError extends Error {
  /** The gRPC status code. */
  readonly code: Code;
  /** The ErrorInfo reason, undefined when the error carried no ErrorInfo. */
  readonly reason: string | undefined;
  /** The ErrorInfo metadata. */
  readonly metadata: Readonly<Record<string, string>>;

  constructor(message: string, code: Code, reason: string | undefined, metadata: Record<string, string>, cause?: unknown) {
    super(message, { cause });
    this.name = new.target.name;
    this.code = code;
    this.reason = reason;
    this.metadata = Object.freeze({ ...metadata });
  }
}

/**
 * FencedWriteError is a write-back rejected by the fence (R9, R25): nothing
 * was written. `attempt` is the attempt the write carried, `currentAttempt` and
 * `currentState` what the job holds now.
 */
export class FencedWriteError extends CoordinatorError {
  readonly jobId: bigint;
  readonly attempt: bigint;
  readonly currentAttempt: bigint;
  readonly currentState: JobState;

  constructor(message: string, code: Code, reason: string, metadata: Record<string, string>, cause?: unknown) {
    super(message, code, reason, metadata, cause);
    this.jobId = int64(metadata["job_id"]);
    this.attempt = int64(metadata["attempt"]);
    this.currentAttempt = int64(metadata["current_attempt"]);
    this.currentState = jobState(metadata["current_state"]);
  }
}

/**
 * StaleAttemptError (STALE_ATTEMPT, FAILED_PRECONDITION): the write does not
 * carry the job's current grant and changed nothing — the job was taken over
 * (an older attempt), the lease token is another grant's or missing (R25:
 * the right attempt is not enough), or the attempt is one this database never
 * granted (a grant lost in a failover, R26). `currentAttempt` and
 * `currentState` say where the job stands; the token never appears in the
 * error. Never retry it, not even "with the current attempt": file what the
 * provider said with ReportObservation instead (R15).
 */
export class StaleAttemptError extends FencedWriteError {}

/**
 * JobNotRunningError (JOB_NOT_RUNNING, FAILED_PRECONDITION): this attempt
 * already wrote a different outcome (R21); nothing was written.
 */
export class JobNotRunningError extends FencedWriteError {}

/**
 * JobNotInReviewError (JOB_NOT_IN_REVIEW, FAILED_PRECONDITION): a
 * ResolveReview found the job no longer in manual review under the attempt
 * the operator looked at; nothing was written.
 */
export class JobNotInReviewError extends FencedWriteError {}

/**
 * OperationKeyConflictError (OPERATION_KEY_CONFLICT, ALREADY_EXISTS): the
 * operation_key is bound to a refund with different values (R1).
 */
export class OperationKeyConflictError extends CoordinatorError {
  readonly operationKey: string;
  /** The job that holds the key. */
  readonly jobId: bigint;

  constructor(message: string, code: Code, reason: string, metadata: Record<string, string>, cause?: unknown) {
    super(message, code, reason, metadata, cause);
    this.operationKey = metadata["operation_key"] ?? "";
    this.jobId = int64(metadata["job_id"]);
  }
}

/**
 * ClaimOutcomeUnknownError (CLAIM_OUTCOME_UNKNOWN, UNAVAILABLE): the claim may
 * or may not have committed. Nothing was granted: act on nothing, claim again
 * (R7). A job it did commit is recovered by a takeover after its lease.
 */
export class ClaimOutcomeUnknownError extends CoordinatorError {}

/**
 * WriteOutcomeUnknownError (WRITE_OUTCOME_UNKNOWN, UNAVAILABLE): a write-back's
 * commit was cut off. Repeat the same write: it is idempotent for its attempt
 * and answers `replayed: true` if the first one landed (R21).
 */
export class WriteOutcomeUnknownError extends CoordinatorError {}

/**
 * DatabaseUnavailableError (DATABASE_UNAVAILABLE, UNAVAILABLE): nothing was
 * changed; retry.
 */
export class DatabaseUnavailableError extends CoordinatorError {}

/** NotFoundError (NOT_FOUND): no such job. */
export class NotFoundError extends CoordinatorError {}

/**
 * GrantTooOldError (GRANT_TOO_OLD, FAILED_PRECONDITION): a renewal refused
 * because the grant has lived as long as the coordinator lets one grant live
 * (its `grantExpiresAt`, the coordinator's --max-grant-age, R27). Renew it no
 * more. The grant is still valid: its holder may write back until a takeover
 * commits after its lease runs out (R8).
 */
export class GrantTooOldError extends CoordinatorError {
  readonly jobId: bigint;
  readonly attempt: bigint;

  constructor(message: string, code: Code, reason: string, metadata: Record<string, string>, cause?: unknown) {
    super(message, code, reason, metadata, cause);
    this.jobId = int64(metadata["job_id"]);
    this.attempt = int64(metadata["attempt"]);
  }
}

/**
 * TooManyCallsError (TOO_MANY_CALLS, RESOURCE_EXHAUSTED): the credential, or
 * the coordinator, has as many calls of this kind in flight as it allows
 * (expensive reads, worker streams); nothing was done. Try again after the
 * RetryInfo's delay.
 */
export class TooManyCallsError extends CoordinatorError {}

/**
 * CancelRequestedError (CANCEL_REQUESTED, FAILED_PRECONDITION): a Reschedule
 * asked to send the refund (next action REFUND) of a job whose cancel was
 * requested (R32); nothing was written. Do not repeat it: only a reconcile
 * may follow, so reschedule to RECONCILE, or complete or escalate. The
 * Worker never asks for it (`WorkerJob.cancelRequested`).
 */
export class CancelRequestedError extends CoordinatorError {}

/**
 * JobNotCancellableError (JOB_NOT_CANCELLABLE, FAILED_PRECONDITION): an
 * operator's CancelRefund named a job that cannot be cancelled: it
 * succeeded, was cancelled for another reason, or was archived (R32). Not to
 * be repeated.
 */
export class JobNotCancellableError extends CoordinatorError {}

/**
 * NotOnAttentionListError (NOT_ON_ATTENTION_LIST, FAILED_PRECONDITION): an
 * operator's AcknowledgeAttention named a job that is not on the attention
 * list (R34). Not to be repeated.
 */
export class NotOnAttentionListError extends CoordinatorError {}

/** FieldViolation names one bad request field. */
export interface FieldViolation {
  /** The proto field name, e.g. "max_jobs". */
  field: string;
  description: string;
}

/**
 * InvalidArgumentError (INVALID_ARGUMENT): the request was rejected before
 * anything happened; `fieldViolations` names each bad field (from
 * google.rpc.BadRequest).
 */
export class InvalidArgumentError extends CoordinatorError {
  readonly fieldViolations: readonly FieldViolation[];

  constructor(message: string, code: Code, reason: string | undefined, metadata: Record<string, string>,
    fieldViolations: FieldViolation[], cause?: unknown) {
    super(message, code, reason, metadata, cause);
    this.fieldViolations = Object.freeze(fieldViolations);
  }

  /** fields returns the names of the violated fields. */
  get fields(): string[] {
    return this.fieldViolations.map((v) => v.field);
  }
}

/**
 * toCoordinatorError turns whatever a call rejected with into a
 * CoordinatorError subclass, chosen by the ErrorInfo reason of domain
 * "jobfence" (R24). Errors without one keep their status code (e.g.
 * UNAVAILABLE when the coordinator cannot be reached).
 */
export function toCoordinatorError(err: unknown): CoordinatorError {
  if (err instanceof CoordinatorError) {
    return err;
  }
  const ce = ConnectError.from(err);
  const details = errorDetails(ce);
  const ei = details.info;
  return errorOf(ce.rawMessage, ce.code, ei?.reason, ei?.metadata ?? {}, details.violations, ce);
}

/**
 * workReplyError decodes the error of a worker stream reply
 * (`WorkReply.error`): a google.rpc.Status serialized, the very bytes the
 * unary call's grpc-status-details-bin trailer carries. It is read as that
 * trailer is — by connect's gRPC trailer decoder, then toCoordinatorError —
 * so a call answered on the stream rejects with the class, code, message,
 * reason, metadata and field violations its unary call would have (R24).
 * Bytes that do not decode, or a Status of code OK, are an INTERNAL error.
 */
export function workReplyError(status: Uint8Array): CoordinatorError {
  let ce: ConnectError | undefined;
  try {
    ce = findTrailerError(new Headers({ "grpc-status-details-bin": encodeBinaryHeader(status) }));
  } catch (err) {
    return toCoordinatorError(new ConnectError("a worker stream reply's error does not decode", Code.Internal, undefined, undefined, err));
  }
  if (ce === undefined) {
    return toCoordinatorError(new ConnectError("a worker stream reply carried an error of status OK", Code.Internal));
  }
  return toCoordinatorError(ce);
}

// errorOf is the CoordinatorError subclass of an ErrorInfo reason (R24).
function errorOf(msg: string, code: Code, reason: string | undefined, meta: Record<string, string>,
  violations: FieldViolation[], cause: unknown): CoordinatorError {
  switch (reason) {
    case Reason.StaleAttempt:
      return new StaleAttemptError(msg, code, reason, meta, cause);
    case Reason.JobNotRunning:
      return new JobNotRunningError(msg, code, reason, meta, cause);
    case Reason.JobNotInReview:
      return new JobNotInReviewError(msg, code, reason, meta, cause);
    case Reason.OperationKeyConflict:
      return new OperationKeyConflictError(msg, code, reason, meta, cause);
    case Reason.ClaimOutcomeUnknown:
      return new ClaimOutcomeUnknownError(msg, code, reason, meta, cause);
    case Reason.WriteOutcomeUnknown:
      return new WriteOutcomeUnknownError(msg, code, reason, meta, cause);
    case Reason.DatabaseUnavailable:
      return new DatabaseUnavailableError(msg, code, reason, meta, cause);
    case Reason.NotFound:
      return new NotFoundError(msg, code, reason, meta, cause);
    case Reason.GrantTooOld:
      return new GrantTooOldError(msg, code, reason, meta, cause);
    case Reason.TooManyCalls:
      return new TooManyCallsError(msg, code, reason, meta, cause);
    case Reason.CancelRequested:
      return new CancelRequestedError(msg, code, reason, meta, cause);
    case Reason.JobNotCancellable:
      return new JobNotCancellableError(msg, code, reason, meta, cause);
    case Reason.NotOnAttentionList:
      return new NotOnAttentionListError(msg, code, reason, meta, cause);
    case Reason.InvalidArgument:
      return new InvalidArgumentError(msg, code, reason, meta, violations, cause);
  }
  if (code === Code.InvalidArgument && violations.length > 0) {
    return new InvalidArgumentError(msg, code, reason, meta, violations, cause);
  }
  return new CoordinatorError(msg, code, reason, meta, cause);
}

/**
 * refusalError is the error of one grant's refusal in a RenewLeases answer
 * (R27): the class, code and metadata the same refusal of a write-back
 * carries, chosen by the reason, never by the message (R24) — a
 * StaleAttemptError for STALE_ATTEMPT, and so on. `jobId` and `attempt` name
 * the grant when the metadata does not.
 */
export function refusalError(reason: ErrorReason, message: string, metadata: Record<string, string>,
  jobId: bigint, attempt: bigint): CoordinatorError {
  // A reason newer than this SDK keeps its number.
  const name = (reasonName(reason) as string | undefined) ?? `ERROR_REASON_${reason}`;
  const meta = { job_id: jobId.toString(), attempt: attempt.toString(), ...metadata };
  return errorOf(message, reasonCode(reason), name, meta, [], undefined);
}

// reasonCode is the gRPC code each reason comes with (the proto's ErrorReason).
function reasonCode(r: ErrorReason): Code {
  switch (r) {
    case ErrorReason.NOT_FOUND:
      return Code.NotFound;
    case ErrorReason.OPERATION_KEY_CONFLICT:
      return Code.AlreadyExists;
    case ErrorReason.CLAIM_OUTCOME_UNKNOWN:
    case ErrorReason.WRITE_OUTCOME_UNKNOWN:
    case ErrorReason.DATABASE_UNAVAILABLE:
    case ErrorReason.DATABASE_FULL:
    case ErrorReason.DATABASE_ACCESS_DENIED:
      return Code.Unavailable;
    case ErrorReason.OBSERVATION_LIMIT:
    case ErrorReason.TOO_MANY_CALLS:
      return Code.ResourceExhausted;
    case ErrorReason.INVALID_ARGUMENT:
      return Code.InvalidArgument;
    case ErrorReason.UNAUTHENTICATED:
      return Code.Unauthenticated;
    case ErrorReason.PERMISSION_DENIED:
      return Code.PermissionDenied;
    default:
      return Code.FailedPrecondition;
  }
}

/**
 * GrantLostError is the reason a handler's `signal` is aborted with when the
 * Worker learns that the grant the handler works under is gone (R27): a
 * renewal answered STALE_ATTEMPT (the job was taken over, R8: the takeover's
 * commit ends the grant), JOB_NOT_RUNNING (the grant already wrote its
 * outcome) or NOT_FOUND. Stop before sending anything new to the provider;
 * an answer already received is still worth returning: the Worker's
 * write-back is refused by the fence and the answer is filed as an
 * observation (R15). `refusal` is the coordinator's refusal, decoded by
 * reason; `currentAttempt` and `currentState` say where the job stands
 * (0 and UNSPECIFIED when the refusal does not say). It never carries the
 * lease token (R25).
 */
export class GrantLostError extends Error {
  readonly jobId: bigint;
  readonly attempt: bigint;
  /** The refusal's reason: Reason.StaleAttempt, Reason.JobNotRunning or Reason.NotFound. */
  readonly reason: string;
  readonly currentAttempt: bigint;
  readonly currentState: JobState;
  readonly refusal: CoordinatorError;

  constructor(jobId: bigint, attempt: bigint, refusal: CoordinatorError) {
    const fenced = refusal instanceof FencedWriteError ? refusal : undefined;
    const where = fenced && fenced.currentAttempt > 0n
      ? `; the job is at attempt ${fenced.currentAttempt}, ${JobState[fenced.currentState] ?? "state unknown"}`
      : "";
    super(`grant lost: job ${jobId} attempt ${attempt} may write no more (${refusal.reason ?? "refused"}${where}); ` +
      "send nothing new to the provider (R27)", { cause: refusal });
    this.name = "GrantLostError";
    this.jobId = jobId;
    this.attempt = attempt;
    this.reason = refusal.reason ?? "";
    this.currentAttempt = fenced?.currentAttempt ?? 0n;
    this.currentState = fenced?.currentState ?? JobState.UNSPECIFIED;
    this.refusal = refusal;
  }
}

/**
 * isRetryableWrite reports whether repeating the same write-back is safe and
 * useful: the outcome is unknown or nothing happened (UNAVAILABLE, including
 * WRITE_OUTCOME_UNKNOWN and DATABASE_UNAVAILABLE), the call's deadline cut
 * it, or its HTTP/2 stream was reset (CANCELED: a connection that died while
 * the process was paused). A repeat is idempotent for its attempt (R21).
 * Fenced rejections, invalid input and NOT_FOUND are final.
 */
export function isRetryableWrite(err: CoordinatorError): boolean {
  if (err.reason === Reason.ClaimOutcomeUnknown) {
    return false; // a claim's answer, never a write's
  }
  return err.code === Code.Unavailable || err.code === Code.DeadlineExceeded || err.code === Code.Canceled;
}

interface Details {
  info: ErrorInfo | undefined;
  violations: FieldViolation[];
}

// errorDetails finds the jobfence ErrorInfo and the BadRequest field
// violations. connect decodes grpc-status-details-bin into ce.details; when a
// proxy left the trailer undecoded in the metadata, decode it here.
function errorDetails(ce: ConnectError): Details {
  let infos = ce.findDetails(ErrorInfoSchema);
  let badRequests = ce.findDetails(BadRequestSchema);
  if (infos.length === 0) {
    const raw = ce.metadata.get("grpc-status-details-bin");
    if (raw) {
      try {
        const st = fromBinary(StatusSchema, decodeBinaryHeader(raw));
        const fromTrailer = new ConnectError(st.message, ce.code, undefined, undefined);
        fromTrailer.details = st.details.map((a) => ({ type: a.typeUrl.slice(a.typeUrl.lastIndexOf("/") + 1), value: a.value }));
        infos = fromTrailer.findDetails(ErrorInfoSchema);
        badRequests = fromTrailer.findDetails(BadRequestSchema);
      } catch {
        // An undecodable trailer leaves the error without details.
      }
    }
  }
  const info = infos.find((i) => i.domain === ErrorDomain);
  const violations = badRequests.flatMap((b) => b.fieldViolations.map((v) => ({ field: v.field, description: v.description })));
  return { info, violations };
}

function int64(s: string | undefined): bigint {
  if (s === undefined || !/^-?\d+$/.test(s)) {
    return 0n;
  }
  return BigInt(s);
}

function jobState(name: string | undefined): JobState {
  const v = JobStateSchema.values.find((e) => e.name === name);
  return v ? (v.number as JobState) : JobState.UNSPECIFIED;
}
