// CoordinatorClient against a real coordinator on real MariaDB: the happy
// path, replays, typed errors and int64 exactness.

import assert from "node:assert/strict";
import { after, describe, it } from "node:test";

import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import {
  CoordinatorError,
  InvalidArgumentError,
  JobNotInReviewError,
  JobNotRunningError,
  JobState,
  NextAction,
  NotFoundError,
  ObservationOutcome,
  OperationKeyConflictError,
  MaxRenewBatch,
  Reason,
  ReviewResolution,
  StaleAttemptError,
  grantOf,
  isRetryableWrite,
  toCoordinatorError,
  type CoordinatorClient,
  type Job,
  type LeaseRenewal,
  type Renewal,
  type RenewLeasesResponse,
} from "../src/index.js";
import { refund, startCoordinator, type Coordinator } from "./harness.js";


// Top-level await: a missing MySQL fails the whole file loudly, never skips it.
const coord: Coordinator = await startCoordinator();
const client: CoordinatorClient = coord.client();
after(async () => {
  await coord.stop();
});

async function claimOne(worker: string, job: Job, c: CoordinatorClient = client) {
  const resp = await c.claim({ workerId: worker, maxJobs: 1, provider: job.provider });
  assert.equal(resp.jobs.length, 1, `${worker} claimed ${resp.jobs.length} jobs`);
  assert.equal(resp.jobs[0]!.job!.id, job.id);
  return resp.jobs[0]!;
}

describe("CoordinatorClient", () => {
  it("enqueues, claims and completes a refund (R1, R5, R9)", async () => {
    const req = refund();
    const enq = await client.enqueueRefund(req);
    assert.equal(enq.created, true);
    const job = enq.job!;
    assert.equal(typeof job.id, "bigint");
    assert.equal(job.state, JobState.READY);
    assert.equal(job.attempt, 0n);

    const claimed = await claimOne("node-a", job);
    assert.equal(typeof claimed.attempt, "bigint");
    assert.equal(claimed.attempt, 1n);
    assert.equal(claimed.nextAction, NextAction.REFUND);
    assert.equal(claimed.takeover, false);
    assert.equal(claimed.job!.operationKey, req.operationKey);
    // R22: the coordinator keeps the resend window, counted from the first send.
    assert.ok(claimed.resendDeadline && claimed.job!.firstSentAt);
    assert.equal(
      timestampDate(claimed.resendDeadline).getTime() - timestampDate(claimed.job!.firstSentAt).getTime(),
      24 * 3600 * 1000,
    );

    const done = await client.complete({ jobId: job.id, attempt: claimed.attempt, leaseToken: claimed.leaseToken, providerRefundId: "re_1" });
    assert.equal(done.replayed, false);
    assert.equal(done.job!.state, JobState.SUCCEEDED);
    assert.equal(done.job!.providerRefundId, "re_1");

    const got = await client.getJob({ job: { case: "operationKey", value: req.operationKey! } });
    assert.deepEqual(got.events.map((e) => [e.kind, e.attempt]), [["enqueued", 0n], ["claimed", 1n], ["completed", 1n]]);
  });

  it("answers a repeated write-back with replayed: true (R21, T4)", async () => {
    const job = (await client.enqueueRefund(refund())).job!;
    const claimed = await claimOne("node-a", job);
    const req = { jobId: job.id, attempt: claimed.attempt, leaseToken: claimed.leaseToken, providerRefundId: "re_replay" };
    const first = await client.complete(req);
    const again = await client.complete(req);
    assert.equal(first.replayed, false);
    assert.equal(again.replayed, true);
    assert.equal(again.job!.state, JobState.SUCCEEDED);

    // The same attempt, another outcome: not a replay.
    await assert.rejects(client.escalate({ jobId: job.id, attempt: claimed.attempt, leaseToken: claimed.leaseToken, reason: "second thoughts" }), (err) => {
      assert.ok(err instanceof JobNotRunningError, String(err));
      assert.equal(err.code, Code.FailedPrecondition);
      assert.equal(err.currentState, JobState.SUCCEEDED);
      assert.equal(err.currentAttempt, claimed.attempt);
      return true;
    });
    const got = await client.getJob({ job: { case: "jobId", value: job.id } });
    assert.equal(got.events.filter((e) => e.kind === "completed").length, 1);
  });

  it("resolves a manual review, fenced by the attempt the operator saw", async () => {
    const job = (await client.enqueueRefund(refund())).job!;
    const claimed = await claimOne("node-a", job);
    const resolve = {
      jobId: job.id,
      attempt: claimed.attempt,
      resolution: ReviewResolution.REFUNDED,
      providerRefundId: "re_ops",
      note: "seen in the provider dashboard",
    };
    await assert.rejects(client.resolveReview(resolve), (err) => err instanceof JobNotInReviewError);
    await client.escalate({ jobId: job.id, attempt: claimed.attempt, leaseToken: claimed.leaseToken, reason: "no record" });
    const done = await client.resolveReview(resolve);
    assert.equal(done.job!.state, JobState.SUCCEEDED);
    assert.equal(done.job!.providerRefundId, "re_ops");
    assert.equal((await client.resolveReview(resolve)).replayed, true);
    await assert.rejects(
      client.resolveReview({ ...resolve, resolution: ReviewResolution.RECONCILE, providerRefundId: "" }),
      (err) => err instanceof JobNotInReviewError,
    );
  });

  it("repeats a write-back whose reply was lost and gets replayed (R21, T4)", async () => {
    // The reply of the first Complete is lost after the coordinator committed it.
    let drop = true;
    const lossy = coord.client({
      interceptors: [
        (next) => async (req) => {
          const res = await next(req);
          if (req.method.name === "Complete" && drop) {
            drop = false;
            throw new ConnectError("test: reply lost after commit", Code.Unavailable);
          }
          return res;
        },
      ],
    });
    const job = (await lossy.enqueueRefund(refund())).job!;
    const claimed = await claimOne("node-a", job, lossy);
    const req = { jobId: job.id, attempt: claimed.attempt, leaseToken: claimed.leaseToken, providerRefundId: "re_lost" };
    const lost = await lossy.complete(req).then(() => undefined, (e: unknown) => e);
    assert.ok(lost instanceof CoordinatorError);
    assert.equal(lost.code, Code.Unavailable);
    assert.equal(isRetryableWrite(lost), true);
    const again = await lossy.complete(req);
    assert.equal(again.replayed, true);
    assert.equal(again.job!.providerRefundId, "re_lost");
    // A stream reset by a connection that died during a pause is repeated too.
    assert.equal(isRetryableWrite(toCoordinatorError(new ConnectError("stream closed: CANCEL", Code.Canceled))), true);
  });

  it("rejects bad input with InvalidArgumentError naming the field", async () => {
    const job = (await client.enqueueRefund(refund())).job!;
    const claimed = await claimOne("node-a", job);
    const cases: Array<[string, () => Promise<unknown>]> = [
      ["operation_key", () => client.enqueueRefund(refund({ operationKey: "" }))],
      ["amount_minor", () => client.enqueueRefund(refund({ amountMinor: 0n }))],
      ["currency", () => client.enqueueRefund(refund({ currency: "usd" }))],
      ["max_jobs", () => client.claim({ workerId: "w", maxJobs: 0 })],
      ["max_jobs", () => client.claim({ workerId: "w", maxJobs: 101 })],
      ["lease_duration", () => client.claim({ workerId: "w", maxJobs: 1, leaseDuration: { seconds: 0n, nanos: 500_000_000 } })],
      ["worker_id", () => client.claim({ maxJobs: 1 })],
      ["attempt", () => client.complete({ jobId: job.id, attempt: 0n, leaseToken: claimed.leaseToken, providerRefundId: "re" })],
      ["provider_refund_id", () => client.complete({ jobId: job.id, attempt: claimed.attempt, leaseToken: claimed.leaseToken })],
      ["reason", () => client.escalate({ jobId: job.id, attempt: claimed.attempt, leaseToken: claimed.leaseToken })],
      ["outcome", () => client.reportObservation({ job: { case: "jobId", value: job.id }, source: "x" })],
    ];
    for (const [field, call] of cases) {
      await assert.rejects(call(), (err) => {
        assert.ok(err instanceof InvalidArgumentError, `${field}: ${String(err)}`);
        assert.equal(err.code, Code.InvalidArgument);
        assert.equal(err.reason, "INVALID_ARGUMENT");
        assert.ok(err.fields.includes(field), `${field}: violations ${JSON.stringify(err.fieldViolations)}`);
        assert.ok(err.fieldViolations.every((v) => v.description !== ""));
        return true;
      });
    }
  });

  it("renews a held grant and answers every other grant's refusal by its reason, never its message (R27, R24)", async () => {
    // held: claimed, its lease already run out with nobody taking over (R8);
    // takenOver: claimed by A, taken over by B; done: completed; plus a
    // grant with the right attempt and another token (R25), and a missing job.
    const held = await claimOne("node-a", (await client.enqueueRefund(refund())).job!);
    await coord.expireLease(held.job!.id);
    const takenJob = (await client.enqueueRefund(refund())).job!;
    const a = await claimOne("node-a", takenJob);
    await coord.expireLease(takenJob.id);
    const b = await claimOne("node-b", takenJob);
    const done = await claimOne("node-a", (await client.enqueueRefund(refund())).job!);
    await client.complete({ ...grantOf(done), providerRefundId: "re_done" });
    const forged = await claimOne("node-a", (await client.enqueueRefund(refund())).job!);
    // R28: a receipt of success filed during held's grant.
    await client.reportObservation({
      job: { case: "jobId", value: held.job!.id }, source: "webhook", outcome: ObservationOutcome.SUCCEEDED, providerRefundId: "re_hook",
    });

    // Every refusal's message says something else: decoding goes by reason.
    let answered: LeaseRenewal[] = [];
    const misleading = coord.client({
      interceptors: [(next) => async (req) => {
        const res = await next(req);
        if (req.method.name === "RenewLeases" && !res.stream) {
          answered = (res.message as unknown as RenewLeasesResponse).renewals;
          for (const r of answered) {
            r.message = "NOT_FOUND: job not found (a message to mislead)";
          }
        }
        return res;
      }],
    });
    const renewals = await misleading.renewLeases([
      grantOf(held),
      grantOf(a),
      grantOf(done),
      { ...grantOf(forged), leaseToken: b.leaseToken },
      { jobId: 987_654_321n, attempt: 1n, leaseToken: held.leaseToken },
    ], { leaseMs: 120_000 });
    assert.equal(answered.length, 5);
    assert.deepEqual(renewals.map((r) => [r.kind, r.jobId, r.attempt]), [
      ["renewed", held.job!.id, held.attempt],
      ["refused", takenJob.id, a.attempt],
      ["refused", done.job!.id, done.attempt],
      ["refused", forged.job!.id, forged.attempt],
      ["refused", 987_654_321n, 1n],
    ], "one answer per grant, in order");
    const [renewed, stale, notRunning, otherToken, missing] = renewals as [Renewal, Renewal, Renewal, Renewal, Renewal];

    assert.ok(renewed.kind === "renewed");
    const got = await client.getJob({ job: { case: "jobId", value: held.job!.id } });
    assert.deepEqual(renewed.leaseUntil, timestampDate(got.job!.leaseUntil!), "the lease the database holds now");
    assert.ok(renewed.leaseUntil.getTime() - timestampDate(got.now!).getTime() > 110_000, "120 s from the database's now (R12)");
    assert.equal(got.job!.attempt, held.attempt, "a renewal never bumps the attempt");
    assert.deepEqual(got.events.map((e) => e.kind), ["enqueued", "claimed"], "nor writes the history");
    assert.ok(renewed.grantExpiresAt !== undefined && renewed.grantExpiresAt >= renewed.leaseUntil);
    assert.ok(renewed.receiptFiledAt !== undefined, "the webhook's receipt during the grant (R28)");
    // The Worker's deadline is a third of a lease: a fractional one must
    // still reach the server (grpc-timeout takes whole units).
    const fractional = await client.renewLeases([grantOf(held)], { leaseMs: 120_000, timeoutMs: 4000 / 3 });
    assert.equal(fractional[0]!.kind, "renewed", "a renewal with a deadline of 1333.33 ms");

    assert.ok(stale.kind === "refused");
    assert.equal(stale.reason, Reason.StaleAttempt);
    assert.ok(stale.error instanceof StaleAttemptError, String(stale.error));
    assert.equal(stale.error.code, Code.FailedPrecondition);
    assert.equal(stale.error.jobId, takenJob.id);
    assert.equal(stale.error.attempt, a.attempt);
    assert.equal(stale.error.currentAttempt, b.attempt);
    assert.equal(stale.error.currentState, JobState.RUNNING);
    assert.equal(stale.grantExpiresAt, undefined, "not running under this grant");
    const bNow = (await client.getJob({ job: { case: "jobId", value: takenJob.id } })).job!;
    assert.deepEqual(timestampDate(bNow.leaseUntil!), timestampDate(b.leaseUntil!), "the new holder's lease is untouched");

    assert.ok(notRunning.kind === "refused" && notRunning.reason === Reason.JobNotRunning);
    assert.ok(notRunning.error instanceof JobNotRunningError);
    assert.equal(notRunning.error.currentState, JobState.SUCCEEDED);

    assert.ok(otherToken.kind === "refused" && otherToken.reason === Reason.StaleAttempt, "the right attempt is not enough (R25)");
    assert.ok(otherToken.error instanceof StaleAttemptError);
    assert.equal(otherToken.error.currentAttempt, forged.attempt);

    assert.ok(missing.kind === "refused" && missing.reason === Reason.NotFound);
    assert.ok(missing.error instanceof NotFoundError);
    assert.equal(missing.error.code, Code.NotFound);

    for (const r of renewals) {
      assert.ok(r.kind === "renewed" || !isRetryableWrite(r.error), "a refusal is final");
      const text = JSON.stringify(r, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v));
      assert.ok(![held, a, b, done, forged].some((c) => text.includes(c.leaseToken)), "no lease token in an answer");
    }
  });

  it("rejects a bad renewal as a whole with InvalidArgumentError naming the field (R27)", async () => {
    const claimed = await claimOne("node-a", (await client.enqueueRefund(refund())).job!);
    const g = grantOf(claimed);
    const cases: Array<[string, () => Promise<unknown>]> = [
      ["grants", () => client.renewLeases([])],
      ["grants", () => client.renewLeases(Array.from({ length: MaxRenewBatch + 1 }, (_, i) => ({ ...g, jobId: BigInt(i + 1) })))],
      ["grants[1].job_id", () => client.renewLeases([g, g])],
      ["grants[0].attempt", () => client.renewLeases([{ ...g, attempt: 0n }])],
      ["grants[0].job_id", () => client.renewLeases([{ ...g, jobId: 0n }])],
      ["lease_duration", () => client.renewLeases([g], { leaseMs: 500 })],
      ["lease_duration", () => client.renewLeases([g], { leaseMs: 16 * 60_000 })],
    ];
    for (const [field, call] of cases) {
      await assert.rejects(call(), (err) => {
        assert.ok(err instanceof InvalidArgumentError, `${field}: ${String(err)}`);
        assert.equal(err.code, Code.InvalidArgument);
        assert.equal(err.reason, Reason.InvalidArgument);
        assert.ok(err.fields.includes(field), `${field}: violations ${JSON.stringify(err.fieldViolations)}`);
        return true;
      });
    }
    // Nothing was renewed, and the grant itself is fine.
    const [r] = await client.renewLeases([g], { leaseMs: 60_000 });
    assert.equal(r!.kind, "renewed");
  });

  it("repeats nothing itself: an unreachable coordinator's renewal is UNAVAILABLE, safe to repeat (R27, R21)", async () => {
    const claimed = await claimOne("node-a", (await client.enqueueRefund(refund())).job!);
    let cut = true;
    const lossy = coord.client({
      interceptors: [(next) => async (req) => {
        const res = await next(req); // renewed at the coordinator…
        if (req.method.name === "RenewLeases" && cut) {
          cut = false; // …and the reply is lost
          throw new ConnectError("test: reply lost", Code.Unavailable);
        }
        return res;
      }],
    });
    const lost = await lossy.renewLeases([grantOf(claimed)]).then(() => undefined, (e: unknown) => e);
    assert.ok(lost instanceof CoordinatorError && lost.code === Code.Unavailable);
    assert.equal(isRetryableWrite(lost), true);
    const [again] = await lossy.renewLeases([grantOf(claimed)]);
    assert.equal(again!.kind, "renewed", "the same renewal again is fine: it is idempotent");
  });

  it("returns the existing job for the same refund and OperationKeyConflictError for different values (R1)", async () => {
    const req = refund();
    const first = await client.enqueueRefund(req);
    const again = await client.enqueueRefund(req);
    assert.equal(again.created, false);
    assert.equal(again.job!.id, first.job!.id);
    await assert.rejects(client.enqueueRefund({ ...req, amountMinor: 4201n }), (err) => {
      assert.ok(err instanceof OperationKeyConflictError, String(err));
      assert.equal(err.code, Code.AlreadyExists);
      assert.equal(err.operationKey, req.operationKey);
      assert.equal(err.jobId, first.job!.id);
      return true;
    });
  });

  it("reports unknown jobs as NotFoundError", async () => {
    await assert.rejects(client.getJob({ job: { case: "jobId", value: 987_654_321n } }), NotFoundError);
    await assert.rejects(
      client.reportObservation({
        job: { case: "operationKey", value: "no-such-key" },
        source: "webhook",
        outcome: ObservationOutcome.PENDING,
      }),
      (err) => err instanceof NotFoundError && err.code === Code.NotFound,
    );
  });

  it("keeps ids and attempts above 2^53 exact (int64 as bigint)", async () => {
    // Test data only: push the id and the attempt past Number.MAX_SAFE_INTEGER,
    // where a JS number would silently round 2^53+1 to 2^53.
    const big = 2n ** 53n + 1n;
    await coord.sql(`ALTER TABLE refund_jobs AUTO_INCREMENT = ${big}`);
    const job = (await client.enqueueRefund(refund())).job!;
    assert.equal(typeof job.id, "bigint");
    assert.ok(job.id >= big, `id ${job.id}`);
    await coord.sql(`UPDATE refund_jobs SET attempt = ${big - 1n} WHERE id = ${job.id}`);

    const a = await claimOne("node-a", job);
    assert.equal(a.attempt, big);
    assert.notEqual(a.attempt.toString(), String(Number(a.attempt)), "the value is not representable as a number");
    await coord.expireLease(job.id);
    const b = await claimOne("node-b", job);
    assert.equal(b.attempt, big + 1n);
    await client.complete({ jobId: job.id, attempt: b.attempt, leaseToken: b.leaseToken, providerRefundId: "re_big" });

    await assert.rejects(client.complete({ jobId: job.id, attempt: a.attempt, leaseToken: a.leaseToken, providerRefundId: "re_a" }), (err) => {
      assert.ok(err instanceof StaleAttemptError, String(err));
      assert.equal(err.jobId, job.id);
      assert.equal(err.attempt, big);
      assert.equal(err.currentAttempt, big + 1n);
      return true;
    });
    const got = await client.getJob({ job: { case: "jobId", value: job.id } });
    assert.equal(got.job!.id, job.id);
    assert.equal(got.job!.attempt, big + 1n);
    assert.deepEqual(got.events.slice(-3).map((e) => e.attempt), [big, big + 1n, big + 1n]);
  });
});
