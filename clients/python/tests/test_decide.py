"""The decision table (R4, R14, R16, R22): a port of the Go SDK's
TestDecisionTable_R14_R16 and TestResendAllowedNeedsMarginBeforeDeadline_R22,
and of the TypeScript SDK's decide tests. Pure: no coordinator needed."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timedelta, timezone

import pytest

from jobfence import (
    DEFAULT_NOT_SENT_DELAY,
    DEFAULT_PENDING_DELAY,
    DEFAULT_UNKNOWN_DELAY,
    MAX_RESCHEDULE_DELAY,
    ClaimedJob,
    Decision,
    DecisionKind,
    Job,
    JobState,
    LeaseToken,
    NextAction,
    Outcome,
    ProviderPolicy,
    Result,
    ResultKind,
    decide_at,
)

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def job(**kw: object) -> Job:
    base = dict(
        id=7, operation_key="op-7", order_id="o", payment_id="p", amount_minor=4200, currency="EUR",
        provider="acme", state=JobState.RUNNING, attempt=2, next_action=NextAction.RECONCILE,
        next_attempt_at=None, lease_until=None, provider_refund_id="", worker_id="w", last_reason="",
        first_sent_at=None, created_at=None, updated_at=None,
    )
    base.update(kw)
    return Job(**base)  # type: ignore[arg-type]


def claimed(attempt: int = 2, next_action: NextAction = NextAction.RECONCILE,
            resend_deadline: datetime | None = None, **kw: object) -> ClaimedJob:
    return ClaimedJob(
        job=job(**kw), attempt=attempt, lease_token=LeaseToken("t"), lease_until=None, next_action=next_action,
        takeover=False, observations=(), observation_count=0, resend_deadline=resend_deadline, claimed_at=None,
    )


SENT = claimed(2, NextAction.RECONCILE, NOW + timedelta(hours=1))
CLOSING = claimed(2, NextAction.RECONCILE, NOW + timedelta(minutes=1))  # inside the default 5m margin
PAST = claimed(2, NextAction.RECONCILE, NOW - timedelta(seconds=1))
NEVER_SENT = claimed(1, NextAction.RECONCILE, None)
REFUND = claimed(1, NextAction.REFUND, NOW + timedelta(hours=24))
SAFE = ProviderPolicy(same_key_resend_safe=True)
UNSAFE = ProviderPolicy()

R, RC, E, C = DecisionKind.RESCHEDULE, NextAction.RECONCILE, DecisionKind.ESCALATE, DecisionKind.COMPLETE

TABLE = [
    ("refunded completes", Result.succeeded("re_1"), SENT, SAFE, Decision(C, provider_refund_id="re_1")),
    ("refunded without id escalates", Result.succeeded(""), SENT, SAFE, Decision(E)),
    ("pending reconciles later R4", Result.pending("re_1"), SENT, SAFE,
     Decision(R, next_action=RC, delay=DEFAULT_PENDING_DELAY)),
    ("pending honours retry-after", Result.pending("", retry_after=7), SENT, SAFE, Decision(R, next_action=RC, delay=7)),
    ("no record inside the window resends", Result.no_record(), SENT, SAFE, Decision(R, next_action=NextAction.REFUND)),
    ("no record, window closing, escalates", Result.no_record(), CLOSING, SAFE, Decision(E)),
    ("no record past the window escalates", Result.no_record(), PAST, SAFE, Decision(E)),
    ("no record without the guarantee escalates R16", Result.no_record(), SENT, UNSAFE, Decision(E)),
    ("no record of a key never sent sends", Result.no_record(), NEVER_SENT, UNSAFE,
     Decision(R, next_action=NextAction.REFUND)),
    ("rejected escalates", Result.failed("re_1", "declined"), SENT, SAFE, Decision(E)),
    ("not sent repeats a refund", Result.not_sent("rate limited"), REFUND, UNSAFE,
     Decision(R, next_action=NextAction.REFUND, delay=DEFAULT_NOT_SENT_DELAY)),
    ("not sent repeats a reconcile", Result.not_sent("rate limited", retry_after=1), SENT, UNSAFE,
     Decision(R, next_action=RC, delay=1)),
    ("unknown reconciles R14", Result.unknown(OSError("cut")), REFUND, SAFE,
     Decision(R, next_action=RC, delay=DEFAULT_UNKNOWN_DELAY)),
    ("the default result is unknown", Result(), REFUND, SAFE, Decision(R, next_action=RC, delay=DEFAULT_UNKNOWN_DELAY)),
    ("handler escalates", Result.escalate("odd"), SENT, SAFE, Decision(E, reason="odd")),
]


@pytest.mark.parametrize("name,result,c,policy,want", TABLE, ids=[t[0] for t in TABLE])
def test_decision_table_R14_R16(name: str, result: Result, c: ClaimedJob, policy: ProviderPolicy, want: Decision) -> None:
    got = decide_at(result, c, policy, NOW)
    if not want.reason:
        assert got.reason or got.kind is C, f"decision {got} has no reason"
        got = dataclasses.replace(got, reason="")
    assert got == want


def test_resend_allowed_needs_margin_before_deadline_R22() -> None:
    deadline = datetime(2030, 1, 2, tzinfo=timezone.utc)
    c = claimed(resend_deadline=deadline)
    p = ProviderPolicy(same_key_resend_safe=True, resend_margin=60)
    for now, want in [
        (deadline - timedelta(hours=1), True),
        (deadline - timedelta(minutes=1, microseconds=1), True),
        (deadline - timedelta(minutes=1), False),
        (deadline + timedelta(hours=1), False),
    ]:
        ok, why = p.resend_allowed(c, now)
        assert ok is want and why, f"resend_allowed at deadline{now - deadline} = {ok} ({why}), want {want}"
    ok, why = ProviderPolicy().resend_allowed(c, deadline - timedelta(hours=1))
    assert not ok and "guarantee" in why


def test_reasons_name_the_rules_and_the_window() -> None:
    # The history shows why (R3); the reasons name the rule and the window.
    d = decide_at(Result.no_record(), PAST, SAFE, NOW)
    assert d.kind is E and "R14, R16" in d.reason and "window closes at" in d.reason
    d = decide_at(Result.no_record(), SENT, UNSAFE, NOW)
    assert "does not guarantee" in d.reason
    assert decide_at(Result.failed("", "card closed"), SENT, SAFE, NOW).reason == "provider rejected the refund: card closed"
    assert decide_at(Result.escalate(""), SENT, SAFE, NOW).reason == "escalated by the handler"
    assert "R4" in decide_at(Result.pending(), SENT, SAFE, NOW).reason


def test_delays_are_bounded_and_zero_means_the_default() -> None:
    assert decide_at(Result.pending(retry_after=1e12), SENT, SAFE, NOW).delay == MAX_RESCHEDULE_DELAY
    assert decide_at(Result.pending(), SENT, ProviderPolicy(pending_delay=42), NOW).delay == 42
    # Like the Go SDK's zero values: 0 is the default, not "now".
    assert decide_at(Result.pending(), SENT, ProviderPolicy(pending_delay=0), NOW).delay == DEFAULT_PENDING_DELAY
    assert decide_at(Result(), SENT, ProviderPolicy(unknown_delay=0), NOW).delay == DEFAULT_UNKNOWN_DELAY


def test_observed_outcomes_R15() -> None:
    assert Result.succeeded("re").observed() is Outcome.SUCCEEDED
    assert Result.pending().observed() is Outcome.PENDING
    assert Result.failed().observed() is Outcome.FAILED
    assert Result.no_record().observed() is Outcome.NOT_FOUND
    for r in (Result(), Result.not_sent("x"), Result.escalate("x")):
        assert r.observed() is None, r
    assert Result().kind is ResultKind.UNKNOWN


def test_coordinator_now_follows_the_claim_not_the_wall_clock_R12_R22() -> None:
    # The claim's database time plus the monotonic time since its answer: a
    # worker clock a day off changes nothing.
    claim_time = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
    c = dataclasses.replace(SENT, claimed_at=claim_time, received_monotonic=time.monotonic() - 2.5)
    elapsed = (c.coordinator_now() - claim_time).total_seconds()
    assert 2.5 <= elapsed < 3.5
    # Without claimed_at, the claiming transaction's write time (Job.updated_at).
    old = dataclasses.replace(SENT, job=job(updated_at=claim_time), received_monotonic=None)
    assert old.coordinator_now() == claim_time


def test_sends_again_tells_a_resend_from_a_first_send_R22() -> None:
    at = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)

    def c(first: datetime | None) -> ClaimedJob:
        return dataclasses.replace(claimed(next_action=NextAction.REFUND, first_sent_at=first), claimed_at=at)

    assert not c(None).sends_again(), "nothing went out yet"
    assert not c(at).sends_again(), "this claim is the first send"
    assert c(at - timedelta(microseconds=1)).sends_again(), "an earlier claim sent the key"


def test_lease_seconds_is_lease_until_less_claimed_at_R27() -> None:
    at = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
    c = dataclasses.replace(SENT, claimed_at=at, lease_until=at + timedelta(seconds=2))
    assert c.lease_seconds() == 2.0
    assert SENT.lease_seconds() is None
