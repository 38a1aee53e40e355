// The receipt spool (R28): an append-only file of the receipts a Worker could
// not file, one JSON line each, so that a receipt outlives the process. The
// lines and the lock are the Go SDK's (clients/go/jobfence/spool.go;
// clients/spec/spool.json pins them): either SDK reads the other's spool.

import { createHash } from "node:crypto";
import {
  closeSync,
  constants,
  fchmodSync,
  fsyncSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { homedir } from "node:os";
import path from "node:path";

import { ObservationOutcome } from "./gen/jobfence/v1/coordinator_pb.js";

/** ReceiptSpoolOff, as `WorkerOptions.receiptSpool`, turns the spool off: a receipt the coordinator does not take is then only reported (event `observation_failed`). */
export const ReceiptSpoolOff = "off";

/**
 * The spool's bounds: a spooled receipt is a few hundred bytes (about 5 KB
 * at most), so 10,000 hold hours of a busy worker's late receipts while the
 * coordinator is away, and 16 MiB caps the worst case (a refile pass reads
 * the whole file). Past either, a receipt is refused and reported.
 */
export const MaxSpooledReceipts = 10_000;
export const MaxReceiptSpoolBytes = 16 * 1024 * 1024;
/** How often a Worker files its spool again. */
export const ReceiptRefileIntervalMs = 30_000;

/** ReceiptSpoolLockedError: another worker (the same id on this machine) holds the spool. */
export class ReceiptSpoolLockedError extends Error {
  /** The holder's pid, as its lock file names it. */
  readonly pid: number;

  constructor(spool: string, pid: number) {
    super(`receipt spool ${spool} is in use by another worker (pid ${pid}): give each worker its own workerId or receiptSpool`);
    this.name = "ReceiptSpoolLockedError";
    this.pid = pid;
  }
}

/** SpoolFullError: the receipt would pass MaxSpooledReceipts or MaxReceiptSpoolBytes. */
export class SpoolFullError extends Error {
  constructor(count: number, bytes: number, maxCount: number, maxBytes: number) {
    super(`receipt spool full: ${count} receipts, ${bytes} bytes (bounds ${maxCount}, ${maxBytes})`);
    this.name = "SpoolFullError";
  }
}

/** The version of a spooled line; a line of another version is kept as it is. */
const spoolFormat = 1;

/**
 * SpooledReceipt is one receipt as spooled: everything ReportObservation
 * needs to file it again with the same dedupe key (job, attempt, source,
 * outcome, provider refund id; the provider event id alone when set, R15).
 * `leaseToken` is the grant's secret (R25): the file is 0600 and nothing
 * reports it.
 */
export interface SpooledReceipt {
  jobId: bigint;
  operationKey: string;
  attempt: bigint;
  leaseToken: string;
  source: string;
  outcome: ObservationOutcome;
  providerRefundId: string;
  providerEventId: string;
  detail: string;
  /** This machine's clock, for people; never for a decision (R12). */
  spooledAt: string;
}

const outcomeNames: ReadonlyArray<[ObservationOutcome, string]> = [
  [ObservationOutcome.SUCCEEDED, "succeeded"],
  [ObservationOutcome.PENDING, "pending"],
  [ObservationOutcome.FAILED, "failed"],
  [ObservationOutcome.NOT_FOUND, "not_found"],
];

/** encodeReceipt is the receipt's line, without its newline, as the Go SDK writes it (int64s as strings). */
export function encodeReceipt(r: SpooledReceipt): string {
  return JSON.stringify({
    v: spoolFormat,
    job_id: r.jobId.toString(),
    operation_key: r.operationKey,
    attempt: r.attempt.toString(),
    lease_token: r.leaseToken,
    source: r.source,
    outcome: outcomeNames.find(([o]) => o === r.outcome)?.[1] ?? "",
    provider_refund_id: r.providerRefundId,
    provider_event_id: r.providerEventId,
    detail: r.detail,
    spooled_at: r.spooledAt,
  });
}

/** decodeReceipt reads a line; undefined when it is not a receipt this version reads. */
export function decodeReceipt(line: string): SpooledReceipt | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(line);
  } catch {
    return undefined;
  }
  if (typeof parsed !== "object" || parsed === null) {
    return undefined;
  }
  const o = parsed as Record<string, unknown>;
  const str = (k: string): string | undefined => (typeof o[k] === "string" ? (o[k] as string) : undefined);
  const int = (k: string): bigint | undefined => {
    const s = str(k);
    return s !== undefined && /^-?\d+$/.test(s) ? BigInt(s) : undefined;
  };
  const outcome = outcomeNames.find(([, n]) => n === o["outcome"])?.[0];
  const r = {
    jobId: int("job_id"),
    operationKey: str("operation_key") ?? "",
    attempt: int("attempt"),
    leaseToken: str("lease_token") ?? "",
    source: str("source"),
    outcome,
    providerRefundId: str("provider_refund_id") ?? "",
    providerEventId: str("provider_event_id") ?? "",
    detail: str("detail") ?? "",
    spooledAt: str("spooled_at") ?? "",
  };
  if (o["v"] !== spoolFormat || r.jobId === undefined || r.attempt === undefined || r.source === undefined ||
    r.outcome === undefined) {
    return undefined;
  }
  return r as SpooledReceipt;
}

/**
 * defaultReceiptSpool is the spool of a worker with this id when
 * `receiptSpool` is not set: `$XDG_CACHE_HOME/jobfence/<name>.receipts.jsonl`,
 * or `~/.cache/jobfence/…` without it, where name is the id with every byte
 * outside [A-Za-z0-9._-] (and a leading dot) replaced by `_`, cut to 100
 * bytes, and followed by `-` and 12 hex digits of the id's SHA-256 whenever
 * it differs from the id — the Go SDK's name for the same id. Throws when
 * neither $XDG_CACHE_HOME nor a home folder is known, or $XDG_CACHE_HOME is
 * relative.
 */
export function defaultReceiptSpool(workerId: string, env: NodeJS.ProcessEnv = process.env): string {
  let cache = env["XDG_CACHE_HOME"] ?? "";
  if (cache !== "" && !path.isAbsolute(cache)) {
    throw new Error("receipt spool: $XDG_CACHE_HOME is relative (set receiptSpool to a file, or to \"off\")");
  }
  if (cache === "") {
    const home = homedir();
    if (home === "") {
      throw new Error("receipt spool: neither $XDG_CACHE_HOME nor a home folder is set (set receiptSpool to a file, or to \"off\")");
    }
    cache = path.join(home, ".cache");
  }
  return path.join(cache, "jobfence", spoolFileName(workerId));
}

/** spoolFileName is the file name of a worker id's spool (see defaultReceiptSpool). */
export function spoolFileName(workerId: string): string {
  const id = Buffer.from(workerId, "utf8");
  const b = Buffer.from(id);
  for (let i = 0; i < b.length; i++) {
    const c = b[i]!;
    const ok = (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || (c >= 0x30 && c <= 0x39) || c === 0x5f || c === 0x2d ||
      (c === 0x2e && i > 0);
    if (!ok) {
      b[i] = 0x5f;
    }
  }
  let name = b.toString("latin1");
  if (!b.equals(id) || b.length > 100) {
    name = `${name.slice(0, 100)}-${createHash("sha256").update(id).digest("hex").slice(0, 12)}`;
  }
  return `${name}.receipts.jsonl`;
}

/** SpoolLine is one line as read: `receipt` is undefined when this version cannot read it; the line is then kept as it is. */
export interface SpoolLine {
  raw: string;
  receipt: SpooledReceipt | undefined;
}

// The lock files this process holds: a lock file naming this pid is stale
// unless this process holds it (a previous process with the same pid, as in
// a restarted container).
const heldHere = new Set<string>();

/**
 * ReceiptSpool is the file of receipts a Worker could not file (R28), held
 * under a lock file beside it (`<path>.lock`, created with O_EXCL, holding
 * the holder's pid; stale once that process is gone; a Go worker holds the
 * same file with flock and its pid). Appends are fsynced before they
 * return; a rewrite replaces the file atomically (temp file, fsync, rename,
 * fsync of the folder). A crash at any point leaves every acknowledged
 * receipt in the file, at worst one already filed, which the coordinator
 * deduplicates. Its file calls are synchronous: each is one small write and
 * an fsync, and "written" must mean on disk before the Worker moves on.
 */
export class ReceiptSpool {
  readonly path: string;
  /** Bytes of an unfinished last line the open cut off: a crash in the middle of an append that was never acknowledged. */
  readonly torn: number;
  /** The bounds; MaxSpooledReceipts and MaxReceiptSpoolBytes unless a test says otherwise. */
  maxCount = MaxSpooledReceipts;
  maxBytes = MaxReceiptSpoolBytes;

  private fd: number;
  private count: number;
  private size: number;
  private closed = false;
  private readonly lockPath: string;

  /**
   * open creates the spool (and its folder, 0700) when missing, takes its
   * lock and cuts off a torn last line. Throws ReceiptSpoolLockedError, or
   * the file system's error.
   */
  static open(file: string): ReceiptSpool {
    mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
    const lockPath = `${file}.lock`;
    lock(file, lockPath);
    try {
      return new ReceiptSpool(file, lockPath);
    } catch (err) {
      unlock(lockPath);
      throw err;
    }
  }

  private constructor(file: string, lockPath: string) {
    this.path = file;
    this.lockPath = lockPath;
    rmSync(`${file}.tmp`, { force: true }); // a rewrite a crash left unfinished: the file is still whole
    const fd = openSync(file, constants.O_RDWR | constants.O_CREAT | constants.O_APPEND, 0o600);
    try {
      fchmodSync(fd, 0o600); // the file holds lease tokens (R25), whoever created it
      let data = readFileSync(file);
      const end = data.lastIndexOf(0x0a) + 1;
      this.torn = data.length - end;
      if (this.torn > 0) {
        ftruncateSync(fd, end);
        data = data.subarray(0, end);
      }
      fsyncSync(fd);
      syncDir(path.dirname(file));
      this.fd = fd;
      this.size = data.length;
      this.count = countLines(data);
    } catch (err) {
      closeSync(fd);
      throw err;
    }
  }

  /** pending is how many receipts the file holds. */
  get pending(): number {
    return this.count;
  }

  /** append writes r as one line and fsyncs it. Throws SpoolFullError, or the file system's error (the file is cut back). */
  append(r: SpooledReceipt): void {
    const line = Buffer.from(`${encodeReceipt(r)}\n`, "utf8");
    if (this.closed) {
      throw new Error("receipt spool closed");
    }
    if (this.count >= this.maxCount || this.size + line.length > this.maxBytes) {
      throw new SpoolFullError(this.count, this.size, this.maxCount, this.maxBytes);
    }
    try {
      let at = 0;
      while (at < line.length) {
        at += writeSync(this.fd, line, at);
      }
      fsyncSync(this.fd);
    } catch (err) {
      // Not acknowledged: take it back, so that count and size stay true.
      try {
        ftruncateSync(this.fd, this.size);
      } catch {
        // a torn line is cut at the next open anyway
      }
      throw err;
    }
    this.count++;
    this.size += line.length;
  }

  /** snapshot reads the lines on file and the offset they end at. */
  snapshot(): { lines: SpoolLine[]; upTo: number } {
    if (this.closed) {
      throw new Error("receipt spool closed");
    }
    const data = readFileSync(this.path);
    const lines: SpoolLine[] = [];
    let at = 0;
    for (;;) {
      const nl = data.indexOf(0x0a, at);
      if (nl < 0) {
        break;
      }
      const raw = data.subarray(at, nl).toString("utf8");
      lines.push({ raw, receipt: decodeReceipt(raw) });
      at = nl + 1;
    }
    return { lines, upTo: data.length };
  }

  /**
   * rewrite replaces the file's first upTo bytes (a snapshot) with keep, and
   * keeps what was appended since, atomically. Throws the file system's
   * error, with the old file intact.
   */
  rewrite(upTo: number, keep: string[]): void {
    if (this.closed) {
      throw new Error("receipt spool closed");
    }
    const data = readFileSync(this.path);
    if (upTo > data.length) {
      throw new Error(`the spool shrank under its lock: ${data.length} bytes, snapshot of ${upTo}`);
    }
    const next = Buffer.concat([Buffer.from(keep.map((l) => `${l}\n`).join(""), "utf8"), data.subarray(upTo)]);
    const tmp = `${this.path}.tmp`;
    try {
      const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC, 0o600);
      try {
        let at = 0;
        while (at < next.length) {
          at += writeSync(fd, next, at);
        }
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      renameSync(tmp, this.path);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
    // The rename is durable once the folder is; until then a crash leaves
    // the old file, whose receipts are filed again and deduplicated.
    syncDir(path.dirname(this.path));
    const fd = openSync(this.path, constants.O_RDWR | constants.O_APPEND);
    closeSync(this.fd);
    this.fd = fd;
    this.count = countLines(next);
    this.size = next.length;
  }

  /** close releases the spool; an empty spool's file is removed with it. */
  close(): void {
    if (this.closed) {
      return;
    }
    this.closed = true;
    closeSync(this.fd);
    if (this.count === 0) {
      rmSync(this.path, { force: true });
      syncDir(path.dirname(this.path));
    }
    unlock(this.lockPath);
  }
}

function countLines(data: Buffer): number {
  let n = 0;
  for (let at = data.indexOf(0x0a); at >= 0; at = data.indexOf(0x0a, at + 1)) {
    n++;
  }
  return n;
}

function syncDir(dir: string): void {
  const fd = openSync(dir, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

// lock creates the lock file with O_EXCL and this pid. A lock file whose pid
// is gone (or is this pid, not held by this process) is stale and removed;
// one whose pid lives is another worker's.
function lock(spool: string, lockPath: string): void {
  for (let tries = 0; ; tries++) {
    try {
      const fd = openSync(lockPath, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600);
      try {
        writeSync(fd, `${process.pid}\n`);
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      heldHere.add(lockPath);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST" || tries >= 3) {
        throw err;
      }
    }
    let content: string;
    try {
      content = readFileSync(lockPath, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") {
        continue; // its holder just let go
      }
      throw err;
    }
    const pid = Number.parseInt(content.trim(), 10);
    if (heldHere.has(lockPath) || (Number.isInteger(pid) && pid > 0 && pid !== process.pid && alive(pid))) {
      throw new ReceiptSpoolLockedError(spool, Number.isInteger(pid) ? pid : 0);
    }
    // Stale. Remove it only if it still is the file just read: another
    // worker may have broken it and taken the lock meanwhile.
    try {
      if (readFileSync(lockPath, "utf8") === content) {
        unlinkSync(lockPath);
      }
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") {
        throw err;
      }
    }
  }
}

function unlock(lockPath: string): void {
  heldHere.delete(lockPath);
  rmSync(lockPath, { force: true });
}

// alive: signal 0 reaches the process, or it exists under another user.
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}
