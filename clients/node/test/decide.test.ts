// The decision helpers beside the decision table: the coordinator's clock
// (R12) and what counts as a same-key resend (R22). The table itself —
// decideReconcile, through the Worker and on its own — is the shared spec's
// decide.json (spec.test). Pure: no coordinator needed.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";

import { ClaimedJobSchema, NextAction, coordinatorNow, sendsAgain, type ClaimedJob } from "../src/index.js";

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
