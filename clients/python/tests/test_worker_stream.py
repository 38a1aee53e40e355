"""The Worker on the worker stream (Work) against a real coordinator on
MariaDB: jobs pushed as they are enqueued, without a Claim call; a
write-back cut with its stream repeated, landing once (R21); a connection
that goes silent without a close, found dead by the keepalive; a coordinator
restarted under the stream; a stale grant's write-back refused on the
stream with the unary call's typed error (R24, R25); no_stream claiming as
before. The coordinator's own metrics count the unary calls."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator, Optional

import pytest

from jobfence import (
    ClaimedJob,
    Client,
    HandlerContext,
    JobState,
    Outcome,
    Result,
    RetryPolicy,
    StaleAttemptError,
    UnavailableError,
    Worker,
    WorkerEvent,
    WorkerEventKind,
)

from harness import BlackholeProxy, Coordinator, CutProxy, eventually, kinds, refund, start_coordinator
from workerrun import Running


class Gate:
    """Refunds re_<job id>; a job whose id is held waits for its gate."""

    def __init__(self) -> None:
        self.held: dict[int, threading.Event] = {}
        self.sent: dict[int, threading.Event] = {}
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def hold(self, job_id: int) -> threading.Event:
        self.sent[job_id] = threading.Event()
        g = self.held[job_id] = threading.Event()
        return g

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        with self.lock:
            self.calls.append((job.job.id, job.attempt))
        if job.job.id in self.held:
            self.sent[job.job.id].set()
            self.held[job.job.id].wait(30)
        return Result.succeeded(f"re_{job.job.id}")

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        return self.refund(job, ctx)


@pytest.fixture
def running() -> Iterator[list[Running]]:
    rs: list[Running] = []
    yield rs
    for r in rs:
        r.w.stop()
    for r in rs:
        r.t.join(60)


def counts(c: Coordinator, *methods: str) -> dict[str, int]:
    return {m: c.rpc_count(m) for m in methods}


def streams_open(c: Coordinator) -> int:
    return int(c.metrics().get("jobfence_worker_streams", 0))


def wait_state(c: Client, job_id: int, state: JobState, timeout: float = 20) -> Any:
    return eventually(lambda: (d := c.get_job(job_id)).job.state is state and d, timeout, f"job {job_id} {state}")


def own_client(address: str, attempts: int = 6) -> Client:
    """A worker's client of its own (the harness closes its clients when it
    stops a coordinator), reconnecting quickly to a coordinator back."""
    return Client(address, retry=RetryPolicy(attempts=attempts, backoff=0.1, max_backoff=0.5), call_timeout=10,
                  channel_options=[("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                                   ("grpc.max_reconnect_backoff_ms", 500)])


def shown_held(w: Worker) -> None:
    """Waits until the coordinator has seen w hold its grant: a renewal
    answered on the stream comes after the grant's acknowledgement. A grant
    whose ack a cut took with it is handed back, as one never received."""
    eventually(lambda: w.stats().renewals >= 1, 10, "a renewal of the held grant")


def test_the_worker_takes_jobs_pushed_on_its_stream_without_claim_calls(
        coord: Coordinator, running: list[Running]) -> None:
    c = coord.client()
    provider = refund()["provider"]
    before = counts(coord, "Claim", "Complete", "Work")
    # A poll a minute apart: a claim would show in the time the jobs take.
    w = Worker(coord.client(), Gate(), worker_id="py-stream", provider=provider, concurrency=4, lease=10,
               poll_interval=60, receipt_spool="off")
    running.append(Running(w))
    eventually(lambda: streams_open(coord) == 1, 10, "the worker's stream")
    jobs = [c.enqueue_refund(**refund(provider=provider))[0] for _ in range(10)]
    for j in jobs:
        d = wait_state(c, j.id, JobState.SUCCEEDED)
        assert kinds(d) == ["enqueued@0", "claimed@1", "completed@1"]
    eventually(lambda: w.stats().completed == len(jobs), 10, "the completions counted")
    after = counts(coord, "Claim", "Complete", "Work")
    assert after["Claim"] == before["Claim"], "a Claim call: the grants must come on the stream"
    assert after["Complete"] == before["Complete"], "a unary Complete: the write-backs must go on the stream"
    assert after["Work"] == before["Work"] + 1
    running.pop().stop()
    s = w.stats()
    assert (s.claimed, s.completed, s.claim_failures, s.write_failures) == (10, 10, 0, 0), s
    eventually(lambda: streams_open(coord) == 0, 10, "the stream closed by the drain")


def test_a_write_back_cut_with_its_stream_is_repeated_and_lands_once_R21(
        coord: Coordinator, running: list[Running]) -> None:
    c = coord.client()
    r = refund()
    proxy = CutProxy(coord.address)
    wc = own_client(proxy.address)
    try:
        h = Gate()
        first, _ = c.enqueue_refund(**r)
        gate = h.hold(first.id)
        events: list[WorkerEvent] = []
        w = Worker(wc, h, worker_id="py-cut", provider=r["provider"], lease=30, lease_renewal=False,
                   poll_interval=60, receipt_spool="off", on_event=events.append)
        running.append(Running(w))
        assert h.sent[first.id].wait(20), "the job never reached the worker"
        before = counts(coord, "Claim", "Work")
        # The next message the worker sends is the write-back, on its stream:
        # the coordinator commits it, and its answer never comes back.
        proxy.hold_replies()
        gate.set()
        assert proxy.holding.wait(10), "the write-back was not sent"
        d = wait_state(c, first.id, JobState.SUCCEEDED)
        assert w.stats().completed == 0, "the answer came through"
        proxy.cut()
        # The call cut with its stream is answered UNAVAILABLE and repeated:
        # a replay (R21), one write in the history.
        eventually(lambda: w.stats().completed == 1, 20, "the repeated write-back answered")
        s = w.stats()
        assert (s.replayed, s.write_failures, s.stale_rejected) == (1, 0, 0), s
        d = c.get_job(first.id)
        assert kinds(d) == ["enqueued@0", "claimed@1", "completed@1"], "the repeat wrote again"
        assert d.job.provider_refund_id == f"re_{first.id}"
        # The worker opens a new stream and takes more work on it.
        second, _ = c.enqueue_refund(**refund(provider=r["provider"]))
        wait_state(c, second.id, JobState.SUCCEEDED)
        after = counts(coord, "Claim", "Work")
        assert after["Claim"] == before["Claim"] and after["Work"] > before["Work"], (before, after)
        assert [x for x in h.calls] == [(first.id, 1), (second.id, 1)]
        assert WorkerEventKind.CLAIM_FAILED in [e.kind for e in events], "the stream's end went unnoticed"
        running.pop().stop()
    finally:
        wc.close()
        proxy.close()


def test_a_blackholed_connection_is_found_dead_by_keepalive_and_the_write_back_repeated_on_a_new_one_R21(
        coord: Coordinator, running: list[Running]) -> None:
    """A coordinator that vanishes without a FIN or RST (its host gone, a
    path dropping every packet) is noticed by the channel's keepalive
    (KEEPALIVE_OPTIONS: a PING after 10 s, 5 s for its answer), not by the
    kernel's retransmission timeout some 15 minutes later: the worker stream
    ends UNAVAILABLE, the write-back it carried is answered UNAVAILABLE and
    repeated on a new connection (R21), landing once under its grant (R9,
    R25), and the worker opens a new stream with its free slot and is granted
    a job enqueued after the blackhole (R18). The worker's calls time out
    only after a minute, so nothing but the keepalive meets the bound."""
    c = coord.client()
    r = refund()
    proxy = BlackholeProxy(coord.address)
    wc = Client(proxy.address, retry=RetryPolicy(attempts=6, backoff=0.1, max_backoff=0.5), call_timeout=60,
                channel_options=[("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                                 ("grpc.max_reconnect_backoff_ms", 500)])
    try:
        h = Gate()
        first, _ = c.enqueue_refund(**r)
        gate = h.hold(first.id)
        ended: list[tuple[float, Optional[BaseException]]] = []

        def on_event(e: WorkerEvent) -> None:
            if e.kind is WorkerEventKind.CLAIM_FAILED:
                ended.append((time.monotonic(), e.error))

        w = Worker(wc, h, worker_id="py-blackholed", provider=r["provider"], lease=30, renew_interval=0.2,
                   poll_interval=60, receipt_spool="off", claim_backoff=0.1, max_claim_backoff=0.5, on_event=on_event)
        running.append(Running(w))
        assert h.sent[first.id].wait(20), "the job never reached the worker"
        shown_held(w)
        blackholed = time.monotonic()
        proxy.blackhole()
        gate.set()  # the write-back goes on the dead stream
        second, _ = c.enqueue_refund(**refund(provider=r["provider"]))
        # Detection takes 5 to 15 s after the blackhole (the last read, then a
        # PING after 10 s and 5 s for its answer).
        bound = 30.0
        for j in (first, second):
            wait_state(c, j.id, JobState.SUCCEEDED, max(0.1, bound - (time.monotonic() - blackholed)))
        took = time.monotonic() - blackholed
        assert ended, "the stream's end went unnoticed"
        at, why = ended[0]
        print(f"stream ended {at - blackholed:.3f}s after the blackhole ({why}); both jobs done after {took:.3f}s")
        assert isinstance(why, UnavailableError), why
        assert kinds(c.get_job(first.id)) == ["enqueued@0", "claimed@1", "completed@1"], \
            "the grant held through the blackhole writes back once"
        assert proxy.accepted >= 2, "no new connection after the blackhole"
        running.pop().stop()
        s = w.stats()
        assert (s.completed, s.replayed, s.write_failures, s.stale_rejected) == (2, 0, 0, 0), s
        assert s.claim_failures >= 1, s
    finally:
        wc.close()
        proxy.close()


def test_a_coordinator_restarted_under_the_stream_is_reconnected_and_the_write_back_lands_once(
        running: list[Running]) -> None:
    coord = start_coordinator()
    again: Optional[Coordinator] = None
    wc = own_client(coord.address, attempts=20)
    try:
        r = refund()
        job, _ = coord.client().enqueue_refund(**r)
        h = Gate()
        gate = h.hold(job.id)
        w = Worker(wc, h, worker_id="py-restart", provider=r["provider"], lease=30, renew_interval=0.2,
                   poll_interval=60, receipt_spool="off", claim_backoff=0.1, max_claim_backoff=0.5)
        running.append(Running(w))
        assert h.sent[job.id].wait(20), "the job never reached the worker"
        shown_held(w)
        # The coordinator stops (its streams end UNAVAILABLE) and another
        # starts on its database and address, the grant still running.
        coord.stop(drop=False)
        again = back = start_coordinator("--listen", coord.address, database=coord.database)
        c = back.client()
        eventually(lambda: streams_open(back) == 1, 20, "the worker's new stream")
        gate.set()
        d = wait_state(c, job.id, JobState.SUCCEEDED)
        assert kinds(d) == ["enqueued@0", "claimed@1", "completed@1"]
        other, _ = c.enqueue_refund(**refund(provider=r["provider"]))
        wait_state(c, other.id, JobState.SUCCEEDED)
        eventually(lambda: w.stats().completed == 2, 10, "both completions counted")
        assert back.rpc_count("Claim") == 0 and back.rpc_count("Complete") == 0
        running.pop().stop()
        s = w.stats()
        assert (s.write_failures, s.replayed, s.claimed) == (0, 0, 2), s
        assert s.claim_failures >= 1, "the stream's end went unnoticed"
    finally:
        wc.close()
        if again is not None:
            again.stop()
        else:
            coord.stop()


def test_a_stale_grants_write_back_on_the_stream_raises_stale_attempt_with_the_current_attempt_R24_R25(
        coord: Coordinator, running: list[Running]) -> None:
    c = coord.client()
    r = refund()
    job, _ = c.enqueue_refund(**r)
    h = Gate()
    gate = h.hold(job.id)
    events: list[WorkerEvent] = []
    # No renewal: nothing but the write-back meets the takeover.
    w = Worker(coord.client(), h, worker_id="py-stale", provider=r["provider"], lease=30, lease_renewal=False,
               poll_interval=60, receipt_spool="off", on_event=events.append)
    running.append(Running(w))
    assert h.sent[job.id].wait(20)
    coord.expire_lease(job.id)
    [b] = c.claim("py-B", 1, provider=r["provider"], lease=30)
    assert b.attempt == 2
    before = counts(coord, "Complete", "ReportObservation")
    gate.set()
    stale = eventually(lambda: next((e for e in events if e.kind is WorkerEventKind.STALE), None), 20,
                       "the fence's refusal")
    err = stale.error
    assert isinstance(err, StaleAttemptError), err
    assert (err.current_attempt, err.current_state, err.job_id, err.attempt) == (2, JobState.RUNNING, job.id, 1)
    # The receipt is filed under A's grant, on the stream too (R15).
    d = eventually(lambda: (x := c.get_job(job.id)).observations and x, 15, "A's receipt")
    [o] = d.observations
    assert (o.outcome, o.reported_attempt, o.attempt_verified, o.source) == (Outcome.SUCCEEDED, 1, True,
                                                                              "worker:py-stale")
    assert counts(coord, "Complete", "ReportObservation") == before, "the write-back or receipt went unary"
    assert (d.job.state, d.job.attempt) == (JobState.RUNNING, 2)
    running.pop().stop()
    assert w.stats().stale_rejected == 1
    c.complete(job.id, b.attempt, b.lease_token, f"re_{job.id}")


def test_no_stream_claims_with_claim_calls_and_writes_back_unary(coord: Coordinator,
                                                                 running: list[Running]) -> None:
    c = coord.client()
    provider = refund()["provider"]
    before = counts(coord, "Claim", "Complete", "Work")
    w = Worker(coord.client(), Gate(), worker_id="py-unary", provider=provider, concurrency=2, no_stream=True,
               poll_interval=0.1, receipt_spool="off")
    running.append(Running(w))
    jobs = [c.enqueue_refund(**refund(provider=provider))[0] for _ in range(3)]
    for j in jobs:
        wait_state(c, j.id, JobState.SUCCEEDED)
    running.pop().stop()
    after = counts(coord, "Claim", "Complete", "Work")
    assert after["Work"] == before["Work"], "a stream was opened"
    assert after["Claim"] > before["Claim"] and after["Complete"] == before["Complete"] + len(jobs), (before, after)
