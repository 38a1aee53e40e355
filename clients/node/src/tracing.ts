// Tracing (R35): each job a Worker works is one attempt span, linked to the
// trace context its enqueue stored (the grant's `traceparent`), and every
// call the Worker makes for the job carries the attempt span's context: a
// unary call as W3C `traceparent` and `tracestate` metadata, a call on the
// worker stream in the WorkCall's `traceparent` and `tracestate` fields.
// Only `@opentelemetry/api` is used: without a TracerProvider (the
// Worker's `tracerProvider`, or one the application registered) its spans
// are no-ops and nothing is recorded or sent. README, "Tracing".

import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  createTraceState,
  isSpanContextValid,
  trace,
  type Attributes,
  type Context,
  type Link,
  type Span,
  type SpanContext,
  type Tracer,
  type TracerProvider,
} from "@opentelemetry/api";

import type { WriteDecision } from "./decide.js";
import { CoordinatorError, FencedWriteError } from "./errors.js";
import { NextAction, type ClaimedJob } from "./gen/jobfence/v1/coordinator_pb.js";
import type { ProviderResult } from "./types.js";

/** TRACER_NAME is the instrumentation scope of the SDK's spans. */
export const TRACER_NAME = "@jobfence/worker";

/**
 * ATTEMPT_SPAN_NAME names the span of one attempt: the same in the three
 * SDKs, in the family of the coordinator's `jobfence.grant` and
 * `jobfence.writeback` spans.
 */
export const ATTEMPT_SPAN_NAME = "jobfence.attempt";

/**
 * RENEW_SPAN_NAME names the span a renewal of several jobs' leases is made
 * in, linked to each job's attempt span; a renewal of one job is made in its
 * attempt span.
 */
export const RENEW_SPAN_NAME = "jobfence.renew";

/** AttemptOutcome is an attempt span's `jobfence.outcome`. */
export type AttemptOutcome = "completed" | "rescheduled" | "escalated" | "stale" | "grant_lost" | "write_failed";

/** A W3C traceparent of version 00: the only one the coordinator stores. */
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/**
 * grantLink is the link to the enqueue's trace context a grant carries;
 * undefined when it carries none, or one that is not valid. A tracestate
 * that does not parse is dropped alone.
 */
export function grantLink(traceparent: string, tracestate: string): Link | undefined {
  const m = TRACEPARENT.exec(traceparent);
  if (m === null) {
    return undefined;
  }
  const context: SpanContext = {
    traceId: m[1]!,
    spanId: m[2]!,
    traceFlags: parseInt(m[3]!, 16) & 1,
    isRemote: true,
  };
  if (!isSpanContextValid(context)) {
    return undefined;
  }
  if (tracestate !== "") {
    try {
      context.traceState = createTraceState(tracestate);
    } catch {
      // a malformed tracestate is dropped alone
    }
  }
  return { context, attributes: { "jobfence.link": "enqueue" } };
}

/**
 * traceHeaders is the W3C trace context of the span `ctx` holds, as a call
 * made in it carries it; undefined when it holds no valid span, which is
 * what an untraced call costs.
 */
export function traceHeaders(ctx: Context): { traceparent: string; tracestate: string } | undefined {
  const sc = trace.getSpanContext(ctx);
  if (sc === undefined || !isSpanContextValid(sc)) {
    return undefined;
  }
  return {
    traceparent: `00-${sc.traceId}-${sc.spanId}-0${(sc.traceFlags & 1).toString(16)}`,
    tracestate: sc.traceState?.serialize() ?? "",
  };
}

/** Tracing is a Worker's tracer. */
export class Tracing {
  private readonly tracer: Tracer;

  constructor(provider: TracerProvider | undefined, private readonly workerId: string) {
    // The global provider is a proxy: one the application registers later
    // is used from then on.
    this.tracer = (provider ?? trace.getTracerProvider()).getTracer(TRACER_NAME);
  }

  /**
   * start starts the attempt span of a job: a root of its own, linked to
   * its enqueue. `attempt.context` holds it: the handler runs in it, and the
   * calls made for the job carry it.
   */
  start(claimed: ClaimedJob, cancelRequested: boolean): Attempt {
    const link = grantLink(claimed.traceparent, claimed.tracestate);
    const span = this.tracer.startSpan(ATTEMPT_SPAN_NAME, {
      kind: SpanKind.CONSUMER,
      root: true,
      links: link === undefined ? undefined : [link],
    }, ROOT_CONTEXT);
    if (span.isRecording()) {
      const job = claimed.job!;
      span.setAttributes({
        "messaging.system": "jobfence",
        "messaging.operation.type": "process",
        "messaging.operation.name": "attempt",
        "messaging.destination.name": job.provider,
        "messaging.message.id": job.id.toString(),
        "jobfence.job.id": Number(job.id),
        // Recorded as the coordinator records it: the business identifier
        // people search by, not a credential (docs/DESIGN.md, R35 in the code).
        "jobfence.operation_key": job.operationKey,
        "jobfence.attempt": Number(claimed.attempt),
        "jobfence.provider": job.provider,
        "jobfence.next_action": actionName(claimed.nextAction),
        "jobfence.takeover": claimed.takeover,
        "jobfence.cancel_requested": cancelRequested,
        "jobfence.worker_id": this.workerId,
      });
    }
    return new Attempt(span, trace.setSpan(ROOT_CONTEXT, span));
  }

  /**
   * renewContext is the context a renewal of several grants is made in: the
   * one grant's attempt span, or a `jobfence.renew` span linked to each
   * sampled attempt span (none when no attempt span is sampled). `end` ends
   * the renewal's own span, if any.
   */
  renewContext(spans: Array<Context | undefined>): { context: Context | undefined; end: () => void } {
    if (spans.length === 1) {
      return { context: spans[0], end: () => {} };
    }
    const links: Link[] = [];
    for (const ctx of spans) {
      const sc = ctx === undefined ? undefined : trace.getSpanContext(ctx);
      if (sc !== undefined && isSpanContextValid(sc) && (sc.traceFlags & 1) === 1) {
        links.push({ context: sc, attributes: { "jobfence.link": "attempt" } });
      }
    }
    if (links.length === 0) {
      return { context: undefined, end: () => {} };
    }
    const span = this.tracer.startSpan(RENEW_SPAN_NAME, {
      kind: SpanKind.CLIENT,
      root: true,
      links,
      attributes: { "messaging.system": "jobfence", "jobfence.worker_id": this.workerId, "jobfence.renew.size": spans.length },
    }, ROOT_CONTEXT);
    return { context: trace.setSpan(ROOT_CONTEXT, span), end: () => span.end() };
  }
}

/**
 * Attempt is the span of one attempt and what the attempt learns on its way
 * to the write-back.
 */
export class Attempt {
  private lost = false;
  private handlerError: string | undefined;

  constructor(private readonly span: Span, readonly context: Context) {}

  /** handled records what the handler returned. */
  handled(result: ProviderResult | undefined): void {
    if (this.span.isRecording()) {
      this.span.setAttribute("jobfence.result", result === undefined ? "unknown" : resultName(result.kind));
    }
  }

  /** handlerFailed: the handler threw, returned no result ("handler_error") or outlived its deadline ("provider_deadline"). */
  handlerFailed(errorType: "handler_error" | "provider_deadline"): void {
    this.handlerError = errorType;
  }

  /** grantLost: a renewal found the grant gone while the handler ran (R27). */
  grantLost(): void {
    this.lost = true;
  }

  /**
   * end ends the span with the write-back's outcome: the decision written
   * (replayed or not), or the write-back's error.
   */
  end(decision: WriteDecision, written: { replayed: boolean } | { error: CoordinatorError }): void {
    const span = this.span;
    if (!span.isRecording()) {
      span.end();
      return;
    }
    let outcome: AttemptOutcome;
    let errorType: string | undefined;
    let description = "";
    const attrs: Attributes = {};
    if ("replayed" in written) {
      outcome = decision.kind === "complete" ? "completed" : decision.kind === "escalate" ? "escalated" : "rescheduled";
      attrs["jobfence.writeback.replayed"] = written.replayed;
      if (this.handlerError !== undefined) {
        errorType = this.handlerError;
        description = "the provider call failed; outcome unknown";
      }
    } else if (this.lost) {
      outcome = "grant_lost";
      errorType = "grant_lost";
      description = "the grant was lost while the handler ran (R27)";
    } else if (written.error instanceof FencedWriteError) {
      outcome = "stale";
      errorType = errorTypeOf(written.error);
      description = "the write-back was refused by the fence";
    } else {
      outcome = "write_failed";
      errorType = errorTypeOf(written.error);
      description = "the write-back failed; the lease lapses";
    }
    attrs["jobfence.outcome"] = outcome;
    if (errorType !== undefined) {
      attrs["error.type"] = errorType;
      span.setStatus({ code: SpanStatusCode.ERROR, message: description });
    }
    span.setAttributes(attrs);
    span.end();
  }
}

// The gRPC codes' canonical names, by number, as the other SDKs write them.
const CODE_NAMES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
  "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"];

// errorTypeOf names a coordinator error for error.type: its ErrorInfo reason
// (STALE_ATTEMPT, …), else its gRPC code's name. Never its message.
function errorTypeOf(err: CoordinatorError): string {
  return err.reason ?? CODE_NAMES[err.code] ?? "UNKNOWN";
}

// resultName is a ProviderResult's kind as decide.json names it.
function resultName(kind: ProviderResult["kind"]): string {
  return kind === "not_found" ? "no_record" : kind;
}

function actionName(a: NextAction): string {
  switch (a) {
    case NextAction.REFUND:
      return "refund";
    case NextAction.RECONCILE:
      return "reconcile";
    default:
      return "";
  }
}
