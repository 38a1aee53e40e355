// JSON for the SDK's values. Ids, attempts and amounts are bigint (exact past
// 2^53), and JSON.stringify throws on a bigint ("Do not know how to serialize
// a BigInt"): a worker that logs a job, a claim or a WorkerEvent as JSON
// needs one of these.
//
//   JSON.stringify(event, bigintReplacer)          // bigints as decimal strings
//   logger.info(jsonSafe(event))                   // a plain copy any JSON logger takes
//   toJsonString(JobSchema, job)                   // a message as canonical proto3 JSON
//
// Strings, not numbers: a number past 2^53 would round, and an attempt or a
// job id that rounds names another one. Read them back with BigInt(s).

export { toJson, toJsonString } from "@bufbuild/protobuf";

/**
 * A JSON.stringify replacer writing each bigint as its decimal string, e.g.
 * `JSON.stringify(job, bigintReplacer)`; everything else as JSON.stringify
 * would.
 */
export function bigintReplacer(_key: string, value: unknown): unknown {
  return typeof value === "bigint" ? value.toString() : value;
}

/**
 * A copy of value that JSON.stringify takes: every bigint, at any depth, as
 * its decimal string; arrays and objects copied (own enumerable properties,
 * as JSON.stringify reads them); an Error as its name, message, cause and own
 * properties (a CoordinatorError's reason and metadata, a StaleAttemptError's
 * currentAttempt…), which JSON.stringify would drop but the last; an object
 * met again inside itself as "[Circular]". Dates, Uint8Arrays and objects
 * with a toJSON method are left as they are, for JSON.stringify to write.
 * value itself is not changed.
 */
export function jsonSafe(value: unknown): unknown {
  return copy(value, new WeakSet<object>());
}

function copy(value: unknown, path: WeakSet<object>): unknown {
  if (typeof value === "bigint") return value.toString();
  if (value === null || typeof value !== "object") return value;
  if (value instanceof Date || value instanceof Uint8Array || typeof (value as { toJSON?: unknown }).toJSON === "function") {
    return value;
  }
  if (path.has(value)) return "[Circular]";
  path.add(value);
  let out: unknown;
  if (Array.isArray(value)) {
    out = value.map((v) => copy(v, path));
  } else {
    const o: Record<string, unknown> = {};
    if (value instanceof Error) {
      o.name = value.name;
      o.message = value.message;
      if (value.cause !== undefined) o.cause = copy(value.cause, path);
    }
    for (const [k, v] of Object.entries(value)) o[k] = copy(v, path);
    out = o;
  }
  path.delete(value);
  return out;
}
