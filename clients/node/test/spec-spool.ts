// spool.json: the receipt spool's lines, file and lock, played on real files
// in a fresh folder with this SDK's spool (spool.ts): its encoder and
// decoder, ReceiptSpool's open, snapshot and close, its lock, and the
// default path.

import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";

import { ObservationOutcome, ReceiptSpoolLockedError } from "../src/index.js";
import { ReceiptSpool, decodeReceipt, defaultReceiptSpool, encodeReceipt, spoolFileName, type SpooledReceipt } from "../src/spool.js";
import { expectOf, type Fields } from "./spec-read.js";

/** A receipt as the spec writes one: every field a string. */
type SpecReceipt = Record<string, string>;

const outcomes: Record<string, ObservationOutcome> = {
  succeeded: ObservationOutcome.SUCCEEDED,
  pending: ObservationOutcome.PENDING,
  failed: ObservationOutcome.FAILED,
  not_found: ObservationOutcome.NOT_FOUND,
};

const receiptKeys = ["job_id", "operation_key", "attempt", "lease_token", "source", "outcome", "provider_refund_id",
  "provider_event_id", "detail", "spooled_at"];

export async function runSpool(v: Fields): Promise<void> {
  const op = v.str("op");
  const dir = mkdtempSync(path.join(tmpdir(), "jobfence-spec-spool-"));
  try {
    switch (op) {
      case "write_line":
        return writeLine(v);
      case "read_line":
        return readLine(v, dir);
      case "parse_file":
        return parseFile(v, dir);
      case "open_file":
        return openFile(v, dir);
      case "close":
        return closeSpool(v, dir);
      case "lock":
        return lockSpool(v, dir);
      case "file_name":
        return fileName(v);
      case "default_path":
        return defaultPath(v);
    }
    throw new Error(`${v.where}.op: ${op} is not an op this runner knows`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function writeLine(v: Fields): void {
  const want = specReceipt(v.fields("receipt")!);
  const line = v.str("line")!;
  const exact = v.bool("exact") ?? false;
  v.done();
  const own = encodeReceipt(toSpooled(want));
  if (exact) {
    assert.equal(own, line, "the line, byte for byte");
  } else {
    const a = JSON.parse(own) as object;
    const b = JSON.parse(line) as object;
    assert.deepEqual(Object.keys(a), Object.keys(b), "the keys, in order");
    assert.deepEqual(a, b, "the line, as JSON");
  }
  for (const [which, l] of [["its own line", own], ["the spec's line", line]] as const) {
    const r = decodeReceipt(l);
    assert.ok(r !== undefined, `${which} reads`);
    assert.deepEqual(fromSpooled(r), want, `${which} reads back`);
  }
}

function readLine(v: Fields, dir: string): void {
  const line = v.str("line")!;
  const expect = expectOf(v);
  v.done();
  const lines = linesOf(`${line}\n`, dir);
  assert.equal(lines.length, 1, "one line");
  if (expect !== undefined) {
    checkLine(lines[0]!, expect, "the line");
  }
}

function parseFile(v: Fields, dir: string): void {
  const contents = v.str("contents")!;
  const expect = expectOf(v);
  v.done();
  const lines = linesOf(contents, dir);
  if (expect === undefined) {
    return;
  }
  const want = expect.list("lines");
  expect.done();
  if (want !== undefined) {
    assert.equal(lines.length, want.length, "the lines");
    want.forEach((w, i) => checkLine(lines[i]!, w, `line ${i}`));
  }
}

// linesOf reads contents as a spool file's: opened as the worker opens its
// spool, then read.
function linesOf(contents: string, dir: string) {
  const file = path.join(dir, "spec.receipts.jsonl");
  writeFileSync(file, contents);
  const spool = ReceiptSpool.open(file);
  try {
    return spool.snapshot().lines;
  } finally {
    spool.close();
  }
}

function checkLine(line: { raw: string; receipt: SpooledReceipt | undefined }, want: Fields, what: string): void {
  const receipt = want.fields("receipt");
  const unreadable = want.bool("unreadable");
  const raw = want.str("raw");
  want.done();
  if (unreadable !== undefined) {
    assert.equal(line.receipt === undefined, unreadable, `${what} unreadable`);
  }
  if (raw !== undefined) {
    assert.equal(line.raw, raw, `${what} kept as it is`);
  }
  if (receipt !== undefined) {
    assert.ok(line.receipt !== undefined, `${what} reads: ${line.raw}`);
    const expected = specReceipt(receipt);
    const got = fromSpooled(line.receipt);
    for (const k of Object.keys(expected)) {
      assert.equal(got[k], expected[k], `${what}: ${k}`);
    }
  }
}

function openFile(v: Fields, dir: string): void {
  const files = v.record("files")!;
  const expect = expectOf(v);
  v.done();
  // A folder that does not exist yet when there are no files.
  const folder = path.join(dir, Object.keys(files).length === 0 ? "new" : "spool");
  const file = path.join(folder, "spec.receipts.jsonl");
  if (Object.keys(files).length > 0) {
    mkdirSync(folder, { mode: 0o755 });
  }
  for (const [suffix, content] of Object.entries(files)) {
    writeFileSync(`${file}${suffix}`, content, { mode: 0o644 });
  }
  const spool = ReceiptSpool.open(file);
  try {
    if (expect === undefined) {
      return;
    }
    checkFiles(file, expect.raw("files"), "after the open");
    const pending = expect.int("pending");
    const torn = expect.int("torn_bytes");
    const mode = expect.str("mode");
    const dirMode = expect.str("dir_mode");
    expect.done();
    if (pending !== undefined) {
      assert.equal(spool.pending, pending, "pending");
    }
    if (torn !== undefined) {
      assert.equal(spool.torn, torn, "torn_bytes");
    }
    if (mode !== undefined) {
      assert.equal(octal(statSync(file).mode), mode, "the file's mode");
    }
    if (dirMode !== undefined) {
      assert.equal(octal(statSync(folder).mode), dirMode, "the folder's mode");
    }
  } finally {
    spool.close();
  }
}

function closeSpool(v: Fields, dir: string): void {
  const appends = v.int("appends")!;
  const expect = expectOf(v);
  v.done();
  const file = path.join(dir, "spec.receipts.jsonl");
  const spool = ReceiptSpool.open(file);
  for (let i = 1; i <= appends; i++) {
    spool.append(toSpooled({
      job_id: String(i), operation_key: `op-${i}`, attempt: "1", lease_token: "t", source: "worker:spec", outcome: "succeeded",
      provider_refund_id: `re_${i}`, provider_event_id: "", detail: "", spooled_at: "",
    }));
  }
  spool.close();
  if (expect === undefined) {
    return;
  }
  checkFiles(file, expect.raw("files"), "after the close");
  const pending = expect.int("pending");
  expect.done();
  if (pending !== undefined) {
    const text = existsSync(file) ? readFileSync(file, "utf8") : "";
    assert.equal(text.split("\n").length - 1, pending, "the receipts left in the file");
  }
}

function lockSpool(v: Fields, dir: string): void {
  const state = v.str("lock_file")!;
  const expect = expectOf(v);
  v.done();
  const file = path.join(dir, "spec.receipts.jsonl");
  const lockFile = `${file}.lock`;
  const pids: Record<string, number> = { own_pid: process.pid, live_other_pid: process.ppid, dead_pid: 2147483647 };
  let first: ReceiptSpool | undefined;
  switch (state) {
    case "absent":
      break;
    case "own_pid":
    case "live_other_pid":
    case "dead_pid":
      writeFileSync(lockFile, `${pids[state]}\n`);
      break;
    case "garbage":
      writeFileSync(lockFile, "no pid here\n");
      break;
    case "held_here":
      first = ReceiptSpool.open(file);
      break;
    default:
      throw new Error(`${v.where}.lock_file: ${state} is not a state this runner knows`);
  }
  let opened: ReceiptSpool | undefined;
  let refused: ReceiptSpoolLockedError | undefined;
  try {
    opened = ReceiptSpool.open(file);
  } catch (err) {
    if (!(err instanceof ReceiptSpoolLockedError)) {
      throw err;
    }
    refused = err;
  }
  try {
    if (expect === undefined) {
      return;
    }
    const locked = expect.bool("locked");
    const holder = expect.str("holder");
    const holds = expect.str("lock_file");
    expect.done();
    if (locked !== undefined) {
      assert.equal(refused !== undefined, locked, "refused as held by another worker");
    }
    if (holder !== undefined) {
      assert.ok(refused !== undefined, "refused");
      assert.equal(refused.pid, pidOf(holder), "the holder the refusal names");
    }
    if (holds !== undefined) {
      assert.ok(opened !== undefined, "opened");
      assert.equal(readFileSync(lockFile, "utf8"), `${pidOf(holds)}\n`, "the lock file names its holder");
    }
  } finally {
    opened?.close();
    first?.close();
  }

  function pidOf(name: string): number {
    const pid = pids[name];
    assert.ok(pid !== undefined, `${v.where}: ${name} is not a pid this runner knows`);
    return pid;
  }
}

function fileName(v: Fields): void {
  const id = v.str("worker_id")!;
  const name = v.str("file_name")!;
  v.done();
  assert.equal(spoolFileName(id), name);
}

function defaultPath(v: Fields): void {
  const id = v.str("worker_id")!;
  const env = v.record("env")!;
  const expect = expectOf(v);
  v.done();
  const unknown = Object.keys(env).filter((k) => k !== "XDG_CACHE_HOME" && k !== "HOME");
  assert.deepEqual(unknown, [], `${v.where}.env: variables this runner does not set`);
  // The home folder comes from the process's HOME (os.homedir()), the
  // cache folder from the env given.
  const home = process.env["HOME"];
  let got: string | Error;
  try {
    if (env["HOME"] === undefined) {
      delete process.env["HOME"];
    } else {
      process.env["HOME"] = env["HOME"];
    }
    got = defaultReceiptSpool(id, { ...env });
  } catch (err) {
    got = err as Error;
  } finally {
    if (home === undefined) {
      delete process.env["HOME"];
    } else {
      process.env["HOME"] = home;
    }
  }
  if (expect === undefined) {
    return;
  }
  const want = expect.str("path");
  const error = expect.bool("error");
  expect.done();
  if (error !== undefined) {
    assert.equal(got instanceof Error, error, `an error: ${String(got)}`);
  }
  if (want !== undefined) {
    assert.equal(got, want, "the default spool");
  }
}

// checkFiles compares the spool's files with what a vector expects: by
// suffix of the spool's path ("" the spool itself), null for none.
function checkFiles(file: string, want: unknown, when: string): void {
  if (want === undefined) {
    return;
  }
  assert.ok(typeof want === "object" && want !== null && !Array.isArray(want), `files: an object, got ${JSON.stringify(want)}`);
  for (const [suffix, content] of Object.entries(want as Record<string, unknown>)) {
    const p = `${file}${suffix}`;
    if (content === null) {
      assert.ok(!existsSync(p), `${when}: no ${suffix || "spool"} file`);
    } else {
      assert.equal(typeof content, "string", `files[${JSON.stringify(suffix)}]: a string or null`);
      assert.ok(existsSync(p), `${when}: the ${suffix || "spool"} file`);
      assert.equal(readFileSync(p, "utf8"), content, `${when}: the ${suffix || "spool"} file's contents`);
    }
  }
}

function specReceipt(r: Fields): SpecReceipt {
  const out: SpecReceipt = {};
  for (const k of receiptKeys) {
    const s = r.str(k);
    if (s !== undefined) {
      out[k] = s;
    }
  }
  r.done();
  return out;
}

function toSpooled(r: SpecReceipt): SpooledReceipt {
  const outcome = outcomes[r["outcome"] ?? ""];
  assert.ok(outcome !== undefined, `outcome ${r["outcome"]} is not one this SDK writes`);
  return {
    jobId: BigInt(r["job_id"] ?? "0"),
    operationKey: r["operation_key"] ?? "",
    attempt: BigInt(r["attempt"] ?? "0"),
    leaseToken: r["lease_token"] ?? "",
    source: r["source"] ?? "",
    outcome,
    providerRefundId: r["provider_refund_id"] ?? "",
    providerEventId: r["provider_event_id"] ?? "",
    detail: r["detail"] ?? "",
    spooledAt: r["spooled_at"] ?? "",
  };
}

function fromSpooled(r: SpooledReceipt): SpecReceipt {
  return {
    job_id: r.jobId.toString(),
    operation_key: r.operationKey,
    attempt: r.attempt.toString(),
    lease_token: r.leaseToken,
    source: r.source,
    outcome: Object.entries(outcomes).find(([, o]) => o === r.outcome)?.[0] ?? "",
    provider_refund_id: r.providerRefundId,
    provider_event_id: r.providerEventId,
    detail: r.detail,
    spooled_at: r.spooledAt,
  };
}

function octal(mode: number): string {
  return `0${(mode & 0o777).toString(8)}`;
}
