"""The jobs, grants and receipts the coordinator hands out, as Python values.

Every time is the coordinator's database clock (R12) as an aware UTC
``datetime``; ``None`` means "not set". Every duration is in seconds (a
``float``), as for ``time.sleep`` and gRPC's ``timeout``. int64 fields are
Python ints: they keep every value of the wire, beyond 2**53 too.
"""

from __future__ import annotations

import enum
import hashlib
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Optional, cast

from .v1 import coordinator_pb2 as pb

__all__ = [
    "ClaimedJob",
    "Event",
    "EventKind",
    "Grant",
    "Job",
    "JobDetail",
    "JobState",
    "LeaseToken",
    "NextAction",
    "Observation",
    "Outcome",
    "Renewal",
    "WriteResult",
]


class JobState(str, enum.Enum):
    """Where a job stands. Only RUNNING is written to, and only by the holder
    of the current grant (R9, R25)."""

    UNSPECIFIED = ""
    READY = "ready"  # waiting for next_attempt_at
    RUNNING = "running"  # held under a lease
    SUCCEEDED = "succeeded"  # the provider confirmed the refund (never for pending, R4)
    MANUAL_REVIEW = "manual_review"  # a person must decide (R14, R16)
    #: Stopped before anything could reach the provider, or by a person's
    #: decision on a maybe-sent refund (R32).
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        """Whether no worker acts on a job in this state again."""
        return self in (JobState.SUCCEEDED, JobState.MANUAL_REVIEW, JobState.CANCELLED)


class NextAction(str, enum.Enum):
    """What the holder of a job does first. A first claim sends the refund; a
    takeover, or any job whose sent request has an unknown outcome, asks the
    provider first (R6, R14)."""

    UNSPECIFIED = ""
    REFUND = "refund"
    RECONCILE = "reconcile"


class Outcome(str, enum.Enum):
    """What the provider said about a refund, as filed in an observation (R15).
    PENDING is not success (R4); NOT_FOUND does not prove that nothing
    happened (R14)."""

    UNSPECIFIED = ""
    SUCCEEDED = "succeeded"
    PENDING = "pending"
    FAILED = "failed"
    NOT_FOUND = "not_found"


class EventKind(str, enum.Enum):
    """The kinds of a job's history entries (R3)."""

    ENQUEUED = "enqueued"
    CLAIMED = "claimed"
    TAKEN_OVER = "taken_over"
    COMPLETED = "completed"
    RESCHEDULED = "rescheduled"
    ESCALATED = "escalated"
    RESOLVED = "resolved"  # an operator closed a review (R29)
    EXPEDITED = "expedited"  # a receipt made a waiting job due now, to reconcile (R28)


class LeaseToken:
    """The secret of one grant (R25): minted with every claim or takeover; a
    write-back of the grant is accepted only with it. The attempt is disclosed
    in errors and logs, the token never is, so knowing the attempt never lets
    a stale worker write.

    It prints as ``[redacted]`` (``str``, ``repr``, f-strings, logging);
    :meth:`fingerprint` names the grant without revealing it, and
    :meth:`reveal` returns the secret for the wire.
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: str) -> None:
        self._secret = secret

    def reveal(self) -> str:
        """The token itself, to send to the coordinator (never to the provider, never to a log)."""
        return self._secret

    def fingerprint(self) -> str:
        """A short, non-secret name of the grant for logs: the first 6 bytes of
        the token's SHA-256 in hex, as the coordinator's history keeps it and
        as the Go and TypeScript SDKs print it; "" for no token."""
        if not self._secret:
            return ""
        return hashlib.sha256(self._secret.encode()).hexdigest()[:12]

    def __repr__(self) -> str:
        return "LeaseToken('[redacted]')"

    def __str__(self) -> str:
        return "[redacted]"

    def __format__(self, spec: str) -> str:
        return format("[redacted]", spec)

    def __bool__(self) -> bool:
        return bool(self._secret)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LeaseToken) and other._secret == self._secret

    def __hash__(self) -> int:
        return hash(self._secret)

    def __reduce__(self) -> Any:
        raise TypeError("a LeaseToken is not pickled: it is a secret (R25)")


@dataclass(frozen=True)
class Job:
    """One refund and its scheduling state."""

    id: int
    #: The business idempotency key: send it to the provider as the
    #: Idempotency-Key, whoever holds the job (R1).
    operation_key: str
    order_id: str
    payment_id: str
    amount_minor: int  # in the currency's minor unit
    currency: str  # ISO 4217, upper case
    provider: str
    state: JobState
    #: Counts claims and takeovers (R2, R3). Internal: never send it to the provider.
    attempt: int
    next_action: NextAction
    next_attempt_at: Optional[datetime]
    lease_until: Optional[datetime]  # set only while running; expiry only opens the job to takeover (R8)
    provider_refund_id: str
    worker_id: str
    last_reason: str
    #: When operation_key could first have reached the provider: its first
    #: claim with next_action refund (R22).
    first_sent_at: Optional[datetime]
    created_at: Optional[datetime]
    updated_at: Optional[datetime]
    #: When the job, final, left the coordinator's working tables for its
    #: archive (R31); None while it is in them. It stays readable, and its key
    #: known for ever (R30).
    archived_at: Optional[datetime] = None
    #: When an operator (or the producer) asked to cancel the refund after it
    #: may have been sent (R32); None when nobody did, and for a job cancelled
    #: at once (CANCELLED). From then on the job is only ever reconciled.
    cancel_requested_at: Optional[datetime] = None
    #: The W3C trace context of the job's enqueue (R35),
    #: "00-<trace id>-<span id>-<flags>"; "" when the enqueue carried none.
    traceparent: str = ""


@dataclass(frozen=True)
class Observation:
    """One receipt in a job's observation log (R15)."""

    id: int
    job_id: int
    operation_key: str
    reported_attempt: int  # the attempt the reporter held; 0 for webhooks and reconcilers
    job_attempt: int  # the job's attempt when the receipt was filed
    source: str
    outcome: Outcome
    provider_refund_id: str
    provider_event_id: str
    detail: str
    created_at: Optional[datetime]
    #: The report carried the lease token of reported_attempt's grant (R25).
    attempt_verified: bool
    #: Who filed it, from the caller's credential ("" on a coordinator without
    #: credentials, "webhook:<provider>" for a webhook).
    reporter: str = ""
    #: Set by report_observation when the job had no room for the receipt
    #: (R28: 1,000 on file, or the share of receipts without a lease token, or
    #: this credential's share, taken): it was kept in the coordinator's
    #: unmatched log as this entry, where a person sees it, and moved nothing;
    #: id is 0. It is not lost: do not file it again.
    kept_aside_id: int = 0


@dataclass(frozen=True)
class ClaimedJob:
    """A job granted by Claim. Every write-back for it carries its grant:
    ``attempt`` and ``lease_token`` (R9, R25); the Worker does that for you."""

    job: Job
    attempt: int
    #: Proves this process holds the grant (R25). It prints redacted.
    lease_token: LeaseToken
    lease_until: Optional[datetime]
    next_action: NextAction
    #: Taken over from an expired lease; next_action is then reconcile (R6, R14).
    takeover: bool
    #: The newest receipts filed for the job, at most 5, oldest first (R15).
    observations: tuple[Observation, ...]
    observation_count: int
    #: Until when (database clock) a same-key resend is inside the provider's
    #: idempotency-key retention window, counted from job.first_sent_at (R22);
    #: None when nothing was sent yet.
    resend_deadline: Optional[datetime]
    #: The database's time when the claim committed (R12).
    claimed_at: Optional[datetime]
    #: time.monotonic() when the claim's answer arrived; see coordinator_now.
    received_monotonic: Optional[float] = field(default=None, compare=False)
    #: A cancel was requested of the job after it may have been sent (R32:
    #: the grant's cancel_requested, or job.cancel_requested_at set). The
    #: Worker then calls only handler.reconcile for it, whatever next_action
    #: says, and never writes back a reschedule that would send it: the
    #: provider has the refund → complete (the coordinator records that the
    #: cancel came too late); pending or no answer → reschedule to reconcile;
    #: no record, or the refund failed → escalate, since only a person may
    #: close a maybe-sent refund as cancelled. A handler may read it, e.g. to
    #: log it or to skip what only a send needs.
    cancel_requested: bool = False
    #: The W3C trace context of the job's enqueue (R35), handed to every
    #: grant; "" when the enqueue carried none. The Worker's attempt span
    #: links to it (WorkerOptions.tracer_provider); without OpenTelemetry a
    #: handler may propagate it itself.
    traceparent: str = ""
    tracestate: str = ""

    def coordinator_now(self) -> datetime:
        """Estimates the coordinator's database clock now (R12, R22), to compare
        with resend_deadline: the claim's database time plus the time elapsed on
        this machine's monotonic clock since the claim's answer arrived. This
        machine's wall clock is never consulted, so a skewed or jumping clock
        does not move the estimate; it runs late by the answer's transit time,
        which errs on the safe side (a resend looks later, never earlier).

        For a ClaimedJob not obtained from Claim it is claimed_at, or the local
        time when that is unset."""
        base = self._claim_time()
        if base is None:
            return datetime.now(timezone.utc)
        if self.received_monotonic is None:
            return base
        return base + timedelta(seconds=max(0.0, time.monotonic() - self.received_monotonic))

    def sends_again(self) -> bool:
        """Whether a refund sent under this claim is a same-key resend: the key
        first went out under an earlier claim (first_sent_at precedes the
        claim's time). A first send, whose own claim set first_sent_at, is not."""
        at = self._claim_time()
        first = self.job.first_sent_at
        return first is not None and at is not None and first < at

    def lease_seconds(self) -> Optional[float]:
        """The lease this claim granted: lease_until less claimed_at, both on
        the coordinator's clock (R12); None when either is unset."""
        if self.lease_until is None or self.claimed_at is None or self.lease_until <= self.claimed_at:
            return None
        return (self.lease_until - self.claimed_at).total_seconds()

    def grant(self) -> Grant:
        """The grant this claim holds, for RenewLeases."""
        return Grant(job_id=self.job.id, attempt=self.attempt, lease_token=self.lease_token)

    def _claim_time(self) -> Optional[datetime]:
        # Coordinators that do not send claimed_at: the claiming
        # transaction's write time.
        return self.claimed_at if self.claimed_at is not None else self.job.updated_at


@dataclass(frozen=True)
class Event:
    """One entry of a job's append-only history (R3)."""

    id: int
    job_id: int
    attempt: int  # the attempt the transition was made under
    kind: str  # an EventKind value; a newer coordinator may send others
    worker_id: str
    from_state: JobState
    to_state: JobState
    next_action: NextAction
    provider_refund_id: str
    reason: str
    created_at: Optional[datetime]


@dataclass(frozen=True)
class JobDetail:
    """A job with its history and one page of its receipts, oldest first."""

    job: Job
    events: tuple[Event, ...]
    observations: tuple[Observation, ...]
    observation_count: int
    resend_deadline: Optional[datetime]
    #: The database's time of the read (R12).
    now: Optional[datetime]
    next_observations_page_token: str


@dataclass(frozen=True)
class WriteResult:
    """The job after a write-back. ``replayed``: this same write had already
    been applied under the same grant by a call whose reply was lost (R21);
    nothing was written now. It is a success."""

    job: Job
    replayed: bool
    #: Reschedule only: a receipt filed during the grant made it due now (R28).
    expedited: bool = False


@dataclass(frozen=True)
class Grant:
    """Names a grant to renew: the job, the attempt Claim granted and its lease token (R25)."""

    job_id: int
    attempt: int
    lease_token: LeaseToken


@dataclass(frozen=True)
class Renewal:
    """The answer to the renewal of one grant (R27).

    ``refused`` is None when the lease was renewed; otherwise the refusal,
    decoded exactly as the same refusal of a write-back (R24): a
    StaleAttemptError (taken over, or not this grant: stop before sending
    anything new, file any answer already received, R15), JobNotRunningError,
    GrantTooOldError (renew no more; the grant stays valid until a takeover
    commits, R8) or NotFoundError.
    """

    job_id: int
    attempt: int
    lease_until: Optional[datetime]
    refused: Optional[Exception]
    grant_expires_at: Optional[datetime]
    #: When a receipt of success or failure was filed for the job during this grant (R28).
    receipt_filed_at: Optional[datetime]


# Wire → Python: one function per message, nothing else reads them.

_STATES: dict[int, JobState] = {
    pb.JOB_STATE_READY: JobState.READY,
    pb.JOB_STATE_RUNNING: JobState.RUNNING,
    pb.JOB_STATE_SUCCEEDED: JobState.SUCCEEDED,
    pb.JOB_STATE_MANUAL_REVIEW: JobState.MANUAL_REVIEW,
    pb.JOB_STATE_CANCELLED: JobState.CANCELLED,
}
_ACTIONS: dict[int, NextAction] = {pb.NEXT_ACTION_REFUND: NextAction.REFUND, pb.NEXT_ACTION_RECONCILE: NextAction.RECONCILE}
_OUTCOMES: dict[int, Outcome] = {
    pb.OBSERVATION_OUTCOME_SUCCEEDED: Outcome.SUCCEEDED,
    pb.OBSERVATION_OUTCOME_PENDING: Outcome.PENDING,
    pb.OBSERVATION_OUTCOME_FAILED: Outcome.FAILED,
    pb.OBSERVATION_OUTCOME_NOT_FOUND: Outcome.NOT_FOUND,
}


def state_of(v: int) -> JobState:
    return _STATES.get(int(v), JobState.UNSPECIFIED)


def state_from_name(name: str) -> JobState:
    """A state as the coordinator names it in error metadata ("JOB_STATE_SUCCEEDED")."""
    try:
        return state_of(pb.JobState.Value(name))
    except ValueError:
        return JobState.UNSPECIFIED


def action_of(v: int) -> NextAction:
    return _ACTIONS.get(int(v), NextAction.UNSPECIFIED)


def action_to_proto(a: NextAction) -> pb.NextAction:
    for k, v in _ACTIONS.items():
        if v is a:
            return cast(pb.NextAction, k)
    return pb.NEXT_ACTION_UNSPECIFIED


def outcome_of(v: int) -> Outcome:
    return _OUTCOMES.get(int(v), Outcome.UNSPECIFIED)


def outcome_to_proto(o: Outcome) -> pb.ObservationOutcome:
    for k, v in _OUTCOMES.items():
        if v is o:
            return cast(pb.ObservationOutcome, k)
    return pb.OBSERVATION_OUTCOME_UNSPECIFIED


def time_of(msg: Any, name: str) -> Optional[datetime]:
    """The Timestamp field ``name`` of msg as an aware UTC datetime; None when unset."""
    if not msg.HasField(name):
        return None
    ts = getattr(msg, name)
    return datetime.fromtimestamp(int(ts.seconds), timezone.utc) + timedelta(microseconds=int(ts.nanos) // 1000)


def job_of(j: pb.Job) -> Job:
    return Job(
        id=int(j.id),
        operation_key=str(j.operation_key),
        order_id=str(j.order_id),
        payment_id=str(j.payment_id),
        amount_minor=int(j.amount_minor),
        currency=str(j.currency),
        provider=str(j.provider),
        state=state_of(j.state),
        attempt=int(j.attempt),
        next_action=action_of(j.next_action),
        next_attempt_at=time_of(j, "next_attempt_at"),
        lease_until=time_of(j, "lease_until"),
        provider_refund_id=str(j.provider_refund_id),
        worker_id=str(j.worker_id),
        last_reason=str(j.last_reason),
        first_sent_at=time_of(j, "first_sent_at"),
        created_at=time_of(j, "created_at"),
        updated_at=time_of(j, "updated_at"),
        archived_at=time_of(j, "archived_at"),
        cancel_requested_at=time_of(j, "cancel_requested_at"),
        traceparent=str(j.traceparent),
    )


def observation_of(o: pb.Observation) -> Observation:
    return Observation(
        id=int(o.id),
        job_id=int(o.job_id),
        operation_key=str(o.operation_key),
        reported_attempt=int(o.reported_attempt),
        job_attempt=int(o.job_attempt),
        source=str(o.source),
        outcome=outcome_of(o.outcome),
        provider_refund_id=str(o.provider_refund_id),
        provider_event_id=str(o.provider_event_id),
        detail=str(o.detail),
        created_at=time_of(o, "created_at"),
        attempt_verified=bool(o.attempt_verified),
        reporter=str(o.reporter),
    )


def claimed_of(c: pb.ClaimedJob, received_monotonic: float) -> ClaimedJob:
    return ClaimedJob(
        job=job_of(c.job),
        attempt=int(c.attempt),
        lease_token=LeaseToken(str(c.lease_token)),
        lease_until=time_of(c, "lease_until"),
        next_action=action_of(c.next_action),
        takeover=bool(c.takeover),
        observations=tuple(observation_of(o) for o in c.observations),
        observation_count=int(c.observation_count),
        resend_deadline=time_of(c, "resend_deadline"),
        claimed_at=time_of(c, "claimed_at"),
        received_monotonic=received_monotonic,
        # Either says it (R32): a grant from a coordinator that sets only one
        # of them is never sent either.
        cancel_requested=bool(c.cancel_requested) or c.job.HasField("cancel_requested_at"),
        traceparent=str(c.traceparent),
        tracestate=str(c.tracestate),
    )


def event_of(e: pb.JobEvent) -> Event:
    return Event(
        id=int(e.id),
        job_id=int(e.job_id),
        attempt=int(e.attempt),
        kind=str(e.kind),
        worker_id=str(e.worker_id),
        from_state=state_of(e.from_state),
        to_state=state_of(e.to_state),
        next_action=action_of(e.next_action),
        provider_refund_id=str(e.provider_refund_id),
        reason=str(e.reason),
        created_at=time_of(e, "created_at"),
    )


def clip(s: str, n: int) -> str:
    """s cut to n characters at most: what a request field the coordinator
    bounds (a reason, a receipt's source and detail) takes."""
    return s if len(s) <= n else s[:n]
