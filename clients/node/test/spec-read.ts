// Reading the shared executable spec (clients/spec, see its README.md)
// strictly: every field a vector holds must be read by the runner, so that a
// vector using a field this SDK does not follow yet fails instead of passing
// half read.

import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** specDir is clients/spec, from this file's place in dist/test. */
export const specDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../spec");

/** For people only: no runner reads them. */
const forPeople = new Set(["note", "rules", "about"]);

/** SpecFile is one JSON file of the spec, with its path relative to specDir. */
export interface SpecFile {
  rel: string;
  doc: Fields;
}

/** specFiles lists every *.json of the spec folder and its subfolders, in name order. */
export function specFiles(dir = specDir, rel = ""): SpecFile[] {
  const out: SpecFile[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
    const r = rel === "" ? e.name : `${rel}/${e.name}`;
    if (e.isDirectory()) {
      out.push(...specFiles(path.join(dir, e.name), r));
    } else if (e.name.endsWith(".json")) {
      const value: unknown = JSON.parse(readFileSync(path.join(dir, e.name), "utf8"));
      out.push({ rel: r, doc: new Fields(value, r) });
    }
  }
  return out;
}

/**
 * Fields reads one JSON object of the spec. Each getter marks its field
 * read; done() fails on any field left unread (those for people aside).
 */
export class Fields {
  private readonly obj: Record<string, unknown>;
  private readonly read = new Set<string>();

  constructor(value: unknown, readonly where: string) {
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      throw new Error(`${where}: an object, got ${JSON.stringify(value)}`);
    }
    this.obj = value as Record<string, unknown>;
  }

  has(key: string): boolean {
    return key in this.obj;
  }

  keys(): string[] {
    return Object.keys(this.obj).filter((k) => !forPeople.has(k));
  }

  /** raw is a field's value, unchecked; it counts as read. */
  raw(key: string): unknown {
    this.read.add(key);
    return this.obj[key];
  }

  str(key: string): string | undefined {
    return this.typed(key, "string") as string | undefined;
  }

  int(key: string): number | undefined {
    const v = this.typed(key, "number") as number | undefined;
    if (v !== undefined && !Number.isInteger(v)) {
      throw new Error(`${this.where}.${key}: an integer, got ${v}`);
    }
    return v;
  }

  /** int64 reads an integer given as a number or, past 2^53, as a string. */
  int64(key: string): bigint | undefined {
    const v = this.raw(key);
    if (v === undefined) {
      return undefined;
    }
    if ((typeof v === "number" && Number.isInteger(v)) || (typeof v === "string" && /^-?\d+$/.test(v))) {
      return BigInt(v);
    }
    throw new Error(`${this.where}.${key}: an int64, got ${JSON.stringify(v)}`);
  }

  bool(key: string): boolean | undefined {
    return this.typed(key, "boolean") as boolean | undefined;
  }

  strs(key: string): string[] | undefined {
    const v = this.raw(key);
    if (v === undefined) {
      return undefined;
    }
    if (!Array.isArray(v) || v.some((s) => typeof s !== "string")) {
      throw new Error(`${this.where}.${key}: a list of strings, got ${JSON.stringify(v)}`);
    }
    return v as string[];
  }

  fields(key: string): Fields | undefined {
    const v = this.raw(key);
    return v === undefined ? undefined : new Fields(v, `${this.where}.${key}`);
  }

  list(key: string): Fields[] | undefined {
    const v = this.raw(key);
    if (v === undefined) {
      return undefined;
    }
    if (!Array.isArray(v)) {
      throw new Error(`${this.where}.${key}: a list, got ${JSON.stringify(v)}`);
    }
    return v.map((x, i) => new Fields(x, `${this.where}.${key}[${i}]`));
  }

  /** record reads an object of strings. */
  record(key: string): Record<string, string> | undefined {
    const v = this.raw(key);
    if (v === undefined) {
      return undefined;
    }
    if (typeof v !== "object" || v === null || Array.isArray(v) || Object.values(v).some((s) => typeof s !== "string")) {
      throw new Error(`${this.where}.${key}: an object of strings, got ${JSON.stringify(v)}`);
    }
    return v as Record<string, string>;
  }

  /** done fails on every field no getter read: one this runner does not know. */
  done(): void {
    const unknown = this.keys().filter((k) => !this.read.has(k));
    if (unknown.length > 0) {
      throw new Error(`${this.where}: fields this runner does not know: ${unknown.join(", ")} — the spec moved, the runner did not`);
    }
  }

  private typed(key: string, type: "string" | "number" | "boolean"): unknown {
    const v = this.raw(key);
    if (v !== undefined && typeof v !== type) {
      throw new Error(`${this.where}.${key}: a ${type}, got ${JSON.stringify(v)}`);
    }
    return v;
  }
}

/**
 * expectOf is what a vector expects of this SDK: `expect`, with this SDK's
 * entry of `answers` merged over it (a dispute, see the README). Undefined
 * when the vector pins nothing for it.
 */
export function expectOf(v: Fields): Fields | undefined {
  const expect = v.raw("expect");
  v.str("dispute");
  const answers = v.fields("answers");
  let mine: unknown;
  if (answers !== undefined) {
    mine = answers.raw("node");
    answers.raw("go");
    answers.raw("python");
    answers.done();
  }
  if (expect === undefined && mine === undefined) {
    return undefined;
  }
  const merged = { ...(expect as object | undefined), ...(mine as object | undefined) };
  return new Fields(merged, `${v.where}.expect`);
}
