// The example refund worker's pure parts: configuration (flags and
// REFUNDWORKER_* variables, as in the Go example worker), what provider
// answers mean (R4, R14) and its counters. The worker itself runs in
// mixed-fleet.test.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Code } from "@connectrpc/connect";

import { Logger, UsageError, newStats, parseConfig, parseDuration, reconcileResult, resultOf, track, type ProviderRefund } from "../examples/refund-worker.js";
import { CoordinatorError } from "../src/index.js";

const refund = (id: string, status: string): ProviderRefund => ({ id, status, payment_id: "pay-1", merchant_reference: "op-1" });

describe("refund-worker configuration", () => {
  it("reads Go-style durations", () => {
    assert.equal(parseDuration("2s"), 2_000);
    assert.equal(parseDuration("1500ms"), 1_500);
    assert.equal(parseDuration("1m30s"), 90_000);
    assert.equal(parseDuration("0.5s"), 500);
    assert.equal(parseDuration("0"), 0);
    for (const bad of ["", "2", "s", "2 s", "-1s", "2x"]) {
      assert.equal(parseDuration(bad), undefined, bad);
    }
  });

  it("takes flags first, then REFUNDWORKER_* variables, then defaults", () => {
    const c = parseConfig(["--lease", "2s", "-concurrency", "8", "--same-key-resends=false"], {
      REFUNDWORKER_LEASE: "9s",
      REFUNDWORKER_PROVIDER_TIMEOUT: "1500ms",
      REFUNDWORKER_WORKER_ID: "node-7",
    });
    assert.ok(c !== "help");
    assert.equal(c.leaseMs, 2_000, "the flag wins over the variable");
    assert.equal(c.providerTimeoutMs, 1_500, "the variable stands in for the flag");
    assert.equal(c.workerId, "node-7");
    assert.equal(c.concurrency, 8, "a single dash, as Go's flag package allows");
    assert.equal(c.sameKeyResends, false);
    assert.equal(c.coordinator, "127.0.0.1:50051");
    assert.equal(c.receiptSpool, "", "the SDK's default spool");
    const spool = parseConfig(["--receipt-spool", "off"], { REFUNDWORKER_RECEIPT_SPOOL: "/elsewhere" });
    assert.ok(spool !== "help" && spool.receiptSpool === "off");
    const fromEnv = parseConfig([], { REFUNDWORKER_RECEIPT_SPOOL: "/var/spool/w.jsonl" });
    assert.ok(fromEnv !== "help" && fromEnv.receiptSpool === "/var/spool/w.jsonl");
    assert.equal(parseConfig(["-h"], {}), "help");
  });

  it("renews leases unless told not to (R27), and then refuses a provider timeout that does not fit in the lease (R17)", () => {
    const c = parseConfig(["--lease", "2s", "--provider-timeout", "4s"], {});
    assert.ok(c !== "help" && !c.noLeaseRenewal && c.renewIntervalMs === 0, "renewed leases may be outlasted by a provider call");
    const every = parseConfig(["--lease", "2s", "--renew-interval", "500ms"], {});
    assert.ok(every !== "help" && every.renewIntervalMs === 500);
    assert.throws(() => parseConfig(["--lease", "2s", "--renew-interval", "2s"], {}), /--renew-interval/);
    assert.throws(() => parseConfig(["--lease", "2s", "--provider-timeout", "2s", "--no-lease-renewal"], {}), UsageError);
    assert.throws(() => parseConfig(["--lease", "2s", "--provider-timeout", "2s"], { REFUNDWORKER_NO_LEASE_RENEWAL: "true" }), UsageError);
    const off = parseConfig(["--lease", "2s", "--provider-timeout", "1s", "--no-lease-renewal"], {});
    assert.ok(off !== "help" && off.noLeaseRenewal);
  });

  it("takes its jobs on the worker stream unless --no-stream; --claim-wait stays for Claim calls", () => {
    const c = parseConfig(["--claim-wait", "1s"], {});
    assert.ok(c !== "help" && !c.noStream && c.claimWaitMs === 1_000, "the stream by default, --claim-wait still accepted");
    const off = parseConfig(["--no-stream"], {});
    assert.ok(off !== "help" && off.noStream);
    const fromEnv = parseConfig([], { REFUNDWORKER_NO_STREAM: "true" });
    assert.ok(fromEnv !== "help" && fromEnv.noStream);
    const on = parseConfig(["--no-stream=false"], { REFUNDWORKER_NO_STREAM: "true" });
    assert.ok(on !== "help" && !on.noStream, "the flag wins over the variable");
  });

  it("refuses bad values and a plaintext token off loopback", () => {
    assert.throws(() => parseConfig([], { REFUNDWORKER_CONCURRENCY: "0" }), /REFUNDWORKER_CONCURRENCY|concurrency/);
    assert.throws(() => parseConfig(["--lease", "soon"], {}), /--lease/);
    assert.throws(() => parseConfig(["--coordinator", "10.0.0.1:50051", "--token-file", "/t"], {}), /TLS/);
    assert.doesNotThrow(() => parseConfig(["--coordinator", "127.0.0.1:50051", "--token-file", "/t"], {}));
    assert.throws(() => parseConfig(["--bogus"], {}), UsageError);
  });
});

describe("refund-worker answers", () => {
  it("pending is not success (R4)", () => {
    assert.deepEqual(resultOf(refund("re_1", "succeeded")), { kind: "succeeded", providerRefundId: "re_1" });
    assert.equal(resultOf(refund("re_1", "pending")).kind, "pending");
    assert.equal(resultOf(refund("re_1", "failed")).kind, "failed");
    assert.throws(() => resultOf(refund("re_1", "reversed")), /unknown status/);
  });

  it("no record is not proof, two live refunds need a person (R14)", () => {
    assert.equal(reconcileResult([]).kind, "not_found");
    assert.deepEqual(reconcileResult([refund("re_1", "failed"), refund("re_2", "succeeded")]), { kind: "succeeded", providerRefundId: "re_2" });
    assert.equal(reconcileResult([refund("re_1", "failed")]).kind, "failed");
    assert.equal(reconcileResult([refund("re_1", "succeeded"), refund("re_2", "pending")]).kind, "escalate");
  });
});

describe("refund-worker counters", () => {
  it("counts a worker stream that failed as a claim failure, as the Go and Python workers do (R7), and every stream end in stream_ends", () => {
    const stats = newStats();
    const quiet = new Logger("error", {});
    const lost = new CoordinatorError("PING timed out", Code.Unavailable, undefined, {});
    track(stats, quiet, { type: "claim_failed", error: lost });
    assert.deepEqual([stats.claim_failures, stats.stream_ends], [1, 0], "a failed Claim call");
    track(stats, quiet, { type: "stream_ended", error: lost, retryInMs: 100 });
    assert.deepEqual([stats.claim_failures, stats.stream_ends], [2, 1], "a stream that failed is a failed claim too");
    track(stats, quiet, { type: "stream_ended", error: undefined, retryInMs: 100 });
    assert.deepEqual([stats.claim_failures, stats.stream_ends], [2, 2], "a stream the coordinator ended cleanly is no failure");
  });
});
