// The client's transport options against a stand-in gRPC server over TLS: the
// coordinator itself serves plaintext, so TLS, the bearer token hook, the
// per-call deadline and error details as they arrive in the
// grpc-status-details-bin trailer are checked here. Behaviour is tested
// against the real coordinator in the other files.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";

import { create, toBinary, type DescMessage, type MessageInitShape } from "@bufbuild/protobuf";
import { anyPack } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";

import {
  ClaimOutcomeUnknownError,
  CoordinatorClient,
  CoordinatorError,
  GetJobResponseSchema,
  InvalidArgumentError,
  JobState,
  StaleAttemptError,
  WriteOutcomeUnknownError,
  isRetryableWrite,
} from "../src/index.js";
import { BadRequestSchema, ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../src/gen/google/rpc/status_pb.js";

const maxInt64 = 2n ** 63n - 1n;

let dir: string;
let cert: Buffer;
let server: http2.Http2SecureServer;
let address: string;
const seen: Array<http2.IncomingHttpHeaders> = [];
const sessions = new Set<http2.ServerHttp2Session>();
const timers = new Set<NodeJS.Timeout>();

function detail<D extends DescMessage>(desc: D, init: MessageInitShape<D>) {
  return anyPack(desc, create(desc, init));
}

function statusTrailer(code: Code, message: string, details: ReturnType<typeof detail>[]): http2.OutgoingHttpHeaders {
  const st = create(StatusSchema, { code, message, details });
  return {
    "grpc-status": String(code),
    "grpc-message": encodeURIComponent(message),
    "grpc-status-details-bin": Buffer.from(toBinary(StatusSchema, st)).toString("base64"),
  };
}

// The stand-in answers each method with one canned reply.
function reply(method: string): { trailers: http2.OutgoingHttpHeaders; body?: Uint8Array; delayMs?: number } {
  switch (method) {
    case "GetJob":
      return {
        body: toBinary(GetJobResponseSchema, create(GetJobResponseSchema, { job: { id: maxInt64, attempt: maxInt64 - 1n } })),
        trailers: { "grpc-status": "0" },
      };
    case "Claim":
      return {
        trailers: statusTrailer(Code.Unavailable, "claim outcome unknown", [
          detail(ErrorInfoSchema, { domain: "jobfence", reason: "CLAIM_OUTCOME_UNKNOWN" }),
        ]),
      };
    case "Complete":
      return {
        trailers: statusTrailer(Code.FailedPrecondition, "stale", [
          detail(ErrorInfoSchema, {
            domain: "jobfence",
            reason: "STALE_ATTEMPT",
            metadata: { job_id: String(maxInt64), attempt: String(maxInt64 - 1n), current_attempt: String(maxInt64), current_state: "JOB_STATE_RUNNING" },
          }),
        ]),
      };
    case "Reschedule":
      return {
        trailers: statusTrailer(Code.Unavailable, "write outcome unknown", [
          detail(ErrorInfoSchema, { domain: "jobfence", reason: "WRITE_OUTCOME_UNKNOWN" }),
        ]),
      };
    case "Escalate":
      // Another domain's reason means nothing to this client.
      return {
        trailers: statusTrailer(Code.FailedPrecondition, "foreign", [
          detail(ErrorInfoSchema, { domain: "example.com", reason: "STALE_ATTEMPT" }),
        ]),
      };
    case "EnqueueRefund":
      return {
        trailers: statusTrailer(Code.InvalidArgument, "bad", [
          detail(ErrorInfoSchema, { domain: "jobfence", reason: "INVALID_ARGUMENT" }),
          detail(BadRequestSchema, { fieldViolations: [{ field: "currency", description: "must be ISO 4217" }] }),
        ]),
      };
    default:
      return { trailers: { "grpc-status": String(Code.Unimplemented) }, delayMs: method === "ReportObservation" ? 2_000 : 0 };
  }
}

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "jobfence-tls-"));
  await promisify(execFile)("openssl", [
    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
    "-keyout", path.join(dir, "key.pem"), "-out", path.join(dir, "cert.pem"),
    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
  ]);
  cert = await readFile(path.join(dir, "cert.pem"));
  server = http2.createSecureServer({ key: await readFile(path.join(dir, "key.pem")), cert });
  server.on("session", (s) => {
    sessions.add(s);
    s.on("close", () => sessions.delete(s));
  });
  server.on("stream", (stream, headers) => {
    seen.push(headers);
    stream.on("data", () => undefined);
    stream.on("end", () => {
      if (headers["authorization"] !== "Bearer s3cret") {
        stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": String(Code.Unauthenticated) }, { endStream: true });
        return;
      }
      const method = String(headers[":path"]).split("/").pop()!;
      const r = reply(method);
      const timer = setTimeout(() => {
        timers.delete(timer);
        if (stream.destroyed) {
          return;
        }
        stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
        stream.on("wantTrailers", () => stream.sendTrailers(r.trailers));
        if (r.body) {
          const frame = Buffer.alloc(5 + r.body.length);
          frame.writeUInt32BE(r.body.length, 1);
          frame.set(r.body, 5);
          stream.end(frame);
        } else {
          stream.end();
        }
      }, r.delayMs ?? 0);
      timers.add(timer);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  for (const t of timers) {
    clearTimeout(t);
  }
  for (const s of sessions) {
    s.destroy();
  }
  await new Promise((resolve) => server.close(resolve));
  await rm(dir, { recursive: true, force: true });
});

function client(token = "s3cret"): CoordinatorClient {
  return new CoordinatorClient({
    address,
    tls: { ca: cert },
    token: async () => token,
    metadata: (h, method) => h.set("x-jobfence-test", method),
  });
}

describe("CoordinatorClient transport", () => {
  it("speaks gRPC over TLS with the bearer token and metadata hook; int64 stays exact", async () => {
    const c = client();
    try {
      const got = await c.getJob({ job: { case: "jobId", value: maxInt64 } });
      assert.equal(got.job!.id, maxInt64);
      assert.equal(got.job!.attempt, maxInt64 - 1n);
      const h = seen.at(-1)!;
      assert.equal(h["authorization"], "Bearer s3cret");
      assert.equal(h["x-jobfence-test"], "GetJob");
      assert.equal(h["content-type"], "application/grpc+proto");
      assert.ok(h["grpc-timeout"], "a deadline is always sent");
    } finally {
      c.close();
    }
  });

  it("surfaces a missing token as UNAUTHENTICATED", async () => {
    const c = client("wrong");
    try {
      await assert.rejects(c.getJob({ job: { case: "jobId", value: 1n } }), (err) => err instanceof CoordinatorError && err.code === Code.Unauthenticated);
    } finally {
      c.close();
    }
  });

  it("decodes every reason from the grpc-status-details-bin trailer (R24)", async () => {
    const c = client();
    try {
      await assert.rejects(c.claim({ workerId: "w", maxJobs: 1 }), (err) => {
        assert.ok(err instanceof ClaimOutcomeUnknownError);
        assert.equal(err.code, Code.Unavailable);
        assert.equal(isRetryableWrite(err), false, "a claim's unknown outcome is no write to repeat");
        return true;
      });
      await assert.rejects(c.complete({ jobId: 1n, attempt: 1n, leaseToken: "tok", providerRefundId: "re" }), (err) => {
        assert.ok(err instanceof StaleAttemptError);
        assert.equal(err.jobId, maxInt64);
        assert.equal(err.attempt, maxInt64 - 1n);
        assert.equal(err.currentAttempt, maxInt64);
        assert.equal(err.currentState, JobState.RUNNING);
        return true;
      });
      await assert.rejects(c.reschedule({ jobId: 1n, attempt: 1n, leaseToken: "tok" }), (err) => err instanceof WriteOutcomeUnknownError && isRetryableWrite(err));
      await assert.rejects(c.escalate({ jobId: 1n, attempt: 1n, leaseToken: "tok", reason: "x" }), (err) => {
        assert.ok(err instanceof CoordinatorError && !(err instanceof StaleAttemptError), String(err));
        assert.equal(err.code, Code.FailedPrecondition);
        return true;
      });
      await assert.rejects(c.enqueueRefund({}), (err) => {
        assert.ok(err instanceof InvalidArgumentError);
        assert.deepEqual(err.fieldViolations, [{ field: "currency", description: "must be ISO 4217" }]);
        return true;
      });
    } finally {
      c.close();
    }
  });

  it("applies the per-call deadline", async () => {
    const c = client();
    try {
      // The connection first: on a busy machine the TLS handshake alone can
      // outlast the 150 ms, and the call would then never reach the server.
      await c.getJob({ job: { case: "jobId", value: maxInt64 } });
      const t0 = Date.now();
      await assert.rejects(c.reportObservation({}, { timeoutMs: 150 }), (err) => {
        assert.ok(err instanceof CoordinatorError);
        assert.equal(err.code, Code.DeadlineExceeded);
        assert.equal(isRetryableWrite(err), true);
        return true;
      });
      assert.ok(Date.now() - t0 < 1_500);
      assert.equal(seen.at(-1)!["grpc-timeout"], "150m");
    } finally {
      c.close();
    }
  });
});
