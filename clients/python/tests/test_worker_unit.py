"""The Worker against a scripted coordinator: it asks only for free slots
(R18), never acts on a failed claim (R7), waits out retry_after (R19), and
leaves a handler that outlives its deadline to a reconcile (R14, R15)."""

from __future__ import annotations

import time

import grpc

from jobfence import (
    Client,
    ClaimedJob,
    HandlerContext,
    NextAction,
    Reason,
    Result,
    RetryPolicy,
    Worker,
    WorkerEvent,
    WorkerEventKind,
)
from jobfence.v1 import coordinator_pb2 as pb

from fakecoord import Fail, FakeCoordinator, claimed
from workerrun import run_for


class Handler:
    def __init__(self, sleep: float = 0.0) -> None:
        self.sleep = sleep
        self.calls: list[tuple[str, int]] = []

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        self.calls.append(("refund", job.job.id))
        time.sleep(self.sleep)
        return Result.succeeded(f"re_{job.job.id}")

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        self.calls.append(("reconcile", job.job.id))
        return Result.pending(f"re_{job.job.id}")


def client(fake: FakeCoordinator) -> Client:
    return Client(fake.address, retry=RetryPolicy(attempts=2, backoff=0.01), call_timeout=5)


def test_claims_only_free_slots_R18(fake: FakeCoordinator) -> None:
    fake.answer("Claim", pb.ClaimResponse(jobs=[claimed(1), claimed(2)]))
    h = Handler(sleep=0.5)
    w = Worker(client(fake), h, worker_id="w", concurrency=3, poll_interval=0.05, lease_renewal=False)
    run_for(w, 0.4)
    asks = [req.max_jobs for req, _ in fake.calls["Claim"]]
    assert asks[0] == 3 and all(n == 1 for n in asks[1:]), asks  # two slots busy, one free
    assert sorted(h.calls) == [("refund", 1), ("refund", 2)]


def test_dispatches_by_next_action_and_writes_with_the_grant_R14_R25(fake: FakeCoordinator) -> None:
    fake.answer("Claim", pb.ClaimResponse(jobs=[claimed(1), claimed(2, 3, pb.NEXT_ACTION_RECONCILE)]))
    h = Handler()
    run_for(Worker(client(fake), h, worker_id="w", concurrency=2, poll_interval=0.05), 0.5)
    assert sorted(h.calls) == [("reconcile", 2), ("refund", 1)]
    [(done, _)] = fake.calls["Complete"]
    assert (done.job_id, done.attempt, done.lease_token, done.provider_refund_id) == (1, 1, "tok-1", "re_1")
    [(resched, _)] = fake.calls["Reschedule"]  # pending is not success (R4)
    assert (resched.job_id, resched.attempt, resched.lease_token, resched.next_action) == (
        2, 3, "tok-2", pb.NEXT_ACTION_RECONCILE)


def test_a_failed_claim_is_never_acted_on_nor_repeated_as_such_R7(fake: FakeCoordinator) -> None:
    fake.answer("Claim", Fail(grpc.StatusCode.UNAVAILABLE, Reason.CLAIM_OUTCOME_UNKNOWN),
                Fail(grpc.StatusCode.UNAVAILABLE))
    events: list[WorkerEvent] = []
    h = Handler()
    w = Worker(client(fake), h, worker_id="w", claim_backoff=0.05, poll_interval=0.05, on_event=events.append)
    run_for(w, 0.5)
    assert [e.kind for e in events][:2] == [WorkerEventKind.CLAIM_FAILED] * 2
    assert h.calls == [] and w.stats().claim_failures == 2
    assert fake.count("Complete") == fake.count("Reschedule") == 0


def test_claim_retry_after_is_waited_out_R19(fake: FakeCoordinator) -> None:
    resp = pb.ClaimResponse()
    resp.retry_after.FromMilliseconds(800)
    fake.answer("Claim", resp)
    w = Worker(client(fake), Handler(), worker_id="w", poll_interval=0.01)
    run_for(w, 0.5)
    assert fake.count("Claim") == 1, "claimed again before retry_after"


def test_a_handler_past_its_deadline_is_unknown_and_its_late_answer_filed_R14_R15(fake: FakeCoordinator) -> None:
    fake.answer("Claim", pb.ClaimResponse(jobs=[claimed(1)]))
    h = Handler(sleep=0.6)
    events: list[WorkerEvent] = []
    w = Worker(client(fake), h, worker_id="w", provider_timeout=0.2, late_answer_grace=0.1, poll_interval=0.05,
               lease_renewal=False, on_event=events.append)
    run_for(w, 1.2)
    [(resched, _)] = fake.calls["Reschedule"]
    assert resched.next_action == pb.NEXT_ACTION_RECONCILE and "outcome unknown" in resched.reason
    [(obs, _)] = fake.calls["ReportObservation"]
    assert (obs.operation_key, obs.attempt, obs.lease_token, obs.provider_refund_id) == ("op-1", 1, "tok-1", "re_1")
    assert obs.source == "worker:w" and "after the provider-call deadline" in obs.detail
    assert WorkerEventKind.PROVIDER_DEADLINE in [e.kind for e in events]


def test_a_stale_write_back_files_the_answer_with_the_lease_token_R15_R25(fake: FakeCoordinator) -> None:
    fake.answer("Claim", pb.ClaimResponse(jobs=[claimed(1)]))
    fake.answer("Complete", Fail(grpc.StatusCode.FAILED_PRECONDITION, Reason.STALE_ATTEMPT,
                                 metadata={"current_attempt": "2"}))
    w = Worker(client(fake), Handler(), worker_id="w", poll_interval=0.05, lease_renewal=False)
    run_for(w, 0.5)
    assert fake.count("Complete") == 1, "the fence's refusal was repeated"
    [(obs, _)] = fake.calls["ReportObservation"]
    assert (obs.attempt, obs.lease_token, obs.outcome) == (1, "tok-1", pb.OBSERVATION_OUTCOME_SUCCEEDED)
    assert w.stats().stale_rejected == 1


def test_renewals_batch_every_due_job_into_one_call_R27(fake: FakeCoordinator) -> None:
    # Leases of 0.6 s: a renewal about every 0.2 s, both jobs in each call.
    jobs = [claimed(1), claimed(2)]
    for j in jobs:
        j.lease_until.FromNanoseconds(j.claimed_at.ToNanoseconds() + 600_000_000)
    fake.answer("Claim", pb.ClaimResponse(jobs=jobs))
    for _ in range(20):
        fake.answer("RenewLeases", pb.RenewLeasesResponse(renewals=[
            pb.LeaseRenewal(job_id=1, attempt=1), pb.LeaseRenewal(job_id=2, attempt=1)]))
    for r in list(fake.script["RenewLeases"]):
        for x in r.renewals:
            x.lease_until.FromSeconds(1_900_000_040)
    w = Worker(client(fake), Handler(sleep=1.0), worker_id="w", concurrency=2, poll_interval=0.05)
    run_for(w, 0.3)  # stop() drains: the handlers run their second out
    calls = [req for req, _ in fake.calls["RenewLeases"]]
    assert len(calls) >= 3, calls
    # Jobs due within half an interval of each other share a call; a busy
    # machine may split the first one, never the rest.
    both = [sorted(g.job_id for g in c.grants) == [1, 2] for c in calls]
    assert sum(both) >= len(calls) - 1, calls
    assert all(g.lease_token == f"tok-{g.job_id}" for c in calls for g in c.grants)
