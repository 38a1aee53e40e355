// JSON for values holding bigints: the SDK's ids, attempts and amounts break
// a plain JSON.stringify; bigintReplacer, jsonSafe and the re-exported
// toJsonString write them exactly. Pure: no coordinator needed.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create } from "@bufbuild/protobuf";

import {
  Code,
  JobSchema,
  JobState,
  Reason,
  StaleAttemptError,
  bigintReplacer,
  jsonSafe,
  toJson,
  toJsonString,
} from "../src/index.js";

// Past 2^53, where a number would round.
const big = 2n ** 63n - 1n;

function job() {
  return create(JobSchema, {
    id: big,
    operationKey: "refund-1001",
    attempt: 7n,
    amountMinor: 1999n,
    currency: "EUR",
    state: JobState.SUCCEEDED,
  });
}

describe("JSON of bigint values", () => {
  it("JSON.stringify alone throws on a job", () => {
    assert.throws(() => JSON.stringify(job()), TypeError);
  });

  it("bigintReplacer writes each bigint as its exact decimal string", () => {
    const out = JSON.parse(JSON.stringify({ job: job(), ids: [1n, big] }, bigintReplacer));
    assert.equal(out.job.id, "9223372036854775807");
    assert.equal(BigInt(out.job.id), big);
    assert.equal(out.job.attempt, "7");
    assert.equal(out.job.amountMinor, "1999");
    assert.deepEqual(out.ids, ["1", "9223372036854775807"]);
  });

  it("jsonSafe copies deep, errors included, and leaves the value as it was", () => {
    const j = job();
    const err = new Error("outer", { cause: new Error("inner") });
    const event: Record<string, unknown> = { type: "written", jobId: big, nested: [{ attempt: 3n }], job: j, err,
      at: new Date("2030-01-01T00:00:00Z") };
    event.self = event;
    const safe = jsonSafe(event);
    const out = JSON.parse(JSON.stringify(safe));
    assert.equal(out.jobId, "9223372036854775807");
    assert.deepEqual(out.nested, [{ attempt: "3" }]);
    assert.equal(out.job.id, "9223372036854775807");
    assert.equal(out.at, "2030-01-01T00:00:00.000Z");
    assert.equal(out.self, "[Circular]");
    assert.deepEqual(out.err, { name: "Error", message: "outer", cause: { name: "Error", message: "inner" } });
    assert.equal(event.jobId, big);
    assert.equal(j.id, big);
  });

  it("jsonSafe keeps what a refusal says, bigints and all", () => {
    const stale = new StaleAttemptError("stale", Code.FailedPrecondition, Reason.StaleAttempt, {
      job_id: "5", attempt: "7", current_attempt: "8", current_state: "JOB_STATE_SUCCEEDED" });
    const out = JSON.parse(JSON.stringify(jsonSafe({ type: "stale", error: stale })));
    assert.equal(out.error.name, stale.name);
    assert.equal(out.error.reason, Reason.StaleAttempt);
    assert.equal(out.error.currentAttempt, "8");
  });

  it("toJson and toJsonString write a message as canonical proto3 JSON", () => {
    const out = JSON.parse(toJsonString(JobSchema, job()));
    assert.equal(out.id, "9223372036854775807");
    assert.equal(out.state, "JOB_STATE_SUCCEEDED");
    assert.deepEqual(toJson(JobSchema, job()), out);
  });
});
