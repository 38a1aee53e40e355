// The worker stream (Coordinator.Work) as a Worker holds it: grants pushed
// against credits, and write-backs, renewals and receipts sent as calls on
// the same stream, each answered exactly as its unary call would be
// (docs/DESIGN.md, "The worker stream").
//
// An open stream that is not half-closed sends a heartbeat, a WorkCredit of
// 0 credits ("still here, no new slot"), whenever it has sent nothing else
// for STREAM_HEARTBEAT_MS: the coordinator offers work only to a stream that
// spoke within the last 3 s (server.StreamSilence), so a frozen process (a
// SIGSTOP, a long GC pause) is not granted jobs it cannot start.
//
// Every grant is acknowledged as it is read (WorkStart.acknowledges): one
// WorkAck naming each job of the WorkGrant with its attempt and lease token,
// queued ahead of anything else waiting to be sent, before any of its jobs
// starts. The coordinator hands back a grant left unacknowledged for 5 s (or
// half its lease), so a worker that stops reading holds no job. A grant read
// after the half-close (the drain) can no longer be acknowledged: it is not
// started, and the coordinator takes it back when the stream ends.

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { context as otelContext } from "@opentelemetry/api";

import {
  renewLeasesRequest,
  renewalOf,
  type CallOptions,
  type CompleteInit,
  type CoordinatorClient,
  type EscalateInit,
  type Grant,
  type RenewLeasesOptions,
  type Renewal,
  type ReportObservationInit,
  type RescheduleInit,
} from "./client.js";
import { CoordinatorError, toCoordinatorError, workReplyError } from "./errors.js";
import {
  WorkRequestSchema,
  type ClaimedJob,
  type WorkCallSchema,
  type CompleteResponse,
  type EscalateResponse,
  type ReportObservationResponse,
  type RescheduleResponse,
  type WorkCall,
  type WorkReply,
  type WorkRequest,
} from "./gen/jobfence/v1/coordinator_pb.js";
import { traceHeaders } from "./tracing.js";

/**
 * STREAM_HEARTBEAT_MS is how long an open stream stays silent before it
 * sends a heartbeat (a WorkCredit of 0 credits): well inside the 3 s of
 * silence after which the coordinator grants the stream nothing.
 */
export const STREAM_HEARTBEAT_MS = 1000;

/**
 * WorkerCalls are the calls a Worker makes for the jobs it holds, with the
 * CoordinatorClient's signatures and errors. The CoordinatorClient makes
 * them as unary calls; a WorkSession on its stream when one is open.
 */
export interface WorkerCalls {
  complete(req: CompleteInit, opts?: CallOptions): Promise<CompleteResponse>;
  reschedule(req: RescheduleInit, opts?: CallOptions): Promise<RescheduleResponse>;
  escalate(req: EscalateInit, opts?: CallOptions): Promise<EscalateResponse>;
  renewLeases(grants: readonly Grant[], opts?: RenewLeasesOptions): Promise<Renewal[]>;
  reportObservation(req: ReportObservationInit, opts?: CallOptions): Promise<ReportObservationResponse>;
}

/** WorkStartInit is what a stream opens with, less the credits. */
export interface WorkStartInit {
  workerId: string;
  /** Only this provider's jobs; "" for all. */
  provider: string;
  /** Each grant's lease; the coordinator's default when undefined. */
  leaseMs: number | undefined;
}

/**
 * SessionHooks are how a WorkSession reports what its stream delivers; it
 * knows nothing else of its owner.
 */
export interface SessionHooks {
  /** granted: the jobs of one grant, acknowledged; each holds a slot until `freed`. */
  granted(jobs: ClaimedJob[]): void;
  /**
   * retryAfter: R19, the providers' budgets are spent; the coordinator holds
   * the credits and offers grants again after `ms`.
   */
  retryAfter(ms: number): void;
  /**
   * dropped: a grant read after closeSend, which can no longer be
   * acknowledged: nothing may start it, the coordinator hands it back when
   * the stream ends.
   */
  dropped(jobs: ClaimedJob[]): void;
}

/**
 * StreamEnd is how one stream ended: `error` undefined when the coordinator
 * ended it cleanly (after the worker's half-close, or while it stops);
 * `received` when it carried at least one message, so it had been open.
 */
export interface StreamEnd {
  error: CoordinatorError | undefined;
  received: boolean;
}

// OpenStream is the stream taking calls now.
interface OpenStream {
  out: Outbox<WorkRequest>;
  // Calls sent and not answered yet, by call id.
  pending: Map<bigint, (answer: WorkReply | CoordinatorError) => void>;
}

/** MAX_ACK_GRANTS bounds the grants one WorkAck names. */
export const MAX_ACK_GRANTS = 100;

/**
 * WorkSession is a Worker's stream to the coordinator, built from the
 * client, the WorkStart, the slot count and its hooks. It keeps the count of
 * free slots the coordinator may fill (the credits): a stream opens with
 * all of them, a grant uses one per job, a job that ends gives one back
 * (`freed`); a grant it cannot acknowledge (read after the half-close) uses
 * none. Its WorkerCalls go on the open stream, answered by the reply
 * with their call id; while no stream is open, and once the worker drains
 * (`closeSend`), they go as the client's unary calls. A call whose stream
 * ends before its reply is answered UNAVAILABLE, safe to repeat: every call
 * that goes on the stream is idempotent (R21, R15, R27), and the Worker
 * repeats it, on the next stream or as a unary call.
 */
export class WorkSession implements WorkerCalls {
  private free: number;
  private open: OpenStream | undefined;
  private closing = false;
  private lastCallId = 0n;

  constructor(
    private readonly client: CoordinatorClient,
    private readonly start: WorkStartInit,
    slots: number,
    private readonly hooks: SessionHooks,
  ) {
    this.free = slots;
  }

  /**
   * serve opens one stream with every free slot as credits and reads it
   * until it ends, acknowledging each grant and then handing its jobs to
   * `hooks.granted`, and each retry_after to `hooks.retryAfter`. A grant
   * read after closeSend is not acknowledged and goes to `hooks.dropped`
   * instead. At the end, every call still waiting is answered UNAVAILABLE.
   * After closeSend it opens nothing and returns at once.
   */
  async serve(): Promise<StreamEnd> {
    if (this.closing) {
      return { error: undefined, received: false };
    }
    const s: OpenStream = { out: new Outbox<WorkRequest>({ ms: STREAM_HEARTBEAT_MS, message: heartbeat }), pending: new Map() };
    s.out.push(startRequest(this.start, this.free));
    this.open = s;
    // Resets the HTTP/2 stream when reading ends other than by the
    // coordinator's own end.
    const abort = new AbortController();
    let received = false;
    let error: CoordinatorError | undefined;
    try {
      for await (const m of this.client.work(s.out, { signal: abort.signal })) {
        received = true;
        switch (m.kind.case) {
          case "grant": {
            const jobs = m.kind.value.jobs;
            if (jobs.length === 0) {
              break;
            }
            // The ack goes first, ahead of calls and credits waiting to be
            // sent and before a job takes a slot: the coordinator hands back
            // what is not acknowledged within 5 s.
            if (this.closing || !this.acknowledge(s, jobs)) {
              this.hooks.dropped(jobs);
              break;
            }
            this.free -= jobs.length;
            this.hooks.granted(jobs);
            break;
          }
          case "reply": {
            const answer = s.pending.get(m.kind.value.callId);
            s.pending.delete(m.kind.value.callId);
            answer?.(m.kind.value);
            break;
          }
          case "retryAfter":
            this.hooks.retryAfter(Number(m.kind.value.seconds) * 1000 + m.kind.value.nanos / 1e6);
            break;
        }
      }
    } catch (err) {
      error = toCoordinatorError(err);
    } finally {
      if (this.open === s) {
        this.open = undefined;
      }
      abort.abort();
      s.out.close();
      const lost = toCoordinatorError(new ConnectError(
        `worker stream ended before the answer (${error === undefined ? "closed by the coordinator" : error.message}); ` +
          "safe to repeat (R21)",
        Code.Unavailable,
      ));
      for (const answer of s.pending.values()) {
        answer(lost);
      }
      s.pending.clear();
    }
    return { error, received };
  }

  /** freed gives a slot back: one credit more for the coordinator, now on the open stream or with the next one. */
  freed(): void {
    this.free++;
    if (this.open !== undefined && !this.closing) {
      this.open.out.push(create(WorkRequestSchema, { kind: { case: "credit", value: { credits: 1 } } }));
    }
  }

  // acknowledge queues the WorkAck of one grant's jobs (at most 100: one
  // message) ahead of everything waiting to be sent; false when the stream
  // takes nothing more (half-closed, or ending).
  private acknowledge(s: OpenStream, jobs: ClaimedJob[]): boolean {
    for (let i = 0; i < jobs.length; i += MAX_ACK_GRANTS) {
      const grants = jobs.slice(i, i + MAX_ACK_GRANTS)
        .map((c) => ({ jobId: c.job?.id ?? 0n, attempt: c.attempt, leaseToken: c.leaseToken }));
      if (!s.out.pushFirst(create(WorkRequestSchema, { kind: { case: "ack", value: { grants } } }))) {
        return false;
      }
    }
    return true;
  }

  /**
   * closeSend half-closes the stream when the worker drains: the
   * coordinator grants nothing more, answers the calls already sent and
   * then ends the stream; a grant still on its way is not started (it can
   * no longer be acknowledged, and the coordinator hands it back). Calls
   * from now on go as unary calls, and no stream opens again.
   */
  closeSend(): void {
    this.closing = true;
    this.open?.out.close();
  }

  /** complete: CoordinatorClient.complete, on the stream when one is open. */
  async complete(req: CompleteInit, opts?: CallOptions): Promise<CompleteResponse> {
    const reply = await this.call({ case: "complete", value: req }, opts);
    if (reply === undefined) {
      return this.client.complete(req, opts);
    }
    return reply.result.case === "complete" ? reply.result.value : unexpected(reply, "complete");
  }

  /** reschedule: CoordinatorClient.reschedule, on the stream when one is open. */
  async reschedule(req: RescheduleInit, opts?: CallOptions): Promise<RescheduleResponse> {
    const reply = await this.call({ case: "reschedule", value: req }, opts);
    if (reply === undefined) {
      return this.client.reschedule(req, opts);
    }
    return reply.result.case === "reschedule" ? reply.result.value : unexpected(reply, "reschedule");
  }

  /** escalate: CoordinatorClient.escalate, on the stream when one is open. */
  async escalate(req: EscalateInit, opts?: CallOptions): Promise<EscalateResponse> {
    const reply = await this.call({ case: "escalate", value: req }, opts);
    if (reply === undefined) {
      return this.client.escalate(req, opts);
    }
    return reply.result.case === "escalate" ? reply.result.value : unexpected(reply, "escalate");
  }

  /** renewLeases: CoordinatorClient.renewLeases, on the stream when one is open; each grant's answer decoded alike. */
  async renewLeases(grants: readonly Grant[], opts?: RenewLeasesOptions): Promise<Renewal[]> {
    const { leaseMs, ...callOpts } = opts ?? {};
    const reply = await this.call({ case: "renewLeases", value: renewLeasesRequest(grants, leaseMs) }, callOpts);
    if (reply === undefined) {
      return this.client.renewLeases(grants, opts);
    }
    return reply.result.case === "renewLeases" ? reply.result.value.renewals.map(renewalOf) : unexpected(reply, "renewLeases");
  }

  /** reportObservation: CoordinatorClient.reportObservation, on the stream when one is open. */
  async reportObservation(req: ReportObservationInit, opts?: CallOptions): Promise<ReportObservationResponse> {
    const reply = await this.call({ case: "reportObservation", value: req }, opts);
    if (reply === undefined) {
      return this.client.reportObservation(req, opts);
    }
    return reply.result.case === "reportObservation" ? reply.result.value : unexpected(reply, "reportObservation");
  }

  // call sends one call on the open stream and waits for its reply, under
  // the call's deadline (the client's default when it names none) and
  // signal, as a unary call would. Undefined: no stream takes calls now, so
  // the caller makes the unary call. A reply's error rejects decoded exactly
  // as the unary call's error (R24).
  private call(call: CallInit, opts: CallOptions | undefined): Promise<WorkReply | undefined> {
    const s = this.open;
    if (s === undefined || this.closing) {
      return Promise.resolve(undefined);
    }
    const callId = ++this.lastCallId;
    const signal = opts?.signal;
    const timeoutMs = opts?.timeoutMs ?? this.client.defaultTimeoutMs;
    return new Promise<WorkReply | undefined>((resolve, reject) => {
      const settle = (answer: WorkReply | CoordinatorError | undefined): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        s.pending.delete(callId);
        if (answer === undefined) {
          resolve(undefined);
          return;
        }
        if (answer instanceof CoordinatorError) {
          reject(answer);
        } else if (answer.error.length > 0) {
          reject(workReplyError(answer.error));
        } else {
          resolve(answer);
        }
      };
      const onAbort = (): void => {
        settle(toCoordinatorError(ConnectError.from(signal!.reason, Code.Canceled)));
      };
      // A reply after the deadline finds no call waiting and is dropped; a
      // repeat of the call is idempotent (R21).
      const timer = setTimeout(() => {
        settle(toCoordinatorError(new ConnectError(`no answer on the worker stream within ${Math.ceil(timeoutMs)} ms`,
          Code.DeadlineExceeded)));
      }, timeoutMs);
      if (signal?.aborted) {
        onAbort();
        return;
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      s.pending.set(callId, settle);
      // R35: the trace context of the span the call is made in, in the
      // call itself: one stream carries many jobs' calls, and its metadata
      // is the stream's.
      const traced = traceHeaders(opts?.traceContext ?? otelContext.active());
      if (!s.out.push(create(WorkRequestSchema, { kind: { case: "call", value: { callId, call, ...traced } } }))) {
        settle(undefined); // the stream is ending and takes nothing more: a unary call
      }
    });
  }
}

/**
 * startRequest is the message a stream opens with: every free slot as
 * credits, and the promise to acknowledge each grant as it is read.
 */
export function startRequest(start: WorkStartInit, free: number): WorkRequest {
  return create(WorkRequestSchema, {
    kind: {
      case: "start",
      value: {
        workerId: start.workerId,
        provider: start.provider,
        leaseDuration: start.leaseMs === undefined ? undefined : durationFromMs(start.leaseMs),
        credits: Math.max(free, 0),
        acknowledges: true,
      },
    },
  });
}

// heartbeat is the message an idle stream sends: no new slot, still here.
function heartbeat(): WorkRequest {
  return create(WorkRequestSchema, { kind: { case: "credit", value: { credits: 0 } } });
}

// CallInit is the call of a WorkCall: one request, as its init shape.
type CallInit = NonNullable<MessageInitShape<typeof WorkCallSchema>["call"]>;

// unexpected: a reply whose result is not the call's; no answer to act on.
function unexpected(reply: WorkReply, want: NonNullable<WorkCall["call"]["case"]>): never {
  throw toCoordinatorError(new ConnectError(
    `the coordinator answered a ${want} call on the worker stream with ${reply.result.case ?? "nothing"}`, Code.Internal));
}

/**
 * Outbox is the stream's requests: an async iterable the transport reads
 * one message at a time, as HTTP/2 flow control lets it. Messages pushed
 * wait in order, those pushed with pushFirst (the acks) ahead of the rest;
 * close() ends it after them (the half-close). Its one
 * iterator's return() and throw(), which the transport calls when the
 * stream is cancelled, close it too. With `idle`, a read that waits `idle.ms`
 * for a message gets `idle.message()` instead (the heartbeat): on a timer of
 * the event loop, which a handler awaiting its provider never holds up. The
 * transport reads the next message only once the last one was written, so
 * heartbeats never queue up behind flow control, and none comes once the
 * outbox is closed.
 */
class Outbox<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  // The first `urgent` items were pushed with pushFirst.
  private urgent = 0;
  private closed = false;
  private waiting: ((r: IteratorResult<T, undefined>) => void) | undefined;
  private idleTimer: ReturnType<typeof setTimeout> | undefined;
  private readonly iterator: AsyncIterator<T, undefined> = {
    next: () => {
      const item = this.items.shift();
      if (item !== undefined) {
        this.urgent = Math.max(this.urgent - 1, 0);
        return Promise.resolve({ done: false, value: item });
      }
      if (this.closed) {
        return Promise.resolve({ done: true, value: undefined });
      }
      return new Promise((resolve) => {
        this.waiting = resolve;
        const idle = this.idle;
        if (idle !== undefined) {
          this.idleTimer = setTimeout(() => {
            this.idleTimer = undefined;
            if (this.waiting === resolve) {
              this.waiting = undefined;
              resolve({ done: false, value: idle.message() });
            }
          }, idle.ms);
        }
      });
    },
    return: async () => {
      this.abandon();
      return { done: true, value: undefined };
    },
    throw: async () => {
      this.abandon();
      return { done: true, value: undefined };
    },
  };

  constructor(private readonly idle?: { ms: number; message: () => T }) {}

  /** push queues m; false once the outbox is closed. */
  push(m: T): boolean {
    if (this.closed) {
      return false;
    }
    const w = this.waiting;
    if (w !== undefined) {
      this.waiting = undefined;
      this.stopIdle();
      w({ done: false, value: m });
    } else {
      this.items.push(m);
    }
    return true;
  }

  /** pushFirst queues m ahead of every message pushed, behind those pushed first; false once the outbox is closed. */
  pushFirst(m: T): boolean {
    if (this.closed) {
      return false;
    }
    if (this.waiting !== undefined) {
      return this.push(m);
    }
    this.items.splice(this.urgent++, 0, m);
    return true;
  }

  /** close ends the outbox once what was pushed has been read. */
  close(): void {
    this.closed = true;
    if (this.items.length === 0) {
      this.wake();
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<T, undefined> {
    return this.iterator;
  }

  // abandon: the transport reads no more; nothing pushed will be sent.
  private abandon(): void {
    this.closed = true;
    this.items.length = 0;
    this.urgent = 0;
    this.wake();
  }

  private wake(): void {
    const w = this.waiting;
    this.waiting = undefined;
    this.stopIdle();
    w?.({ done: true, value: undefined });
  }

  private stopIdle(): void {
    clearTimeout(this.idleTimer);
    this.idleTimer = undefined;
  }
}
