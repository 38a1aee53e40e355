// Child processes for the fleet tests (the fake provider, Go and Node
// workers): started with their JSON logs captured, and never left behind —
// every one still running is killed when the test process exits, even after a
// failure.

import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";

/** Exit is how a process ended. */
export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** Proc is a running child process. */
export interface Proc {
  readonly name: string;
  readonly pid: number;
  /** Its log lines (stderr and stdout) that parsed as JSON objects, in order. */
  readonly records: Array<Record<string, unknown>>;
  /** Resolves when it exits. */
  readonly exited: Promise<Exit>;
  /** waitFor resolves with the first record that matches, rejects if the process exits or timeoutMs passes first. */
  waitFor(match: (rec: Record<string, unknown>) => boolean, what: string, timeoutMs?: number): Promise<Record<string, unknown>>;
  /** signal sends a signal (SIGSTOP, SIGCONT…) if it still runs. */
  signal(sig: NodeJS.Signals): void;
  /**
   * stop sends SIGCONT and SIGTERM, and SIGKILL when it has not exited after
   * graceMs. Resolves with how it ended.
   */
  stop(graceMs?: number): Promise<Exit>;
  /** tail returns its last log lines, for failure messages. */
  tail(lines?: number): string;
}

const live = new Set<ChildProcess>();
process.once("exit", () => {
  for (const p of live) {
    p.kill("SIGCONT");
    p.kill("SIGKILL");
  }
});

/** startProcess starts cmd with args; env adds to the test's environment. */
export function startProcess(name: string, cmd: string, args: string[], env: Record<string, string> = {}): Proc {
  const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  live.add(child);
  const records: Array<Record<string, unknown>> = [];
  const raw: string[] = [];
  const waiters = new Set<() => void>();
  let ended: Exit | undefined;
  const exited = new Promise<Exit>((resolve) => {
    child.once("exit", (code, signal) => {
      live.delete(child);
      ended = { code, signal };
      resolve(ended);
      for (const w of waiters) w();
    });
    child.once("error", (err) => {
      live.delete(child);
      raw.push(`spawn ${cmd}: ${err.message}`);
      ended = { code: null, signal: null };
      resolve(ended);
      for (const w of waiters) w();
    });
  });
  for (const stream of [child.stdout!, child.stderr!]) {
    createInterface({ input: stream }).on("line", (line) => {
      raw.push(line);
      if (raw.length > 5_000) raw.splice(0, 1_000);
      if (line.startsWith("{")) {
        try {
          records.push(JSON.parse(line) as Record<string, unknown>);
        } catch {
          // a partial or foreign line; kept in raw only
        }
      }
      for (const w of waiters) w();
    });
  }

  const proc: Proc = {
    name,
    pid: child.pid ?? -1,
    records,
    exited,
    waitFor(match, what, timeoutMs = 30_000) {
      return new Promise((resolve, reject) => {
        let seen = 0;
        const check = (): void => {
          for (; seen < records.length; seen++) {
            if (match(records[seen]!)) {
              done();
              resolve(records[seen]!);
              return;
            }
          }
          if (ended !== undefined) {
            done();
            reject(new Error(`${name} exited (${ended.code ?? ended.signal}) before ${what}\n${proc.tail()}`));
          }
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`${name}: no ${what} within ${timeoutMs} ms\n${proc.tail()}`));
        }, timeoutMs);
        const done = (): void => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      });
    },
    signal(sig) {
      if (ended === undefined) {
        child.kill(sig);
      }
    },
    async stop(graceMs = 15_000) {
      if (ended === undefined) {
        child.kill("SIGCONT");
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
        await exited;
        clearTimeout(timer);
      }
      return exited;
    },
    tail(lines = 40) {
      return raw.slice(-lines).map((l) => `  ${name}| ${l}`).join("\n");
    },
  };
  return proc;
}
