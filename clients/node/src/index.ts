// Package entry point: the typed Coordinator client, the Worker runtime with
// its worker stream, its lease renewal (R27) and its receipt spool (R28), the
// decision helper, the grant fingerprint (R25), the error classes, and JSON
// for values holding bigints.

export { CoordinatorClient, DEFAULT_KEEPALIVE, MaxRenewBatch, grantOf } from "./client.js";
export type {
  CallOptions,
  ClaimInit,
  CompleteInit,
  CoordinatorClientOptions,
  EnqueueRefundInit,
  EscalateInit,
  GetJobInit,
  Grant,
  KeepaliveOptions,
  ListJobsInit,
  RenewLeasesOptions,
  Renewal,
  RenewalRefused,
  Renewed,
  ReportObservationInit,
  ResolveReviewInit,
  RescheduleInit,
  TLSOptions,
} from "./client.js";
export { Worker } from "./worker.js";
export type { JobIds, WorkerEvent } from "./events.js";
export type { WorkerOptions } from "./options.js";
export type { ClaimedJobView, Handlers, ProviderResult, WorkerJob } from "./types.js";
export {
  MaxReceiptSpoolBytes,
  MaxSpooledReceipts,
  ReceiptRefileIntervalMs,
  ReceiptSpoolLockedError,
  ReceiptSpoolOff,
  defaultReceiptSpool,
} from "./spool.js";
export { grantFingerprint } from "./types.js";
export { ATTEMPT_SPAN_NAME, RENEW_SPAN_NAME, TRACER_NAME } from "./tracing.js";
export type { AttemptOutcome } from "./tracing.js";
export { MaxDelayMs, cancelRequested, coordinatorNow, decideReconcile, resendAllowed, sendsAgain } from "./decide.js";
export { bigintReplacer, jsonSafe, toJson, toJsonString } from "./json.js";
export type { DecisionPolicy, WriteDecision } from "./decide.js";
export {
  CancelRequestedError,
  ClaimOutcomeUnknownError,
  CoordinatorError,
  DatabaseUnavailableError,
  ErrorDomain,
  FencedWriteError,
  GrantLostError,
  GrantTooOldError,
  InvalidArgumentError,
  JobNotCancellableError,
  JobNotRunningError,
  JobNotInReviewError,
  NotFoundError,
  NotOnAttentionListError,
  OperationKeyConflictError,
  Reason,
  TooManyCallsError,
  StaleAttemptError,
  WriteOutcomeUnknownError,
  isRetryableWrite,
  toCoordinatorError,
} from "./errors.js";
export type { FieldViolation } from "./errors.js";
export * from "./gen/jobfence/v1/coordinator_pb.js";
export { Code } from "@connectrpc/connect";
