// decideReconcile: what each provider answer means for the job (R4, R14,
// R16, R22). Pure: no coordinator needed.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";

import {
  ClaimedJobSchema,
  MaxDelayMs,
  NextAction,
  coordinatorNow,
  decideReconcile,
  sendsAgain,
  type ClaimedJob,
  type DecisionPolicy,
} from "../src/index.js";

const claimTime = new Date("2026-03-01T12:00:00Z");
const deadline = new Date("2026-03-02T10:00:00Z");

function claimed(nextAction: NextAction, resendDeadline: Date | null = deadline): ClaimedJob {
  return create(ClaimedJobSchema, {
    job: { id: 7n, operationKey: "op-7", provider: "acme", updatedAt: timestampFromDate(claimTime) },
    attempt: 3n,
    nextAction,
    takeover: true,
    resendDeadline: resendDeadline === null ? undefined : timestampFromDate(resendDeadline),
  });
}

const safeNow: DecisionPolicy = { sameKeyResendSafe: true, now: claimTime };

describe("decideReconcile", () => {
  it("completes on a refund the provider made (R14)", () => {
    assert.deepEqual(decideReconcile({ kind: "succeeded", providerRefundId: "re_1" }, claimed(NextAction.RECONCILE), safeNow), {
      kind: "complete",
      providerRefundId: "re_1",
    });
  });

  it("never completes without a provider refund id", () => {
    const d = decideReconcile({ kind: "succeeded", providerRefundId: "" }, claimed(NextAction.RECONCILE), safeNow);
    assert.equal(d.kind, "escalate");
  });

  it("reschedules a reconcile for pending: pending is not success (R4)", () => {
    const d = decideReconcile({ kind: "pending", retryAfterMs: 1500 }, claimed(NextAction.REFUND), safeNow);
    assert.deepEqual(d, { kind: "reschedule", nextAction: NextAction.RECONCILE, delayMs: 1500, reason: "provider: refund pending" });
    const byDefault = decideReconcile({ kind: "pending" }, claimed(NextAction.RECONCILE), { ...safeNow, pendingDelayMs: 42 });
    assert.equal(byDefault.kind === "reschedule" && byDefault.delayMs, 42);
    const huge = decideReconcile({ kind: "pending", retryAfterMs: 1e12 }, claimed(NextAction.RECONCILE), safeNow);
    assert.equal(huge.kind === "reschedule" && huge.delayMs, MaxDelayMs);
  });

  it("resends on no record only with the guarantee and inside the window (R14, R16, R22)", () => {
    const notFound = { kind: "not_found" } as const;
    const resend = decideReconcile(notFound, claimed(NextAction.RECONCILE), safeNow);
    assert.equal(resend.kind, "reschedule");
    assert.equal(resend.kind === "reschedule" && resend.nextAction, NextAction.REFUND);

    const noGuarantee = decideReconcile(notFound, claimed(NextAction.RECONCILE), { ...safeNow, sameKeyResendSafe: false });
    assert.equal(noGuarantee.kind, "escalate");
    assert.match(noGuarantee.kind === "escalate" ? noGuarantee.reason : "", /does not guarantee/);

    const late = decideReconcile(notFound, claimed(NextAction.RECONCILE), { ...safeNow, now: new Date(deadline.getTime() + 1) });
    assert.equal(late.kind, "escalate");
    assert.match(late.kind === "escalate" ? late.reason : "", /window has passed/);

    // The margin keeps a resend from starting right at the edge.
    const edge = new Date(deadline.getTime() - 30_000);
    assert.equal(decideReconcile(notFound, claimed(NextAction.RECONCILE), { ...safeNow, now: edge }).kind, "escalate");
    assert.equal(decideReconcile(notFound, claimed(NextAction.RECONCILE), { ...safeNow, now: edge, resendMarginMs: 10_000 }).kind,
      "reschedule");
  });

  it("treats an unset resend_deadline as nothing sent yet (R22)", () => {
    const d = decideReconcile({ kind: "not_found" }, claimed(NextAction.RECONCILE, null), { ...safeNow, sameKeyResendSafe: false });
    assert.equal(d.kind === "reschedule" && d.nextAction, NextAction.REFUND);
  });

  it("escalates a rejection and a handler's escalation, with a reason", () => {
    const failed = decideReconcile({ kind: "failed", reason: "card closed" }, claimed(NextAction.REFUND), safeNow);
    assert.deepEqual(failed, { kind: "escalate", reason: "provider rejected the refund: card closed" });
    const esc = decideReconcile({ kind: "escalate", reason: "" }, claimed(NextAction.REFUND), safeNow);
    assert.equal(esc.kind === "escalate" && esc.reason.length > 0, true);
  });

  it("repeats the same action when the request was never sent", () => {
    const refund = decideReconcile({ kind: "not_sent", reason: "rate limited", retryAfterMs: 250 }, claimed(NextAction.REFUND), safeNow);
    assert.deepEqual(refund, { kind: "reschedule", nextAction: NextAction.REFUND, delayMs: 250, reason: "request not sent: rate limited" });
    const rec = decideReconcile({ kind: "not_sent", reason: "circuit open" }, claimed(NextAction.RECONCILE), safeNow);
    assert.equal(rec.kind === "reschedule" && rec.nextAction, NextAction.RECONCILE);
  });
});

describe("coordinatorNow", () => {
  it("counts from the claim's database time, never the worker's wall clock (R12)", () => {
    assert.equal(coordinatorNow(claimed(NextAction.REFUND), 2_500)!.getTime(), claimTime.getTime() + 2_500);
    assert.equal(coordinatorNow(create(ClaimedJobSchema, {}), 1), undefined);
  });
});

describe("sendsAgain", () => {
  const at = (firstSent: Date | undefined, claimedAt: Date): ClaimedJob =>
    create(ClaimedJobSchema, {
      job: { id: 7n, firstSentAt: firstSent === undefined ? undefined : timestampFromDate(firstSent) },
      claimedAt: timestampFromDate(claimedAt),
      nextAction: NextAction.REFUND,
    });

  it("tells a same-key resend from a first send (R22)", () => {
    assert.equal(sendsAgain(at(undefined, claimTime)), false, "nothing went out yet");
    assert.equal(sendsAgain(at(claimTime, claimTime)), false, "this claim is the first send");
    assert.equal(sendsAgain(at(new Date(claimTime.getTime() - 1), claimTime)), true, "an earlier claim sent the key");
  });
});
