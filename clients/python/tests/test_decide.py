"""What this SDK adds around the decision table (R4, R14, R15, R16, R22,
R27). The table itself, the resend window's margin and the delays' bounds
are the SDKs' shared spec (clients/spec/decide.json, run by test_spec.py);
here: the reasons' wording, the outcome each result files, the estimate of
the coordinator's clock, what a resend is, and the lease a claim granted.
Pure: no coordinator needed."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timedelta, timezone


from jobfence import (
    DEFAULT_UNKNOWN_DELAY,
    ClaimedJob,
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
PAST = claimed(2, NextAction.RECONCILE, NOW - timedelta(seconds=1))
SAFE = ProviderPolicy(same_key_resend_safe=True)
UNSAFE = ProviderPolicy()
E = DecisionKind.ESCALATE


def test_reasons_name_the_rules_and_the_window() -> None:
    # The history shows why (R3); the reasons name the rule and the window.
    d = decide_at(Result.no_record(), PAST, SAFE, NOW)
    assert d.kind is E and "R14, R16" in d.reason and "window closes at" in d.reason
    d = decide_at(Result.no_record(), SENT, UNSAFE, NOW)
    assert "does not guarantee" in d.reason
    assert decide_at(Result.failed("", "card closed"), SENT, SAFE, NOW).reason == "provider rejected the refund: card closed"
    assert decide_at(Result.escalate(""), SENT, SAFE, NOW).reason == "escalated by the handler"
    assert "R4" in decide_at(Result.pending(), SENT, SAFE, NOW).reason


def test_an_unknown_delay_of_zero_is_the_default() -> None:
    # Like the Go SDK's zero values: 0 is the default, not "now" (the pending
    # delay's zero is a vector of the spec's).
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
