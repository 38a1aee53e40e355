// The receipt spool (R28) on its own: appends that survive a killed process,
// a torn last line, the atomic rewrite, the lock and the bound. The lines,
// file names and lock states every SDK shares are the spec's spool.json.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, readdirSync, existsSync, appendFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { after, describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import { ObservationOutcome } from "../src/index.js";
import {
  ReceiptSpool,
  ReceiptSpoolLockedError,
  SpoolFullError,
  decodeReceipt,
  type SpooledReceipt,
} from "../src/spool.js";

const spoolModule = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../src/spool.js");

const dirs: string[] = [];
after(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
function tempSpool(sub = ""): string {
  const d = mkdtempSync(path.join(tmpdir(), "jobfence-spool-"));
  dirs.push(d);
  return path.join(d, sub, "w.receipts.jsonl");
}

function receipt(n: number): SpooledReceipt {
  return {
    jobId: BigInt(100 + n), operationKey: `op-${n}`, attempt: 1n, leaseToken: `tok-${n}-secret`, source: "worker:w",
    outcome: ObservationOutcome.SUCCEEDED, providerRefundId: `re_${n}`, providerEventId: "", detail: "late\nanswer",
    spooledAt: "2025-01-02T03:04:05.006Z",
  };
}

function receipts(s: ReceiptSpool): SpooledReceipt[] {
  return s.snapshot().lines.map((l) => {
    assert.ok(l.receipt, `unreadable line ${l.raw}`);
    return l.receipt;
  });
}

// holder runs another process that opens the spool, appends `appends`
// receipts and waits to be killed.
async function holder(file: string, appends: number): Promise<{ pid: number; kill: () => Promise<void> }> {
  const script = `
    const { ReceiptSpool } = await import(${JSON.stringify(spoolModule)});
    const s = ReceiptSpool.open(${JSON.stringify(file)});
    for (let i = 0; i < ${appends}; i++) {
      s.append({ jobId: BigInt(200 + i), operationKey: "op-child-" + i, attempt: 3n, leaseToken: "child-secret-" + i,
        source: "worker:child", outcome: 1, providerRefundId: "re_c" + i, providerEventId: "", detail: "", spooledAt: "" });
    }
    console.log("held");
    setInterval(() => {}, 1000);`;
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout! });
  await new Promise<void>((resolve, reject) => {
    lines.once("line", (l) => (l === "held" ? resolve() : reject(new Error(l))));
    child.once("exit", (code) => reject(new Error(`holder exited ${code}`)));
  });
  return {
    pid: child.pid!,
    kill: () => new Promise((resolve) => {
      child.once("exit", () => resolve());
      child.kill("SIGKILL"); // no cleanup: only the kernel closes its files
    }),
  };
}

describe("receipt spool (R28)", () => {
  it("keeps every acknowledged append across a killed process", async () => {
    const file = tempSpool("new/folder");
    const h = await holder(file, 3);
    await h.kill();
    assert.ok(existsSync(`${file}.lock`), "a killed holder leaves its lock file");
    const s = ReceiptSpool.open(file); // stale: its pid is gone
    try {
      const got = receipts(s);
      assert.equal(s.pending, 3);
      assert.deepEqual(got.map((r) => [r.operationKey, r.attempt, r.leaseToken, r.providerRefundId]), [
        ["op-child-0", 3n, "child-secret-0", "re_c0"],
        ["op-child-1", 3n, "child-secret-1", "re_c1"],
        ["op-child-2", 3n, "child-secret-2", "re_c2"],
      ]);
      assert.equal(statSync(file).mode & 0o777, 0o600);
      assert.equal(statSync(`${file}.lock`).mode & 0o777, 0o600);
      assert.equal(statSync(path.dirname(file)).mode & 0o777, 0o700);
      assert.equal(readFileSync(`${file}.lock`, "utf8"), `${process.pid}\n`);
    } finally {
      s.close();
    }
  });

  it("cuts off a torn last line, never acknowledged", () => {
    const file = tempSpool();
    const s = ReceiptSpool.open(file);
    s.append(receipt(1));
    s.close();
    appendFileSync(file, `{"v":1,"job_id":"7","operation_key":"op-`);
    const again = ReceiptSpool.open(file);
    try {
      assert.ok(again.torn > 0);
      assert.equal(again.pending, 1);
      again.append(receipt(2));
      assert.deepEqual(receipts(again), [receipt(1), receipt(2)]);
    } finally {
      again.close();
    }
  });

  it("rewrites atomically and keeps what was appended since the snapshot", () => {
    const file = tempSpool();
    const s = ReceiptSpool.open(file);
    try {
      for (const n of [0, 1, 2]) s.append(receipt(n));
      const snap = s.snapshot();
      s.append(receipt(3)); // while a refile pass is out
      const before = statSync(file).ino;
      s.rewrite(snap.upTo, [snap.lines[1]!.raw]);
      assert.notEqual(statSync(file).ino, before, "replaced by a rename, not rewritten in place");
      assert.ok(!existsSync(`${file}.tmp`));
      assert.equal(statSync(file).mode & 0o777, 0o600);
      assert.deepEqual(receipts(s), [receipt(1), receipt(3)]);
      assert.equal(s.pending, 2);
      s.append(receipt(4));
      assert.deepEqual(receipts(s), [receipt(1), receipt(3), receipt(4)]);
    } finally {
      s.close();
    }
    // A crash left half a rewrite: the spool itself is whole.
    writeFileSync(`${file}.tmp`, "half a rewrite");
    const again = ReceiptSpool.open(file);
    try {
      assert.deepEqual(receipts(again), [receipt(1), receipt(3), receipt(4)]);
      assert.ok(!existsSync(`${file}.tmp`));
    } finally {
      again.close();
    }
  });

  it("keeps lines it cannot read", () => {
    const file = tempSpool();
    const future = `{"v":2,"something":"new"}`;
    writeFileSync(file, `${future}\n`);
    const s = ReceiptSpool.open(file);
    try {
      s.append(receipt(1));
      const snap = s.snapshot();
      assert.equal(snap.lines[0]!.receipt, undefined);
      s.rewrite(snap.upTo, [snap.lines[0]!.raw]);
      assert.equal(readFileSync(file, "utf8"), `${future}\n`);
    } finally {
      s.close();
    }
  });

  it("is bounded", () => {
    const s = ReceiptSpool.open(tempSpool());
    try {
      s.maxCount = 2;
      s.append(receipt(0));
      s.append(receipt(1));
      assert.throws(() => s.append(receipt(2)), SpoolFullError);
      s.maxCount = 100;
      s.maxBytes = readFileSync(s.path).length + 10;
      assert.throws(() => s.append(receipt(3)), SpoolFullError);
      assert.equal(s.pending, 2);
      assert.equal(receipts(s).length, 2);
    } finally {
      s.close();
    }
  });

  it("removes an empty spool and its lock on close, keeps one with receipts", () => {
    const file = tempSpool();
    ReceiptSpool.open(file).close();
    assert.deepEqual(readdirSync(path.dirname(file)), []);
    const s = ReceiptSpool.open(file);
    s.append(receipt(1));
    s.close();
    assert.deepEqual(readdirSync(path.dirname(file)), [path.basename(file)]);
    assert.throws(() => s.append(receipt(2)), /closed/);
  });

  it("refuses a second opener while the first holds it", async () => {
    const file = tempSpool();
    const s = ReceiptSpool.open(file);
    assert.throws(() => ReceiptSpool.open(file), ReceiptSpoolLockedError, "the same process");
    s.close();
    ReceiptSpool.open(file).close();

    const h = await holder(file, 0);
    assert.throws(() => ReceiptSpool.open(file), (err: unknown) => err instanceof ReceiptSpoolLockedError && err.pid === h.pid);
    await h.kill();
    ReceiptSpool.open(file).close(); // its holder is gone: stale

    // A Go worker's lock file: its pid, alive (it holds a flock we cannot see).
    writeFileSync(`${file}.lock`, `${process.ppid}\n`);
    assert.throws(() => ReceiptSpool.open(file), ReceiptSpoolLockedError);
    rmSync(`${file}.lock`);
  });

  it("reads no line that is JSON null or a bare version", () => {
    // The Go SDK's lines, file names and default paths are the shared spec's
    // spool.json (spec.test).
    assert.equal(decodeReceipt(`{"v":1}`), undefined);
    assert.equal(decodeReceipt("null"), undefined);
  });
});
