"""The Worker against a real coordinator on MariaDB: the whole loop, lease
renewal while a handler outlives its lease (R27), a grant lost while its
handler runs (R27, R15), GRANT_TOO_OLD, the drain (R18)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator, Optional

import pytest

from jobfence import (
    ClaimedJob,
    GrantLostError,
    HandlerContext,
    JobState,
    NextAction,
    Outcome,
    ProviderPolicy,
    Result,
    StaleAttemptError,
    Worker,
    WorkerEvent,
    WorkerEventKind,
)

from harness import Coordinator, eventually, kinds, refund, start_coordinator
from workerrun import Running


Fn = Callable[[ClaimedJob, HandlerContext], Result]


class Recorder:
    """A handler from two functions, recording what it was asked."""

    def __init__(self, refund: Optional[Fn] = None, reconcile: Optional[Fn] = None) -> None:
        self._refund = refund or (lambda j, ctx: Result.succeeded(f"re_{j.job.id}"))
        self._reconcile = reconcile or (lambda j, ctx: Result.succeeded(f"re_{j.job.id}"))
        self.calls: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        with self.lock:
            self.calls.append(("refund", job.job.id, job.attempt))
        return self._refund(job, ctx)

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        with self.lock:
            self.calls.append(("reconcile", job.job.id, job.attempt))
        return self._reconcile(job, ctx)


@pytest.fixture
def workers() -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(c: Coordinator, handler: object, events: Optional[list[WorkerEvent]] = None, **opts: object) -> Running:
        opts.setdefault("poll_interval", 0.1)
        if events is not None:
            opts["on_event"] = events.append
        r = Running(Worker(c.client(), handler, **opts))  # type: ignore[arg-type]
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


def wait_state(c: Coordinator, job_id: int, state: JobState, timeout: float = 20):
    cl = c.client()
    return eventually(lambda: (d := cl.get_job(job_id)).job.state is state and d, timeout, f"job {job_id} {state}")


def test_worker_claims_refunds_and_completes(coord: Coordinator, workers) -> None:
    c = coord.client()
    r = refund()
    job, _ = c.enqueue_refund(**r)
    h = Recorder()
    events: list[WorkerEvent] = []
    run = workers(coord, h, events, worker_id="py-w1", provider=r["provider"], lease=5)
    d = wait_state(coord, job.id, JobState.SUCCEEDED)
    assert kinds(d) == ["enqueued@0", "claimed@1", "completed@1"] and d.job.provider_refund_id == f"re_{job.id}"
    assert h.calls == [("refund", job.id, 1)]
    eventually(lambda: run.w.stats().completed == 1)
    assert [e.kind for e in events if e.job is not None][:3] == [
        WorkerEventKind.CLAIMED, WorkerEventKind.HANDLED, WorkerEventKind.WRITTEN]


def test_takeover_reconciles_first_and_pending_is_not_success_R4_R14(coord: Coordinator, workers) -> None:
    c = coord.client()
    r = refund()
    job, _ = c.enqueue_refund(**r)
    first = c.claim("py-crashed", 1, provider=r["provider"], lease=30)[0]
    coord.expire_lease(job.id)
    answers = iter([Result.pending("re_p", retry_after=0.2), Result.succeeded("re_p")])
    h = Recorder(reconcile=lambda j, ctx: next(answers))
    workers(coord, h, worker_id="py-w2", provider=r["provider"], lease=5)
    d = wait_state(coord, job.id, JobState.SUCCEEDED)
    assert [x[0] for x in h.calls] == ["reconcile", "reconcile"], h.calls
    assert kinds(d) == ["enqueued@0", "claimed@1", "taken_over@2", "rescheduled@2", "claimed@3", "completed@3"]
    with pytest.raises(StaleAttemptError):
        c.complete(job.id, first.attempt, first.lease_token, "re_late")


def test_no_record_without_the_guarantee_escalates_R16(coord: Coordinator, workers) -> None:
    c = coord.client()
    r = refund()
    job, _ = c.enqueue_refund(**r)
    c.claim("py-crashed", 1, provider=r["provider"])
    coord.expire_lease(job.id)
    workers(coord, Recorder(reconcile=lambda j, ctx: Result.no_record()), worker_id="py-w3", provider=r["provider"],
            policy=ProviderPolicy(same_key_resend_safe=False))
    d = wait_state(coord, job.id, JobState.MANUAL_REVIEW)
    assert "R14, R16" in d.job.last_reason


def test_renewing_worker_outlives_its_lease_without_a_takeover_R27(coord: Coordinator, workers) -> None:
    # A 2 s lease and a 6 s provider call: the worker renews at about a third
    # of the lease; a rival claiming all along never gets the job.
    c = coord.client()
    r = refund()
    job, _ = c.enqueue_refund(**r)

    def slow(j: ClaimedJob, ctx: HandlerContext) -> Result:
        if ctx.wait(6):
            return Result.unknown(ctx.cause)
        return Result.succeeded("re_slow")

    a = workers(coord, Recorder(refund=slow), worker_id="py-slow", provider=r["provider"], lease=2, provider_timeout=20)
    eventually(lambda: a.w.stats().claimed == 1)
    rival = Recorder()
    workers(coord, rival, worker_id="py-rival", provider=r["provider"], lease=2)
    d = wait_state(coord, job.id, JobState.SUCCEEDED, timeout=30)
    assert kinds(d) == ["enqueued@0", "claimed@1", "completed@1"], "a live worker was taken over"
    assert rival.calls == []
    # The worker counts its completion once the answer is back, after the commit.
    s = eventually(lambda: (x := a.w.stats()).completed == 1 and x, 10, "A's completion counted")
    assert s.renewals >= 4 and s.grants_lost == 0, s


def test_grant_lost_while_the_handler_runs_cancels_it_R27_R15(coord: Coordinator, workers) -> None:
    c = coord.client()
    r = refund()
    job, _ = c.enqueue_refund(**r)
    started = threading.Event()
    seen: dict[str, object] = {}

    def hang(j: ClaimedJob, ctx: HandlerContext) -> Result:
        started.set()
        t0 = time.monotonic()
        ctx.wait(60)
        seen["after"] = time.monotonic() - t0
        seen["cause"] = ctx.cause
        return Result.succeeded("re_A")  # the provider had answered meanwhile

    events: list[WorkerEvent] = []
    a = workers(coord, Recorder(refund=hang), events, worker_id="py-A", provider=r["provider"], lease=3,
                provider_timeout=60)
    assert started.wait(20)
    coord.expire_lease(job.id)
    b = c.claim("py-B", 1, provider=r["provider"], lease=30)[0]
    assert b.attempt == 2
    d = eventually(lambda: (x := c.get_job(job.id)).observations and x, 15, "A's receipt")
    cause = seen["cause"]
    assert isinstance(cause, GrantLostError) and isinstance(cause.refusal, StaleAttemptError), cause
    assert cause.current_attempt == 2
    assert float(seen["after"]) < 3.0, "cancelled within a lease"  # type: ignore[arg-type]
    [o] = d.observations
    assert (o.outcome, o.provider_refund_id, o.reported_attempt, o.attempt_verified) == (Outcome.SUCCEEDED, "re_A", 1, True)
    assert o.source == "worker:py-A"
    # Nothing A wrote landed: the job is B's, running.
    assert (d.job.state, d.job.attempt, d.job.worker_id) == (JobState.RUNNING, 2, "py-B")
    assert kinds(d) == ["enqueued@0", "claimed@1", "taken_over@2"]
    s = a.w.stats()
    assert (s.grants_lost, s.stale_rejected, s.completed) == (1, 1, 0), s
    assert any(e.kind is WorkerEventKind.GRANT_LOST for e in events)
    c.complete(job.id, b.attempt, b.lease_token, "re_A")


def test_grant_too_old_stops_renewing_and_cancels_nothing_R27_R8(workers) -> None:
    coord = start_coordinator("--max-grant-age", "2s")
    try:
        c = coord.client()
        r = refund()
        job, _ = c.enqueue_refund(**r)
        seen: dict[str, bool] = {}

        def slow(j: ClaimedJob, ctx: HandlerContext) -> Result:
            seen["cancelled"] = ctx.wait(3.5)
            return Result.succeeded("re_old")

        events: list[WorkerEvent] = []
        a = workers(coord, Recorder(refund=slow), events, worker_id="py-old", provider=r["provider"], lease=1.5,
                    provider_timeout=20)
        d = wait_state(coord, job.id, JobState.SUCCEEDED, timeout=20)
        assert seen == {"cancelled": False}
        assert any(e.kind is WorkerEventKind.GRANT_TOO_OLD for e in events)
        # Nobody else claimed: the grant that could no longer be renewed still wrote (R8).
        assert kinds(d) == ["enqueued@0", "claimed@1", "completed@1"]
        assert a.w.stats().grants_lost == 0
        a.stop()
    finally:
        coord.stop()


def test_stop_drains_jobs_in_flight_and_claims_no_more_R18(coord: Coordinator) -> None:
    c = coord.client()
    provider = refund()["provider"]
    jobs = [c.enqueue_refund(**refund(provider=provider))[0] for _ in range(3)]
    started = threading.Event()
    gate = threading.Event()

    def gated(j: ClaimedJob, ctx: HandlerContext) -> Result:
        started.set()
        gate.wait(10)
        return Result.succeeded(f"re_{j.job.id}")

    w = Worker(coord.client(), Recorder(refund=gated), worker_id="py-drain", provider=provider, concurrency=2,
               lease=10, poll_interval=0.1)
    run = Running(w)
    assert started.wait(20)
    eventually(lambda: w.in_flight == 2)
    w.stop()
    time.sleep(0.3)
    gate.set()
    run.stop()
    states = sorted(c.get_job(j.id).job.state.value for j in jobs)
    # R18: two slots, two claims; the third job was never claimed.
    assert states == ["ready", "succeeded", "succeeded"]
    assert w.stats().claimed == 2


def test_a_same_key_resend_is_checked_again_before_it_leaves_R22(coord: Coordinator, workers) -> None:
    # The reconcile found "no record" inside the window and chose a resend; by
    # the time the resend is claimed the margin covers the whole window: the
    # worker escalates instead of sending.
    c = coord.client()
    r = refund()
    job, _ = c.enqueue_refund(**r)
    first = c.claim("py-first", 1, provider=r["provider"])[0]
    c.reschedule(job.id, first.attempt, first.lease_token, next_action=NextAction.REFUND, reason="no record (test)")
    h = Recorder()
    events: list[WorkerEvent] = []
    workers(coord, h, events, worker_id="py-resend", provider=r["provider"],
            policy=ProviderPolicy(same_key_resend_safe=True, resend_margin=10 * 365 * 24 * 3600.0))
    d = wait_state(coord, job.id, JobState.MANUAL_REVIEW)
    assert h.calls == [], "nothing was sent"
    assert "resend refused before sending" in d.job.last_reason
    assert any(e.kind is WorkerEventKind.RESEND_REFUSED for e in events)
