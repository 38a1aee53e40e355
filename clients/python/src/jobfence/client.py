"""A typed, thread-safe client of the jobfence.v1.Coordinator service."""

from __future__ import annotations

import dataclasses
import copy
import logging
import random
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from .tracing import trace_headers
from .errors import (
    BudgetExhaustedError,
    CoordinatorError,
    UnavailableError,
    decode_error,
    refusal_of,
)
from .types import (
    ClaimedJob,
    Grant,
    Job,
    JobDetail,
    JobState,
    LeaseToken,
    NextAction,
    Observation,
    Outcome,
    Renewal,
    WriteResult,
    action_to_proto,
    claimed_of,
    event_of,
    job_of,
    observation_of,
    outcome_to_proto,
    time_of,
)
from .v1 import coordinator_pb2 as pb
from .v1 import coordinator_pb2_grpc as pb_grpc

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "KEEPALIVE_OPTIONS",
    "MAX_RENEW_BATCH",
    "Client",
    "RetryPolicy",
    "TokenSource",
]

#: Bounds each call attempt that names no timeout, in seconds.
DEFAULT_CALL_TIMEOUT = 10.0
#: The most grants one RenewLeases call renews (R27).
MAX_RENEW_BATCH = 100

#: The keepalive of the channel a Client dials, as grpcio channel options: an
#: HTTP/2 PING after 10 s (the coordinator's minimum: it answers more frequent
#: pings with GOAWAY "too_many_pings"), the connection declared dead when the
#: PING is not answered within 5 s, also while no call is in flight; on Linux
#: grpcio also sets TCP_USER_TIMEOUT to the PING timeout, so data the peer's
#: TCP leaves unacknowledged for 5 s (the worker stream's heartbeats go every
#: second) closes it too. So a coordinator that vanished without a FIN or RST
#: (a host gone, a path dropping packets) is noticed within 15 s at most, not
#: when TCP gives up some 15 minutes later: the worker stream ends
#: UNAVAILABLE, its calls are answered UNAVAILABLE and repeated (R21), and the
#: Worker opens a new stream on a new connection. An option of the same name
#: in ``channel_options`` replaces the default.
KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
)

#: A bearer token, or a function returning one, asked before every call (so
#: it may refresh the token).
TokenSource = Union[str, Callable[[], str]]
GrantToken = Union[LeaseToken, str]

T = TypeVar("T")

_log = logging.getLogger("jobfence")

# The states ListJobs filters on.
_STATE_TO_PROTO = {
    JobState.READY: pb.JOB_STATE_READY,
    JobState.RUNNING: pb.JOB_STATE_RUNNING,
    JobState.SUCCEEDED: pb.JOB_STATE_SUCCEEDED,
    JobState.MANUAL_REVIEW: pb.JOB_STATE_MANUAL_REVIEW,
}


@dataclass(frozen=True)
class RetryPolicy:
    """How calls that are safe to repeat are repeated after UNAVAILABLE or a
    per-attempt timeout: up to ``attempts`` tries in all (1: no retry), waiting
    ``backoff`` seconds before the second, doubling up to ``max_backoff``, each
    wait jittered by ±50 %."""

    attempts: int = 6
    backoff: float = 0.1
    max_backoff: float = 2.0


def _channel_options(given: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The options of the channel a Client dials: KEEPALIVE_OPTIONS, less
    those named in given, then given as it is."""
    names = {name for name, _ in given}
    return [o for o in KEEPALIVE_OPTIONS if o[0] not in names] + list(given)


class Client:
    """A typed client of jobfence.v1.Coordinator. It is safe to share between
    threads.

    It repeats only what is safe to repeat, with the same request, after
    UNAVAILABLE or a per-attempt timeout (DEADLINE_EXCEEDED):

    - complete, reschedule and escalate: a write-back is idempotent for its
      grant, and a repeat whose first try had landed answers replayed=True,
      a success (R21);
    - renew_leases: a renewal is the same grant extended again (R27);
    - report_observation: the coordinator deduplicates receipts (R15);
    - enqueue_refund: the operation key makes it idempotent (R1);
    - get_job, list_jobs and resolve_review (fenced by the attempt the
      operator saw, replayed like a write-back).

    claim is never repeated: a claim whose outcome is unknown granted nothing
    the caller may act on (R7).

    Connect over TLS with ``tls=True`` (the system roots) or
    ``tls=grpc.ssl_channel_credentials(...)`` (a private CA, a client
    certificate for mutual TLS). Without it the connection is plaintext,
    which the coordinator serves on loopback. ``token`` sends
    ``authorization: Bearer <token>`` with every call; it is refused (a
    ValueError here, before anything is sent) over a plaintext connection
    unless ``plaintext_tokens=True``: for loopback and for a local proxy that
    adds TLS.

    ``channel_options`` are grpcio channel options for the channel it dials,
    e.g. reconnect backoffs; they replace the defaults of the same name
    (KEEPALIVE_OPTIONS).
    """

    def __init__(
        self,
        target: str,
        *,
        tls: Union[bool, grpc.ChannelCredentials] = False,
        tls_server_name: Optional[str] = None,
        token: Optional[TokenSource] = None,
        plaintext_tokens: bool = False,
        call_timeout: Optional[float] = DEFAULT_CALL_TIMEOUT,
        retry: RetryPolicy = RetryPolicy(),
        channel_options: Sequence[tuple[str, Any]] = (),
        logger: Optional[logging.Logger] = None,
    ) -> None:
        options = _channel_options(channel_options)
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls is False:
            if token is not None and not plaintext_tokens:
                raise ValueError(
                    "jobfence: a bearer token is sent only over TLS (tls=...); plaintext_tokens=True allows it "
                    "for loopback or a local proxy that adds TLS"
                )
            channel = grpc.insecure_channel(target, options=options)
        else:
            creds = grpc.ssl_channel_credentials() if tls is True else tls
            channel = grpc.secure_channel(target, creds, options=options)
        self._init(channel, True, token, call_timeout, retry, logger)

    @classmethod
    def from_channel(
        cls,
        channel: grpc.Channel,
        *,
        call_timeout: Optional[float] = DEFAULT_CALL_TIMEOUT,
        retry: RetryPolicy = RetryPolicy(),
        logger: Optional[logging.Logger] = None,
    ) -> Client:
        """A Client on a channel the caller made and closes: its transport
        security, credentials, interceptors and keepalive are the channel's
        business (give it KEEPALIVE_OPTIONS, so that a dead coordinator is
        noticed)."""
        c = cls.__new__(cls)
        c._init(channel, False, None, call_timeout, retry, logger)
        return c

    def _init(
        self,
        channel: grpc.Channel,
        owned: bool,
        token: Optional[TokenSource],
        call_timeout: Optional[float],
        retry: RetryPolicy,
        logger: Optional[logging.Logger],
    ) -> None:
        self._channel = channel
        self._owned = owned
        self._token = token
        self._call_timeout = call_timeout
        self._retry = RetryPolicy(max(1, retry.attempts), retry.backoff, retry.max_backoff)
        self._log = logger or _log
        self._stub: Any = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]

    @property
    def stub(self) -> Any:
        """The generated jobfence.v1 CoordinatorStub, for calls this class does not cover."""
        return self._stub

    def _through(self, stub: Any) -> Client:
        """This Client calling through stub instead, on the same channel, with
        the same credentials, timeouts and retries: the Worker's, whose stub
        sends write-backs, renewals and receipts on its worker stream. Closing
        it closes nothing."""
        c = copy.copy(self)
        c._stub = stub
        c._owned = False
        return c

    def close(self) -> None:
        """Closes the channel this Client dialled; does nothing for from_channel."""
        if self._owned:
            self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------

    def _metadata(self) -> list[tuple[str, str]]:
        # R35: the W3C trace context of the span current in this thread, when
        # OpenTelemetry is installed and one is.
        traced = trace_headers()
        md: list[tuple[str, str]] = []
        if traced is not None:
            md.append(("traceparent", traced[0]))
            if traced[1]:
                md.append(("tracestate", traced[1]))
        if self._token is None:
            return md
        try:
            tok = self._token if isinstance(self._token, str) else self._token()
        except Exception as e:
            # Like a coordinator that cannot be reached: nothing was sent.
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"jobfence: bearer token: {e}") from e
        return md + [("authorization", f"Bearer {tok}")]

    def _timeout(self, timeout: Optional[float], extra: float = 0.0) -> Optional[float]:
        t = self._call_timeout if timeout is None else timeout
        return None if t is None or t <= 0 else t + extra

    def _once(self, method: str, req: Any, timeout: Optional[float]) -> Any:
        try:
            return getattr(self._stub, method)(req, timeout=timeout, metadata=self._metadata())
        except grpc.RpcError as e:
            raise decode_error(e) from None

    def _retry_safe(self, method: str, req: Any, timeout: Optional[float]) -> Any:
        """Runs an RPC that is safe to repeat with the same request until it
        succeeds, fails in a way a repeat cannot fix, or the tries run out.
        UNAVAILABLE (transport, DATABASE_UNAVAILABLE, WRITE_OUTCOME_UNKNOWN)
        and an attempt that ran out of its own time both leave the outcome
        unknown, which a repeat of the same request settles (R21)."""
        wait = self._retry.backoff
        per_try = self._timeout(timeout)
        for attempt in range(1, self._retry.attempts + 1):
            try:
                return self._once(method, req, per_try)
            except CoordinatorError as e:
                if attempt >= self._retry.attempts or not retryable(e):
                    raise
                pause = wait * (0.5 + random.random())
                self._log.warning(
                    "jobfence: repeating call",
                    extra={"method": method, "try": attempt + 1, "after": round(pause, 3), "error": str(e)},
                )
                time.sleep(pause)
                wait = min(2 * wait, self._retry.max_backoff)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- calls -------------------------------------------------------------

    def enqueue_refund(
        self,
        *,
        operation_key: str,
        order_id: str,
        payment_id: str,
        amount_minor: int,
        currency: str,
        provider: str,
        not_before: Optional[datetime] = None,
        timeout: Optional[float] = None,
    ) -> tuple[Job, bool]:
        """Creates a ready refund job and returns it with created=True.
        Enqueuing the same operation key with the same values returns the
        existing job with created=False (R1), so the call is repeated after
        UNAVAILABLE.

        Raises OperationKeyConflictError when the key is bound to other
        values; InvalidArgumentError; UnavailableError after the retries."""
        req = pb.EnqueueRefundRequest(
            operation_key=operation_key,
            order_id=order_id,
            payment_id=payment_id,
            amount_minor=amount_minor,
            currency=currency,
            provider=provider,
        )
        if not_before is not None:
            req.not_before.CopyFrom(_timestamp(not_before))
        resp = self._retry_safe("EnqueueRefund", req, timeout)
        return job_of(resp.job), bool(resp.created)

    def claim(
        self,
        worker_id: str,
        max_jobs: int,
        *,
        lease: Optional[float] = None,
        provider: str = "",
        wait: Optional[float] = None,
        timeout: Optional[float] = None,
        cancel: Optional[threading.Event] = None,
    ) -> list[ClaimedJob]:
        """Asks for up to max_jobs jobs (1..100): ready jobs that are due, and
        running jobs whose lease expired (takeovers, R6). Each was granted by a
        committed transaction that bumped its attempt (R5) and minted its lease
        token (R25). No work is an empty list. Claim only what you can start
        now (R18).

        ``lease`` (1 s..15 min) is the lease to ask for; None: the
        coordinator's default. ``wait`` (0..60 s) long-polls: when no job is
        available the coordinator waits up to that long for one; the call's
        deadline is the call timeout plus ``wait``. Setting ``cancel`` ends a
        waiting claim early (it raises CoordinatorError CANCELLED).

        Never repeated: on any error nothing may be acted on (R7); a job the
        failed call did grant comes back through a takeover once its lease
        expires. Raises ClaimOutcomeUnknownError (an UnavailableError);
        UnavailableError; InvalidArgumentError; BudgetExhaustedError when
        jobs are due but their providers' budgets allow none now (R19)."""
        req = pb.ClaimRequest(worker_id=worker_id, max_jobs=max_jobs, provider=provider)
        if lease:
            req.lease_duration.CopyFrom(_duration(lease))
        if wait:
            req.wait.CopyFrom(_duration(wait))
        deadline = self._timeout(timeout, max(wait or 0.0, 0.0))
        if cancel is None:
            resp = self._once("Claim", req, deadline)
        else:
            resp = self._cancellable("Claim", req, deadline, cancel)
        received = time.monotonic()
        if not resp.jobs and resp.HasField("retry_after"):
            ra = resp.retry_after
            raise BudgetExhaustedError(int(ra.seconds) + int(ra.nanos) / 1e9)
        return [claimed_of(j, received) for j in resp.jobs]

    def _cancellable(self, method: str, req: Any, timeout: Optional[float], cancel: threading.Event) -> Any:
        fut = getattr(self._stub, method).future(req, timeout=timeout, metadata=self._metadata())
        while not fut.done():
            if cancel.wait(0.05):
                fut.cancel()
                break
        try:
            return fut.result()
        except grpc.FutureCancelledError:
            raise CoordinatorError(grpc.StatusCode.CANCELLED, "jobfence: call cancelled") from None
        except grpc.RpcError as e:
            raise decode_error(e) from None

    def complete(
        self,
        job_id: int,
        attempt: int,
        lease_token: GrantToken,
        provider_refund_id: str,
        *,
        timeout: Optional[float] = None,
    ) -> WriteResult:
        """Moves a running job to succeeded and records the refund, if attempt
        and lease_token are still the job's current grant (R9, R10, R25).
        Repeated with the same request after UNAVAILABLE; a repeat whose first
        try had landed returns replayed=True (R21).

        Raises StaleAttemptError when the request does not carry the job's
        current grant (taken over, another token): never repeat it, not even
        with its current_attempt; file the provider's answer with
        report_observation (R15). JobNotRunningError when this grant already
        wrote a different outcome; NotFoundError; InvalidArgumentError;
        UnavailableError (WriteOutcomeUnknownError, DatabaseUnavailableError)
        after the retries."""
        req = pb.CompleteRequest(
            job_id=job_id, attempt=attempt, lease_token=_secret(lease_token), provider_refund_id=provider_refund_id
        )
        resp = self._retry_safe("Complete", req, timeout)
        return WriteResult(job_of(resp.job), bool(resp.replayed))

    def reschedule(
        self,
        job_id: int,
        attempt: int,
        lease_token: GrantToken,
        *,
        next_action: NextAction = NextAction.RECONCILE,
        delay: Optional[float] = None,
        at: Optional[datetime] = None,
        reason: str = "",
        timeout: Optional[float] = None,
    ) -> WriteResult:
        """Hands a running job back to ready for a later attempt, fenced by its
        grant exactly like complete and repeated the same way (R21).
        ``next_action`` is RECONCILE unless the provider definitely did not act
        on the request, or a reconcile found a same-key resend safe (R14).
        ``delay`` (seconds, 0..30 days from the database's now) or ``at``
        (absolute, wins) says when; neither: due now. Raises as complete."""
        req = pb.RescheduleRequest(
            job_id=job_id,
            attempt=attempt,
            lease_token=_secret(lease_token),
            next_action=action_to_proto(next_action),
            reason=reason,
        )
        if at is not None:
            req.next_attempt_at.CopyFrom(_timestamp(at))
        elif delay:
            req.delay.CopyFrom(_duration(delay))
        resp = self._retry_safe("Reschedule", req, timeout)
        return WriteResult(job_of(resp.job), bool(resp.replayed), bool(resp.expedited))

    def escalate(
        self,
        job_id: int,
        attempt: int,
        lease_token: GrantToken,
        reason: str,
        *,
        timeout: Optional[float] = None,
    ) -> WriteResult:
        """Moves a running job to manual_review (R14, R16), fenced by its grant
        exactly like complete and repeated the same way (R21). ``reason`` tells
        a person why they must look; required. Raises as complete."""
        req = pb.EscalateRequest(job_id=job_id, attempt=attempt, lease_token=_secret(lease_token), reason=reason)
        resp = self._retry_safe("Escalate", req, timeout)
        return WriteResult(job_of(resp.job), bool(resp.replayed))

    def renew_leases(
        self, grants: Sequence[Grant], *, lease: Optional[float] = None, timeout: Optional[float] = None
    ) -> list[Renewal]:
        """Extends the leases of grants this process holds, up to
        MAX_RENEW_BATCH in one call, each job once, each to ``lease`` seconds
        from the coordinator's now (None: its default lease), never past its
        grant's life (R27). Each grant is fenced like a write-back and answered
        on its own, in order (see Renewal): a lease that ran out is renewed as
        long as no takeover has committed (R8); a renewal never bumps the
        attempt. Safe to repeat, and repeated after UNAVAILABLE. The whole call
        raises only InvalidArgumentError (the field named: grants,
        grants[i].job_id, lease_duration), UnavailableError,
        PermissionDeniedError or UnauthenticatedError."""
        req = pb.RenewLeasesRequest(
            grants=[pb.GrantRef(job_id=g.job_id, attempt=g.attempt, lease_token=_secret(g.lease_token)) for g in grants]
        )
        if lease:
            req.lease_duration.CopyFrom(_duration(lease))
        resp = self._retry_safe("RenewLeases", req, timeout)
        out = []
        for r in resp.renewals:
            refused = refusal_of(r) if r.refused != pb.ERROR_REASON_UNSPECIFIED else None
            out.append(
                Renewal(
                    job_id=int(r.job_id),
                    attempt=int(r.attempt),
                    lease_until=time_of(r, "lease_until"),
                    refused=refused,
                    grant_expires_at=time_of(r, "grant_expires_at"),
                    receipt_filed_at=time_of(r, "receipt_filed_at"),
                )
            )
        return out

    def report_observation(
        self,
        *,
        source: str,
        outcome: Outcome,
        job_id: int = 0,
        operation_key: str = "",
        attempt: int = 0,
        lease_token: Optional[GrantToken] = None,
        provider_refund_id: str = "",
        provider_event_id: str = "",
        detail: str = "",
        timeout: Optional[float] = None,
    ) -> tuple[Observation, bool, bool]:
        """Files what a worker, webhook or reconciler learned from the provider
        and returns (observation, duplicate, expedited). Accepted from stale
        workers too; it never changes the job's state (R15, R28). The job is
        named by job_id, or when that is 0 by operation_key. ``attempt`` is
        the attempt the reporter held (0: none); with that grant's
        ``lease_token`` the receipt is attempt_verified (R25). The same receipt
        filed twice is kept once (duplicate=True), so the call is repeated
        after UNAVAILABLE. A receipt the job has no room for is kept in the
        coordinator's unmatched log (observation.kept_aside_id, R28). Raises
        NotFoundError, InvalidArgumentError, UnavailableError after the
        retries (ObservationLimitError from coordinators of earlier
        releases)."""
        req = pb.ReportObservationRequest(
            attempt=attempt,
            lease_token=_secret(lease_token) if lease_token is not None else "",
            source=source,
            outcome=outcome_to_proto(outcome),
            provider_refund_id=provider_refund_id,
            provider_event_id=provider_event_id,
            detail=detail,
        )
        if job_id:
            req.job_id = job_id
        else:
            req.operation_key = operation_key
        resp = self._retry_safe("ReportObservation", req, timeout)
        obs = observation_of(resp.observation)
        if resp.HasField("kept_aside"):
            obs = dataclasses.replace(obs, kept_aside_id=int(resp.kept_aside.id))
        return obs, bool(resp.duplicate), bool(resp.expedited)

    def get_job(
        self,
        job_id: int = 0,
        *,
        operation_key: str = "",
        observations_page_size: int = 0,
        observations_page_token: str = "",
        timeout: Optional[float] = None,
    ) -> JobDetail:
        """The job with this id (or, when job_id is 0, this operation key), its
        history and a page of its receipts. Raises NotFoundError,
        InvalidArgumentError, UnavailableError after the retries."""
        req = pb.GetJobRequest(
            observations_page_size=observations_page_size, observations_page_token=observations_page_token
        )
        if job_id:
            req.job_id = job_id
        else:
            req.operation_key = operation_key
        resp = self._retry_safe("GetJob", req, timeout)
        return JobDetail(
            job=job_of(resp.job),
            events=tuple(event_of(e) for e in resp.events),
            observations=tuple(observation_of(o) for o in resp.observations),
            observation_count=int(resp.observation_count),
            resend_deadline=time_of(resp, "resend_deadline"),
            now=time_of(resp, "now"),
            next_observations_page_token=str(resp.next_observations_page_token),
        )

    def list_jobs(
        self,
        *,
        state: Optional[JobState] = None,
        provider: str = "",
        order_id: str = "",
        payment_id: str = "",
        provider_refund_id: str = "",
        page_size: int = 0,
        page_token: str = "",
        timeout: Optional[float] = None,
    ) -> tuple[list[Job], str]:
        """One page of jobs by state, provider, order, payment or provider
        refund id, and the next page's token ("" on the last page)."""
        req = pb.ListJobsRequest(
            provider=provider,
            order_id=order_id,
            payment_id=payment_id,
            provider_refund_id=provider_refund_id,
            page_size=page_size,
            page_token=page_token,
        )
        if state is not None:
            req.state = _STATE_TO_PROTO[state]
        resp = self._retry_safe("ListJobs", req, timeout)
        return [job_of(j) for j in resp.jobs], str(resp.next_page_token)

    def resolve_review(
        self,
        job_id: int,
        attempt: int,
        *,
        refunded: bool,
        note: str,
        provider_refund_id: str = "",
        timeout: Optional[float] = None,
    ) -> WriteResult:
        """An operator closes a job in manual review: succeeded with the
        provider's refund id (refunded=True), or back to ready to reconcile. It
        is fenced by the attempt the operator looked at (StaleAttemptError or
        JobNotInReviewError when the job moved on) and carries no lease token:
        an operator is authorised by role, not by a grant (R25, R29)."""
        req = pb.ResolveReviewRequest(
            job_id=job_id,
            attempt=attempt,
            resolution=pb.REVIEW_RESOLUTION_REFUNDED if refunded else pb.REVIEW_RESOLUTION_RECONCILE,
            provider_refund_id=provider_refund_id,
            note=note,
        )
        resp = self._retry_safe("ResolveReview", req, timeout)
        return WriteResult(job_of(resp.job), bool(resp.replayed))


def retryable(e: CoordinatorError) -> bool:
    """Whether repeating the same request may settle e: UNAVAILABLE (transport,
    DATABASE_*, WRITE_OUTCOME_UNKNOWN) or a call that ran out of its time. Never
    for a claim, which the Client does not repeat at all (R7)."""
    return e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _secret(t: GrantToken) -> str:
    return t.reveal() if isinstance(t, LeaseToken) else str(t)


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    whole = int(seconds)
    d.seconds = whole
    d.nanos = int(round((seconds - whole) * 1e9))
    return d


def _timestamp(t: datetime) -> timestamp_pb2.Timestamp:
    if t.tzinfo is None:
        raise ValueError("jobfence: a naive datetime has no time zone; pass an aware one (e.g. UTC)")
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(t.astimezone(timezone.utc).replace(tzinfo=None))
    return ts
