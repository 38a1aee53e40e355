// The mixed fleet: two Go workers (cmd/refundworker) and two Node workers
// (examples/refund-worker) work the same 500 refunds at once, with 2 s leases,
// against a real coordinator on MariaDB and a real fake provider over HTTP.
// The provider cuts replies, hangs past the lease, pends, lags and fails a
// burst of requests; one Node worker is frozen (SIGSTOP: a GC pause, a stopped
// container) while it holds jobs, so that they are taken over and its late
// writes hit the fence. In the end every job succeeded exactly once, the
// provider refunded every operation key exactly once, and the ledger agrees.
//
// Nothing here asserts on timing: waits are generous and event-driven, and the
// numbers (takeovers, stale rejections, observations, jobs per language) are
// reported as diagnostics.

import assert from "node:assert/strict";
import path from "node:path";
import { after, describe, it, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";

import { JobState, NextAction, type CoordinatorClient, type GetJobResponse, type Job } from "../src/index.js";
import { goBinary, startCoordinator, testSpool, type Coordinator } from "./harness.js";
import { startProcess, type Proc } from "./processes.js";

const JOBS = 500;
const PROVIDER = "acme";
// Short leases so that takeovers happen (R17: shorter leases, more takeovers).
const LEASE = "2s";
const nodeWorkerJs = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../examples/refund-worker.js");

// The flags both languages share (REFUNDWORKER_* in the environment works too).
function workerFlags(coordinator: string, provider: string, id: string, providerTimeout: string): string[] {
  return [
    "--coordinator", coordinator, "--provider", provider, "--provider-name", PROVIDER, "--worker-id", id,
    "--concurrency", "6", "--lease", LEASE, "--provider-timeout", providerTimeout,
    "--unknown-delay", "300ms", "--pending-delay", "500ms", "--claim-wait", "5s", "--drain-timeout", "20s",
    // Receipts the coordinator cannot take stay with the test, not in the user's cache (R28).
    "--receipt-spool", testSpool(id),
    // Debug: every accepted write-back is logged (with its grant, R25).
    "--log-level", "debug",
  ];
}

/** The provider's global faults (POST /v1/_admin/faults), durations in seconds. */
interface Faults {
  hang_before?: number;
  hang_after?: number;
  cut_reply?: boolean;
  pending?: number;
  lookup_lag?: number;
  error_burst?: number;
  fail?: boolean;
  key?: string;
  times?: number;
}

// Applied one after the other, each once the previous one was used up. The
// hangs outlast the 2 s lease; go-1's provider timeout (4 s) lets it wait
// them out, the way the article's worker did, so a hang that lands there
// turns into a takeover and a late write. The others cut the call at 1.5 s:
// an unknown outcome, reconciled.
const faultPhases: Array<{ name: string; faults: Faults }> = [
  { name: "T3: refund made, reply cut", faults: { cut_reply: true, times: 4 } },
  { name: "hang 3 s after the refund is made (longer than the lease)", faults: { hang_after: 3, times: 3 } },
  { name: "503 burst", faults: { error_burst: 6 } },
  { name: "hang 3 s before anything is done (longer than the lease)", faults: { hang_before: 3, times: 3 } },
  { name: "R4: refunds pending for 1 s", faults: { pending: 1, times: 8 } },
  { name: "R14: reply cut and lookups lag 2 s behind", faults: { cut_reply: true, lookup_lag: 2, times: 3 } },
];

interface OperationTruth {
  merchant_references: string[];
  idempotency_keys: string[];
  refund_ids: string[];
  refunds: number;
  failed: number;
  duplicate: boolean;
}

interface OracleReport {
  refunds: Array<{ id: string; merchant_reference: string; status: string; payment_id: string; amount_minor: number }>;
  operations: OperationTruth[];
  payments: Array<{ payment_id: string; refunds: number; over_refunded: boolean }>;
  duplicate_operations: number;
  over_refunded_payments: number;
  double_refunds: number;
  stats: Record<string, number>;
}

/** ProviderAdmin calls the fake provider's admin and oracle endpoints. */
class ProviderAdmin {
  constructor(readonly url: string) {}

  async call<T>(method: string, p: string, body?: unknown): Promise<T> {
    const resp = await fetch(this.url + p, {
      method,
      headers: body === undefined ? {} : { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
      redirect: "error",
      signal: AbortSignal.timeout(15_000),
    });
    const text = await resp.text();
    if (!resp.ok) {
      throw new Error(`provider ${method} ${p}: ${resp.status} ${text}`);
    }
    return (text === "" ? undefined : JSON.parse(text)) as T;
  }
}

/** pool runs fn over items, n at a time. */
async function pool<T>(items: readonly T[], n: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: n }, async () => {
    while (next < items.length) {
      await fn(items[next++]!);
    }
  }));
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** listAll pages through ListJobs with one state filter. */
async function listAll(c: CoordinatorClient, state: JobState): Promise<Job[]> {
  const out: Job[] = [];
  let pageToken = "";
  do {
    const page = await c.listJobs({ state, provider: PROVIDER, pageSize: 500, pageToken });
    out.push(...page.jobs);
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
  return out;
}

/** goStats parses the Go worker's stats, logged as Go's %+v of WorkerStats. */
function goStats(rec: Record<string, unknown>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of String(rec["stats"]).matchAll(/(\w+):(\d+)/g)) {
    out[m[1]!] = Number(m[2]);
  }
  return out;
}

// Top-level await: a missing MySQL or a failed build fails the whole file
// loudly, never skips it.
const [coord, fakeproviderBin, refundworkerBin]: [Coordinator, string, string] = await Promise.all([
  startCoordinator(),
  goBinary("fakeprovider", "JOBFENCE_FAKEPROVIDER_BIN"),
  goBinary("refundworker", "JOBFENCE_REFUNDWORKER_BIN"),
]);
const procs: Proc[] = [];
after(async () => {
  // Frozen or not, every child ends here (SIGCONT, SIGTERM, then SIGKILL).
  await Promise.all(procs.map((p) => p.stop(5_000)));
  await coord.stop();
});

describe("mixed fleet", () => {
  it("Go and Node workers on the same 500 refunds with 2 s leases: each succeeded exactly once, no double refund (R1, R2, R8, R9, R14, R15, T1, T3)", { timeout: 150_000 }, async (t: TestContext) => {
    const client = coord.client();
    // Every refund creation takes 200 ms, like a real provider's round trip:
    // a frozen worker then holds acknowledged jobs mid-call, which only a
    // takeover ends, instead of finishing each before any freeze costs it one.
    const provider = startProcess("fakeprovider", fakeproviderBin, ["--listen", "127.0.0.1:0", "--log-format", "json",
      "--shutdown-timeout", "1s", "--latency", "200ms"]);
    procs.push(provider);
    const serving = await provider.waitFor((r) => r["msg"] === "fakeprovider serving", "\"fakeprovider serving\"");
    const providerUrl = `http://${String(serving["listen"])}`;
    const admin = new ProviderAdmin(providerUrl);

    // The first fault phase is set before any work exists, so that it hits the first sends.
    await admin.call("POST", "/v1/_admin/faults", faultPhases[0]!.faults);

    // The fleet. go-1 waits out slow provider calls longer than its lease
    // (the article's story); node-2 is configured by environment only.
    const workers: Array<{ id: string; lang: "go" | "node"; proc: Proc }> = [];
    const goWorker = (id: string, providerTimeout: string): void => {
      const proc = startProcess(id, refundworkerBin, [
        ...workerFlags(coord.address, providerUrl, id, providerTimeout), "--log-format", "json",
      ]);
      procs.push(proc);
      workers.push({ id, lang: "go", proc });
    };
    goWorker("go-1", "4s");
    goWorker("go-2", "1500ms");
    const node1 = startProcess("node-1", process.execPath, [nodeWorkerJs, ...workerFlags(coord.address, providerUrl, "node-1", "1500ms")]);
    const envFlags = workerFlags(coord.address, providerUrl, "node-2", "1500ms");
    const env: Record<string, string> = {};
    for (let i = 0; i < envFlags.length; i += 2) {
      env[`REFUNDWORKER_${envFlags[i]!.slice(2).toUpperCase().replaceAll("-", "_")}`] = envFlags[i + 1]!;
    }
    const node2 = startProcess("node-2", process.execPath, [nodeWorkerJs], env);
    procs.push(node1, node2);
    workers.push({ id: "node-1", lang: "node", proc: node1 }, { id: "node-2", lang: "node", proc: node2 });
    await Promise.all(workers.map(({ proc, lang }) =>
      proc.waitFor((r) => r["msg"] === (lang === "go" ? "refundworker started" : "refund-worker started"), "its start", 60_000)));

    const started = performance.now();
    let fleetDone = false;

    // The fault phases, each set once the previous one is used up (times
    // and error_burst count down at the provider).
    const phasesUsed: string[] = [];
    const faults = (async () => {
      for (let i = 0; ; i++) {
        for (;;) {
          const now = await admin.call<Faults>("GET", "/v1/_admin/faults");
          if (!now.cut_reply && !now.hang_after && !now.hang_before && !now.pending && !now.lookup_lag && !now.error_burst && !now.fail) {
            phasesUsed.push(`${faultPhases[i]!.name} @${Math.round(performance.now() - started)}ms`);
            break;
          }
          if (fleetDone) {
            return;
          }
          await sleep(50);
        }
        if (i + 1 === faultPhases.length || fleetDone) {
          return;
        }
        await admin.call("POST", "/v1/_admin/faults", faultPhases[i + 1]!.faults);
      }
    })();

    // Freeze node-2 while it holds jobs: its leases lapse and the others take
    // the jobs over (R6, R8: expiry only opens the competition; the takeover's
    // commit ends node-2's right to write). Then let it run on: every write it
    // still makes for those jobs carries a stale attempt (T1), and the
    // refunds it still sends carry the same operation key (R1), which the
    // provider answers from its idempotency store.
    //
    // node-2 is frozen while it holds jobs, again and again until a freeze
    // costs it a job. A grant it had not yet acknowledged when it froze comes
    // back within half a lease (the worker stream hands it back); the jobs it
    // had acknowledged, and so may be working, are the ones taken over.
    const victim = workers.find((w) => w.id === "node-2")!;
    const rounds: Array<{ held: number; takenOver: number; frozenMs: number }> = [];
    const freeze = (async () => {
      for (let round = 0; round < 100 && !fleetDone; round++) {
        if (round > 0) {
          await sleep(200);
        }
        let held: Job[] = [];
        while (!fleetDone) {
          held = (await listAll(client, JobState.RUNNING)).filter((j) => j.workerId === victim.id);
          if (held.length > 0) {
            break;
          }
          await sleep(50);
        }
        if (held.length === 0) {
          break;
        }
        victim.proc.signal("SIGSTOP");
        const frozenAt = performance.now();
        // Wait until each held job was taken over, or had been written back
        // just before the freeze.
        let takenOver = 0;
        const end = Date.now() + 60_000;
        for (const j of held) {
          for (;;) {
            const now = (await client.getJob({ job: { case: "jobId", value: j.id } })).job!;
            if (now.attempt > j.attempt || now.state !== JobState.RUNNING) {
              takenOver += now.attempt > j.attempt ? 1 : 0;
              break;
            }
            if (Date.now() > end) {
              victim.proc.signal("SIGCONT");
              throw new Error(`job ${j.id} held by the frozen ${victim.id} was not taken over within 60 s`);
            }
            await sleep(100);
          }
        }
        victim.proc.signal("SIGCONT");
        rounds.push({ held: held.length, takenOver, frozenMs: Math.round(performance.now() - frozenAt) });
        if (takenOver > 0) {
          return;
        }
      }
      victim.proc.signal("SIGCONT");
    })();
    // Awaited below; until then a failure must not count as unhandled.
    faults.catch(() => undefined);
    freeze.catch(() => undefined);

    // 500 refunds, their payments registered with the provider so that an
    // over-refund shows in the oracle. The fleet works them as they come.
    const keys = Array.from({ length: JOBS }, (_, i) => `mix-${i + 1}`);
    const amountOf = (key: string): bigint => 1_000n + BigInt(Number(key.slice(4)));
    const jobIds = new Map<string, bigint>();
    const enqueueStarted = performance.now();
    await pool(keys, 16, async (key) => {
      await admin.call("POST", "/v1/_admin/payments", { payment_id: `pay-${key}`, amount_minor: Number(amountOf(key)), currency: "EUR" });
      const { job } = await client.enqueueRefund({
        operationKey: key, orderId: `order-${key}`, paymentId: `pay-${key}`, amountMinor: amountOf(key), currency: "EUR", provider: PROVIDER,
      });
      jobIds.set(key, job!.id);
    });
    t.diagnostic(`enqueued ${JOBS} refunds in ${Math.round(performance.now() - enqueueStarted)} ms`);

    // Wait until every job is final: nothing ready, nothing running.
    let lastProgress = "";
    try {
      const end = Date.now() + 120_000;
      for (;;) {
        const [ready, running] = await Promise.all([
          client.listJobs({ state: JobState.READY, provider: PROVIDER, pageSize: 1 }),
          client.listJobs({ state: JobState.RUNNING, provider: PROVIDER, pageSize: 1 }),
        ]);
        if (ready.jobs.length === 0 && running.jobs.length === 0) {
          break;
        }
        lastProgress = `ready ${ready.jobs.length ? "some" : "none"}, running ${running.jobs.length ? "some" : "none"}`;
        if (Date.now() > end) {
          throw new Error(`jobs not final after 120 s (${lastProgress})\n${workers.map((w) => w.proc.tail(15)).join("\n")}`);
        }
        await sleep(250);
      }
    } finally {
      fleetDone = true;
    }
    await freeze;
    await faults;
    await admin.call("DELETE", "/v1/_admin/faults");
    t.diagnostic(`all ${JOBS} jobs final ${Math.round(performance.now() - started)} ms after the fleet started`);

    // SIGTERM: every worker drains and exits cleanly.
    const exits = await Promise.all(workers.map((w) => w.proc.stop(30_000)));
    exits.forEach((e, i) => assert.deepEqual(e, { code: 0, signal: null }, `${workers[i]!.id} exit\n${workers[i]!.proc.tail()}`));
    const stats = new Map<string, Record<string, number>>();
    for (const w of workers) {
      const rec = w.proc.records.find((r) => r["msg"] === (w.lang === "go" ? "refundworker stopped" : "refund-worker stopped"));
      assert.ok(rec, `${w.id} logged no stop record\n${w.proc.tail()}`);
      stats.set(w.id, w.lang === "go" ? goStats(rec) : (rec["stats"] as Record<string, number>));
    }

    // The coordinator's view: every job succeeded, exactly one completion.
    const details = new Map<string, GetJobResponse>();
    await pool(keys, 8, async (key) => {
      details.set(key, await client.getJob({ job: { case: "operationKey", value: key } }));
    });
    const notSucceeded = keys.filter((k) => details.get(k)!.job!.state !== JobState.SUCCEEDED);
    assert.deepEqual(notSucceeded.map((k) => {
      const d = details.get(k)!;
      return `${k}: ${JobState[d.job!.state]} (${d.job!.lastReason}) ${d.events.map((e) => `${e.kind}@${e.attempt}:${e.workerId}`).join(" ")}`;
    }), [], "every job SUCCEEDED");

    const completedBy = { go: 0, node: 0 } as Record<string, number>;
    let takeovers = 0;
    let reconcileClaims = 0;
    let observations = 0;
    let staleObservations = 0;
    for (const key of keys) {
      const d = details.get(key)!;
      const job = d.job!;
      assert.equal(job.id, jobIds.get(key));
      const completed = d.events.filter((e) => e.kind === "completed");
      assert.equal(completed.length, 1, `${key}: exactly one completed event`);
      const done = completed[0]!;
      assert.equal(done.attempt, job.attempt, `${key}: completed under the current attempt (R9)`);
      assert.equal(done.providerRefundId, job.providerRefundId);
      // R2: one attempt per claim or takeover, never reused.
      const grants = d.events.filter((e) => e.kind === "claimed" || e.kind === "taken_over");
      assert.deepEqual(grants.map((e) => e.attempt), grants.map((_, i) => BigInt(i + 1)), `${key}: attempts 1, 2, 3… one per claim`);
      assert.equal(BigInt(grants.length), job.attempt, `${key}: attempt counts the claims`);
      takeovers += d.events.filter((e) => e.kind === "taken_over").length;
      reconcileClaims += grants.filter((e) => e.nextAction !== NextAction.REFUND).length;
      const lang = done.workerId.startsWith("go-") ? "go" : done.workerId.startsWith("node-") ? "node" : done.workerId;
      completedBy[lang] = (completedBy[lang] ?? 0) + 1;
      observations += d.observations.length;
      // R15: every receipt a stale worker filed names the refund the job completed with.
      for (const o of d.observations) {
        assert.ok(o.reportedAttempt <= job.attempt, `${key}: observation attempt`);
        if (o.providerRefundId !== "") {
          assert.equal(o.providerRefundId, job.providerRefundId, `${key}: observed refund id`);
        }
        if (o.reportedAttempt < job.attempt) staleObservations++;
      }
    }
    assert.ok(completedBy["go"]! >= 1, `Go workers completed jobs: ${JSON.stringify(completedBy)}`);
    assert.ok(completedBy["node"]! >= 1, `Node workers completed jobs: ${JSON.stringify(completedBy)}`);
    assert.equal(completedBy["go"]! + completedBy["node"]!, JOBS, `completions by worker: ${JSON.stringify(completedBy)}`);

    // The provider's truth: one refund per operation key, under that key and
    // reference only (R1, R2), nobody refunded twice.
    const oracle = await admin.call<OracleReport>("GET", "/v1/_oracle");
    assert.equal(oracle.double_refunds, 0, `double refunds: ${JSON.stringify(oracle.operations.filter((o) => o.duplicate))}`);
    assert.equal(oracle.duplicate_operations, 0);
    assert.equal(oracle.over_refunded_payments, 0);
    assert.equal(oracle.refunds.length, JOBS, "one refund created per job");
    const byRef = new Map(oracle.operations.map((o) => [o.merchant_references[0]!, o]));
    for (const key of keys) {
      const op = byRef.get(key);
      assert.ok(op, `${key}: the provider has an operation`);
      assert.deepEqual(op.merchant_references, [key], `${key}: merchant reference`);
      assert.deepEqual(op.idempotency_keys, [key], `${key}: Idempotency-Key is the operation key, never with the attempt (R2)`);
      assert.equal(op.refund_ids.length, 1, `${key}: exactly one refund`);
      assert.equal(op.refunds, 1);
      assert.equal(op.refund_ids[0], details.get(key)!.job!.providerRefundId, `${key}: the job completed with the provider's refund`);
    }
    for (const r of oracle.refunds) {
      assert.equal(r.status, "succeeded", `${r.id} settled`);
      assert.equal(BigInt(r.amount_minor), amountOf(r.merchant_reference), `${r.id}: amount`);
    }

    // The ledger agrees: one row per succeeded job, with its refund, amount and attempt (R10).
    const ledger = (await coord.sql(
      "SELECT COUNT(*), COUNT(DISTINCT l.operation_key), " +
      "SUM(j.state = 'succeeded' AND j.provider_refund_id = l.provider_refund_id AND j.operation_key = l.operation_key " +
      "AND j.amount_minor = l.amount_minor AND j.attempt = l.attempt) " +
      "FROM refund_ledger l JOIN refund_jobs j ON j.id = l.job_id",
    )).trim().split("\t").map(Number);
    assert.deepEqual(ledger, [JOBS, JOBS, JOBS], "ledger rows, distinct keys, rows agreeing with their job");
    const succeeded = (await coord.sql("SELECT COUNT(*) FROM refund_jobs WHERE state = 'succeeded'")).trim();
    assert.equal(Number(succeeded), JOBS);

    // R25: every worker log line about a job names its grant under `grant`
    // (the fingerprint, in both languages), and it is a grant the database's
    // history recorded for that job and attempt; every write-back a worker
    // was told had landed is in the history under that very grant. That is
    // what the chaos checker matches after a lossy failover.
    const grantRows = (await coord.sql(
      "SELECT job_id, attempt, kind, LOWER(HEX(LEFT(lease_token_hash, 6))) FROM refund_job_events",
    )).trim().split("\n").map((l) => l.split("\t"));
    const grantsMade = new Set(grantRows.filter((r) => r[2] === "claimed" || r[2] === "taken_over").map(([j, a, , g]) => `${j} ${a} ${g}`));
    const writesMade = new Set(grantRows.map(([j, a, k, g]) => `${j} ${a} ${k} ${g}`));
    const ackKinds: Record<string, string> = {
      complete: "completed", reschedule: "rescheduled", escalate: "escalated",
      "job completed": "completed", "job rescheduled": "rescheduled", "job escalated to manual review": "escalated",
    };
    const acked = { go: 0, node: 0 };
    for (const w of workers) {
      for (const r of w.proc.records) {
        if (r["job_id"] === undefined || r["attempt"] === undefined) {
          continue;
        }
        const line = JSON.stringify(r);
        const grant = String(r["grant"]);
        assert.match(grant, /^[0-9a-f]{12}$/, `${w.id}: a job line without its grant: ${line}`);
        assert.ok(!Object.keys(r).some((k) => /token/i.test(k)), `${w.id}: a token field in ${line}`);
        const [job, attempt] = [String(r["job_id"]), String(r["attempt"])];
        assert.ok(grantsMade.has(`${job} ${attempt} ${grant}`), `${w.id}: a grant the history never recorded: ${line}`);
        const kind = ackKinds[r["msg"] === "job written" ? String(r["decision"]) : String(r["msg"])];
        if (kind !== undefined) {
          assert.ok(writesMade.has(`${job} ${attempt} ${kind} ${grant}`), `${w.id}: an accepted write-back not in the history under its grant: ${line}`);
          acked[w.lang]++;
        }
      }
    }
    assert.ok(acked.go > 0 && acked.node > 0, `accepted write-backs logged with their grant: ${JSON.stringify(acked)}`);

    // The hazards were really there: jobs were taken over, including the frozen worker's.
    assert.ok(rounds.some((r) => r.takenOver > 0), `jobs of the frozen node-2 were taken over: ${JSON.stringify(rounds)}`);
    assert.ok(takeovers >= 1, "takeovers happened");

    const sum = (field: string): number => [...stats.values()].reduce((n, s) => n + (s[field] ?? 0), 0);
    t.diagnostic(`completed by language: go ${completedBy["go"]}, node ${completedBy["node"]}; ` +
      `per worker: ${workers.map((w) => `${w.id}=${w.lang === "go" ? stats.get(w.id)!["Completed"] : stats.get(w.id)!["completed"]}`).join(" ")}`);
    t.diagnostic(`takeovers (job histories) ${takeovers}; claims that reconciled first ${reconcileClaims}; ` +
      `stale write-backs rejected: go ${sum("StaleRejected")}, node ${sum("stale_rejected")}; ` +
      `observations on file ${observations} (${staleObservations} from stale attempts)`);
    t.diagnostic(`frozen node-2: ${rounds.map((r) => `${r.held} jobs held, ${r.takenOver} taken over, frozen ${r.frozenMs} ms`).join("; ")}; ` +
      `fault phases used: ${phasesUsed.length}/${faultPhases.length}: ${phasesUsed.join("; ")}`);
    t.diagnostic(`provider: ${JSON.stringify(oracle.stats)}`);
    for (const w of workers) {
      const notable = new Map<string, number>();
      for (const r of w.proc.records) {
        const level = String(r["level"]).toLowerCase();
        if (level === "warn" || level === "error" || r["msg"] === "write-back rejected by the fence; filing the answer as an observation") {
          const what = `${level} ${String(r["msg"])}${r["error"] ? `: ${String(r["error"]).replace(/\d+/g, "N")}` : ""}`;
          notable.set(what, (notable.get(what) ?? 0) + 1);
        }
      }
      t.diagnostic(`${w.id} log: ${[...notable].map(([m, n]) => `${n}× ${m}`).join(" | ") || "nothing notable"}`);
    }
    const coordNotable = new Map<string, number>();
    for (const r of coord.logs) {
      const level = String(r["level"]).toUpperCase();
      if (level === "WARN" || level === "ERROR") {
        const what = `${level} ${String(r["msg"])} ${String(r["grpc.code"] ?? r["error"] ?? "")}`.replace(/\d+/g, "N");
        coordNotable.set(what, (coordNotable.get(what) ?? 0) + 1);
      }
    }
    t.diagnostic(`coordinator log: ${[...coordNotable].map(([m, n]) => `${n}× ${m}`).join(" | ") || "nothing notable"}`);
    t.diagnostic(`workers: ${workers.map((w) => `${w.id} ${JSON.stringify(stats.get(w.id))}`).join("; ")}`);
  });
});
