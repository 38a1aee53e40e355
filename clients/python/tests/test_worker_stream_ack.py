"""The worker stream's acknowledgements (WorkStart.acknowledges) against a
real coordinator on MariaDB: every grant is acknowledged as it is read,
before its jobs start, so a handler that runs past the coordinator's 5 s
acknowledgement timeout keeps its job; and a grant read after the drain's
half-close, which can no longer be acknowledged, is not started: the
coordinator hands it back. A client interceptor on the worker's channel sees
what the worker sends and receives on its stream."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import grpc
import pytest

from jobfence import ClaimedJob, Client, HandlerContext, JobState, Result, RetryPolicy, Worker
from jobfence.v1 import coordinator_pb2 as pb

from harness import Coordinator, eventually, kinds, refund
from workerrun import Running

# The coordinator's acknowledgement timeout (server.StreamAckTimeout).
ACK_TIMEOUT = 5.0

Ref = tuple[int, int, str]


class StreamTap(grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Watches the worker streams of a channel: the WorkStarts, the grants
    received and the acks sent, each with when (time.monotonic()). It can
    hold the next grant back until the worker half-closed its stream, so
    that the grant reaches a draining worker."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[pb.WorkStart] = []
        self.grants: list[tuple[float, list[Ref]]] = []
        self.acks: list[tuple[float, list[Ref]]] = []
        self.hold_next = False
        self.held = threading.Event()
        self.held_ids: list[int] = []

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        if not details.method.endswith("/Work"):
            return continuation(details, request_iterator)
        half_closed = threading.Event()
        tap = self

        def outbound() -> Iterator[pb.WorkRequest]:
            for m in request_iterator:
                kind = m.WhichOneof("kind")
                with tap.lock:
                    if kind == "start":
                        tap.starts.append(m.start)
                    elif kind == "ack":
                        tap.acks.append((time.monotonic(), [(g.job_id, g.attempt, g.lease_token) for g in m.ack.grants]))
                yield m
            half_closed.set()

        return _TappedCall(continuation(details, outbound()), tap, half_closed)


class _TappedCall:
    """A worker stream's call, its responses seen by the tap."""

    def __init__(self, call: Any, tap: StreamTap, half_closed: threading.Event) -> None:
        self._call = call
        self._tap = tap
        self._half_closed = half_closed

    def __iter__(self) -> _TappedCall:
        return self

    def __next__(self) -> pb.WorkResponse:
        m = next(self._call)
        if m.WhichOneof("kind") != "grant":
            return m
        tap = self._tap
        with tap.lock:
            tap.grants.append((time.monotonic(), [(j.job.id, j.attempt, j.lease_token) for j in m.grant.jobs]))
            hold, tap.hold_next = tap.hold_next, False
        if hold:
            tap.held_ids = [j.job.id for j in m.grant.jobs]
            tap.held.set()
            self._half_closed.wait(30)  # past it the test failed: let the grant go
        return m

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


@pytest.fixture
def tapped(coord: Coordinator) -> Iterator[tuple[Client, StreamTap]]:
    tap = StreamTap()
    channel = grpc.intercept_channel(grpc.insecure_channel(coord.address), tap)
    try:
        yield Client.from_channel(channel, retry=RetryPolicy(attempts=6, backoff=0.1, max_backoff=0.5)), tap
    finally:
        channel.close()


def handed_back(coord: Coordinator) -> float:
    return coord.metrics().get("jobfence_grants_handed_back_total", 0)


class Slow:
    """A provider whose every call takes `seconds`, succeeding; records the jobs it was called for."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.called: list[int] = []

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        self.called.append(job.job.id)
        if self.seconds:
            threading.Event().wait(self.seconds)  # a provider call this slow
        return Result.succeeded(f"re_{job.job.id}")

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        return self.refund(job, ctx)


def test_each_grant_is_acknowledged_at_once_so_a_handler_outlasting_the_ack_timeout_keeps_its_job_R25(
        coord: Coordinator, tapped: tuple[Client, StreamTap]) -> None:
    wc, tap = tapped
    c = coord.client()
    provider = refund()["provider"]
    before = handed_back(coord)
    # A 30 s lease: the first renewal (R27), which also shows the coordinator
    # the grant, comes ~10 s in, too late to save an unacknowledged one.
    w = Worker(wc, Slow(ACK_TIMEOUT + 2), worker_id="py-acker", provider=provider, concurrency=3, lease=30,
               provider_timeout=20, poll_interval=60, receipt_spool="off")
    r = Running(w)
    try:
        eventually(lambda: len(tap.starts) == 1, 10, "the worker's stream")
        jobs = [c.enqueue_refund(**refund(provider=provider))[0] for _ in range(3)]
        for j in jobs:
            # Written back, or handed back (ready again after a claim).
            d = eventually(lambda: ((x := c.get_job(j.id)).job.state is JobState.SUCCEEDED
                                    or x.job.state is JobState.READY and x.job.attempt > 0) and x,
                           20, f"job {j.id} settled")
            assert kinds(d) == ["enqueued@0", "claimed@1", "completed@1"], \
                f"job {j.id} must complete under its first grant (last reason {d.job.last_reason!r})"
    finally:
        r.stop()
    assert handed_back(coord) == before, "a grant was handed back"
    s = w.stats()
    assert (s.completed, s.stale_rejected, s.write_failures, s.renewals) == (3, 0, 0, 0), s
    assert [st.acknowledges for st in tap.starts] == [True], "the WorkStart must say the worker acknowledges"
    # One WorkAck per WorkGrant, naming its jobs with their attempt and lease
    # token (R25), sent within moments of the grant's arrival.
    assert len(tap.acks) == len(tap.grants), (tap.acks, tap.grants)
    for (granted_at, granted), (acked_at, acked) in zip(tap.grants, tap.acks):
        assert acked == granted
        assert acked_at - granted_at < ACK_TIMEOUT / 2, f"acknowledged {acked_at - granted_at:.3f}s after it arrived"


def test_a_grant_read_after_the_drains_half_close_is_not_started_and_the_coordinator_hands_it_back_R25(
        coord: Coordinator, tapped: tuple[Client, StreamTap]) -> None:
    wc, tap = tapped
    c = coord.client()
    provider = refund()["provider"]
    before = handed_back(coord)
    h = Slow(0)
    w = Worker(wc, h, worker_id="py-drainer", provider=provider, lease=30, poll_interval=60, receipt_spool="off")
    r = Running(w)
    try:
        eventually(lambda: len(tap.starts) == 1, 10, "the worker's stream")
        tap.hold_next = True
        job, _ = c.enqueue_refund(**refund(provider=provider))
        assert tap.held.wait(20), "the job was never granted"
    finally:
        r.stop()  # the drain half-closes the stream; then the held grant goes on
    assert tap.held_ids == [job.id]
    d = eventually(lambda: (x := c.get_job(job.id)).job.state is JobState.READY and x, 20, "the grant handed back")
    assert kinds(d) == ["enqueued@0", "claimed@1", "rescheduled@1"]
    assert "acknowledged" in d.job.last_reason, d.job.last_reason
    assert h.called == [], "the draining worker handled the grant"
    s = w.stats()
    assert (s.claimed, s.completed, s.rescheduled, s.stale_rejected) == (0, 0, 0, 0), s
    assert len(tap.grants) == 1 and tap.acks == [], "the grant after the half-close was acknowledged"
    assert handed_back(coord) == before + 1
