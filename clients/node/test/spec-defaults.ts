// defaults.json: each vector names one default; the runner reads this SDK's
// real value for it — a Worker's settings with nothing set, the client's,
// the constants the Worker runs by — and compares. null: this SDK has no
// such setting.

import assert from "node:assert/strict";

import {
  CoordinatorClient,
  DEFAULT_KEEPALIVE,
  MaxDelayMs,
  MaxReceiptSpoolBytes,
  MaxRenewBatch,
  MaxSpooledReceipts,
  ReceiptRefileIntervalMs,
} from "../src/index.js";
import { settingsOf, writeRetryDelayMs, type WorkerOptions } from "../src/options.js";
import { FinalRefileTimeoutMs, RefileMinGapMs } from "../src/receipts.js";
import { RenewDivisor, RenewJitter, RenewRetryDivisor } from "../src/renewer.js";
import { MAX_ACK_GRANTS, STREAM_HEARTBEAT_MS, startRequest } from "../src/session.js";
import { MaxStreamBackoffMs } from "../src/worker.js";
import { expectOf, type Fields } from "./spec-read.js";

type Value = number | boolean | null;

// Options with nothing set but what a Worker requires.
const bare: WorkerOptions = {
  client: undefined as never,
  workerId: "spec",
  handlers: { refund: () => Promise.reject(new Error("unused")), reconcile: () => Promise.reject(new Error("unused")) },
};

function defaults(): Record<string, () => Value> {
  const s = settingsOf(bare);
  const start = startRequest({ workerId: "spec", provider: "", leaseMs: undefined }, 1);
  return {
    "worker.concurrency": () => s.concurrency,
    "worker.provider_timeout_ms": () => s.providerCallTimeoutMs,
    "worker.late_answer_grace_ms": () => s.lateAnswerGraceMs,
    "worker.poll_interval_ms": () => s.idlePollMs,
    "worker.claim_wait_ms": () => s.claimWaitMs,
    "worker.claim_backoff_ms": () => s.claimErrorBackoffMs,
    "worker.max_claim_backoff_ms": () => MaxStreamBackoffMs,
    // stop() drains without a bound.
    "worker.drain_timeout_ms": () => null,
    "worker.stream": () => bare.noStream !== true,
    "worker.renew_leases": () => s.renewLeases,
    // A receipt is repeated writeRetries times, then spooled: no time bound.
    "worker.observe_retry_for_ms": () => null,
    "renew.interval_divisor": () => RenewDivisor,
    "renew.jitter": () => RenewJitter,
    "renew.retry_divisor": () => RenewRetryDivisor,
    "renew.max_batch": () => MaxRenewBatch,
    "stream.heartbeat_ms": () => STREAM_HEARTBEAT_MS,
    "stream.max_ack_grants": () => MAX_ACK_GRANTS,
    "stream.acknowledges": () => (start.kind.case === "start" ? start.kind.value.acknowledges : null),
    "client.call_timeout_ms": () => {
      const c = new CoordinatorClient({ address: "127.0.0.1:1" });
      c.close();
      return c.defaultTimeoutMs;
    },
    // writeRetries counts the repeats: one try more in all.
    "client.retry_attempts": () => s.writeRetries + 1,
    "client.retry_backoff_ms": () => s.writeRetryDelayMs,
    "client.retry_max_backoff_ms": () => writeRetryDelayMs(s, 64),
    "keepalive.time_ms": () => DEFAULT_KEEPALIVE.pingIntervalMs,
    "keepalive.timeout_ms": () => DEFAULT_KEEPALIVE.pingTimeoutMs,
    "keepalive.without_calls": () => DEFAULT_KEEPALIVE.pingIdleConnection,
    "spool.max_receipts": () => MaxSpooledReceipts,
    "spool.max_bytes": () => MaxReceiptSpoolBytes,
    "spool.refile_interval_ms": () => ReceiptRefileIntervalMs,
    "spool.refile_min_gap_ms": () => RefileMinGapMs,
    "spool.final_refile_timeout_ms": () => FinalRefileTimeoutMs,
    // A held lock is refused at once, never waited for.
    "spool.lock_wait_ms": () => null,
    "policy.same_key_resend_safe": () => s.sameKeyResendSafe as boolean,
    "policy.resend_margin_ms": () => s.resendMarginMs,
    "policy.pending_delay_ms": () => s.pendingDelayMs,
    "policy.unknown_delay_ms": () => s.unknownOutcomeDelayMs,
    // A request not sent is repeated after the unknown-outcome delay.
    "policy.not_sent_delay_ms": () => s.unknownOutcomeDelayMs,
    "policy.max_reschedule_delay_ms": () => MaxDelayMs,
  };
}

export async function runDefaults(v: Fields): Promise<void> {
  const name = v.str("name")!;
  const expect = expectOf(v);
  v.done();
  const read = defaults()[name];
  assert.ok(read !== undefined, `${v.where}: ${name} is not a default this runner knows`);
  if (expect === undefined) {
    return;
  }
  const want = expect.raw("value");
  expect.done();
  assert.equal(read(), want, name);
}
