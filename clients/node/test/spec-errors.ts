// errors.json: each vector's status is decoded as a unary call's error is —
// from the gRPC trailers a coordinator sends, by connect's trailer decoder
// and toCoordinatorError — and as the same status in a worker stream reply
// (workReplyError), which must decode alike (R24). What the worker does with
// it is then played for real: a write-back answered with it (JobRunner,
// R21), a receipt refused with it (Receipts and a real spool, R28), and a
// refile pass that meets it.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";

import { create, toBinary } from "@bufbuild/protobuf";
import { anyPack, timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Code, encodeBinaryHeader, type ConnectError } from "@connectrpc/connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";

import { BadRequestSchema, ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../src/gen/google/rpc/status_pb.js";
import {
  CancelRequestedError,
  ClaimedJobSchema,
  ClaimOutcomeUnknownError,
  CoordinatorError,
  DatabaseUnavailableError,
  FencedWriteError,
  GrantTooOldError,
  InvalidArgumentError,
  JobNotCancellableError,
  JobNotInReviewError,
  JobNotRunningError,
  JobState,
  NextAction,
  NotFoundError,
  NotOnAttentionListError,
  ObservationOutcome,
  OperationKeyConflictError,
  Reason,
  StaleAttemptError,
  TooManyCallsError,
  WriteOutcomeUnknownError,
  toCoordinatorError,
} from "../src/index.js";
import { workReplyError } from "../src/errors.js";
import { JobRunner } from "../src/job.js";
import { settingsOf } from "../src/options.js";
import { Receipts } from "../src/receipts.js";
import { Renewer } from "../src/renewer.js";
import type { WorkerCalls } from "../src/session.js";
import { ReceiptSpool } from "../src/spool.js";
import { describeError } from "./harness.js";
import { expectOf, type Fields } from "./spec-read.js";

/** The gRPC codes by their canonical names. */
export const codes: Record<string, Code> = {
  CANCELLED: Code.Canceled,
  UNKNOWN: Code.Unknown,
  INVALID_ARGUMENT: Code.InvalidArgument,
  DEADLINE_EXCEEDED: Code.DeadlineExceeded,
  NOT_FOUND: Code.NotFound,
  ALREADY_EXISTS: Code.AlreadyExists,
  PERMISSION_DENIED: Code.PermissionDenied,
  RESOURCE_EXHAUSTED: Code.ResourceExhausted,
  FAILED_PRECONDITION: Code.FailedPrecondition,
  ABORTED: Code.Aborted,
  OUT_OF_RANGE: Code.OutOfRange,
  UNIMPLEMENTED: Code.Unimplemented,
  INTERNAL: Code.Internal,
  UNAVAILABLE: Code.Unavailable,
  DATA_LOSS: Code.DataLoss,
  UNAUTHENTICATED: Code.Unauthenticated,
};

export async function runErrors(v: Fields): Promise<void> {
  const status = statusOf(v.fields("status")!);
  const expect = expectOf(v);
  v.done();

  const asUnary = unaryError(status);
  const err = toCoordinatorError(asUnary);
  const onStream = workReplyError(toBinary(StatusSchema, status));
  assert.deepEqual(describeError(onStream), describeError(err), "a stream reply decodes as the unary error (R24)");
  if (expect === undefined) {
    return;
  }

  const want = {
    kind: expect.str("kind"),
    reason: expect.str("reason"),
    fenced: expect.bool("fenced"),
    unavailable: expect.bool("unavailable"),
    retryWrite: expect.bool("retry_write"),
    refileLater: expect.bool("refile_later"),
    refileStops: expect.bool("refile_stops"),
    takenOver: expect.bool("taken_over"),
    jobId: expect.int64("job_id"),
    attempt: expect.int64("attempt"),
    currentAttempt: expect.int64("current_attempt"),
    currentState: expect.str("current_state"),
    violations: expect.strs("violations"),
  };
  expect.done();

  if (want.kind !== undefined) {
    assert.equal(kindOf(err), want.kind, "kind");
  }
  if (want.reason !== undefined) {
    assert.equal(err.reason, want.reason, "reason");
  }
  if (want.fenced !== undefined) {
    assert.equal(err instanceof FencedWriteError, want.fenced, "fenced: a FencedWriteError");
  }
  if (want.unavailable !== undefined) {
    assert.equal(err.code === Code.Unavailable, want.unavailable, "unavailable");
  }
  if (want.takenOver !== undefined) {
    assert.ok(err instanceof StaleAttemptError, "taken_over: a StaleAttemptError");
    assert.equal(err.currentAttempt > err.attempt, want.takenOver, "taken_over: currentAttempt > attempt");
  }
  if (want.jobId !== undefined) {
    assert.ok("jobId" in err, `job_id: ${err.constructor.name} names no job`);
    assert.equal(err.jobId, want.jobId, "job_id");
  }
  if (want.attempt !== undefined || want.currentAttempt !== undefined || want.currentState !== undefined) {
    assert.ok(err instanceof FencedWriteError, `attempt, current_attempt, current_state: ${err.constructor.name} has none`);
    if (want.attempt !== undefined) {
      assert.equal(err.attempt, want.attempt, "attempt");
    }
    if (want.currentAttempt !== undefined) {
      assert.equal(err.currentAttempt, want.currentAttempt, "current_attempt");
    }
    if (want.currentState !== undefined) {
      assert.equal(JobState[err.currentState]?.toLowerCase(), want.currentState, "current_state");
    }
  }
  if (want.violations !== undefined) {
    assert.ok(err instanceof InvalidArgumentError, "violations: an InvalidArgumentError");
    assert.deepEqual(err.fields, want.violations, "violations");
  }
  if (want.retryWrite !== undefined) {
    assert.equal(await writeRepeated(asUnary), want.retryWrite, "retry_write: the Worker repeats a write-back answered with it");
  }
  if (want.refileLater !== undefined || want.refileStops !== undefined) {
    const played = await refiled(asUnary);
    if (want.refileLater !== undefined) {
      assert.equal(played.spooled, want.refileLater, "refile_later: a receipt refused with it is spooled");
    }
    if (want.refileStops !== undefined) {
      assert.equal(played.stopped, want.refileStops, "refile_stops: a refile pass that meets it tries no further receipt");
    }
  }
}

// statusOf is the google.rpc.Status the vector describes.
export function statusOf(s: Fields) {
  const name = s.str("code")!;
  const code = codes[name];
  assert.ok(code !== undefined, `${s.where}.code: ${name} is not a gRPC code this runner knows`);
  const message = s.str("message") ?? "";
  const reason = s.str("reason");
  const domain = s.str("domain") ?? "jobfence";
  const metadata = s.record("metadata") ?? {};
  const violations = s.list("field_violations")?.map((f) => {
    const v = { field: f.str("field") ?? "", description: f.str("description") ?? "" };
    f.done();
    return v;
  });
  s.done();
  const details = [];
  if (reason !== undefined) {
    details.push(anyPack(ErrorInfoSchema, create(ErrorInfoSchema, { domain, reason, metadata })));
  }
  if (violations !== undefined) {
    details.push(anyPack(BadRequestSchema, create(BadRequestSchema, { fieldViolations: violations })));
  }
  return create(StatusSchema, { code, message, details });
}

// unaryError is the error a unary call answered with status rejects with,
// before the SDK decodes it: connect's reading of the trailers.
function unaryError(status: ReturnType<typeof statusOf>): ConnectError {
  const trailers = new Headers({
    "grpc-status": String(status.code),
    "grpc-message": encodeURIComponent(status.message),
    "grpc-status-details-bin": encodeBinaryHeader(toBinary(StatusSchema, status)),
  });
  const ce = findTrailerError(trailers);
  assert.ok(ce !== undefined, "a status other than OK");
  return ce;
}

// kindOf is the spec's name of the error's kind: its class, else its reason
// when this SDK knows it, else its code.
function kindOf(err: CoordinatorError): string {
  const classes: Array<[new (...a: never[]) => CoordinatorError, string]> = [
    [StaleAttemptError, "stale_attempt"],
    [JobNotRunningError, "job_not_running"],
    [JobNotInReviewError, "job_not_in_review"],
    [OperationKeyConflictError, "operation_key_conflict"],
    [ClaimOutcomeUnknownError, "claim_outcome_unknown"],
    [WriteOutcomeUnknownError, "write_outcome_unknown"],
    [DatabaseUnavailableError, "database_unavailable"],
    [NotFoundError, "not_found"],
    [GrantTooOldError, "grant_too_old"],
    [TooManyCallsError, "too_many_calls"],
    [JobNotCancellableError, "job_not_cancellable"],
    [CancelRequestedError, "cancel_requested"],
    [NotOnAttentionListError, "not_on_attention_list"],
    [InvalidArgumentError, "invalid_argument"],
  ];
  for (const [cls, kind] of classes) {
    if (err instanceof cls) {
      return kind;
    }
  }
  if (err.reason !== undefined && (Object.values(Reason) as string[]).includes(err.reason)) {
    return err.reason.toLowerCase();
  }
  switch (err.code) {
    case Code.Unavailable:
      return "unavailable";
    case Code.DeadlineExceeded:
      return "deadline_exceeded";
    case Code.Canceled:
      return "canceled";
    case Code.Unauthenticated:
      return "unauthenticated";
    case Code.PermissionDenied:
      return "permission_denied";
  }
  return "other";
}

const claimed = create(ClaimedJobSchema, {
  job: { id: 7n, operationKey: "op-spec", provider: "p-spec", attempt: 1n },
  attempt: 1n,
  leaseToken: "spec-token",
  nextAction: NextAction.REFUND,
  claimedAt: timestampFromMs(Date.parse("2030-01-01T12:00:00Z")),
});

// writeRepeated runs one job whose Complete is answered with err once, and
// reports whether the Worker made it again.
async function writeRepeated(err: ConnectError): Promise<boolean> {
  let completes = 0;
  const calls = callsAnswering({
    complete: () => (++completes === 1 ? Promise.reject(err) : Promise.resolve({ replayed: true } as never)),
  });
  const settings = settingsOf({
    client: undefined as never, workerId: "spec", renewLeases: false, writeRetries: 1, writeRetryDelayMs: 0,
    handlers: {
      refund: async () => ({ kind: "succeeded", providerRefundId: "re_spec" }),
      reconcile: async () => ({ kind: "succeeded", providerRefundId: "re_spec" }),
    },
  });
  const emit = (): void => undefined;
  const receipts = new Receipts(calls, undefined, settings, emit);
  await new JobRunner(settings, calls, new Renewer(calls, settings, emit, emit), receipts, emit).run(claimed, 0);
  return completes > 1;
}

// refiled plays a receipt refused with err: is it spooled? Then a refile
// pass over two spooled receipts that meets err on the first: does it try
// the second?
async function refiled(err: ConnectError): Promise<{ spooled: boolean; stopped: boolean }> {
  const dir = mkdtempSync(path.join(tmpdir(), "jobfence-spec-"));
  try {
    const settings = { workerId: "spec", writeRetries: 0, writeRetryDelayMs: 0 };
    const emit = (): void => undefined;
    const refusing = callsAnswering({ reportObservation: () => Promise.reject(err) });

    const first = ReceiptSpool.open(path.join(dir, "first.receipts.jsonl"));
    await new Receipts(refusing, first, settings, emit).file(claimed, { kind: "succeeded", providerRefundId: "re_spec" }, "spec");
    const spooled = first.pending === 1;
    first.close();

    const spool = ReceiptSpool.open(path.join(dir, "pass.receipts.jsonl"));
    for (const n of [1, 2]) {
      spool.append({
        jobId: BigInt(n), operationKey: `op-${n}`, attempt: 1n, leaseToken: "t", source: "worker:spec",
        outcome: ObservationOutcome.SUCCEEDED, providerRefundId: `re_${n}`, providerEventId: "", detail: "", spooledAt: "",
      });
    }
    let tried = 0;
    let refuse = true;
    const calls = callsAnswering({
      reportObservation: () => {
        tried++;
        return refuse ? Promise.reject(err) : Promise.resolve({ duplicate: true } as never);
      },
    });
    const receipts = new Receipts(calls, spool, settings, emit);
    await receipts.start(); // the first pass
    const stopped = tried === 1;
    refuse = false;
    receipts.drain();
    await receipts.close();
    return { spooled, stopped };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// callsAnswering is a WorkerCalls whose calls answer as given; the others
// succeed.
function callsAnswering(answers: Partial<Record<keyof WorkerCalls, () => Promise<never>>>): WorkerCalls {
  const ok = (): Promise<never> => Promise.resolve({ replayed: false, duplicate: false } as never);
  return {
    complete: () => (answers.complete ?? ok)(),
    reschedule: () => (answers.reschedule ?? ok)(),
    escalate: () => (answers.escalate ?? ok)(),
    renewLeases: () => (answers.renewLeases ?? ok)(),
    reportObservation: () => (answers.reportObservation ?? ok)(),
  };
}
