// The run of one granted job: the handler's call to the provider under its
// deadline, the decision (R14, R16, R22) and the fenced write-back under
// the claimed grant — attempt and lease token (R9, R25).

import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { context as otelContext } from "@opentelemetry/api";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";

import { cancelRequested, coordinatorNow, decideReconcile, resendAllowed, sends, sendsAgain, type WriteDecision } from "./decide.js";
import { FencedWriteError, GrantLostError, isRetryableWrite, toCoordinatorError } from "./errors.js";
import { jobIds, type Emit } from "./events.js";
import { NextAction, type ClaimedJob } from "./gen/jobfence/v1/coordinator_pb.js";
import { writeRetryDelayMs, type Settings } from "./options.js";
import type { Receipts } from "./receipts.js";
import type { Renewer } from "./renewer.js";
import type { WorkerCalls } from "./session.js";
import { Tracing, type Attempt } from "./tracing.js";
import { clip, withoutToken, type ProviderResult, type WorkerJob } from "./types.js";

type Settled = { ok: true; result: unknown } | { ok: false; error: unknown };

/**
 * JobRunner runs granted jobs, one `run` each: it calls the handler its
 * next_action names under the provider-call deadline, renewing the lease
 * meanwhile (R27), decides the write-back and makes it under the claimed
 * grant, repeating it only when that is safe (R21). An answer the fence
 * refuses, or that arrives after the deadline, is filed as a receipt (R15).
 */
export class JobRunner {
  // The filings of answers that arrived after their deadline (R15).
  private readonly late = new Set<Promise<void>>();

  constructor(
    private readonly settings: Settings,
    private readonly calls: WorkerCalls,
    private readonly renewer: Renewer,
    private readonly receipts: Receipts,
    private readonly emit: Emit,
    private readonly tracing: Tracing = new Tracing(undefined, settings.workerId),
  ) {}

  /**
   * run handles one granted job to its write-back; claimedAt is when the
   * grant arrived (performance.now()). It never rejects.
   */
  async run(claimed: ClaimedJob, claimedAt: number): Promise<void> {
    const job = claimed.job;
    if (job === undefined) {
      return; // never sent by the coordinator; nothing to act on
    }
    const ids = jobIds(claimed);
    const cancel = cancelRequested(claimed);
    // R35: the attempt's span, linked to the enqueue; the handler runs in it
    // and every call made for the job carries it.
    const attempt = this.tracing.start(claimed, cancel);
    this.emit({ type: "claimed", ...ids, nextAction: claimed.nextAction, takeover: claimed.takeover, cancelRequested: cancel });

    // R32: a job whose cancel was requested is only ever reconciled, whatever
    // its grant's action says (sends), so it has no resend to refuse.
    if (sends(claimed) && sendsAgain(claimed) && this.resendSafe(job.provider)) {
      // R14, R22: the reconcile that chose this same-key resend checked the
      // window, but the job may have waited since (a backlog, an empty
      // provider budget). Past the window the provider has forgotten the key
      // and the resend would be a second refund: check again before anything
      // leaves, against the coordinator's clock (R12).
      const now = coordinatorNow(claimed, performance.now() - claimedAt);
      if (now === undefined || !resendAllowed(claimed, { sameKeyResendSafe: true, now, resendMarginMs: this.settings.resendMarginMs })) {
        const reason = "same-key resend refused before sending: the provider's idempotency-key retention window has passed " +
          "or is about to (R14, R16, R22)";
        this.emit({ type: "resend_refused", ...ids, reason });
        await this.writeBack(claimed, { kind: "escalate", reason }, undefined, attempt);
        return;
      }
    }

    const abort = new AbortController();
    const held = this.renewer.hold(claimed, abort, claimedAt, attempt.context);
    const view: WorkerJob = {
      ...ids,
      nextAction: claimed.nextAction,
      takeover: claimed.takeover,
      cancelRequested: cancel,
      job,
      claimed: withoutToken(claimed),
      signal: abort.signal,
      timeoutMs: this.settings.providerCallTimeoutMs,
      traceContext: attempt.context,
    };
    // R14: only a REFUND action sends; anything else asks first. R32: a job
    // whose cancel was requested is only ever asked about.
    const handlers = this.settings.handlers;
    const handler = sends(claimed) ? handlers.refund : handlers.reconcile;
    const settled = Promise.resolve()
      .then(() => otelContext.with(attempt.context, () => handler.call(handlers, view)))
      .then((result): Settled => ({ ok: true, result }), (error: unknown): Settled => ({ ok: false, error }));

    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<"deadline">((resolve) => {
      timer = setTimeout(() => resolve("deadline"), this.settings.providerCallTimeoutMs);
    });
    const first = await Promise.race([settled, deadline]);
    clearTimeout(timer);
    // The handler returned, or the worker stops waiting for it: the grant
    // is renewed no more (R27); the write-back decides what it still may do.
    this.renewer.release(held);
    if (abort.signal.aborted && abort.signal.reason instanceof GrantLostError) {
      attempt.grantLost();
    }

    let answer: ProviderResult | undefined;
    let decision: WriteDecision;
    if (first === "deadline") {
      abort.abort(new Error(`provider call deadline of ${this.settings.providerCallTimeoutMs} ms exceeded`));
      this.emit({ type: "provider_deadline", ...ids });
      attempt.handlerFailed("provider_deadline");
      decision = this.unknownOutcome("provider call deadline exceeded; outcome unknown");
      // R15: an answer arriving after the deadline is a receipt: file it, never
      // write with it.
      const filing = settled.then(async (s) => {
        if (s.ok && isProviderResult(s.result)) {
          await this.receipts.file(claimed, s.result, "answer arrived after the provider-call deadline", attempt.context);
        }
      });
      const tracked = filing.finally(() => this.late.delete(tracked));
      this.late.add(tracked);
    } else if (!first.ok) {
      this.emit({ type: "handler_error", ...ids, error: first.error });
      attempt.handlerFailed("handler_error");
      decision = this.unknownOutcome(`provider call failed; outcome unknown: ${errorText(first.error)}`);
    } else if (!isProviderResult(first.result)) {
      this.emit({ type: "handler_error", ...ids, error: new TypeError("handler returned no ProviderResult") });
      attempt.handlerFailed("handler_error");
      decision = this.unknownOutcome("handler returned no valid result; outcome unknown");
    } else {
      answer = first.result;
      decision = decideReconcile(answer, claimed, {
        sameKeyResendSafe: this.resendSafe(job.provider),
        now: coordinatorNow(claimed, performance.now() - claimedAt) ?? new Date(),
        resendMarginMs: this.settings.resendMarginMs,
        pendingDelayMs: this.settings.pendingDelayMs,
        notSentDelayMs: this.settings.unknownOutcomeDelayMs,
      });
    }
    attempt.handled(answer);
    await this.writeBack(claimed, decision, answer, attempt);
  }

  /** lateAnswers waits up to graceMs for the answers that arrived after their deadline to be filed. */
  async lateAnswers(graceMs: number): Promise<void> {
    if (this.late.size > 0) {
      await Promise.race([Promise.allSettled([...this.late]), sleep(graceMs)]);
    }
  }

  // writeBack makes the fenced write under the claimed grant: its attempt
  // and its lease token (R9, R25), in the attempt's span, which it ends
  // with the outcome (after the receipt it may file).
  private async writeBack(claimed: ClaimedJob, decision: WriteDecision, answer: ProviderResult | undefined,
    attempt: Attempt): Promise<void> {
    const traced = { traceContext: attempt.context };
    const job = claimed.job!;
    const ids = jobIds(claimed);
    const grant = { jobId: job.id, attempt: claimed.attempt, leaseToken: claimed.leaseToken };
    const write = (): Promise<{ replayed: boolean }> => {
      switch (decision.kind) {
        case "complete":
          return this.calls.complete({ ...grant, providerRefundId: decision.providerRefundId }, traced);
        case "reschedule":
          return this.calls.reschedule({
            ...grant,
            nextAction: decision.nextAction,
            when: { case: "delay", value: durationFromMs(decision.delayMs) },
            reason: clip(decision.reason, 1024),
          }, traced);
        case "escalate":
          return this.calls.escalate({ ...grant, reason: clip(decision.reason, 1024) }, traced);
      }
    };
    for (let retry = 0; ; retry++) {
      try {
        const resp = await write();
        this.receipts.healed();
        this.emit({ type: "written", ...ids, decision, replayed: resp.replayed });
        attempt.end(decision, { replayed: resp.replayed });
        return;
      } catch (e) {
        const err = toCoordinatorError(e);
        if (err instanceof FencedWriteError) {
          // R9, R21: the fence said no; repeating cannot change that. Keep the
          // provider's answer as evidence for the current holder (R15).
          this.emit({ type: "stale", ...ids, error: err, decision });
          if (answer !== undefined) {
            await this.receipts.file(claimed, answer, `write-back rejected with ${err.reason}`, attempt.context);
          }
          attempt.end(decision, { error: err });
          return;
        }
        if (isRetryableWrite(err) && retry < this.settings.writeRetries) {
          // R21: the same write under the same attempt is idempotent.
          this.emit({ type: "write_retry", ...ids, error: err, retry: retry + 1 });
          await sleep(writeRetryDelayMs(this.settings, retry));
          continue;
        }
        // Give up: the lease lapses and a takeover reconciles (R6, R14). The
        // receipt is kept if the coordinator takes it (R15).
        this.emit({ type: "write_failed", ...ids, error: err });
        if (answer !== undefined) {
          await this.receipts.file(claimed, answer, `write-back failed: ${err.message}`, attempt.context);
        }
        attempt.end(decision, { error: err });
        return;
      }
    }
  }

  // unknownOutcome: a request may have reached the provider; the next holder
  // asks before anything else (R14).
  private unknownOutcome(reason: string): WriteDecision {
    return { kind: "reschedule", nextAction: NextAction.RECONCILE, delayMs: this.settings.unknownOutcomeDelayMs, reason };
  }

  private resendSafe(provider: string): boolean {
    const s = this.settings.sameKeyResendSafe;
    return typeof s === "function" ? s(provider) : s;
  }
}

const resultKinds = new Set(["succeeded", "pending", "not_found", "failed", "not_sent", "escalate"]);

function isProviderResult(v: unknown): v is ProviderResult {
  return typeof v === "object" && v !== null && resultKinds.has((v as { kind?: unknown }).kind as string);
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
