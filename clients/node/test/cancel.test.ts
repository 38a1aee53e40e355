// R32 through the Worker: a job whose cancel was requested is never sent,
// whatever the provider answers, inside the resend window or past it, with
// a policy that trusts same-key resends, and even under a grant that
// (wrongly) says REFUND. The real Worker (noStream: Claim calls) against the
// scripted coordinator (a real gRPC server on a loopback port) works a grant
// of every such job at once; its handlers record every call, and the refund
// handler is never called. No coordinator or database needed.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create, type JsonObject } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";

import {
  ClaimResponseSchema,
  ClaimedJobSchema,
  CoordinatorClient,
  ErrorReason,
  NextAction,
  Reason,
  Worker,
  type ClaimResponse,
  type ClaimedJob,
  type ProviderResult,
  type WorkerJob,
} from "../src/index.js";
import { ScriptedCoordinator } from "./spec-coordinator.js";

type Answer = () => ProviderResult;

/** What the provider answers, and the write-back it must become. */
const answers: Array<{ name: string; answer: Answer; method: string; nextAction?: string; reason: string }> = [
  { name: "refunded", answer: () => ({ kind: "succeeded", providerRefundId: "re_1" }), method: "Complete", reason: "" },
  { name: "pending", answer: () => ({ kind: "pending" }), method: "Reschedule", nextAction: "NEXT_ACTION_RECONCILE", reason: "pending" },
  { name: "no record", answer: () => ({ kind: "not_found" }), method: "Escalate", reason: "cancel requested" },
  { name: "rejected", answer: () => ({ kind: "failed", reason: "declined" }), method: "Escalate", reason: "cancel requested" },
  {
    name: "handler throws",
    answer: () => {
      throw new Error("connection cut");
    },
    method: "Reschedule",
    nextAction: "NEXT_ACTION_RECONCILE",
    reason: "outcome unknown",
  },
  {
    name: "no valid result",
    answer: () => undefined as unknown as ProviderResult,
    method: "Reschedule",
    nextAction: "NEXT_ACTION_RECONCILE",
    reason: "outcome unknown",
  },
  {
    name: "not sent",
    answer: () => ({ kind: "not_sent", reason: "rate limited" }),
    method: "Reschedule",
    nextAction: "NEXT_ACTION_RECONCILE",
    reason: "rate limited",
  },
  { name: "escalate", answer: () => ({ kind: "escalate", reason: "odd" }), method: "Escalate", reason: "odd" },
];
const windows = [
  { name: "inside the window", ms: 3_600_000 },
  { name: "past the window", ms: -1_000 },
];
const actions = [
  { name: "reconcile", action: NextAction.RECONCILE },
  { name: "refund", action: NextAction.REFUND },
];

/**
 * grant is a grant of a job first sent a minute before its claim, whose
 * resend window ends windowMs after the claim, telling of the cancel request
 * as `how` says: on the grant, on the job (cancelRequestedAt), or not at all.
 */
function grant(id: bigint, action: NextAction, windowMs: number, how: "grant" | "job" | "none"): ClaimedJob {
  const now = Date.now();
  return create(ClaimedJobSchema, {
    job: {
      id,
      operationKey: `op-${id}`,
      provider: "acme",
      attempt: 3n,
      nextAction: action,
      firstSentAt: timestampFromMs(now - 60_000),
      cancelRequestedAt: how === "job" ? timestampFromMs(now - 1_000) : undefined,
    },
    attempt: 3n,
    leaseToken: `tok-${id}`,
    nextAction: action,
    takeover: action === NextAction.RECONCILE,
    claimedAt: timestampFromMs(now),
    leaseUntil: timestampFromMs(now + 30_000),
    resendDeadline: timestampFromMs(now + windowMs),
    cancelRequested: how === "grant",
  });
}

interface Call {
  handler: "refund" | "reconcile";
  jobId: bigint;
  cancelRequested: boolean;
}

/**
 * work runs a Worker that trusts same-key resends on grants, all granted by
 * its first Claim, until each job has its write-back; it returns the
 * handler calls and the write-backs by job id, as protojson.
 */
async function work(grants: ClaimedJob[], answerOf: (id: bigint) => Answer): Promise<{ calls: Call[]; writes: Map<string, { method: string; json: JsonObject }> }> {
  const coord = await ScriptedCoordinator.start();
  const held: Array<(r: ClaimResponse) => void> = [];
  let granted = false;
  coord.unary = (call) => {
    if (call.method !== "Claim") {
      return {}; // an accepted write-back
    }
    if (!granted) {
      granted = true;
      return create(ClaimResponseSchema, { jobs: grants });
    }
    return new Promise<ClaimResponse>((answer) => held.push(answer));
  };
  const calls: Call[] = [];
  const handler = (name: "refund" | "reconcile") => async (job: WorkerJob): Promise<ProviderResult> => {
    calls.push({ handler: name, jobId: job.jobId, cancelRequested: job.cancelRequested });
    return answerOf(job.jobId)();
  };
  const client = new CoordinatorClient({ address: coord.address });
  const w = new Worker({
    client,
    workerId: "w-cancel",
    handlers: { refund: handler("refund"), reconcile: handler("reconcile") },
    concurrency: grants.length,
    noStream: true,
    renewLeases: false,
    receiptSpool: "off",
    sameKeyResendSafe: true,
  });
  const writes = new Map<string, { method: string; json: JsonObject }>();
  try {
    w.start();
    const deadline = Date.now() + 20_000;
    while (writes.size < grants.length && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
      for (const c of coord.unaryCalls) {
        if (["Complete", "Reschedule", "Escalate"].includes(c.method)) {
          const json = c.json as JsonObject;
          const id = String(json["job_id"]);
          const before = writes.get(id);
          assert.ok(before === undefined || before.json === json, `job ${id} written twice`);
          writes.set(id, { method: c.method, json });
        }
      }
    }
  } finally {
    // Stop the Worker first (it cancels its parked Claim), then answer every
    // Claim still held, so that no answer is left to a closed connection.
    await Promise.race([w.stop(), new Promise((r) => setTimeout(r, 5_000).unref())]);
    for (const answer of held) {
      answer(create(ClaimResponseSchema));
    }
    await new Promise((r) => setTimeout(r, 50));
    client.close();
    await coord.close();
  }
  assert.equal(writes.size, grants.length, `write-backs of jobs ${[...writes.keys()].join(", ")} only`);
  assert.deepEqual(coord.unaryCalls.filter((c) => c.method === "ReportObservation"), [], "an accepted write-back files no receipt");
  return { calls, writes };
}

describe("a job whose cancel was requested is never sent (R32)", () => {
  for (const how of ["grant", "job"] as const) {
    it(`whatever the provider answers, inside the window or past it, with the cancel on the ${how}`, { timeout: 30_000 }, async () => {
      const cases = new Map<bigint, { name: string; answer: Answer; method: string; nextAction?: string; reason: string }>();
      const grants: ClaimedJob[] = [];
      for (const a of answers) {
        for (const win of windows) {
          for (const act of actions) {
            const id = BigInt(grants.length + 1);
            grants.push(grant(id, act.action, win.ms, how));
            cases.set(id, { ...a, name: `${a.name}, ${win.name}, grant says ${act.name}` });
          }
        }
      }
      const { calls, writes } = await work(grants, (id) => cases.get(id)!.answer);

      assert.deepEqual(calls.filter((c) => c.handler === "refund"), [], "the refund handler was called for a cancel-requested job");
      assert.deepEqual(calls.map((c) => c.jobId).sort((a, b) => Number(a - b)), [...cases.keys()], "one reconcile per job");
      assert.ok(calls.every((c) => c.cancelRequested), "a handler did not see cancelRequested");
      for (const [id, c] of cases) {
        const w = writes.get(id.toString())!;
        assert.equal(w.method, c.method, `${c.name}: ${JSON.stringify(w.json)}`);
        assert.equal(w.json["attempt"], "3", `${c.name}: written without its grant`);
        assert.equal(w.json["lease_token"], `tok-${id}`, `${c.name}: written without its grant`);
        if (c.method === "Complete") {
          assert.equal(w.json["provider_refund_id"], "re_1", c.name);
          continue;
        }
        assert.ok(String(w.json["reason"]).includes(c.reason), `${c.name}: reason ${JSON.stringify(w.json["reason"])} lacks ${c.reason}`);
        if (c.method === "Reschedule") {
          assert.equal(w.json["next_action"], c.nextAction, `${c.name}: rescheduled to ${String(w.json["next_action"])}`);
        }
      }
    });
  }

  it("while the same grants without a cancel request send (R14, R22)", { timeout: 30_000 }, async () => {
    // The premise of the tests above: with no cancel request a refund grant
    // calls the refund handler, and no record inside the window reschedules
    // a same-key resend.
    const answerOf = (id: bigint): Answer => id === 1n
      ? () => ({ kind: "succeeded", providerRefundId: "re_1" })
      : () => ({ kind: "not_found" });
    const { calls, writes } = await work([grant(1n, NextAction.REFUND, 3_600_000, "none"), grant(2n, NextAction.RECONCILE, 3_600_000, "none")], answerOf);
    assert.deepEqual(
      calls.map((c) => [c.handler, c.jobId, c.cancelRequested]).sort((a, b) => Number((a[1] as bigint) - (b[1] as bigint))),
      [["refund", 1n, false], ["reconcile", 2n, false]],
    );
    assert.equal(writes.get("1")!.method, "Complete");
    assert.equal(writes.get("2")!.method, "Reschedule");
    assert.equal(writes.get("2")!.json["next_action"], "NEXT_ACTION_REFUND");
  });
});

describe("error reasons (R24)", () => {
  it("name every reason of the proto's ErrorReason, the cancel's three included", () => {
    const names = new Set<string>(Object.values(Reason));
    const missing = Object.values(ErrorReason)
      .filter((v): v is ErrorReason => typeof v === "number" && v !== ErrorReason.UNSPECIFIED)
      .map((v) => ErrorReason[v])
      .filter((n) => !names.has(n));
    assert.deepEqual(missing, [], "reasons without a Reason name");
    for (const r of [Reason.CancelRequested, Reason.JobNotCancellable, Reason.NotOnAttentionList]) {
      assert.ok(names.has(r));
    }
  });
});
