// A real coordinator process on a fresh MariaDB/MySQL database, per test file.
//
// MySQL is mandatory: when the server cannot be reached the tests fail, never
// skip. The coordinator binary comes from JOBFENCE_COORDINATOR_BIN, or is built
// from the repository with `go build`. JOBFENCE_TEST_MYSQL_DSN names another
// server (default root@tcp(127.0.0.1:3306)/), as for the Go tests.

import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { after } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import {
  CoordinatorClient,
  FencedWriteError,
  InvalidArgumentError,
  type CoordinatorClientOptions,
  type CoordinatorError,
  type EnqueueRefundInit,
} from "../src/index.js";

const run = promisify(execFile);

// dist/test/harness.js → the repository root.
const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");

interface MySQLServer {
  user: string;
  password: string;
  host: string;
  port: string;
}

function mysqlServer(): MySQLServer {
  const dsn = process.env.JOBFENCE_TEST_MYSQL_DSN || "root@tcp(127.0.0.1:3306)/";
  const m = /^([^:@]*)(?::([^@]*))?@tcp\(([^:)]+)(?::(\d+))?\)\//.exec(dsn);
  if (!m) {
    throw new Error(`JOBFENCE_TEST_MYSQL_DSN ${JSON.stringify(dsn)} is not user[:password]@tcp(host:port)/`);
  }
  return { user: m[1]!, password: m[2] ?? "", host: m[3]!, port: m[4] ?? "3306" };
}

/** mysql runs statements with the mysql CLI and returns its tab-separated output. */
export async function mysql(sql: string, database?: string): Promise<string> {
  const s = mysqlServer();
  const args = [`-h${s.host}`, `-P${s.port}`, `-u${s.user}`, "--batch", "--skip-column-names", "-e", sql];
  if (database) {
    args.push(database);
  }
  const env = { ...process.env, MYSQL_PWD: s.password };
  try {
    const { stdout } = await run("mysql", args, { env, timeout: 30_000 });
    return stdout;
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`MySQL is required for these tests and the statement failed at ${s.host}:${s.port}: ` +
      `${e.stderr?.trim() || e.message}\n(start MariaDB, or set JOBFENCE_TEST_MYSQL_DSN)`);
  }
}

const built = new Map<string, Promise<string>>();

/**
 * goBinary returns the binary named by the environment variable envVar, or
 * builds ./cmd/<name> of the repository once per process.
 */
export function goBinary(name: string, envVar: string): Promise<string> {
  const fromEnv = process.env[envVar];
  if (fromEnv) {
    return Promise.resolve(fromEnv);
  }
  let bin = built.get(name);
  if (bin === undefined) {
    bin = (async () => {
      const dir = await mkdtemp(path.join(tmpdir(), `jobfence-${name}-`));
      const out = path.join(dir, name);
      process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
      await run("go", ["build", "-o", out, `./cmd/${name}`], { cwd: repoRoot, timeout: 300_000 });
      return out;
    })();
    built.set(name, bin);
  }
  return bin;
}

/** coordinatorBinary returns JOBFENCE_COORDINATOR_BIN or builds ./cmd/coordinator once per process. */
export function coordinatorBinary(): Promise<string> {
  return goBinary("coordinator", "JOBFENCE_COORDINATOR_BIN");
}

/** Coordinator is a running coordinator process on its own database. */
export interface Coordinator {
  /** host:port the coordinator listens on. */
  address: string;
  database: string;
  /** Log lines the process wrote, parsed. */
  logs: Array<Record<string, unknown>>;
  client(opts?: Partial<CoordinatorClientOptions>): CoordinatorClient;
  /** sql runs statements on the coordinator's database. */
  sql(statement: string): Promise<string>;
  /** expireLease ends a running job's lease in test data (T1: never by moving a clock). */
  expireLease(jobId: bigint): Promise<void>;
  /** signal sends a signal (SIGSTOP, SIGCONT…) to the coordinator process. */
  signal(sig: NodeJS.Signals): void;
  /**
   * restart kills the coordinator process (SIGKILL: nothing drains, every
   * connection is cut) and starts a new one on the same database, address
   * and arguments. Clients made by client() reconnect on their own.
   */
  restart(): Promise<void>;
  /**
   * metric reads the coordinator's /metrics (it must run with
   * --metrics-listen): the sum of the samples of metric `name` that carry
   * every label given, e.g. `metric("grpc_server_handled_total",
   * {grpc_method: "Claim"})`; 0 when there is none.
   */
  metric(name: string, labels?: Record<string, string>): Promise<number>;
  stop(): Promise<void>;
}

/**
 * startCoordinator creates a fresh database, starts the coordinator on it at
 * 127.0.0.1:0 and reads the address from its "coordinator serving" log line.
 */
export async function startCoordinator(extraArgs: string[] = []): Promise<Coordinator> {
  const bin = await coordinatorBinary();
  const database = `jobfence_node_${randomBytes(6).toString("hex")}`;
  await mysql(`CREATE DATABASE \`${database}\``);
  const s = mysqlServer();
  const dsn = `${s.user}${s.password ? `:${s.password}` : ""}@tcp(${s.host}:${s.port})/${database}`;
  const logs: Array<Record<string, unknown>> = [];
  const clients: CoordinatorClient[] = [];
  const launch = async (listen: string): Promise<{ proc: ChildProcess; address: string }> => {
    const proc = spawn(bin, ["--listen", listen, "--log-format", "json", "--mysql-dsn", dsn, ...extraArgs], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    try {
      return { proc, address: await serving(proc, logs) };
    } catch (err) {
      proc.kill("SIGKILL");
      throw err;
    }
  };
  let proc: ChildProcess;
  let address: string;
  try {
    ({ proc, address } = await launch("127.0.0.1:0"));
  } catch (err) {
    await mysql(`DROP DATABASE IF EXISTS \`${database}\``).catch(() => undefined);
    throw err;
  }
  const kill = async (sig: NodeJS.Signals): Promise<void> => {
    if (proc.exitCode === null && proc.signalCode === null) {
      const exited = new Promise((resolve) => proc.once("exit", resolve));
      proc.kill("SIGCONT");
      proc.kill(sig);
      const timer = setTimeout(() => proc.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(timer);
    }
  };
  return {
    address,
    database,
    logs,
    client(opts) {
      const c = new CoordinatorClient({ address, defaultTimeoutMs: 15_000, ...opts });
      clients.push(c);
      return c;
    },
    sql: (statement) => mysql(statement, database),
    // A running job's next_attempt_at is its lease end and moves with it:
    // claims find expired leases by it (DESIGN.md, "One index for due work
    // and expired leases").
    async expireLease(jobId) {
      await mysql(`UPDATE refund_jobs SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, ` +
        `next_attempt_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ${jobId} AND state = 'running'`, database);
    },
    signal(sig) {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill(sig);
      }
    },
    async restart() {
      await kill("SIGKILL");
      // The port is free again once the process is gone; the new one takes it.
      ({ proc } = await launch(address));
    },
    async metric(name, labels = {}) {
      let rec: Record<string, unknown> | undefined;
      await eventually(() => {
        rec = [...logs].reverse().find((r) => r["msg"] === "metrics serving");
        if (rec === undefined) {
          throw new Error("the coordinator serves no metrics: start it with --metrics-listen");
        }
      }, 5_000);
      const text = await (await fetch(`http://${String(rec!["listen"])}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
      let sum = 0;
      for (const line of text.split("\n")) {
        const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
        if (m === null || m[1] !== name) {
          continue;
        }
        const has = new Set((m[2] ?? "").match(/\w+="(?:[^"\\]|\\.)*"/g) ?? []);
        if (Object.entries(labels).every(([k, v]) => has.has(`${k}=${JSON.stringify(v)}`))) {
          sum += Number(m[3]);
        }
      }
      return sum;
    },
    async stop() {
      for (const c of clients) {
        c.close();
      }
      await kill("SIGTERM");
      await mysql(`DROP DATABASE IF EXISTS \`${database}\``);
    },
  };
}

/**
 * startCoordinators starts a coordinator for each list of extra arguments,
 * all at once (startCoordinator), for the test file that calls it at its top
 * level: they are stopped after the file's tests.
 */
export async function startCoordinators<A extends string[][]>(...extraArgs: A): Promise<{ [K in keyof A]: Coordinator }> {
  const coords = await Promise.all(extraArgs.map((args) => startCoordinator(args)));
  after(async () => {
    await Promise.all(coords.map((c) => c.stop()));
  });
  return coords as { [K in keyof A]: Coordinator };
}

function serving(proc: ChildProcess, logs: Array<Record<string, unknown>>): Promise<string> {
  return new Promise((resolve, reject) => {
    const raw: string[] = [];
    const lines = createInterface({ input: proc.stderr! });
    const timer = setTimeout(() => fail(new Error("coordinator did not log \"coordinator serving\" within 30 s")), 30_000);
    function fail(err: Error): void {
      clearTimeout(timer);
      reject(new Error(`${err.message}\n${raw.join("\n")}`));
    }
    lines.on("line", (line) => {
      raw.push(line);
      let rec: Record<string, unknown>;
      try {
        rec = JSON.parse(line) as Record<string, unknown>;
      } catch {
        return;
      }
      logs.push(rec);
      if (rec["msg"] === "coordinator serving" && typeof rec["listen"] === "string") {
        clearTimeout(timer);
        resolve(rec["listen"]);
      }
    });
    proc.once("error", (err) => fail(err));
    proc.once("exit", (code, signal) => fail(new Error(`coordinator exited (${code ?? signal}) before serving`)));
  });
}

let seq = 0;

/** refund returns a fresh, valid EnqueueRefund request. */
export function refund(overrides: Partial<EnqueueRefundInit> = {}): EnqueueRefundInit {
  seq++;
  const tag = `${process.pid}-${seq}-${randomBytes(3).toString("hex")}`;
  return {
    operationKey: `node-op-${tag}`,
    orderId: `ord-${tag}`,
    paymentId: `pay-${tag}`,
    amountMinor: 4200n,
    currency: "USD",
    // A provider of its own lets a test claim only its jobs.
    provider: `p-${tag}`.toLowerCase(),
    ...overrides,
  };
}

/** eventually polls check until it returns without throwing, or rethrows after timeoutMs. */
export async function eventually(check: () => Promise<void> | void, timeoutMs = 10_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    try {
      await check();
      return;
    } catch (err) {
      if (Date.now() > end) {
        throw err;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/**
 * testSpool is a receipt spool path in a folder of its own, removed when the
 * test process exits: tests reuse worker ids, and must not share the user's
 * cache (R28).
 */
export function testSpool(workerId: string): string {
  const dir = mkdtempSync(path.join(tmpdir(), "jobfence-node-spool-"));
  process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
  return path.join(dir, `${workerId}.receipts.jsonl`);
}

/**
 * BlackholeProxy is a TCP proxy to a coordinator that can blackhole the
 * connections it carries: after blackhole() their sockets stay open and
 * nothing more is forwarded, in either direction, and nothing is closed, as a
 * coordinator host that vanished or a path dropping every packet would (no
 * FIN, no RST): the bytes wait in the kernels' buffers, acknowledged by TCP
 * and never delivered. Connections accepted after it are forwarded normally,
 * as a new connection's path to another replica would be.
 */
export interface BlackholeProxy {
  /** host:port to connect to. */
  address: string;
  /** How many connections it has accepted. */
  accepted(): number;
  /** blackhole stops every connection open now; what they carry from now on is dropped. */
  blackhole(): void;
  close(): Promise<void>;
}

/** startBlackholeProxy proxies a loopback port to target. */
export async function startBlackholeProxy(target: string): Promise<BlackholeProxy> {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  const conns: Array<{ down: net.Socket; up: net.Socket; black: boolean }> = [];
  let accepted = 0;
  const server = net.createServer((down) => {
    accepted++;
    const c = { down, up: net.connect(port, host), black: false };
    conns.push(c);
    const pump = (src: net.Socket, dst: net.Socket): void => {
      src.on("data", (chunk) => {
        if (c.black) {
          src.pause(); // reads no more: the bytes stay in the kernel's buffer
          return;
        }
        dst.write(chunk);
      });
      // A close the blackhole did not make is forwarded as one.
      src.on("end", () => c.black || dst.end());
      src.on("error", () => c.black || dst.destroy());
      src.on("close", () => c.black || dst.destroy());
    };
    pump(down, c.up);
    pump(c.up, down);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    address: `127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    accepted: () => accepted,
    blackhole() {
      for (const c of conns) {
        c.black = true;
        c.down.pause();
        c.up.pause();
      }
    },
    async close() {
      for (const c of conns) {
        c.down.destroy();
        c.up.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * describeError is what a client can tell of an error: class, code, reason,
 * message, metadata, field violations and where a fenced job stands — equal
 * for two errors decoded alike (R24).
 */
export function describeError(e: CoordinatorError) {
  return {
    class: e.constructor.name,
    code: e.code,
    reason: e.reason,
    message: e.message,
    metadata: e.metadata,
    fields: e instanceof InvalidArgumentError ? e.fieldViolations : [],
    current: e instanceof FencedWriteError ? [e.jobId, e.attempt, e.currentAttempt, e.currentState] : [],
  };
}
