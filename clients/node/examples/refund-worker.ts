// refund-worker: the example jobfence worker for Node.js. It takes refund jobs
// from a coordinator (granted on the worker stream; with --no-stream, claimed
// with Claim calls), refunds through the fake payment provider (the
// `fakeprovider` command, a Stripe-like refunds API) over HTTP, and writes each
// outcome back with the attempt it was granted, using this package's Worker.
//
//   node dist/examples/refund-worker.js --coordinator 127.0.0.1:50051 --provider http://127.0.0.1:8099
//
// It works jobs until SIGTERM or SIGINT, then stops claiming and drains the
// jobs in flight (a rolling deploy); a second signal exits at once. Its flags
// and environment variables are those of the Go example worker
// (cmd/refundworker), so a fleet of both is configured alike: every flag falls
// back to REFUNDWORKER_<FLAG> (upper case, '-' as '_'), e.g.
// REFUNDWORKER_COORDINATOR. Logs are JSON lines on stderr; the last one,
// "refund-worker stopped", carries the worker's counters. Every line about a
// job names it with job_id, operation_key, attempt and grant — the grant's
// fingerprint (R25: the first 6 bytes of the SHA-256 of its lease token, in
// hex), under the same key as the Go worker's `grant`. The lease token itself
// is never logged: the Worker keeps it and sends it with every write-back.
//
// What it sends to the provider (R1, R2): the job's operation_key as the
// Idempotency-Key and as the merchant_reference, never anything derived from
// the attempt. What it makes of the answers:
//
//   refund     200 succeeded → succeeded; 200 pending → pending (R4, not a
//              success); 200 failed or 4xx → failed (a person decides);
//              409 key reused → escalate (R1 broke somewhere).
//   reconcile  GET /v1/refunds?merchant_reference=<operation_key>, plus the
//              refund ids of receipts already filed for the job (R15): one
//              live refund → its status; none → not_found, which proves
//              nothing (R14: the Worker resends under the same key only inside
//              the coordinator's resend window, else escalates); more than
//              one → escalate.
//   anything   no reply (cut connection, the provider-call deadline), a 5xx,
//              an unreadable body → the handler throws: the outcome is
//              unknown and the job is reconciled later (R14).
//
// The HTTP layer is node:http on purpose, and it never sends a request twice.
// fetch() would follow redirects with the POST body and, as the Fetch standard
// asks, replay a request answered 421 on a new connection: a refund resent by
// the transport, behind the decision table's back (R14, R16).

import { readFileSync, realpathSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import { hostname } from "node:os";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import {
  CoordinatorClient,
  NextAction,
  ObservationOutcome,
  Worker,
  type JobIds,
  type ProviderResult,
  type TLSOptions,
  type WorkerEvent,
  type WorkerJob,
} from "../src/index.js";
import { TracingConfigError, setupTracing, type ExampleTracing } from "./tracing.js";

// ---------------------------------------------------------------------------
// Configuration

/** Config is the worker's configuration, from flags and REFUNDWORKER_* variables. */
export interface Config {
  coordinator: string;
  tlsCA: string;
  useTLS: boolean;
  tokenFile: string;
  callTimeoutMs: number;
  provider: string;
  providerName: string;
  workerId: string;
  concurrency: number;
  leaseMs: number;
  /** 0: a third of each job's lease (R27). */
  renewIntervalMs: number;
  noLeaseRenewal: boolean;
  /** Claim with Claim calls and write back with unary calls, not on the worker stream. */
  noStream: boolean;
  providerTimeoutMs: number;
  sameKeyResends: boolean;
  resendMarginMs: number;
  pendingDelayMs: number;
  unknownDelayMs: number;
  claimWaitMs: number;
  drainTimeoutMs: number;
  receiptSpool: string;
  logLevel: Level;
}

type FlagKind = "string" | "duration" | "int" | "bool";

interface FlagSpec {
  kind: FlagKind;
  default: string;
  usage: string;
}

// The flags, in the order -h lists them. Defaults are strings, parsed like
// values from the command line or the environment.
const flags = {
  coordinator: { kind: "string", default: "127.0.0.1:50051", usage: "coordinator gRPC address (host:port)" },
  tls: { kind: "bool", default: "false", usage: "connect to the coordinator over TLS (system roots unless --tls-ca)" },
  "tls-ca": { kind: "string", default: "", usage: "PEM file of the CA that signed the coordinator's certificate; implies --tls" },
  "token-file": {
    kind: "string",
    default: "",
    usage: "file holding a bearer token sent with every coordinator call, re-read per call; only over TLS or to a loopback coordinator",
  },
  "call-timeout": { kind: "duration", default: "10s", usage: "deadline of each coordinator call" },
  provider: { kind: "string", default: "http://127.0.0.1:8099", usage: "base URL of the payment provider (fakeprovider)" },
  "provider-name": { kind: "string", default: "acme", usage: "the provider name of the jobs to claim" },
  "worker-id": {
    kind: "string",
    default: "",
    usage: "this worker's name in job histories and observation sources (default refund-worker-node-<hostname>-<pid>)",
  },
  concurrency: { kind: "int", default: "4", usage: "jobs worked at once (1..100); only that many are claimed (R18)" },
  lease: {
    kind: "duration",
    default: "30s",
    usage: "lease to ask for (1s..15m); renewed while a job's provider calls run (R27), so it bounds how long a dead " +
      "worker's jobs wait for a takeover (R17)",
  },
  "renew-interval": { kind: "duration", default: "0", usage: "how often a running job's lease is renewed; 0: a third of the lease (R27)" },
  "no-lease-renewal": {
    kind: "bool",
    default: "false",
    usage: "never renew a lease: --lease must then outlast --provider-timeout and the deploy hand-over time (R17)",
  },
  "no-stream": {
    kind: "bool",
    default: "false",
    usage: "claim with Claim calls (--claim-wait) and write back with unary calls instead of the worker stream, on which " +
      "the coordinator pushes grants as slots free up and the write-backs, renewals and receipts travel",
  },
  "provider-timeout": { kind: "duration", default: "3s", usage: "deadline of each provider call; with --no-lease-renewal shorter than --lease (R17)" },
  "same-key-resends": {
    kind: "bool",
    default: "true",
    usage: "the provider honours same-key, same-body resends inside its idempotency-key window (fakeprovider does); " +
      "false: every \"no record\" reconcile goes to manual review (R14, R16)",
  },
  "resend-margin": { kind: "duration", default: "5m", usage: "no same-key resend is started closer than this to the job's resend deadline (R22)" },
  "pending-delay": { kind: "duration", default: "30s", usage: "when to reconcile a pending refund again (R4)" },
  "unknown-delay": { kind: "duration", default: "5s", usage: "when to reconcile after a provider call whose outcome is unknown (R14)" },
  "claim-wait": {
    kind: "duration",
    default: "10s",
    usage: "with --no-stream: long-poll each claim up to this long (0..60s); 0: poll every second",
  },
  "drain-timeout": { kind: "duration", default: "30s", usage: "on SIGTERM, how long jobs in flight may finish their provider call and write-back" },
  "receipt-spool": {
    kind: "string",
    default: "",
    usage: "file keeping the receipts the coordinator could not take (R28), filed again before the first claim and every 30s; " +
      "a restart files them only from the same file, so keep --worker-id (or this) stable. \"off\": such receipts are only logged " +
      "(default $XDG_CACHE_HOME or ~/.cache, then jobfence/<worker id>.receipts.jsonl)",
  },
  "log-level": { kind: "string", default: "info", usage: "log level: debug, info, warn or error" },
} satisfies Record<string, FlagSpec>;

type FlagName = keyof typeof flags;

/** UsageError is a bad flag or variable; main prints it with the usage. */
export class UsageError extends Error {}

/** envName is the variable standing in for a flag: REFUNDWORKER_<FLAG>. */
export function envName(flag: string): string {
  return `REFUNDWORKER_${flag.toUpperCase().replaceAll("-", "_")}`;
}

/**
 * parseConfig reads the command line, then REFUNDWORKER_* variables for the
 * flags not given, then the defaults. Throws UsageError.
 */
export function parseConfig(argv: string[], env: NodeJS.ProcessEnv): Config | "help" {
  const options: Record<string, { type: "string" | "boolean"; short?: string }> = { help: { type: "boolean", short: "h" } };
  for (const [name, spec] of Object.entries(flags)) {
    options[name] = { type: spec.kind === "bool" ? "boolean" : "string" };
    if (spec.kind === "bool") {
      options[`no-${name}`] = { type: "boolean" };
    }
  }
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({ args: goStyle(argv), options, strict: true, allowPositionals: false }));
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  if (values["help"]) {
    return "help";
  }
  const raw = (name: FlagName): { value: string; from: string } => {
    const given = values[name];
    if (given !== undefined) {
      return { value: String(given), from: `--${name}` };
    }
    if (values[`no-${name}`] !== undefined) {
      return { value: String(!values[`no-${name}`]), from: `--no-${name}` };
    }
    const fromEnv = env[envName(name)];
    if (fromEnv !== undefined) {
      return { value: fromEnv, from: envName(name) };
    }
    return { value: flags[name].default, from: `--${name} default` };
  };
  const str = (name: FlagName): string => raw(name).value;
  const dur = (name: FlagName): number => {
    const { value, from } = raw(name);
    const ms = parseDuration(value);
    if (ms === undefined) {
      throw new UsageError(`${from}: ${JSON.stringify(value)} is not a duration (e.g. 2s, 1500ms, 1m30s)`);
    }
    return ms;
  };
  const int = (name: FlagName): number => {
    const { value, from } = raw(name);
    if (!/^-?\d+$/.test(value.trim())) {
      throw new UsageError(`${from}: ${JSON.stringify(value)} is not an integer`);
    }
    return Number.parseInt(value, 10);
  };
  const bool = (name: FlagName): boolean => {
    const { value, from } = raw(name);
    const v = value.trim().toLowerCase();
    if (["1", "t", "true"].includes(v)) return true;
    if (["0", "f", "false"].includes(v)) return false;
    throw new UsageError(`${from}: ${JSON.stringify(value)} is not a boolean`);
  };

  const c: Config = {
    coordinator: str("coordinator"),
    tlsCA: str("tls-ca"),
    useTLS: bool("tls"),
    tokenFile: str("token-file"),
    callTimeoutMs: dur("call-timeout"),
    provider: str("provider").replace(/\/+$/, ""),
    providerName: str("provider-name"),
    workerId: str("worker-id") || `refund-worker-node-${hostname()}-${process.pid}`.slice(0, 128),
    concurrency: int("concurrency"),
    leaseMs: dur("lease"),
    renewIntervalMs: dur("renew-interval"),
    noLeaseRenewal: bool("no-lease-renewal"),
    noStream: bool("no-stream"),
    providerTimeoutMs: dur("provider-timeout"),
    sameKeyResends: bool("same-key-resends"),
    resendMarginMs: dur("resend-margin"),
    pendingDelayMs: dur("pending-delay"),
    unknownDelayMs: dur("unknown-delay"),
    claimWaitMs: dur("claim-wait"),
    drainTimeoutMs: dur("drain-timeout"),
    receiptSpool: str("receipt-spool"),
    logLevel: str("log-level") as Level,
  };
  c.useTLS ||= c.tlsCA !== "";
  let url: URL;
  try {
    url = new URL(c.provider);
  } catch {
    throw new UsageError(`--provider: ${JSON.stringify(c.provider)} is not a URL`);
  }
  switch (true) {
    case url.protocol !== "http:" && url.protocol !== "https:":
      throw new UsageError(`--provider must be an http:// or https:// URL, got ${c.provider}`);
    case !(c.concurrency >= 1 && c.concurrency <= 100):
      throw new UsageError(`--concurrency must be 1..100, got ${c.concurrency}`);
    case !(c.leaseMs >= 1_000 && c.leaseMs <= 15 * 60_000):
      throw new UsageError(`--lease must be between 1s and 15m, got ${c.leaseMs} ms`);
    case c.renewIntervalMs !== 0 && c.renewIntervalMs >= c.leaseMs:
      throw new UsageError(`--renew-interval must be 0 (a third of the lease) or shorter than --lease, got ${c.renewIntervalMs} ms`);
    case !(c.providerTimeoutMs > 0):
      throw new UsageError(`--provider-timeout must be positive, got ${c.providerTimeoutMs} ms`);
    case c.noLeaseRenewal && c.providerTimeoutMs >= c.leaseMs:
      // R17: the Worker cuts every provider call at this deadline, so that an
      // unrenewed lease outlasts it and the write-back lands inside it. A
      // renewed lease lasts as long as the call (R27).
      throw new UsageError(`--provider-timeout must be shorter than --lease with --no-lease-renewal, got ${c.providerTimeoutMs} ms`);
    case !(c.claimWaitMs >= 0 && c.claimWaitMs <= 60_000):
      throw new UsageError(`--claim-wait must be 0..60s, got ${c.claimWaitMs} ms`);
    case c.callTimeoutMs <= 0:
      throw new UsageError(`--call-timeout must be positive, got ${c.callTimeoutMs} ms`);
    case !(c.logLevel in levels):
      throw new UsageError(`--log-level must be debug, info, warn or error, got ${JSON.stringify(c.logLevel)}`);
    case c.tokenFile !== "" && !c.useTLS && !isLoopback(c.coordinator):
      throw new UsageError("--token-file needs TLS (--tls or --tls-ca) unless the coordinator is on loopback: " +
        "a bearer token never crosses a network in plaintext");
  }
  return c;
}

/**
 * goStyle rewrites the command-line forms Go's flag package accepts and
 * parseArgs does not: a single dash (-lease 2s) and a boolean with a value
 * (--tls=false).
 */
function goStyle(argv: string[]): string[] {
  return argv.map((arg) => {
    const m = /^--?([a-z][a-z-]*)(?:=(.*))?$/.exec(arg);
    if (!m || !(m[1]! in flags || m[1] === "help")) {
      return arg;
    }
    const name = m[1]!;
    const value = m[2];
    if (value !== undefined && name in flags && flags[name as FlagName].kind === "bool") {
      const v = value.trim().toLowerCase();
      if (["0", "f", "false"].includes(v)) return `--no-${name}`;
      if (["1", "t", "true"].includes(v)) return `--${name}`;
    }
    return value === undefined ? `--${name}` : `--${name}=${value}`;
  });
}

/**
 * parseDuration reads a Go-style duration ("2s", "1500ms", "1m30s", "0") into
 * milliseconds; undefined when it is not one.
 */
export function parseDuration(s: string): number | undefined {
  const units: Record<string, number> = { ns: 1e-6, us: 1e-3, "µs": 1e-3, ms: 1, s: 1_000, m: 60_000, h: 3_600_000 };
  const text = s.trim();
  if (text === "0") {
    return 0;
  }
  const part = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)/y;
  let ms = 0;
  let at = 0;
  while (at < text.length) {
    part.lastIndex = at;
    const m = part.exec(text);
    if (!m) {
      return undefined;
    }
    ms += Number(m[1]) * units[m[2]!]!;
    at = part.lastIndex;
  }
  return at > 0 ? ms : undefined;
}

function isLoopback(address: string): boolean {
  const host = address.replace(/^https?:\/\//, "").replace(/:\d+$/, "").replace(/^\[|\]$/g, "");
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

function usage(): string {
  const lines = [
    "Usage: refund-worker [flags]",
    "",
    "Works refund jobs from a jobfence coordinator against a payment provider until SIGTERM (then drains).",
    "Every flag falls back to the environment variable REFUNDWORKER_<FLAG> (upper case, '-' as '_'),",
    "e.g. REFUNDWORKER_COORDINATOR. Boolean flags also take --no-<flag>.",
    "",
  ];
  for (const [name, spec] of Object.entries(flags) as Array<[string, FlagSpec]>) {
    const dflt = spec.default === "" ? "" : ` (default ${spec.default})`;
    lines.push(`  --${name}${spec.kind === "bool" ? "" : ` <${spec.kind}>`}`, `        ${spec.usage}${dflt}`);
  }
  return lines.join("\n");
}

// ---------------------------------------------------------------------------
// Logging: JSON lines on stderr.

const levels = { debug: 0, info: 1, warn: 2, error: 3 } as const;
type Level = keyof typeof levels;

/** Logger writes one JSON object per line; bigints are written as strings. */
export class Logger {
  constructor(
    private readonly min: Level,
    private readonly base: Record<string, unknown>,
  ) {}

  log(level: Level, msg: string, fields: Record<string, unknown> = {}): void {
    if (levels[level] < levels[this.min]) {
      return;
    }
    const rec = { time: new Date().toISOString(), level, msg, ...this.base, ...fields };
    process.stderr.write(`${JSON.stringify(rec, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v))}\n`);
  }
}

// ---------------------------------------------------------------------------
// The provider over HTTP

/** ProviderRefund is a refund as the provider reports it. */
export interface ProviderRefund {
  id: string;
  payment_id: string;
  merchant_reference: string;
  status: "pending" | "succeeded" | "failed" | string;
  failure_reason?: string;
}

/**
 * NoReplyError: no complete HTTP reply came (connection refused or cut, the
 * call's signal aborted, a truncated body). The request may or may not have
 * been processed: the outcome is unknown (T3).
 */
export class NoReplyError extends Error {}

/** ProviderStatusError is an error reply; `code` is the provider's error code. */
export class ProviderStatusError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(`provider: ${status} ${code}: ${message}`);
  }
}

interface Reply {
  status: number;
  body: string;
}

/**
 * ProviderClient talks to the fake provider's refunds API. Each call sends
 * exactly one HTTP request: nothing in it repeats a request, whatever the
 * answer (or its absence).
 */
export class ProviderClient {
  private readonly base: URL;
  private readonly agent: http.Agent;
  private readonly transport: typeof http | typeof https;

  constructor(baseUrl: string, maxSockets: number) {
    this.base = new URL(baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`);
    const secure = this.base.protocol === "https:";
    this.transport = secure ? https : http;
    this.agent = secure ? new https.Agent({ keepAlive: true, maxSockets }) : new http.Agent({ keepAlive: true, maxSockets });
  }

  /**
   * createRefund POSTs /v1/refunds under the operation key (R1): it is the
   * Idempotency-Key and the merchant reference; the attempt is never sent (R2).
   */
  async createRefund(
    operationKey: string,
    p: { paymentId: string; amountMinor: bigint; currency: string },
    signal: AbortSignal,
  ): Promise<ProviderRefund> {
    // Built by hand so that the int64 amount stays exact (JSON.stringify has no bigint).
    const body = `{"payment_id":${JSON.stringify(p.paymentId)},"amount_minor":${p.amountMinor.toString()},` +
      `"currency":${JSON.stringify(p.currency)},"merchant_reference":${JSON.stringify(operationKey)}}`;
    const reply = await this.request("POST", "v1/refunds", signal, body, { "Idempotency-Key": operationKey });
    return decode<ProviderRefund>(reply);
  }

  /** findByReference lists the visible refunds under a merchant reference, oldest first. */
  async findByReference(merchantReference: string, signal: AbortSignal): Promise<ProviderRefund[]> {
    const reply = await this.request("GET", `v1/refunds?merchant_reference=${encodeURIComponent(merchantReference)}`, signal);
    return decode<{ data: ProviderRefund[] | null }>(reply).data ?? [];
  }

  /** getRefund returns one refund, or undefined on 404 (which under lookup lag proves nothing). */
  async getRefund(id: string, signal: AbortSignal): Promise<ProviderRefund | undefined> {
    const reply = await this.request("GET", `v1/refunds/${encodeURIComponent(id)}`, signal);
    if (reply.status === 404) {
      return undefined;
    }
    return decode<ProviderRefund>(reply);
  }

  /** close ends the idle keep-alive connections. */
  close(): void {
    this.agent.destroy();
  }

  private request(method: string, path: string, signal: AbortSignal, body?: string, headers: Record<string, string> = {}): Promise<Reply> {
    const url = new URL(path, this.base);
    return new Promise<Reply>((resolve, reject) => {
      const fail = (why: string, cause?: unknown): void =>
        reject(new NoReplyError(`provider: no reply to ${method} ${url.pathname}: ${why}`, { cause }));
      if (signal.aborted) {
        fail("cancelled before sending", signal.reason);
        return;
      }
      const req = this.transport.request(url, {
        method,
        agent: this.agent,
        signal,
        headers: {
          Accept: "application/json",
          ...(body === undefined ? {} : { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) }),
          ...headers,
        },
      });
      req.on("error", (err) => fail(err.message, err));
      req.on("response", (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("error", (err) => fail(`reading the reply: ${err.message}`, err));
        res.on("close", () => {
          if (!res.complete) {
            fail("connection closed inside the reply");
            return;
          }
          resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") });
        });
      });
      req.end(body);
    });
  }
}

function decode<T>(reply: Reply): T {
  if (reply.status >= 300) {
    let code = "";
    let message = reply.body.trim();
    try {
      const e = (JSON.parse(reply.body) as { error?: { code?: string; message?: string } }).error;
      code = e?.code ?? "";
      message = e?.message ?? message;
    } catch {
      // not the provider's error shape; keep the raw text
    }
    throw new ProviderStatusError(reply.status, code, message);
  }
  try {
    return JSON.parse(reply.body) as T;
  } catch (err) {
    // A reply we cannot read tells nothing: unknown outcome.
    throw new Error(`provider: unreadable reply: ${(err as Error).message}`);
  }
}

// ---------------------------------------------------------------------------
// Handlers: provider answers → ProviderResult

/** resultOf reads one provider refund (R4: pending is not success). Throws on an unknown status. */
export function resultOf(r: ProviderRefund): ProviderResult {
  switch (r.status) {
    case "succeeded":
      return { kind: "succeeded", providerRefundId: r.id };
    case "pending":
      return { kind: "pending", detail: `refund ${r.id} pending` };
    case "failed":
      return { kind: "failed", reason: `refund ${r.id} ${r.failure_reason || "failed"}` };
  }
  throw new Error(`provider: refund ${r.id} in unknown status ${JSON.stringify(r.status)}`);
}

/**
 * reconcileResult turns what the provider holds under one operation key
 * into an answer: one live refund → its status; several → a person looks;
 * only failed ones → failed; none → not_found, which proves nothing (R14).
 */
export function reconcileResult(found: ProviderRefund[]): ProviderResult {
  const live = found.filter((r) => r.status !== "failed");
  if (live.length > 1) {
    return { kind: "escalate", reason: `provider shows ${live.length} live refunds for this operation key: ${live.map((r) => r.id).join(", ")}` };
  }
  if (live.length === 1) {
    return resultOf(live[0]!);
  }
  if (found.length > 0) {
    return resultOf(found[found.length - 1]!);
  }
  return { kind: "not_found", detail: "no refund under this merchant reference" };
}

/** handlers returns the Worker's refund and reconcile handlers for the provider. */
export function handlers(pay: ProviderClient): { refund(job: WorkerJob): Promise<ProviderResult>; reconcile(job: WorkerJob): Promise<ProviderResult> } {
  return {
    async refund(job) {
      try {
        const r = await pay.createRefund(
          job.operationKey,
          { paymentId: job.job.paymentId, amountMinor: job.job.amountMinor, currency: job.job.currency },
          job.signal,
        );
        return resultOf(r);
      } catch (err) {
        if (err instanceof ProviderStatusError && err.code === "idempotency_key_reused") {
          // The key was used for a different refund: the binding of R1 broke.
          return { kind: "escalate", reason: "provider: Idempotency-Key already used with different parameters (R1)" };
        }
        if (err instanceof ProviderStatusError && err.status >= 400 && err.status < 500) {
          // Refused as invalid: nothing is stored under the key.
          return { kind: "failed", reason: err.message };
        }
        // No reply, 5xx (a real provider does not promise it did nothing):
        // the outcome is unknown (R14).
        throw err;
      }
    },
    async reconcile(job) {
      const found = await pay.findByReference(job.operationKey, job.signal);
      // R15: receipts already filed for the job name refund ids; verify the
      // ones the lookup did not return.
      for (const o of job.claimed.observations) {
        const id = o.providerRefundId;
        if (id === "" || found.some((f) => f.id === id)) {
          continue;
        }
        const r = await pay.getRefund(id, job.signal);
        if (r !== undefined && r.merchant_reference === job.operationKey) {
          found.push(r);
        }
      }
      return reconcileResult(found);
    },
  };
}

// ---------------------------------------------------------------------------
// Counters (M1)

/** Stats counts what the worker did, logged when it stops. */
export interface Stats {
  claimed: number;
  takeovers: number;
  reconciles: number;
  completed: number;
  rescheduled: number;
  escalated: number;
  replayed: number;
  stale_rejected: number;
  observations: number;
  unknown_outcomes: number;
  provider_deadlines: number;
  resends_refused: number;
  write_failures: number;
  /**
   * Failed claims: Claim calls (with --no-stream) and worker streams that
   * ended with an error or could not open, as the Go and Python workers
   * count them (WorkerStats.ClaimFailures, claim_failures). Each is tried
   * again; a Claim whose outcome is unknown granted nothing to act on (R7).
   */
  claim_failures: number;
  spooled: number;
  refiled: number;
  renewals: number;
  renew_failures: number;
  grants_lost: number;
  /**
   * Worker streams that ended while the worker ran, each opened again: the
   * failed ones (also in claim_failures) and those the coordinator ended
   * cleanly.
   */
  stream_ends: number;
}

/** newStats is every counter at 0. */
export function newStats(): Stats {
  return {
    claimed: 0, takeovers: 0, reconciles: 0, completed: 0, rescheduled: 0, escalated: 0, replayed: 0,
    stale_rejected: 0, observations: 0, unknown_outcomes: 0, provider_deadlines: 0, resends_refused: 0, write_failures: 0, claim_failures: 0,
    spooled: 0, refiled: 0, renewals: 0, renew_failures: 0, grants_lost: 0, stream_ends: 0,
  };
}

// jobFields names a job and its grant in a log line: the grant's fingerprint
// (R25), never its lease token, which no WorkerEvent carries.
function jobFields(e: JobIds): Record<string, unknown> {
  return { job_id: e.jobId, operation_key: e.operationKey, attempt: e.attempt, grant: e.grant };
}

/** track counts e in stats and logs it. */
export function track(stats: Stats, log: Logger, e: WorkerEvent): void {
  switch (e.type) {
    case "claimed":
      stats.claimed++;
      if (e.takeover) stats.takeovers++;
      if (e.nextAction !== NextAction.REFUND) stats.reconciles++;
      log.log(e.takeover ? "info" : "debug", e.takeover ? "job taken over" : "job claimed", {
        ...jobFields(e), next_action: NextAction[e.nextAction],
      });
      return;
    case "written": {
      const d = e.decision;
      if (e.replayed) stats.replayed++;
      if (d.kind === "complete") stats.completed++;
      else if (d.kind === "reschedule") stats.rescheduled++;
      else stats.escalated++;
      const fields = { ...jobFields(e), replayed: e.replayed };
      if (d.kind === "complete") log.log("debug", "job completed", { ...fields, provider_refund_id: d.providerRefundId });
      else if (d.kind === "reschedule") log.log("info", "job rescheduled", { ...fields, next_action: NextAction[d.nextAction], delay_ms: d.delayMs, reason: d.reason });
      else log.log("warn", "job escalated to manual review", { ...fields, reason: d.reason });
      return;
    }
    case "stale":
      stats.stale_rejected++;
      log.log("info", "write-back rejected by the fence; filing the answer as an observation", {
        ...jobFields(e), reason: e.error.reason,
        current_attempt: e.error.currentAttempt, decision: e.decision.kind,
        provider_refund_id: e.decision.kind === "complete" ? e.decision.providerRefundId : "",
      });
      return;
    case "observation":
      if (!e.duplicate) stats.observations++;
      log.log("info", "observation filed", {
        ...jobFields(e), duplicate: e.duplicate, attempt_verified: e.attemptVerified,
        outcome: ObservationOutcome[e.outcome], provider_refund_id: e.providerRefundId,
      });
      return;
    case "handler_error":
      stats.unknown_outcomes++;
      log.log("info", "provider call failed; outcome unknown", { ...jobFields(e), error: errorText(e.error) });
      return;
    case "resend_refused":
      stats.resends_refused++;
      log.log("warn", "same-key resend refused before sending; escalating", { ...jobFields(e), reason: e.reason });
      return;
    case "provider_deadline":
      stats.provider_deadlines++;
      log.log("warn", "provider call outlived its deadline; outcome unknown", jobFields(e));
      return;
    case "write_retry":
      log.log("warn", "write-back repeated after UNAVAILABLE (R21)", { ...jobFields(e), retry: e.retry, error: e.error.message });
      return;
    case "write_failed":
      stats.write_failures++;
      log.log("warn", "write-back failed; the lease will lapse and a takeover reconciles", { ...jobFields(e), error: e.error.message });
      return;
    case "observation_failed":
      log.log("error", "observation not filed: the provider's answer is only in this log", {
        ...jobFields(e), error: e.error.message, code: e.error.code, reason: e.error.reason,
        ...(e.spoolError === undefined ? {} : { spool_error: errorText(e.spoolError) }),
      });
      return;
    case "spooled":
      stats.spooled++;
      log.log("warn", "observation not filed; spooled, to be filed when the coordinator takes it (R28)", {
        ...jobFields(e), error: e.error.message, spool: e.spool, outcome: ObservationOutcome[e.outcome], provider_refund_id: e.providerRefundId,
      });
      return;
    case "refiled":
      stats.refiled++;
      if (!e.duplicate) stats.observations++;
      log.log("info", "spooled receipt filed", {
        ...jobFields(e), duplicate: e.duplicate, attempt_verified: e.attemptVerified,
        outcome: ObservationOutcome[e.outcome], provider_refund_id: e.providerRefundId,
      });
      return;
    case "spool_error":
      log.log("error", "receipt spool", { spool: e.spool, error: errorText(e.error) });
      return;
    case "renewed":
      stats.renewals++;
      log.log("debug", "lease renewed", {
        ...jobFields(e), lease_until: e.leaseUntil.toISOString(), grant_expires_at: e.grantExpiresAt?.toISOString() ?? "",
        ...(e.receiptFiledAt === undefined ? {} : { receipt_filed_at: e.receiptFiledAt.toISOString() }),
      });
      return;
    case "grant_lost":
      stats.grants_lost++;
      log.log("warn", "grant lost: the provider call is cancelled and nothing new is sent (R27)", {
        ...jobFields(e), reason: e.reason, error: e.error.message,
      });
      return;
    case "grant_too_old":
      log.log("warn", "grant too old to renew; it holds until its lease runs out and a takeover commits (R27, R8)", {
        ...jobFields(e), grant_expires_at: e.grantExpiresAt?.toISOString() ?? "",
      });
      return;
    case "renewal_failed":
      stats.renew_failures++;
      log.log("warn", "lease renewal failed; tried again sooner, nothing aborted (R27)", {
        jobs: e.grants.length, retry_in_ms: e.retryInMs, error: e.error.message, code: e.error.code, reason: e.error.reason,
      });
      return;
    case "claim_failed":
      stats.claim_failures++;
      log.log("warn", "claim failed; nothing acted on (R7)", { error: e.error.message, reason: e.error.reason });
      return;
    case "stream_ended":
      stats.stream_ends++;
      if (e.error !== undefined) stats.claim_failures++;
      log.log(e.error === undefined ? "info" : "warn", "worker stream ended; opening it again", {
        retry_in_ms: e.retryInMs,
        ...(e.error === undefined ? {} : { error: e.error.message, code: e.error.code, reason: e.error.reason }),
      });
      return;
    case "stream_unsupported":
      log.log("info", "the coordinator has no worker stream; claiming with Claim calls", { error: e.error.message });
      return;
    case "budget_exhausted":
      log.log("debug", "provider budget exhausted; work is offered again after the wait (R19)", { retry_after_ms: e.retryAfterMs });
      return;
  }
}

function errorText(err: unknown): string {
  if (!(err instanceof Error)) {
    return String(err);
  }
  const cause = err.cause instanceof Error ? `: ${err.cause.message}` : "";
  return err.message.endsWith(cause.slice(2)) ? err.message : `${err.message}${cause}`;
}

// ---------------------------------------------------------------------------
// main

async function main(): Promise<number> {
  let cfg: Config | "help";
  try {
    cfg = parseConfig(process.argv.slice(2), process.env);
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`refund-worker: ${err.message}\n\n${usage()}\n`);
      return 2;
    }
    throw err;
  }
  if (cfg === "help") {
    process.stdout.write(`${usage()}\n`);
    return 0;
  }
  const c = cfg;
  const log = new Logger(c.logLevel, { worker_id: c.workerId });
  // R35: spans only when the OTEL_* variables ask for them.
  let tracing: ExampleTracing;
  try {
    tracing = await setupTracing();
  } catch (err) {
    if (err instanceof TracingConfigError) {
      process.stderr.write(`refund-worker: ${err.message}\n`);
      return 2;
    }
    throw err;
  }
  log.log("info", "tracing", tracing.describe);

  let tls: TLSOptions | undefined;
  if (c.useTLS) {
    tls = c.tlsCA === "" ? true : { ca: readFileSync(c.tlsCA) };
  }
  const client = new CoordinatorClient({
    address: c.coordinator,
    tls,
    token: c.tokenFile === "" ? undefined : () => readFileSync(c.tokenFile, "utf8").trim(),
    defaultTimeoutMs: c.callTimeoutMs,
  });
  const pay = new ProviderClient(c.provider, c.concurrency);
  const stats = newStats();
  const worker = new Worker({
    client,
    workerId: c.workerId,
    handlers: handlers(pay),
    concurrency: c.concurrency,
    leaseMs: c.leaseMs,
    renewLeases: !c.noLeaseRenewal,
    noStream: c.noStream,
    renewIntervalMs: c.renewIntervalMs === 0 ? undefined : c.renewIntervalMs,
    provider: c.providerName,
    providerCallTimeoutMs: c.providerTimeoutMs,
    sameKeyResendSafe: c.sameKeyResends,
    resendMarginMs: c.resendMarginMs,
    pendingDelayMs: c.pendingDelayMs,
    unknownOutcomeDelayMs: c.unknownDelayMs,
    claimWaitMs: c.claimWaitMs,
    receiptSpool: c.receiptSpool,
    tracerProvider: tracing.provider,
    onEvent: (e) => track(stats, log, e),
  });

  const signalled = new Promise<NodeJS.Signals>((resolve) => {
    const first = (sig: NodeJS.Signals): void => {
      resolve(sig);
      // A second signal does not wait for the drain.
      const again = (s: NodeJS.Signals): void => {
        log.log("warn", "second signal: exiting without draining", { signal: s });
        process.exit(1);
      };
      process.once("SIGTERM", again);
      process.once("SIGINT", again);
    };
    process.once("SIGTERM", first);
    process.once("SIGINT", first);
  });

  worker.start();
  log.log("info", "refund-worker started", {
    coordinator: c.coordinator, provider: c.provider, provider_name: c.providerName, concurrency: c.concurrency,
    lease_ms: c.leaseMs, lease_renewal: !c.noLeaseRenewal, worker_stream: !c.noStream, provider_timeout_ms: c.providerTimeoutMs,
    pid: process.pid,
  });

  const sig = await signalled;
  log.log("info", "draining: no more claims; finishing the jobs in flight", { signal: sig, in_flight: worker.inFlight });
  let timer: NodeJS.Timeout | undefined;
  const drained = await Promise.race([
    worker.stop().then(() => true),
    new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), c.drainTimeoutMs);
    }),
  ]);
  clearTimeout(timer);
  if (!drained) {
    // Their leases expire and a takeover reconciles them (R6, R14).
    log.log("warn", "drain timeout: jobs still in flight are cut off", { in_flight: worker.inFlight });
  }
  client.close();
  pay.close();
  try {
    await tracing.shutdown(); // the spans still queued
  } catch (err) {
    log.log("warn", "tracing: spans not exported", { error: err instanceof Error ? err.message : String(err) });
  }
  log.log("info", "refund-worker stopped", { drained, stats });
  return drained ? 0 : 1;
}

// Run main only when executed, not when imported (the tests import the
// pure parts).
if (process.argv[1] !== undefined && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().then(
    (code) => process.exit(code),
    (err: unknown) => {
      process.stderr.write(`refund-worker: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exit(1);
    },
  );
}
