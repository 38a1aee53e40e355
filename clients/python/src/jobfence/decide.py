"""What a provider answer means for the job: the fenced write-back to make
(R4, R14, R16, R22). Pure: no coordinator, no wall clock."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Optional

from .types import ClaimedJob, NextAction, Outcome

__all__ = [
    "DEFAULT_NOT_SENT_DELAY",
    "DEFAULT_PENDING_DELAY",
    "DEFAULT_RESEND_MARGIN",
    "DEFAULT_UNKNOWN_DELAY",
    "MAX_RESCHEDULE_DELAY",
    "Decision",
    "DecisionKind",
    "ProviderPolicy",
    "Result",
    "ResultKind",
    "cancel_requested",
    "decide",
    "decide_at",
    "sends",
]

#: Policy defaults, in seconds (those of the Go SDK).
DEFAULT_RESEND_MARGIN = 5 * 60.0
DEFAULT_PENDING_DELAY = 30.0
DEFAULT_UNKNOWN_DELAY = 5.0
DEFAULT_NOT_SENT_DELAY = 5.0
#: The longest delay Reschedule accepts: 30 days.
MAX_RESCHEDULE_DELAY = 30 * 24 * 3600.0


class ResultKind(enum.Enum):
    """What a handler learned from the payment provider. The default Result is
    UNKNOWN, so a handler that returns ``Result()`` leaves the job to a
    reconcile, never to a resend."""

    #: The request may or may not have reached the provider (timeout, cut
    #: connection, crash): reconcile next (R14).
    UNKNOWN = "unknown"
    #: The provider says the refund was made.
    SUCCEEDED = "succeeded"
    #: Accepted but not finished; not a success (R4).
    PENDING = "pending"
    #: The provider has no record of the operation key, which does not prove
    #: that nothing happened (replica lag, a queued request, R14).
    NO_RECORD = "no_record"
    #: The provider rejected the refund for good.
    FAILED = "failed"
    #: The request provably never reached the provider (refused locally, rate
    #: limited before sending): the same action may run again.
    NOT_SENT = "not_sent"
    #: The handler wants a person to decide.
    ESCALATE = "escalate"


@dataclass(frozen=True)
class Result:
    """What a refund or reconcile handler learned from the provider, asked with
    the job's operation key (R1, R14). Build it with the class methods:
    ``Result.succeeded(id)``, ``pending``, ``no_record``, ``failed``,
    ``not_sent``, ``unknown`` or ``escalate``."""

    kind: ResultKind = ResultKind.UNKNOWN
    #: The provider's refund id (required for SUCCEEDED, welcome for the others).
    provider_refund_id: str = ""
    #: Identifies the provider's answer, when it has one; it deduplicates the
    #: observation filed from it (R15).
    provider_event_id: str = ""
    #: When to ask again, in seconds (PENDING, NOT_SENT); None: the policy's delay.
    retry_after: Optional[float] = None
    #: Why (FAILED, NOT_SENT, ESCALATE); kept in the job's history.
    reason: str = ""
    #: What went wrong (UNKNOWN).
    error: Optional[BaseException] = None

    @classmethod
    def succeeded(cls, provider_refund_id: str, provider_event_id: str = "") -> Result:
        """A refund the provider made, with its id."""
        return cls(ResultKind.SUCCEEDED, provider_refund_id, provider_event_id)

    @classmethod
    def pending(cls, provider_refund_id: str = "", retry_after: Optional[float] = None, reason: str = "") -> Result:
        """A refund accepted but not finished (R4)."""
        return cls(ResultKind.PENDING, provider_refund_id, retry_after=retry_after, reason=reason)

    @classmethod
    def no_record(cls, reason: str = "") -> Result:
        """The provider has no record of the operation key."""
        return cls(ResultKind.NO_RECORD, reason=reason)

    @classmethod
    def failed(cls, provider_refund_id: str = "", reason: str = "") -> Result:
        """A refund the provider rejected for good."""
        return cls(ResultKind.FAILED, provider_refund_id, reason=reason)

    @classmethod
    def not_sent(cls, reason: str, retry_after: Optional[float] = None) -> Result:
        """A request that provably never reached the provider."""
        return cls(ResultKind.NOT_SENT, reason=reason, retry_after=retry_after)

    @classmethod
    def unknown(cls, error: Optional[BaseException] = None) -> Result:
        """A call whose outcome is unknown."""
        return cls(ResultKind.UNKNOWN, error=error)

    @classmethod
    def escalate(cls, reason: str) -> Result:
        """Asks for a person to decide."""
        return cls(ResultKind.ESCALATE, reason=reason)

    def observed(self) -> Optional[Outcome]:
        """The outcome this answer is evidence of (R15), or None when it carries
        no word from the provider."""
        return {
            ResultKind.SUCCEEDED: Outcome.SUCCEEDED,
            ResultKind.PENDING: Outcome.PENDING,
            ResultKind.FAILED: Outcome.FAILED,
            ResultKind.NO_RECORD: Outcome.NOT_FOUND,
        }.get(self.kind)


@dataclass(frozen=True)
class ProviderPolicy:
    """What the decision table needs to know about one payment provider. The
    idempotency-key retention window itself is not here: the coordinator keeps
    it per provider and hands every claim its resend_deadline (R22)."""

    #: The provider guarantees that a request resent with the same
    #: Idempotency-Key and body, inside its retention window, returns the first
    #: result instead of refunding again (R14). Without it, "no record" always
    #: escalates (R16).
    same_key_resend_safe: bool = False
    #: No same-key resend starts closer than this (seconds) to the job's
    #: resend_deadline: it absorbs the gap between the coordinator's and the
    #: provider's clocks and the time the request takes to arrive.
    resend_margin: float = DEFAULT_RESEND_MARGIN
    #: When to reconcile a pending refund again, unless the answer says.
    pending_delay: float = DEFAULT_PENDING_DELAY
    #: When to reconcile after an unknown outcome.
    unknown_delay: float = DEFAULT_UNKNOWN_DELAY
    #: When to repeat an action whose request was not sent, unless the result says.
    not_sent_delay: float = DEFAULT_NOT_SENT_DELAY

    def resend_allowed(self, c: ClaimedJob, now: datetime) -> tuple[bool, str]:
        """Whether a same-key resend of c's refund may start at ``now``, a time
        on the coordinator's clock (ClaimedJob.coordinator_now), and why (R14,
        R16, R22). Never once a cancel was requested (R32). Otherwise allowed
        when the key never went out (resend_deadline unset: it is a first
        send), or when the provider guarantees same-key resends and now lies
        more than resend_margin before the resend deadline."""
        if cancel_requested(c):
            return False, "a cancel was requested (R32)"
        if c.resend_deadline is None:
            return True, "the operation key was never sent"
        if not self.same_key_resend_safe:
            return False, "the provider does not guarantee that same-key resends are safe"
        deadline = _iso(c.resend_deadline)
        margin = _or(self.resend_margin, DEFAULT_RESEND_MARGIN)
        if now + timedelta(seconds=margin) >= c.resend_deadline:
            return False, f"the provider's idempotency-key window closes at {deadline} (margin {margin:g}s)"
        return True, f"inside the provider's idempotency-key window until {deadline}"


class DecisionKind(enum.Enum):
    """The fenced write-back a Decision asks for."""

    RESCHEDULE = "reschedule"  # back to ready, with next_action and delay
    COMPLETE = "complete"  # succeeded, with provider_refund_id
    ESCALATE = "escalate"  # manual_review, with reason


@dataclass(frozen=True)
class Decision:
    """The write-back to make, under the claimed grant, for one provider answer."""

    kind: DecisionKind
    provider_refund_id: str = ""  # COMPLETE
    next_action: NextAction = NextAction.UNSPECIFIED  # RESCHEDULE
    delay: float = 0.0  # RESCHEDULE, seconds
    reason: str = ""  # RESCHEDULE, ESCALATE


def decide(r: Result, c: ClaimedJob, p: ProviderPolicy) -> Decision:
    """decide_at with c.coordinator_now() as the time."""
    return decide_at(r, c, p, c.coordinator_now())


def decide_at(r: Result, c: ClaimedJob, p: ProviderPolicy, now: datetime) -> Decision:
    """Turns a provider answer about claimed job c into its fenced write-back,
    with ``now`` on the coordinator's clock::

        provider says                  write-back
        refunded (id)                  Complete with the refund id
        refunded, no id                Escalate: nothing to record
        pending                        Reschedule reconcile after retry_after or pending_delay (R4)
        no record, resend allowed      Reschedule refund now: a same-key resend (R14)
        no record, otherwise           Escalate to manual_review (R14, R16)
        rejected                       Escalate: the API has no failed state, a person decides
        not sent                       Reschedule the claimed action after retry_after or not_sent_delay
        outcome unknown                Reschedule reconcile after unknown_delay (R14)
        handler asks to escalate       Escalate

    A job whose cancel was requested (c.cancel_requested, R32) is never sent
    again, whatever the provider says and whatever the policy allows::

        refunded (id)                  Complete: the cancel came too late (the coordinator records it)
        pending, outcome unknown       as above: Reschedule reconcile
        no record                      Escalate, even inside the resend window: only a person
                                       may close a maybe-sent refund as cancelled
        rejected                       Escalate: a person closes it as cancelled
        anything else                  as above, but a Reschedule to refund becomes one to reconcile

    "Resend allowed" is ProviderPolicy.resend_allowed. It never reads this
    machine's wall clock and has no side effects; the caller writes the
    decision with c's attempt and lease token.
    """
    if not cancel_requested(c):
        return _decide_table(r, c, p, now)
    # R32: no record and a rejection, which the table may answer with a
    # resend or leave to a person as a failure, are for a person to close as
    # cancelled; whatever else it answers never sends.
    if r.kind is ResultKind.NO_RECORD:
        reason = ("cancel requested (R32): reconcile found no record at the provider; the refund may still have "
                  "been sent, so it is never sent again: only a person may close it as cancelled")
        return Decision(DecisionKind.ESCALATE, reason=f"{reason}: {r.reason}" if r.reason else reason)
    if r.kind is ResultKind.FAILED:
        return Decision(DecisionKind.ESCALATE, reason="cancel requested (R32): provider rejected the refund: "
                        f"{r.reason or 'no reason given'}; a person closes it as cancelled")
    d = _decide_table(r, c, p, now)
    if d.kind is DecisionKind.RESCHEDULE and d.next_action is NextAction.REFUND:
        d = replace(d, next_action=NextAction.RECONCILE,
                    reason=d.reason + "; cancel requested (R32): reconcile, never send")
    return d


def cancel_requested(c: ClaimedJob) -> bool:
    """Whether a cancel was requested of c's job (R32): the grant says so, or
    the job carries the request's time."""
    return c.cancel_requested or c.job.cancel_requested_at is not None


def sends(c: ClaimedJob) -> bool:
    """Whether c's handler call is refund, the one that sends: a refund action
    of a job whose cancel was not requested. Anything else asks the provider
    first with reconcile (R14), and so does a job whose cancel was requested,
    whatever its grant's action says (R32: no grant of it should carry
    refund)."""
    return c.next_action is NextAction.REFUND and not cancel_requested(c)


def _decide_table(r: Result, c: ClaimedJob, p: ProviderPolicy, now: datetime) -> Decision:
    """decide_at's table for a job whose cancel was not requested."""

    def detail(s: str) -> str:
        return f"{s}: {r.reason}" if r.reason else s

    k = r.kind
    if k is ResultKind.SUCCEEDED:
        if not r.provider_refund_id:
            return Decision(DecisionKind.ESCALATE, reason="provider reported the refund made but gave no refund id")
        return Decision(DecisionKind.COMPLETE, provider_refund_id=r.provider_refund_id)
    if k is ResultKind.PENDING:
        return Decision(
            DecisionKind.RESCHEDULE,
            next_action=NextAction.RECONCILE,
            delay=_delay(r.retry_after, _or(p.pending_delay, DEFAULT_PENDING_DELAY)),
            reason=detail("provider: refund pending (R4)"),
        )
    if k is ResultKind.NO_RECORD:
        ok, why = p.resend_allowed(c, now)
        if ok:
            return Decision(
                DecisionKind.RESCHEDULE,
                next_action=NextAction.REFUND,
                reason=detail(f"reconcile: no record at the provider; same-key resend, {why} (R14)"),
            )
        return Decision(DecisionKind.ESCALATE, reason=detail(f"reconcile: no record at the provider and {why} (R14, R16)"))
    if k is ResultKind.FAILED:
        return Decision(DecisionKind.ESCALATE, reason=f"provider rejected the refund: {r.reason or 'no reason given'}")
    if k is ResultKind.NOT_SENT:
        action = NextAction.REFUND if c.next_action is NextAction.REFUND else NextAction.RECONCILE
        return Decision(
            DecisionKind.RESCHEDULE,
            next_action=action,
            delay=_delay(r.retry_after, _or(p.not_sent_delay, DEFAULT_NOT_SENT_DELAY)),
            reason=f"request not sent: {r.reason or 'no reason given'}",
        )
    if k is ResultKind.ESCALATE:
        return Decision(DecisionKind.ESCALATE, reason=r.reason or "escalated by the handler")
    why = "outcome unknown"
    if r.error is not None:
        why += f": {r.error}"
    return Decision(DecisionKind.RESCHEDULE, next_action=NextAction.RECONCILE, delay=_or(p.unknown_delay, DEFAULT_UNKNOWN_DELAY), reason=why + " (R14)")


def _delay(d: Optional[float], default: float) -> float:
    if d is None or d <= 0:
        d = default
    return min(d, MAX_RESCHEDULE_DELAY)


def _or(v: float, default: float) -> float:
    # Like the Go SDK's zero values: a delay or margin of 0 or less is the default.
    return v if v > 0 else default


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
