// A typed client for jobfence.v1.Coordinator over the gRPC protocol.

import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";
import { context as otelContext, type Context } from "@opentelemetry/api";
import type { SecureClientSessionOptions } from "node:http2";

import { CoordinatorError, refusalError, toCoordinatorError } from "./errors.js";
import { traceHeaders } from "./tracing.js";
import {
  Coordinator,
  ErrorReason,
  type ClaimedJob,
  type ClaimRequestSchema,
  type ClaimResponse,
  type CompleteRequestSchema,
  type CompleteResponse,
  type EnqueueRefundRequestSchema,
  type EnqueueRefundResponse,
  type EscalateRequestSchema,
  type EscalateResponse,
  type GetJobRequestSchema,
  type GetJobResponse,
  type LeaseRenewal,
  type ListJobsRequestSchema,
  type ListJobsResponse,
  type RenewLeasesRequestSchema,
  type ResolveReviewRequestSchema,
  type ResolveReviewResponse,
  type ReportObservationRequestSchema,
  type ReportObservationResponse,
  type RescheduleRequestSchema,
  type RescheduleResponse,
  type WorkRequest,
  type WorkResponse,
} from "./gen/jobfence/v1/coordinator_pb.js";

/** TLSOptions configures a TLS connection; `true` uses the system roots. */
export type TLSOptions = true | Pick<SecureClientSessionOptions, "ca" | "cert" | "key" | "servername" | "rejectUnauthorized">;

/** CoordinatorClientOptions configures a CoordinatorClient. */
export interface CoordinatorClientOptions {
  /** "host:port", or a URL ("http://host:port", "https://host:port"). */
  address: string;
  /** Connect with TLS. Off by default ("host:port" then means plaintext). */
  tls?: TLSOptions;
  /**
   * Bearer token sent as `authorization: Bearer <token>` on every call; a
   * function is asked before each call, so it can refresh the token.
   */
  token?: string | (() => string | Promise<string>);
  /** Adds request metadata (headers) to every call, e.g. a tenant header. */
  metadata?: (headers: Headers, method: string) => void | Promise<void>;
  /** The deadline of a call that names none. Default 10 s. */
  defaultTimeoutMs?: number;
  /** Extra connect interceptors, outermost first. */
  interceptors?: Interceptor[];
  /**
   * How the client's HTTP/2 connection is kept checked with PING frames;
   * each field given replaces its default (DEFAULT_KEEPALIVE).
   */
  keepalive?: KeepaliveOptions;
}

/**
 * KeepaliveOptions check the client's HTTP/2 connection with PING frames, so
 * that a coordinator that vanished without a FIN or RST (a host gone, a path
 * dropping packets) is noticed, where the worker stream's writes would
 * otherwise sit in the kernel's send buffer until TCP gives up, some 15
 * minutes later. A connection found dead is closed: its calls and the worker
 * stream fail UNAVAILABLE, the Worker repeats the calls it was waiting on
 * (R21) and opens a new stream, on a new connection.
 */
export interface KeepaliveOptions {
  /**
   * A PING this long after the connection last showed it is alive (a PING
   * answered, bytes read on a call or the stream); a call on a connection
   * silent this long is preceded by one. Infinity: none. The coordinator
   * answers pings more frequent than every 10 s with GOAWAY
   * "too_many_pings".
   */
  pingIntervalMs?: number;
  /** How long a PING waits for its answer before the connection is closed. */
  pingTimeoutMs?: number;
  /** Also ping while no call or stream is open on the connection. */
  pingIdleConnection?: boolean;
}

/**
 * DEFAULT_KEEPALIVE: a PING after 10 s of silence (the coordinator's
 * minimum), 5 s for its answer, also while no call is open: a dead
 * connection is closed within about 15 s.
 */
export const DEFAULT_KEEPALIVE: Readonly<Required<KeepaliveOptions>> = Object.freeze({
  pingIntervalMs: 10_000,
  pingTimeoutMs: 5_000,
  pingIdleConnection: true,
});

/** CallOptions apply to one call. */
export interface CallOptions {
  /** The call's deadline, sent to the server as grpc-timeout. */
  timeoutMs?: number;
  /** Cancels the call. */
  signal?: AbortSignal;
  /** Extra request metadata. */
  headers?: ConstructorParameters<typeof Headers>[0];
  /**
   * The OpenTelemetry context whose span the call is made in (R35): its W3C
   * trace context goes with the call (`traceparent` and `tracestate`
   * metadata; in the WorkCall on the worker stream). Default: the active
   * context. Nothing is sent when it holds no span.
   */
  traceContext?: Context;
}

/**
 * A write-back carries its grant (R9, R25): the `attempt` and the `leaseToken`
 * of the same ClaimedJob. The token is required by the type, so that a
 * write-back that forgot it does not compile: the coordinator refuses the
 * right attempt with another or no token as STALE_ATTEMPT.
 */
type WithGrant<T> = T & {
  /**
   * `ClaimedJob.leaseToken` of the grant this write-back belongs to (R25). A
   * secret: keep it out of logs, never send it to the provider. Log
   * `grantFingerprint(leaseToken)` instead.
   */
  leaseToken: string;
};

/** Request init shapes: plain objects; int64 fields take bigint. */
export type EnqueueRefundInit = MessageInitShape<typeof EnqueueRefundRequestSchema>;
export type ClaimInit = MessageInitShape<typeof ClaimRequestSchema>;
/** A Complete request: jobId, attempt, leaseToken (R25) and providerRefundId. */
export type CompleteInit = WithGrant<MessageInitShape<typeof CompleteRequestSchema>>;
/** A Reschedule request: jobId, attempt, leaseToken (R25), nextAction, when, reason. */
export type RescheduleInit = WithGrant<MessageInitShape<typeof RescheduleRequestSchema>>;
/** An Escalate request: jobId, attempt, leaseToken (R25) and reason. */
export type EscalateInit = WithGrant<MessageInitShape<typeof EscalateRequestSchema>>;
/**
 * A ReportObservation request. `leaseToken` is optional: a reporter that held
 * the grant of `attempt` sends its token and the receipt is stored with
 * `attemptVerified: true` (R25); webhooks and reconcilers (attempt 0) send none,
 * and a receipt without it is filed all the same (R15).
 */
export type ReportObservationInit = MessageInitShape<typeof ReportObservationRequestSchema>;
export type GetJobInit = MessageInitShape<typeof GetJobRequestSchema>;
export type ListJobsInit = MessageInitShape<typeof ListJobsRequestSchema>;
export type ResolveReviewInit = MessageInitShape<typeof ResolveReviewRequestSchema>;

/** MaxRenewBatch is the most grants one RenewLeases call renews (R27). */
export const MaxRenewBatch = 100;

/**
 * Grant names a grant to renew (R25): the job, the attempt Claim granted and
 * that claim's lease token. `grantOf(claimed)` makes one.
 */
export interface Grant {
  jobId: bigint;
  attempt: bigint;
  /** `ClaimedJob.leaseToken`: a secret, never logged (R25). */
  leaseToken: string;
}

/** grantOf is the grant a claimed job holds. */
export function grantOf(claimed: ClaimedJob): Grant {
  return { jobId: claimed.job?.id ?? 0n, attempt: claimed.attempt, leaseToken: claimed.leaseToken };
}

/** RenewLeasesOptions apply to one renewLeases call. */
export interface RenewLeasesOptions extends CallOptions {
  /**
   * How long each lease runs from the coordinator's now (1 s..15 min, R12);
   * the coordinator's default lease when unset, like Claim's.
   */
  leaseMs?: number;
}

/**
 * Renewal answers the renewal of one grant (R27), one per grant in the
 * request's order: `kind: "renewed"` with the lease's new end, or
 * `kind: "refused"`.
 */
export type Renewal = Renewed | RenewalRefused;

interface RenewalOf {
  jobId: bigint;
  attempt: bigint;
  /**
   * The end of the grant's life: no renewal extends its lease past it (R27).
   * Set while the job runs under this grant.
   */
  grantExpiresAt: Date | undefined;
  /**
   * When the newest receipt of success or failure was filed for the job
   * during this grant, if one was (R28): what the provider told someone else
   * while this holder worked. A reschedule to RECONCILE is then due at once.
   */
  receiptFiledAt: Date | undefined;
}

/** Renewed: the grant's lease now ends at `leaseUntil` (the database's clock, R12). */
export interface Renewed extends RenewalOf {
  kind: "renewed";
  leaseUntil: Date;
}

/**
 * RenewalRefused: the grant's lease was not renewed. Branch on `reason` (a
 * Reason value) or on `error`'s class, never on its message (R24):
 * - Reason.StaleAttempt (StaleAttemptError): taken over, or not this grant:
 *   stop before sending anything new to the provider and file any answer
 *   already received as an observation (R15). `error.currentAttempt` and
 *   `error.currentState` say where the job stands.
 * - Reason.JobNotRunning (JobNotRunningError): this grant already wrote its
 *   outcome.
 * - Reason.GrantTooOld (GrantTooOldError): renew no more; the grant is still
 *   valid until a takeover commits after its lease runs out (R8).
 * - Reason.NotFound (NotFoundError): no such job.
 * - A reason whose error `isRetryableWrite` (DATABASE_UNAVAILABLE,
 *   WRITE_OUTCOME_UNKNOWN): this grant was not decided; renew it again.
 */
export interface RenewalRefused extends RenewalOf {
  kind: "refused";
  /** The ErrorInfo reason, a Reason value. */
  reason: string;
  /** The refusal as the same refusal of a write-back decodes (R24). */
  error: CoordinatorError;
}

/**
 * CoordinatorClient calls jobfence.v1.Coordinator. Every method rejects with
 * a CoordinatorError subclass chosen by the ErrorInfo reason (R24):
 * StaleAttemptError, JobNotRunningError, OperationKeyConflictError,
 * ClaimOutcomeUnknownError, WriteOutcomeUnknownError,
 * DatabaseUnavailableError, NotFoundError, InvalidArgumentError, or a plain
 * CoordinatorError carrying the status code. It never retries: whether a
 * repeat is safe depends on the call (see Worker and isRetryableWrite).
 */
export class CoordinatorClient {
  /** The underlying connect client, for calls this wrapper does not cover. */
  readonly raw: Client<typeof Coordinator>;
  /** The deadline of a call that names none (`CoordinatorClientOptions.defaultTimeoutMs`). */
  readonly defaultTimeoutMs: number;
  private readonly sessions: Http2SessionManager;

  constructor(opts: CoordinatorClientOptions) {
    const baseUrl = toBaseUrl(opts.address, opts.tls !== undefined);
    const nodeOptions: SecureClientSessionOptions = typeof opts.tls === "object" ? { ...opts.tls } : {};
    // One HTTP/2 session per client, owned here so close() can end it, kept
    // checked with PINGs (KeepaliveOptions). A session silent for the ping
    // interval is also verified with a PING before it carries a call: a
    // process that was paused (GC, SIGSTOP, a laptop lid) would otherwise
    // send its write-back into a connection that died meanwhile.
    this.sessions = new Http2SessionManager(baseUrl, keepaliveOf(opts.keepalive), nodeOptions);
    this.defaultTimeoutMs = opts.defaultTimeoutMs ?? 10_000;
    const interceptors: Interceptor[] = [...(opts.interceptors ?? [])];
    if (opts.token !== undefined || opts.metadata !== undefined) {
      interceptors.push(metadataInterceptor(opts.token, opts.metadata));
    }
    const transport = createGrpcTransport({ baseUrl, sessionManager: this.sessions, interceptors });
    this.raw = createClient(Coordinator, transport);
  }

  /** enqueueRefund creates a ready job, or returns the existing one for the same refund (R1). */
  enqueueRefund(req: EnqueueRefundInit, opts?: CallOptions): Promise<EnqueueRefundResponse> {
    return this.call((o) => this.raw.enqueueRefund(req, o), opts);
  }

  /**
   * claim grants up to max_jobs jobs, each with a bumped attempt (R5, R6) and
   * a freshly minted `leaseToken` (R25): 128 random bits, 22 characters of
   * base64url. Keep each job's attempt and token together and pass both to
   * every write-back of that job; only this answer ever carries the token
   * (never GetJob, errors or the coordinator's logs), so keep it out of your
   * own logs too (log `grantFingerprint(job.leaseToken)`).
   * Rejects with ClaimOutcomeUnknownError when nothing may be acted on (R7).
   */
  claim(req: ClaimInit, opts?: CallOptions): Promise<ClaimResponse> {
    return this.call((o) => this.raw.claim(req, o), opts);
  }

  /**
   * complete marks the job succeeded under its grant (R9, R10, R25): only if
   * `attempt` and `leaseToken` are still the job's current grant. Knowing the
   * current attempt is not enough — it is disclosed in errors and logs: with
   * another or no token, or an attempt the database never granted (lost in a
   * failover), it rejects with StaleAttemptError and nothing is written. The
   * same write repeated after a lost reply, same attempt and token, answers
   * `replayed: true` (R21).
   */
  complete(req: CompleteInit, opts?: CallOptions): Promise<CompleteResponse> {
    return this.call((o) => this.raw.complete(req, o), opts);
  }

  /** reschedule hands the job back to ready, fenced by attempt and leaseToken exactly like complete (R9, R25). */
  reschedule(req: RescheduleInit, opts?: CallOptions): Promise<RescheduleResponse> {
    return this.call((o) => this.raw.reschedule(req, o), opts);
  }

  /** escalate moves the job to manual review (R14, R16), fenced by attempt and leaseToken exactly like complete (R25). */
  escalate(req: EscalateInit, opts?: CallOptions): Promise<EscalateResponse> {
    return this.call((o) => this.raw.escalate(req, o), opts);
  }

  /**
   * renewLeases extends the leases of grants the caller holds (R27), up to
   * MaxRenewBatch per call, each job at most once: each lease then ends
   * `leaseMs` from the database's now (R12), never past its grant's
   * `grantExpiresAt`. Each grant is fenced by attempt and lease token like
   * complete (R25) and answered on its own, in order (see Renewal): a lease
   * that ran out is still renewed as long as no takeover has committed (R8);
   * a renewal never bumps the attempt. The whole call rejects only with
   * InvalidArgumentError (the field named: grants, grants[i].job_id,
   * grants[i].attempt, lease_duration), UNAVAILABLE (nothing was decided),
   * PERMISSION_DENIED or UNAUTHENTICATED. Renewing is idempotent: repeat the
   * call when `isRetryableWrite(err)`, as for a write-back (the Worker does,
   * at its next renewal, sooner).
   */
  async renewLeases(grants: readonly Grant[], opts?: RenewLeasesOptions): Promise<Renewal[]> {
    const { leaseMs, ...callOpts } = opts ?? {};
    const req = renewLeasesRequest(grants, leaseMs);
    const resp = await this.call((o) => this.raw.renewLeases(req, o), callOpts);
    return resp.renewals.map(renewalOf);
  }

  /**
   * reportObservation files a provider receipt; it never changes the job
   * (R15). With the `leaseToken` of the reported attempt's grant, the stored
   * observation has `attemptVerified: true` (R25); without it the receipt is
   * filed all the same.
   */
  reportObservation(req: ReportObservationInit, opts?: CallOptions): Promise<ReportObservationResponse> {
    return this.call((o) => this.raw.reportObservation(req, o), opts);
  }

  /** getJob returns the job with its history and observations. */
  getJob(req: GetJobInit, opts?: CallOptions): Promise<GetJobResponse> {
    return this.call((o) => this.raw.getJob(req, o), opts);
  }

  /**
   * listJobs pages through jobs by state, provider or order: pass
   * next_page_token back as page_token until it comes back empty.
   */
  listJobs(req: ListJobsInit, opts?: CallOptions): Promise<ListJobsResponse> {
    return this.call((o) => this.raw.listJobs(req, o), opts);
  }

  /**
   * resolveReview closes a job in manual review (an operator's call): refunded
   * with the provider's refund id, or back to reconcile. It is fenced by the
   * attempt the operator looked at: StaleAttemptError or JobNotInReviewError
   * when the job moved on. It takes no lease token: an operator is
   * authorised by role, not by a grant (R25).
   */
  resolveReview(req: ResolveReviewInit, opts?: CallOptions): Promise<ResolveReviewResponse> {
    return this.call((o) => this.raw.resolveReview(req, o), opts);
  }

  /**
   * work opens the worker stream (Coordinator.Work), the Worker's by default
   * (see WorkerOptions.noStream): a bidirectional gRPC stream on this
   * client's HTTP/2 connection. `requests` are sent as the transport takes
   * them, a WorkStart first; their end is the stream's half-close. The
   * answer yields the coordinator's messages — grants, one reply per call,
   * retry_after — until the coordinator ends the stream (after a half-close,
   * once every call sent is answered) or `signal` aborts it. The stream has
   * no deadline. It rejects with a CoordinatorError, decoded as a unary
   * call's is (R24): UNIMPLEMENTED from a coordinator without Work,
   * INVALID_ARGUMENT naming a field of a bad WorkStart or WorkCredit,
   * UNAVAILABLE when the connection is lost or the coordinator stops.
   */
  async *work(requests: AsyncIterable<WorkRequest>, opts: { signal?: AbortSignal } = {}): AsyncGenerator<WorkResponse, void, undefined> {
    try {
      // timeoutMs 0: no deadline, whatever the transport's default.
      yield* this.raw.work(requests, { signal: opts.signal, timeoutMs: 0 });
    } catch (err) {
      throw toCoordinatorError(err);
    }
  }

  /** close ends the connection; calls still in flight fail. */
  close(): void {
    this.sessions.abort();
  }

  private async call<T>(fn: (o: CallOptions) => Promise<T>, opts: CallOptions | undefined): Promise<T> {
    // gRPC's grpc-timeout header takes whole units: a fractional deadline
    // (a third of a lease) would be sent as one the server refuses with
    // HTTP 400, so it is rounded up to the next millisecond.
    const timeoutMs = opts?.timeoutMs ?? this.defaultTimeoutMs;
    const { traceContext, ...callOpts } = opts ?? {};
    // R35: the W3C trace context of the span the call is made in.
    const traced = traceHeaders(traceContext ?? otelContext.active());
    let headers = callOpts.headers;
    if (traced !== undefined) {
      const h = new Headers(headers);
      h.set("traceparent", traced.traceparent);
      if (traced.tracestate !== "") {
        h.set("tracestate", traced.tracestate);
      } else {
        h.delete("tracestate");
      }
      headers = h;
    }
    try {
      return await fn({ ...callOpts, headers, timeoutMs: timeoutMs === undefined ? undefined : Math.ceil(timeoutMs) });
    } catch (err) {
      throw toCoordinatorError(err);
    }
  }
}

/** renewLeasesRequest is the RenewLeases request of grants, as a call or on the worker stream. */
export function renewLeasesRequest(grants: readonly Grant[], leaseMs: number | undefined): MessageInitShape<typeof RenewLeasesRequestSchema> {
  return {
    grants: grants.map((g) => ({ jobId: g.jobId, attempt: g.attempt, leaseToken: g.leaseToken })),
    leaseDuration: leaseMs === undefined ? undefined : durationFromMs(leaseMs),
  };
}

/** renewalOf decodes one grant's answer; a refusal by its reason (R24). */
export function renewalOf(r: LeaseRenewal): Renewal {
  const of: RenewalOf = {
    jobId: r.jobId,
    attempt: r.attempt,
    grantExpiresAt: dateOf(r.grantExpiresAt),
    receiptFiledAt: dateOf(r.receiptFiledAt),
  };
  if (r.refused === ErrorReason.UNSPECIFIED && r.leaseUntil !== undefined) {
    return { kind: "renewed", ...of, leaseUntil: timestampDate(r.leaseUntil) };
  }
  if (r.refused === ErrorReason.UNSPECIFIED) {
    // Neither renewed nor refused: not an answer this SDK can act on.
    const error = new CoordinatorError("the coordinator answered a renewal with neither a lease nor a refusal", Code.Internal, undefined, {});
    return { kind: "refused", ...of, reason: "", error };
  }
  const error = refusalError(r.refused, r.message, r.metadata, r.jobId, r.attempt);
  return { kind: "refused", ...of, reason: error.reason ?? "", error };
}

function dateOf(t: Timestamp | undefined): Date | undefined {
  return t === undefined ? undefined : timestampDate(t);
}

// keepaliveOf is DEFAULT_KEEPALIVE with the fields given replaced.
function keepaliveOf(k: KeepaliveOptions | undefined): Required<KeepaliveOptions> {
  return {
    pingIntervalMs: k?.pingIntervalMs ?? DEFAULT_KEEPALIVE.pingIntervalMs,
    pingTimeoutMs: k?.pingTimeoutMs ?? DEFAULT_KEEPALIVE.pingTimeoutMs,
    pingIdleConnection: k?.pingIdleConnection ?? DEFAULT_KEEPALIVE.pingIdleConnection,
  };
}

function metadataInterceptor(token: CoordinatorClientOptions["token"], metadata: CoordinatorClientOptions["metadata"]): Interceptor {
  return (next) => async (req) => {
    if (token !== undefined) {
      const t = typeof token === "function" ? await token() : token;
      req.header.set("authorization", `Bearer ${t}`);
    }
    if (metadata !== undefined) {
      await metadata(req.header, req.method.name);
    }
    return next(req);
  };
}

function toBaseUrl(address: string, tls: boolean): string {
  if (/^https?:\/\//.test(address)) {
    if (tls && address.startsWith("http://")) {
      throw new Error(`address ${address} is plaintext but tls options were given`);
    }
    return address;
  }
  return `${tls ? "https" : "http"}://${address}`;
}
