"""R32 through the Worker: a job whose cancel was requested is never sent,
whatever the provider answers, inside the resend window or past it, with a
policy that trusts same-key resends, and even under a grant that (wrongly)
says REFUND. A Worker against a scripted coordinator (fakecoord) works a
grant of every such job at once; its handler records every call, and the
refund handler is never called."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from jobfence import (
    Client,
    ClaimedJob,
    HandlerContext,
    ProviderPolicy,
    Result,
    RetryPolicy,
    Worker,
)
from jobfence.v1 import coordinator_pb2 as pb

from fakecoord import FakeCoordinator, claimed
from workerrun import Running

RC, RF = pb.NEXT_ACTION_RECONCILE, pb.NEXT_ACTION_REFUND


def _raise() -> Result:
    raise ConnectionError("connection cut")


# What the provider answers, and the write-back it must become: the method,
# the next action of a reschedule, and a part of the reason.
ANSWERS: list[tuple[str, Callable[[], Result], str, int, str]] = [
    ("refunded", lambda: Result.succeeded("re_1"), "Complete", 0, ""),
    ("pending", lambda: Result.pending("re_1"), "Reschedule", RC, "pending"),
    ("no record", Result.no_record, "Escalate", 0, "cancel requested"),
    ("rejected", lambda: Result.failed("re_1", "declined"), "Escalate", 0, "cancel requested"),
    ("unknown", lambda: Result.unknown(TimeoutError("no answer")), "Reschedule", RC, "outcome unknown"),
    ("handler raises", _raise, "Reschedule", RC, "outcome unknown"),
    ("not sent", lambda: Result.not_sent("rate limited"), "Reschedule", RC, "rate limited"),
    ("escalate", lambda: Result.escalate("odd"), "Escalate", 0, "odd"),
]
WINDOWS = [("inside the window", 3600), ("past the window", -1)]
ACTIONS = [("reconcile", RC), ("refund", RF)]


class Recording:
    """A handler answering each job as its case says, recording every call."""

    def __init__(self, answers: dict[int, Callable[[], Result]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, int, bool]] = []  # method, job, the cancel_requested it saw

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        self.calls.append(("refund", job.job.id, job.cancel_requested))
        return self.answers[job.job.id]()

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        self.calls.append(("reconcile", job.job.id, job.cancel_requested))
        return self.answers[job.job.id]()


def _grant(job_id: int, action: int, window: int, how: str) -> pb.ClaimedJob:
    """A grant of a job first sent a minute before its claim, whose resend
    window ends window seconds after the claim, telling of the cancel request
    as how says: on the grant, on the job (cancel_requested_at), or not."""
    g = claimed(job_id, 3, action)
    at = g.claimed_at.ToSeconds()
    g.takeover = action == RC
    g.job.first_sent_at.FromSeconds(at - 60)
    g.resend_deadline.FromSeconds(at + window)
    if how == "grant":
        g.cancel_requested = True
    elif how == "job":
        g.job.cancel_requested_at.FromSeconds(at - 1)
    return g


def _work(fake: FakeCoordinator, grants: list[pb.ClaimedJob], h: Recording) -> dict[int, tuple[str, Any]]:
    """Runs a Worker that trusts same-key resends on grants, all granted by
    one Claim, until each job has its write-back; the write-backs by job."""
    fake.answer("Claim", pb.ClaimResponse(jobs=grants))
    client = Client(fake.address, retry=RetryPolicy(attempts=2, backoff=0.01), call_timeout=5)
    w = Worker(client, h, worker_id="w-cancel", concurrency=len(grants), poll_interval=0.05,
               lease_renewal=False, receipt_spool="off", policy=ProviderPolicy(same_key_resend_safe=True))
    run = Running(w)
    writes: dict[int, tuple[str, Any]] = {}
    try:
        deadline = time.monotonic() + 20
        while len(writes) < len(grants) and time.monotonic() < deadline:
            time.sleep(0.05)
            with fake.lock:
                for method in ("Complete", "Reschedule", "Escalate"):
                    for req, _ in fake.calls[method]:
                        assert req.job_id not in writes or writes[req.job_id] == (method, req), (
                            f"job {req.job_id} written twice: {writes[req.job_id]} and {method} {req}")
                        writes[req.job_id] = (method, req)
    finally:
        run.stop()
        client.close()
    assert len(writes) == len(grants), f"write-backs of {sorted(writes)} only"
    assert fake.count("ReportObservation") == 0, "an accepted write-back files no receipt"
    return writes


@pytest.mark.parametrize("how", ["grant", "job"])
def test_a_cancel_requested_job_is_never_sent_whatever_the_provider_answers_R32(fake: FakeCoordinator,
                                                                                  how: str) -> None:
    cases: dict[int, tuple[str, str, int, str]] = {}
    grants: list[pb.ClaimedJob] = []
    answers: dict[int, Callable[[], Result]] = {}
    for answer_name, answer, method, action, reason in ANSWERS:
        for window_name, window in WINDOWS:
            for action_name, grant_action in ACTIONS:
                job_id = len(grants) + 1
                grants.append(_grant(job_id, grant_action, window, how))
                answers[job_id] = answer
                cases[job_id] = (f"{answer_name}, {window_name}, grant says {action_name}", method, action, reason)
    h = Recording(answers)
    writes = _work(fake, grants, h)

    assert [c for c in h.calls if c[0] == "refund"] == [], "the refund handler was called for a cancel-requested job"
    assert sorted(job for _, job, _ in h.calls) == sorted(cases), "one reconcile per job"
    assert all(saw for _, _, saw in h.calls), "a handler did not see cancel_requested"
    for job_id, (name, method, action, reason) in cases.items():
        got, req = writes[job_id]
        assert got == method, f"{name}: {got} {req}, want {method}"
        assert (req.attempt, req.lease_token) == (3, f"tok-{job_id}"), f"{name}: written without its grant"
        if method == "Complete":
            assert req.provider_refund_id == "re_1", name
        else:
            assert reason in req.reason, f"{name}: reason {req.reason!r} lacks {reason!r}"
        if method == "Reschedule":
            assert req.next_action == action != RF, f"{name}: rescheduled to {req.next_action}"


def test_without_a_cancel_request_the_same_grants_send_R14_R32(fake: FakeCoordinator) -> None:
    # The premise of the test above: the same grants with no cancel request
    # call the refund handler, and no record inside the window reschedules a
    # same-key resend (R14, R22).
    grants = [_grant(1, RF, 3600, "none"), _grant(2, RC, 3600, "none")]
    h = Recording({1: lambda: Result.succeeded("re_1"), 2: Result.no_record})
    writes = _work(fake, grants, h)
    assert sorted(h.calls) == [("reconcile", 2, False), ("refund", 1, False)]
    assert writes[1][0] == "Complete"
    assert writes[2][0] == "Reschedule" and writes[2][1].next_action == RF
