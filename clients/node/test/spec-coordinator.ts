// A scripted coordinator: a real gRPC server (connect-node over plaintext
// HTTP/2, on a loopback port) serving Coordinator.Work and the unary calls,
// which does only what a test tells it to: it hands the test every message a
// worker sends on each stream, sends what the test says, and ends a stream
// when and how the test says. The unary calls are recorded and answered by
// the test's `unary` function.

import http2 from "node:http2";
import type { AddressInfo } from "node:net";

import { create, toJson, type DescMessage, type JsonValue, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import { Coordinator, WorkResponseSchema, type WorkRequest, type WorkResponse } from "../src/index.js";

export type ResponseInit = MessageInitShape<typeof WorkResponseSchema>;

/** Closed: what next() yields once the worker half-closed the stream (or it ended). */
export const Closed = Symbol("closed");

/** Queue hands values to one reader, waiting with a deadline. */
class Queue<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;

  push(v: T): void {
    this.items.push(v);
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  /** next takes the next value, or undefined after timeoutMs. */
  async next(timeoutMs: number): Promise<T | undefined> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      if (this.items.length > 0) {
        return this.items.shift();
      }
      const left = deadline - performance.now();
      if (left <= 0) {
        return undefined;
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  }

  get length(): number {
    return this.items.length;
  }
}

/** ScriptedStream is one worker stream as the scripted coordinator holds it. */
export class ScriptedStream {
  /** Every message the worker sent on it, in order. */
  readonly sent: WorkRequest[] = [];
  halfClosed = false;
  private readonly inbox = new Queue<WorkRequest | typeof Closed>();
  private readonly out = new Queue<WorkResponse | { end: ConnectError | undefined }>();

  /** next is the worker's next message, Closed after its half-close, undefined after timeoutMs. */
  next(timeoutMs: number): Promise<WorkRequest | typeof Closed | undefined> {
    return this.inbox.next(timeoutMs);
  }

  /** send sends one message to the worker. */
  send(m: ResponseInit): void {
    this.out.push(create(WorkResponseSchema, m));
  }

  /** end ends the stream after what was sent: cleanly, or with err. */
  end(err?: ConnectError): void {
    this.out.push({ end: err });
  }

  /** @internal */
  received(m: WorkRequest): void {
    this.sent.push(m);
    this.inbox.push(m);
  }

  /** @internal */
  closed(): void {
    this.halfClosed = true;
    this.inbox.push(Closed);
  }

  /** @internal */
  async *responses(): AsyncGenerator<WorkResponse> {
    for (;;) {
      const m = await this.out.next(3_600_000);
      if (m === undefined) {
        continue;
      }
      if ("end" in m) {
        if (m.end !== undefined) {
          throw m.end;
        }
        return;
      }
      yield m;
    }
  }
}

/** A unary call the scripted coordinator received, its request as protojson with the proto's field names. */
export interface UnaryCall {
  method: string;
  json: JsonValue;
  /** The call's W3C trace context metadata (R35); "" when it carried none. */
  traceparent?: string;
  tracestate?: string;
}

export class ScriptedCoordinator {
  /** The unary calls received, in order. */
  readonly unaryCalls: UnaryCall[] = [];
  /** When set, Work answers UNIMPLEMENTED: a coordinator without the worker stream. */
  withoutStream = false;
  /** Answers a unary call: its response, or a ConnectError. Default: UNIMPLEMENTED. */
  unary: (call: UnaryCall) => unknown = (c) => {
    throw new ConnectError(`the script has no answer for ${c.method}`, Code.Unimplemented);
  };

  private readonly streams = new Queue<ScriptedStream>();
  private readonly server: http2.Http2Server;

  private constructor() {
    const answer = <I extends DescMessage>(method: string, input: I) => async (request: MessageShape<I>, ctx: HandlerContext) => {
      const call = {
        method,
        json: toJson(input, request, { useProtoFieldName: true, alwaysEmitImplicit: true }),
        traceparent: ctx.requestHeader.get("traceparent") ?? "",
        tracestate: ctx.requestHeader.get("tracestate") ?? "",
      };
      this.unaryCalls.push(call);
      return this.unary(call) as never;
    };
    const m = Coordinator.method;
    this.server = http2.createServer(connectNodeAdapter({
      routes: (router) => router.service(Coordinator, {
        claim: answer("Claim", m.claim.input),
        complete: answer("Complete", m.complete.input),
        reschedule: answer("Reschedule", m.reschedule.input),
        escalate: answer("Escalate", m.escalate.input),
        renewLeases: answer("RenewLeases", m.renewLeases.input),
        reportObservation: answer("ReportObservation", m.reportObservation.input),
        work: (requests: AsyncIterable<WorkRequest>, ctx: HandlerContext) => this.work(requests, ctx.signal),
      }),
    }));
  }

  static async start(): Promise<ScriptedCoordinator> {
    const c = new ScriptedCoordinator();
    await new Promise<void>((resolve) => c.server.listen(0, "127.0.0.1", resolve));
    return c;
  }

  get address(): string {
    return `127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** nextStream is the next worker stream opened, undefined after timeoutMs. */
  nextStream(timeoutMs: number): Promise<ScriptedStream | undefined> {
    return this.streams.next(timeoutMs);
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      // Streams still open end with the server.
      setTimeout(() => resolve(), 2_000).unref();
    });
  }

  private async *work(requests: AsyncIterable<WorkRequest>, signal: AbortSignal): AsyncGenerator<WorkResponse> {
    if (this.withoutStream) {
      throw new ConnectError("this coordinator has no worker stream", Code.Unimplemented);
    }
    const st = new ScriptedStream();
    // A stream the worker reset: stop waiting for the script.
    signal.addEventListener("abort", () => st.end(), { once: true });
    this.streams.push(st);
    void (async () => {
      for await (const m of requests) {
        st.received(m);
      }
      st.closed();
    })().catch(() => st.closed());
    yield* st.responses();
  }
}
