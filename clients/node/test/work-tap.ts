// A tap on the worker stream (Coordinator.Work), as a client interceptor: it
// sees every message the worker sends and receives on its streams, and stands
// in for a lossy network or coordinator on the calls they carry, as the Go
// SDK's test harness does on the server side (lossyStream, cutStreamAfter).

import { create, toBinary } from "@bufbuild/protobuf";
import { anyPack } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type Interceptor, type StreamRequest, type StreamResponse } from "@connectrpc/connect";

import { ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../src/gen/google/rpc/status_pb.js";
import {
  WorkResponseSchema,
  type WorkCall,
  type WorkRequest,
  type WorkResponse,
} from "../src/gen/jobfence/v1/coordinator_pb.js";

/** CallKind names a call on the stream: "complete", "renewLeases"… */
export type CallKind = NonNullable<WorkCall["call"]["case"]>;

/** methodOf is the unary method a stream call stands for: "Complete", "RenewLeases"… */
export function methodOf(kind: CallKind): string {
  return kind[0]!.toUpperCase() + kind.slice(1);
}

/** statusBytes is a google.rpc.Status with a jobfence ErrorInfo, serialized as a WorkReply's error. */
export function statusBytes(code: Code, message: string, reason?: string): Uint8Array {
  const details = reason === undefined ? [] : [anyPack(ErrorInfoSchema, create(ErrorInfoSchema, { domain: "jobfence", reason }))];
  return toBinary(StatusSchema, create(StatusSchema, { code, message, details }));
}

interface Fault {
  n: number;
  error?: Uint8Array;
}

/** WorkTap records a client's worker streams and injects faults into them. */
export class WorkTap {
  /** Streams opened. */
  opened = 0;
  /** Every message the worker sent, in order, as the transport took it. */
  readonly sent: WorkRequest[] = [];
  /** Every message the worker was handed, in order, after the faults. */
  readonly received: WorkResponse[] = [];
  /** Streams the worker half-closed: their requests ended. */
  halfClosed = 0;
  /** Both directions, in the order the worker sent and was handed them. */
  readonly log: Array<{ sent: WorkRequest } | { received: WorkResponse }> = [];
  /** Called with each message as it is sent, and as it is received. */
  onSent: ((m: WorkRequest) => void) | undefined;
  onReceived: ((m: WorkResponse) => void) | undefined;
  /**
   * refusal, when set, is asked for each call before it is forwarded: a
   * serialized google.rpc.Status (statusBytes) answers the call with that
   * error instead, and the coordinator never sees it.
   */
  refusal: ((call: WorkCall) => Uint8Array | undefined) | undefined;

  private readonly refusals = new Map<CallKind, Fault>();
  private readonly drops = new Map<CallKind, Fault>();
  private readonly cuts = new Map<CallKind, Fault>();

  /** interceptor is the tap, for CoordinatorClientOptions.interceptors. */
  readonly interceptor: Interceptor = (next) => async (req) => {
    if (!req.stream || req.method.name !== "Work") {
      return next(req);
    }
    this.opened++;
    return this.tapped(next as (r: StreamRequest) => Promise<StreamResponse>, req as StreamRequest);
  };

  /** calls lists the calls of one kind the worker sent on its streams. */
  calls(kind: CallKind): WorkCall[] {
    return this.sent.flatMap((m) => (m.kind.case === "call" && m.kind.value.call.case === kind ? [m.kind.value] : []));
  }

  /** starts lists the WorkStarts sent, one per stream. */
  starts() {
    return this.sent.flatMap((m) => (m.kind.case === "start" ? [m.kind.value] : []));
  }

  /**
   * refuse makes the next n calls of kind answered by the tap with code
   * (and reason), never reaching the coordinator: a coordinator that
   * refused them before doing anything.
   */
  refuse(kind: CallKind, n: number, code: Code, reason?: string): void {
    this.refusals.set(kind, { n, error: statusBytes(code, `test: ${kind} refused on the worker stream`, reason) });
  }

  /** dropReply makes the next n calls of kind served, their answers replaced by code (and reason): a reply lost after commit. */
  dropReply(kind: CallKind, n: number, code: Code, reason?: string): void {
    this.drops.set(kind, { n, error: statusBytes(code, `test: ${kind} reply lost after commit`, reason) });
  }

  /** cutAfter makes the next n calls of kind served, and their stream cut before their answers reach the worker. */
  cutAfter(kind: CallKind, n: number): void {
    this.cuts.set(kind, { n });
  }

  private async tapped(next: (r: StreamRequest) => Promise<StreamResponse>, req: StreamRequest): Promise<StreamResponse> {
    // Answers the tap gives, merged into what the coordinator sends.
    const injected: WorkResponse[] = [];
    let kick = (): void => undefined;
    let kicked = new Promise<void>((r) => (kick = r));
    const inject = (m: WorkResponse): void => {
      injected.push(m);
      kick();
      kicked = new Promise<void>((r) => (kick = r));
    };
    const served = new Map<bigint, CallKind>(); // calls forwarded, by id
    const upstream = req.message as AsyncIterable<WorkRequest>;
    const tap = this;
    async function* outbound(): AsyncGenerator<WorkRequest> {
      for await (const m of upstream) {
        tap.sent.push(m);
        tap.log.push({ sent: m });
        tap.onSent?.(m);
        if (m.kind.case === "call") {
          const { callId, call } = m.kind.value;
          const refused = take(tap.refusals, call.case!)?.error ?? tap.refusal?.(m.kind.value);
          if (refused !== undefined) {
            inject(create(WorkResponseSchema, { kind: { case: "reply", value: { callId, error: refused } } }));
            continue;
          }
          served.set(callId, call.case!);
        }
        yield m;
      }
      tap.halfClosed++;
    }
    const res = await next({ ...req, message: outbound() });
    const coordinator = res.message as AsyncIterable<WorkResponse>;
    async function* inbound(): AsyncGenerator<WorkResponse> {
      const it = coordinator[Symbol.asyncIterator]();
      let pending: Promise<IteratorResult<WorkResponse>> | undefined;
      for (;;) {
        const own = injected.shift();
        if (own !== undefined) {
          tap.received.push(own);
          tap.log.push({ received: own });
          tap.onReceived?.(own);
          yield own;
          continue;
        }
        pending ??= it.next();
        const r = await Promise.race([pending, kicked.then(() => undefined)]);
        if (r === undefined) {
          continue; // an injected answer
        }
        pending = undefined;
        if (r.done === true) {
          return;
        }
        let m = r.value;
        if (m.kind.case === "reply") {
          const kind = served.get(m.kind.value.callId);
          served.delete(m.kind.value.callId);
          if (kind !== undefined && take(tap.cuts, kind) !== undefined) {
            throw new ConnectError(`test: worker stream cut after the ${kind} call was served`, Code.Unavailable);
          }
          const drop = kind === undefined || m.kind.value.error.length > 0 ? undefined : take(tap.drops, kind);
          if (drop !== undefined) {
            m = create(WorkResponseSchema, { kind: { case: "reply", value: { callId: m.kind.value.callId, error: drop.error } } });
          }
        }
        tap.received.push(m);
        tap.log.push({ received: m });
        tap.onReceived?.(m);
        yield m;
      }
    }
    return { ...res, message: inbound() } as StreamResponse;
  }
}

// take uses one of a fault's n.
function take(faults: Map<CallKind, Fault>, kind: CallKind): Fault | undefined {
  const f = faults.get(kind);
  if (f === undefined || f.n <= 0) {
    return undefined;
  }
  f.n--;
  return f;
}
