"""The retry policy: calls safe to repeat are repeated after UNAVAILABLE or
a per-attempt timeout (R1, R15, R21, R27); Claim never is (R7); the fence's
refusal never is (R9)."""

from __future__ import annotations

from typing import Callable

import grpc
import pytest

from jobfence import (
    ClaimOutcomeUnknownError,
    Client,
    Grant,
    LeaseToken,
    Outcome,
    Reason,
    RetryPolicy,
    StaleAttemptError,
    UnavailableError,
)
from jobfence.v1 import coordinator_pb2 as pb

from fakecoord import Fail, FakeCoordinator, Sleep

UN = grpc.StatusCode.UNAVAILABLE
FAST = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.02)


def client(fake: FakeCoordinator, **kw: object) -> Client:
    return Client(fake.address, retry=FAST, call_timeout=kw.pop("call_timeout", 5), **kw)  # type: ignore[arg-type]


def test_claim_is_never_repeated_R7(fake: FakeCoordinator) -> None:
    for failure in (Fail(UN, Reason.CLAIM_OUTCOME_UNKNOWN), Fail(UN), Fail(UN, Reason.DATABASE_UNAVAILABLE)):
        before = fake.count("Claim")
        fake.answer("Claim", failure, pb.ClaimResponse())
        with client(fake) as c, pytest.raises(UnavailableError) as info:
            c.claim("w", 1)
        assert fake.count("Claim") == before + 1, f"{failure}: a claim was repeated"
        if failure.reason == Reason.CLAIM_OUTCOME_UNKNOWN:
            assert isinstance(info.value, ClaimOutcomeUnknownError)
        fake.script["Claim"].clear()


def test_claim_is_not_repeated_after_its_deadline_R7(fake: FakeCoordinator) -> None:
    fake.answer("Claim", Sleep(1.0, pb.ClaimResponse()))
    with client(fake, call_timeout=0.2) as c, pytest.raises(Exception):
        c.claim("w", 1)
    assert fake.count("Claim") == 1


CALLS: dict[str, Callable[[Client], object]] = {
    "Complete": lambda c: c.complete(1, 2, LeaseToken("t"), "re_1"),
    "Reschedule": lambda c: c.reschedule(1, 2, LeaseToken("t"), delay=1.5, reason="r"),
    "Escalate": lambda c: c.escalate(1, 2, LeaseToken("t"), "why"),
    "RenewLeases": lambda c: c.renew_leases([Grant(1, 2, LeaseToken("t"))], lease=2),
    "ReportObservation": lambda c: c.report_observation(source="worker:w", outcome=Outcome.SUCCEEDED, operation_key="k"),
    "EnqueueRefund": lambda c: c.enqueue_refund(operation_key="k", order_id="o", payment_id="p", amount_minor=1,
                                                currency="EUR", provider="acme"),
    "GetJob": lambda c: c.get_job(1),
    "ListJobs": lambda c: c.list_jobs(),
    "ResolveReview": lambda c: c.resolve_review(1, 2, refunded=False, note="n"),
}


@pytest.mark.parametrize("method", list(CALLS))
def test_safe_calls_are_repeated_after_unavailable_R21(fake: FakeCoordinator, method: str) -> None:
    fake.answer(method, Fail(UN, Reason.WRITE_OUTCOME_UNKNOWN), Fail(UN))
    with client(fake) as c:
        CALLS[method](c)
    assert fake.count(method) == 3
    # The same request each time (R21: a repeat is the same write).
    reqs = [r for r, _ in fake.calls[method]]
    assert all(r == reqs[0] for r in reqs)


@pytest.mark.parametrize("method", ["Complete", "RenewLeases", "GetJob"])
def test_safe_calls_are_repeated_after_a_per_attempt_timeout(fake: FakeCoordinator, method: str) -> None:
    fake.answer(method, Sleep(1.0))
    with client(fake, call_timeout=0.3) as c:
        CALLS[method](c)
    assert fake.count(method) == 2


def test_retries_stop_after_the_policy_attempts(fake: FakeCoordinator) -> None:
    fake.answer("Complete", *[Fail(UN)] * 10)
    with client(fake) as c, pytest.raises(UnavailableError):
        c.complete(1, 2, LeaseToken("t"), "re")
    assert fake.count("Complete") == FAST.attempts


def test_the_fence_is_never_repeated_R9(fake: FakeCoordinator) -> None:
    fake.answer("Complete", Fail(grpc.StatusCode.FAILED_PRECONDITION, Reason.STALE_ATTEMPT))
    with client(fake) as c, pytest.raises(StaleAttemptError):
        c.complete(1, 2, LeaseToken("t"), "re")
    assert fake.count("Complete") == 1


def test_write_backs_carry_attempt_and_lease_token_R25(fake: FakeCoordinator) -> None:
    with client(fake) as c:
        c.complete(1, 2, LeaseToken("secret-token"), "re")
        c.reschedule(1, 2, "secret-token")
        c.escalate(1, 2, LeaseToken("secret-token"), "why")
        c.renew_leases([Grant(1, 2, LeaseToken("secret-token"))])
    for m in ("Complete", "Reschedule", "Escalate"):
        req = fake.calls[m][0][0]
        assert (req.job_id, req.attempt, req.lease_token) == (1, 2, "secret-token"), m
    g = fake.calls["RenewLeases"][0][0].grants[0]
    assert (g.job_id, g.attempt, g.lease_token) == (1, 2, "secret-token")


def test_bearer_token_per_call_and_never_in_plaintext_unless_allowed(fake: FakeCoordinator) -> None:
    with pytest.raises(ValueError, match="only over TLS"):
        Client(fake.address, token="tok")
    tokens = iter(["one", "two"])
    with Client(fake.address, token=lambda: next(tokens), plaintext_tokens=True) as c:
        c.get_job(1)
        c.get_job(2)
    assert [md.get("authorization") for _, md in fake.calls["GetJob"]] == ["Bearer one", "Bearer two"]


def test_int64_beyond_2_53_is_kept(fake: FakeCoordinator) -> None:
    big = 2**62 + 1
    fake.answer("GetJob", pb.GetJobResponse(job=pb.Job(id=big, amount_minor=big, attempt=2**53 + 1)))
    with client(fake) as c:
        d = c.get_job(big)
        c.enqueue_refund(operation_key="k", order_id="o", payment_id="p", amount_minor=big, currency="EUR",
                         provider="acme")
    assert (d.job.id, d.job.amount_minor, d.job.attempt) == (big, big, 2**53 + 1)
    assert fake.calls["GetJob"][0][0].job_id == big
    assert fake.calls["EnqueueRefund"][0][0].amount_minor == big


def test_budget_exhausted_carries_retry_after_R19(fake: FakeCoordinator) -> None:
    from jobfence import BudgetExhaustedError

    resp = pb.ClaimResponse()
    resp.retry_after.FromMilliseconds(1500)
    fake.answer("Claim", resp)
    with client(fake) as c, pytest.raises(BudgetExhaustedError) as info:
        c.claim("w", 1)
    assert info.value.retry_after == 1.5
