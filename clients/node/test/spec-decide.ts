// decide.json: each vector runs one claimed job through the Worker's real
// JobRunner (job.ts) — the handler it calls, the resend check before
// sending, the decision and the write-back request it makes — with the
// write-back calls recorded instead of sent.

import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";

import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";

import {
  ClaimedJobSchema,
  NextAction,
  decideReconcile,
  type ProviderResult,
  type WorkerOptions,
  type WriteDecision,
} from "../src/index.js";
import { JobRunner } from "../src/job.js";
import { settingsOf } from "../src/options.js";
import { Receipts } from "../src/receipts.js";
import { Renewer } from "../src/renewer.js";
import type { WorkerCalls } from "../src/session.js";
import { expectOf, type Fields } from "./spec-read.js";

/** The spec's "now", on the coordinator's clock; the claim happened at it. */
const now = Date.parse("2030-01-01T12:00:00Z");

/** A write-back as the JobRunner sent it. */
interface Written {
  decision: "complete" | "reschedule" | "escalate";
  providerRefundId?: string;
  nextAction?: NextAction;
  delayMs?: number;
  reason?: string;
}

export async function runDecide(v: Fields): Promise<void> {
  const step = v.str("step");
  assert.ok(step === "before_send" || step === "result", `${v.where}: step ${step}`);
  const claimed = claimedOf(v.fields("job")!);
  const options = policyOf(v.fields("policy")!);
  const resultSpec = v.fields("result");
  assert.ok((resultSpec !== undefined) === (step === "result"), `${v.where}: a result exactly for step "result"`);
  const answer = resultSpec === undefined ? undefined : resultOf(resultSpec);
  const expect = expectOf(v);
  v.done();

  // What the handlers were asked, and the write-backs made.
  const called: Array<"refund" | "reconcile"> = [];
  const written: Written[] = [];
  const handler = (name: "refund" | "reconcile") => async (): Promise<ProviderResult> => {
    called.push(name);
    if (answer === undefined || answer instanceof Error) {
      throw answer ?? new Error("before_send: the spec asks only which handler runs");
    }
    return answer;
  };
  const calls = recordingCalls(written);
  const settings = settingsOf({
    ...options,
    client: undefined as never,
    workerId: "spec",
    handlers: { refund: handler("refund"), reconcile: handler("reconcile") },
    renewLeases: false,
  });
  const emit = (): void => undefined;
  const runner = new JobRunner(settings, calls, new Renewer(calls, settings, emit, emit), new Receipts(calls, undefined, settings, emit), emit);
  // The grant "arrived" a minute from now on the monotonic clock: the time
  // elapsed since is clamped to 0, so the SDK's estimate of the
  // coordinator's clock is exactly claimed_at, the spec's now.
  await runner.run(claimed, performance.now() + 60_000);
  if (answer !== undefined && !(answer instanceof Error) && written.length === 1) {
    // The public helper, given only the policy the vector sets, decides as
    // the Worker did: its own defaults are the Worker's.
    const d = decideReconcile(answer, claimed, {
      sameKeyResendSafe: options.sameKeyResendSafe === true,
      now: new Date(now),
      resendMarginMs: options.resendMarginMs,
      pendingDelayMs: options.pendingDelayMs,
      notSentDelayMs: options.unknownOutcomeDelayMs,
    });
    assert.deepEqual(writtenOf(d), written[0], "decideReconcile decides as the Worker");
  }

  if (expect === undefined) {
    return;
  }
  const call = expect.str("call");
  const decision = expect.str("decision");
  const refundId = expect.str("provider_refund_id");
  const nextAction = expect.str("next_action");
  const delayMs = expect.int("delay_ms");
  const reason = expect.str("reason");
  const includes = expect.strs("reason_includes");
  expect.done();

  assert.ok(written.length <= 1, `one write-back, got ${written.length}`);
  const w = written[0];
  if (step === "before_send") {
    assert.ok((call === undefined) !== (decision === undefined), "a before_send vector expects call or decision");
    if (call !== undefined) {
      assert.deepEqual(called, [call], "the handler called");
      return;
    }
    assert.deepEqual(called, [], "no handler called: the resend was refused before sending");
  } else {
    assert.equal(called.length, 1, "one handler called");
    // R32: a job whose cancel was requested is only reconciled, whatever its action.
    const sent = claimed.nextAction === NextAction.REFUND && !claimed.cancelRequested;
    assert.equal(called[0], sent ? "refund" : "reconcile", "the handler of the next action");
  }
  assert.ok(w !== undefined, "a write-back");
  if (decision !== undefined) {
    assert.equal(w.decision, decision, "the write-back");
  }
  if (w.decision !== "complete") {
    assert.ok((w.reason ?? "") !== "", "a write-back other than complete carries a reason");
  }
  if (refundId !== undefined) {
    assert.equal(w.providerRefundId, refundId, "provider_refund_id");
  }
  if (nextAction !== undefined) {
    assert.equal(w.nextAction, actionOf(nextAction), "next_action");
  }
  if (delayMs !== undefined) {
    assert.equal(w.delayMs, delayMs, "delay_ms");
  }
  if (reason !== undefined) {
    assert.equal(w.reason, reason, "reason");
  }
  for (const part of includes ?? []) {
    assert.ok((w.reason ?? "").includes(part), `the reason ${JSON.stringify(w.reason)} includes ${JSON.stringify(part)}`);
  }
}

// claimedOf is the vector's job, claimed at now.
function claimedOf(j: Fields) {
  const nextAction = actionOf(j.str("next_action")!);
  const attempt = j.int64("attempt")!;
  const takeover = j.bool("takeover") ?? false;
  const firstSentMs = j.int("first_sent_ms");
  const resendDeadlineMs = j.int("resend_deadline_ms");
  const cancelRequested = j.bool("cancel_requested") ?? false;
  j.done();
  return create(ClaimedJobSchema, {
    job: {
      id: 1n,
      operationKey: "op-spec",
      provider: "p-spec",
      attempt,
      firstSentAt: firstSentMs === undefined ? undefined : timestampFromMs(now + firstSentMs),
      updatedAt: timestampFromMs(now),
    },
    attempt,
    leaseToken: "spec-token",
    nextAction,
    takeover,
    cancelRequested,
    claimedAt: timestampFromMs(now),
    leaseUntil: timestampFromMs(now + 30_000),
    resendDeadline: resendDeadlineMs === undefined ? undefined : timestampFromMs(now + resendDeadlineMs),
  });
}

// policyOf is the vector's policy as Worker options; absent fields keep the
// Worker's defaults.
function policyOf(p: Fields): Partial<WorkerOptions> {
  const o: Partial<WorkerOptions> = {
    sameKeyResendSafe: p.bool("same_key_resend_safe"),
    resendMarginMs: p.int("resend_margin_ms"),
    pendingDelayMs: p.int("pending_delay_ms"),
    unknownOutcomeDelayMs: p.int("unknown_delay_ms"),
  };
  if (p.has("not_sent_delay_ms")) {
    // The Worker repeats a request not sent after unknownOutcomeDelayMs: it
    // has no option of its own for it.
    throw new Error(`${p.where}.not_sent_delay_ms: the TypeScript Worker has no such option (it uses unknownOutcomeDelayMs)`);
  }
  p.done();
  return Object.fromEntries(Object.entries(o).filter(([, x]) => x !== undefined));
}

// resultOf is what the handler returns, or the Error it throws for an
// unknown outcome.
export function resultOf(r: Fields): ProviderResult | Error {
  const kind = r.str("kind") ?? "unknown";
  const refundId = r.str("provider_refund_id");
  const retryAfterMs = r.int("retry_after_ms");
  const reason = r.str("reason");
  const error = r.str("error");
  r.done();
  switch (kind) {
    case "unknown":
      return new Error(error ?? "the handler returned no result");
    case "succeeded":
      return { kind: "succeeded", providerRefundId: refundId ?? "" };
    // A pending or failed result names no refund id in this SDK; it plays no
    // part in the decision.
    case "pending":
      return { kind: "pending", retryAfterMs };
    case "no_record":
      return { kind: "not_found" };
    case "failed":
      return { kind: "failed", reason: reason ?? "" };
    case "not_sent":
      return { kind: "not_sent", reason: reason ?? "", retryAfterMs };
    case "escalate":
      return { kind: "escalate", reason: reason ?? "" };
  }
  throw new Error(`${r.where}.kind: ${kind} is not a result this runner knows`);
}

function actionOf(name: string): NextAction {
  switch (name) {
    case "refund":
      return NextAction.REFUND;
    case "reconcile":
      return NextAction.RECONCILE;
  }
  throw new Error(`next_action ${name} is not one this runner knows`);
}

// writtenOf is the write-back a decision makes.
function writtenOf(d: WriteDecision): Written {
  switch (d.kind) {
    case "complete":
      return { decision: "complete", providerRefundId: d.providerRefundId };
    case "reschedule":
      return { decision: "reschedule", nextAction: d.nextAction, delayMs: d.delayMs, reason: d.reason };
    case "escalate":
      return { decision: "escalate", reason: d.reason };
  }
}

// recordingCalls answers every write-back as written and records it.
function recordingCalls(written: Written[]): WorkerCalls {
  const ok = { replayed: false } as never;
  return {
    async complete(req) {
      written.push({ decision: "complete", providerRefundId: req.providerRefundId });
      return ok;
    },
    async reschedule(req) {
      const d = req.when?.case === "delay" ? req.when.value : undefined;
      written.push({
        decision: "reschedule",
        nextAction: req.nextAction,
        delayMs: d === undefined ? undefined : Number(d.seconds ?? 0n) * 1000 + (d.nanos ?? 0) / 1e6,
        reason: req.reason,
      });
      return ok;
    },
    async escalate(req) {
      written.push({ decision: "escalate", reason: req.reason });
      return ok;
    },
    renewLeases: () => Promise.reject(new Error("no renewal in a decide vector")),
    reportObservation: () => Promise.reject(new Error("no receipt in a decide vector")),
  };
}
