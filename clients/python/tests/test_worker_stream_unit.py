"""The Worker on the worker stream (Work) against a scripted coordinator: one
credit per free slot and one back per finished job (R18), every grant
acknowledged as it is read, write-backs on the stream whose errors decode
exactly as the unary calls' (R24), a call cut with its stream repeated
(R21), a new stream after one ends, the drain's half-close (a grant read
after it is not started), the heartbeats of an idle stream, and the fallback
to Claim calls for good against a coordinator without the stream."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterator, Optional

import grpc
import pytest

from jobfence import (
    ClaimedJob,
    Client,
    CoordinatorError,
    HandlerContext,
    InvalidArgumentError,
    Result,
    RetryPolicy,
    StaleAttemptError,
    Worker,
    WorkerEvent,
    WorkerEventKind,
)
from jobfence.session import STREAM_HEARTBEAT_INTERVAL, _Requests
from jobfence.v1 import coordinator_pb2 as pb

from fakecoord import Cut, Fail, FakeCoordinator, FakeStream, claimed
from test_errors import CASES
from workerrun import Records, Running

FP = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture
def sfake() -> Iterator[FakeCoordinator]:
    f = FakeCoordinator(stream=True)
    yield f
    f.stop()


class Gated:
    """Refunds re_<id>, each job once its gate opens (open by default)."""

    def __init__(self) -> None:
        self.gates: dict[int, threading.Event] = {}
        self.started: list[int] = []
        self.lock = threading.Lock()

    def hold(self, job_id: int) -> threading.Event:
        g = self.gates[job_id] = threading.Event()
        return g

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        with self.lock:
            self.started.append(job.job.id)
        g = self.gates.get(job.job.id)
        if g is not None:
            g.wait(10)
        return Result.succeeded(f"re_{job.job.id}")

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        return self.refund(job, ctx)


def client(fake: FakeCoordinator, attempts: int = 3, logger: Optional[logging.Logger] = None) -> Client:
    return Client(fake.address, retry=RetryPolicy(attempts=attempts, backoff=0.01), call_timeout=5, logger=logger)


def worker(fake: FakeCoordinator, h: Any, *, attempts: int = 3, **kw: Any) -> Worker:
    kw.setdefault("worker_id", "w")
    kw.setdefault("lease_renewal", False)
    kw.setdefault("receipt_spool", "off")
    kw.setdefault("poll_interval", 60.0)  # a claim would show: the stream needs none
    kw.setdefault("claim_backoff", 0.05)
    return Worker(client(fake, attempts, kw.get("logger")), h, **kw)


def wait(cond: Any, what: str, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"no {what} within {timeout}s")
        time.sleep(0.01)


def one_job_held(sfake: FakeCoordinator,
                 concurrency: int = 2) -> tuple[Gated, threading.Event, Worker, Running, FakeStream]:
    """A worker of concurrency slots on sfake's first stream, granted job 1,
    whose handler has started and waits for the gate returned."""
    h = Gated()
    gate = h.hold(1)
    w = worker(sfake, h, concurrency=concurrency)
    r = Running(w)
    st = sfake.stream(0)
    st.grant(claimed(1))
    wait(lambda: h.started == [1], "the job's handler")
    return h, gate, w, r, st


def test_stream_opens_with_a_credit_per_free_slot_and_gets_one_back_per_finished_job_R18(
        sfake: FakeCoordinator) -> None:
    h = Gated()
    w = worker(sfake, h, worker_id="w-credits", concurrency=3, lease=5, provider="acme")
    r = Running(w)
    st = sfake.stream(0)
    assert (st.start.worker_id, st.start.provider, st.start.credits, st.start.lease_duration.seconds) == (
        "w-credits", "acme", 3, 5)
    st.grant(claimed(1), claimed(2))
    st.wait_for(lambda s: len(s.credits()) == 2, "a credit back per finished job")
    assert st.credits() == [1, 1]
    # The write-backs went on the stream, each call with an id of its own.
    calls = st.calls()
    assert sorted(c.complete.job_id for c in calls) == [1, 2]
    assert len({c.call_id for c in calls}) == 2
    assert sfake.count("Complete", via="stream") == 2 and sfake.count("Complete", via="unary") == 0
    r.stop()
    assert st.half_closed.is_set() and st.ended.is_set()
    assert sfake.count("Claim") == 0 and len(sfake.streams) == 1
    s = w.stats()
    assert (s.claimed, s.completed, s.claim_failures) == (2, 2, 0), s


def acks(st: FakeStream) -> list[list[tuple[int, int, str]]]:
    """The WorkAcks st got, each as the (job, attempt, lease token) it names."""
    return [[(g.job_id, g.attempt, g.lease_token) for g in r.ack.grants]
            for r in list(st.requests) if r.WhichOneof("kind") == "ack"]


def test_each_grant_is_acknowledged_once_before_its_jobs_write_back_R25(sfake: FakeCoordinator) -> None:
    h = Gated()
    w = worker(sfake, h, concurrency=3)
    r = Running(w)
    st = sfake.stream(0)
    assert st.start.acknowledges, "the WorkStart must say the worker acknowledges its grants"
    st.grant(claimed(1), claimed(2))
    st.grant(claimed(3, attempt=4))
    wait(lambda: w.stats().completed == 3, "the three jobs written back")
    # One WorkAck per WorkGrant, all its jobs with their attempt and token,
    # sent before any of them wrote back.
    assert acks(st) == [[(1, 1, "tok-1"), (2, 1, "tok-2")], [(3, 4, "tok-3")]]
    kinds = [req.WhichOneof("kind") for req in st.requests]
    assert kinds.index("ack") < kinds.index("call"), kinds
    r.stop()


def test_an_ack_goes_ahead_of_the_messages_waiting_to_be_sent() -> None:
    q = _Requests()
    credit, call = pb.WorkRequest(credit=pb.WorkCredit(credits=1)), pb.WorkRequest(call=pb.WorkCall(call_id=1))
    first, second = (pb.WorkRequest(ack=pb.WorkAck(grants=[pb.GrantRef(job_id=i, attempt=1, lease_token=f"tok-{i}")]))
                     for i in (1, 2))
    assert q.put(credit) and q.put(call) and q.put_first(first) and q.put_first(second)
    q.close()
    assert list(q) == [first, second, credit, call]
    assert not q.put_first(first) and not q.put(credit), "taken after the half-close"


def test_stream_replies_decode_to_the_unary_calls_errors_R24(sfake: FakeCoordinator) -> None:
    # The same scripted error, once as a unary call's trailer, once as a
    # stream reply's status: the same class, code, message, reason, metadata
    # and field violations, by the same code (errors.decode_status).
    w = worker(sfake, Gated(), attempts=1)
    r = Running(w)
    sfake.stream(0)
    unary = client(sfake, attempts=1)
    on_stream: Client = w._client  # the Worker's: its write-backs go on its stream
    cases = [Fail(code, reason, message=f"scripted {reason}", metadata={"current_attempt": "7", "job_id": "1"},
                  violations=[("lease_token", "required")] if code == grpc.StatusCode.INVALID_ARGUMENT else [])
             for code, reason, _ in CASES]
    cases += [Fail(grpc.StatusCode.INVALID_ARGUMENT, violations=[("provider_refund_id", "too long")]),
              Fail(FP, "STALE_ATTEMPT", domain="other.example"), Fail(grpc.StatusCode.INTERNAL, message="boom")]
    try:
        for f in cases:
            got = []
            for c in (unary, on_stream):
                sfake.answer("Complete", f)
                with pytest.raises(CoordinatorError) as info:
                    c.complete(1, 1, "tok-1", "re_1")
                e = info.value
                got.append((type(e), e.code, e.message, e.reason, e.metadata, getattr(e, "violations", None)))
            assert got[0] == got[1], f
        assert sfake.count("Complete", via="stream") == len(cases) == sfake.count("Complete", via="unary")
        expected = {reason: cls for _, reason, cls in CASES}
        sfake.answer("Complete", Fail(FP, "STALE_ATTEMPT", metadata={"current_attempt": "2",
                                                                     "current_state": "JOB_STATE_SUCCEEDED"}))
        with pytest.raises(StaleAttemptError) as stale:
            on_stream.complete(1, 1, "tok-1", "re_1")
        assert isinstance(stale.value, expected["STALE_ATTEMPT"]) and stale.value.current_attempt == 2
        sfake.answer("Complete", Fail(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT",
                                      violations=[("attempt", "must be positive")]))
        with pytest.raises(InvalidArgumentError) as bad:
            on_stream.complete(1, 0, "tok-1", "re_1")
        assert bad.value.fields == ["attempt"]
    finally:
        unary.close()
        r.stop()


def test_a_write_back_cut_with_its_stream_is_repeated_and_a_new_stream_opens_R21(
        sfake: FakeCoordinator, logs: tuple[logging.Logger, Records]) -> None:
    log, records = logs
    sfake.answer("Complete", Cut())  # taken, never answered, the stream ends UNAVAILABLE
    events: list[WorkerEvent] = []
    w = worker(sfake, Gated(), concurrency=2, on_event=events.append, logger=log)
    r = Running(w)
    first = sfake.stream(0)
    first.grant(claimed(1))
    wait(lambda: w.stats().completed == 1, "the repeated write-back")
    # Repeated, on the next stream or as a unary call: twice in all, one write.
    [cut, repeat] = [req for req, _ in sfake.calls["Complete"]]
    assert cut == repeat and cut.job_id == 1 and cut.lease_token == "tok-1"
    # At once, answered UNAVAILABLE when the stream ended, not after its call timeout.
    [why] = [getattr(x, "error", "") for x in records.records if x.getMessage() == "jobfence: repeating call"]
    assert "UNAVAILABLE" in why and "worker stream ended before the answer" in why, why
    second = sfake.stream(1)
    # The new stream holds every free slot: as credits at its start, or given
    # back after it if the job was still running when it opened.
    second.wait_for(lambda s: s.start.credits + sum(s.credits()) == 2, "both slots as credits")
    second.grant(claimed(2))
    wait(lambda: w.stats().completed == 2, "work from the new stream")
    r.stop()
    s = w.stats()
    assert (s.write_failures, s.claim_failures, s.replayed) == (0, 1, 0), s
    assert [e.kind for e in events].count(WorkerEventKind.CLAIM_FAILED) == 1
    assert "worker stream ended; opening it again" in records.msgs()
    assert sfake.count("Claim") == 0


def test_a_stream_that_ends_is_opened_again_with_the_free_slots_and_takes_the_write_backs(
        sfake: FakeCoordinator) -> None:
    _, gate, _, r, first = one_job_held(sfake)
    first.end(grpc.StatusCode.UNAVAILABLE, "the coordinator is stopping")
    second = sfake.stream(1)
    assert second.start.credits == 1, "the running job's slot is not free"
    gate.set()
    # The running job's write-back goes on the new stream, then its credit.
    second.wait_for(lambda s: s.credits() == [1], "the freed slot's credit")
    assert [c.complete.job_id for c in second.calls()] == [1]
    assert sfake.count("Complete", via="unary") == 0
    r.stop()


def test_retry_after_on_the_stream_is_not_a_failure_R19(sfake: FakeCoordinator) -> None:
    w = worker(sfake, Gated())
    r = Running(w)
    st = sfake.stream(0)
    st.retry_after(0.2)
    st.grant(claimed(1))
    wait(lambda: w.stats().completed == 1, "the job after the retry_after")
    r.stop()
    assert w.stats().claim_failures == 0 and len(sfake.streams) == 1


def test_stop_half_closes_the_stream_leaves_a_grant_read_after_it_unstarted_and_writes_back_unary_R25(
        sfake: FakeCoordinator, logs: tuple[logging.Logger, Records]) -> None:
    # The drain: no more grants are asked for. One the coordinator sent
    # before it saw the half-close arrives, can no longer be acknowledged and
    # is not started: the coordinator hands it back. The write-back after
    # the half-close goes as a unary call, even while the stream is still
    # open (this one ends only once it came).
    log, records = logs

    def half_closed(st: Any) -> None:
        st.grant(claimed(9))

        def end_after_the_write_back() -> None:
            wait(lambda: sfake.count("Complete") == 1, "the held job's write-back")
            st.end()

        threading.Thread(target=end_after_the_write_back, daemon=True).start()

    sfake.on_half_close = half_closed
    h = Gated()
    gate = h.hold(1)
    w = worker(sfake, h, concurrency=2, logger=log)
    r = Running(w)
    st = sfake.stream(0)
    st.grant(claimed(1))
    wait(lambda: h.started == [1], "the job's handler")
    w.stop()
    assert st.half_closed.wait(5), "stop() did not half-close the stream"
    wait(lambda: "grants read after the stream's half-close left unstarted; the coordinator hands them back"
         in records.msgs(), "the grant in flight left unstarted")
    gate.set()
    r.stop()
    assert h.started == [1], "the grant read after the half-close was started"
    assert acks(st) == [[(1, 1, "tok-1")]], "only the grant before the half-close is acknowledged"
    assert sfake.count("Complete", via="unary") == 1 and sfake.count("Complete", via="stream") == 0
    assert st.credits() == [], "credits given after the half-close"
    s = w.stats()
    assert (s.claimed, s.completed) == (1, 1), s
    assert len(sfake.streams) == 1
    # The dropped grant took no slot: both are free again.
    assert w._session is not None and w._session._free == 2


def test_an_idle_stream_sends_a_heartbeat_every_second_and_none_after_the_half_close(
        sfake: FakeCoordinator) -> None:
    # A heartbeat is a WorkCredit of 0 credits: "still here, no new slot".
    # The coordinator offers work only to a stream that spoke within the last
    # 3 s, so a worker with nothing to send says so every second.
    sfake.on_half_close = lambda st: None  # open after the half-close, until the test ends it
    w = worker(sfake, Gated())
    r = Running(w)
    st = sfake.stream(0)
    opened = st.times[0]
    st.wait_for(lambda s: len(s.heartbeats()) >= 2, "two heartbeats", timeout=2.5)
    beats = st.heartbeats()
    gaps = [b - a for a, b in zip([opened] + beats, beats)]
    assert all(g >= 0.8 * STREAM_HEARTBEAT_INTERVAL for g in gaps), f"heartbeats too often: {gaps}"
    assert st.credits() == [] and st.calls() == []
    w.stop()
    assert st.half_closed.wait(5), "stop() did not half-close the stream"
    # Half-closed, the stream stays open (the coordinator answers what it
    # carries) and the worker sends nothing more on it.
    sent = len(st.requests)
    time.sleep(1.5 * STREAM_HEARTBEAT_INTERVAL)
    assert len(st.requests) == sent and not st.ended.is_set()
    st.end()
    r.stop()
    assert len(sfake.streams) == 1 and w.stats().claim_failures == 0


def test_heartbeats_go_on_while_every_slot_runs_a_blocked_handler(sfake: FakeCoordinator) -> None:
    # No handler can hold them back: they are sent by grpcio's thread, not
    # the worker's or a job's.
    h, gate, w, r, st = one_job_held(sfake, concurrency=1)
    held = time.monotonic()
    st.wait_for(lambda s: len([t for t in s.heartbeats() if t > held]) >= 2, "two heartbeats", timeout=2.5)
    gate.set()
    st.wait_for(lambda s: s.credits() == [1], "the freed slot's credit")
    r.stop()
    assert w.stats().completed == 1


def test_a_coordinator_without_the_stream_is_claimed_from_for_good(
        fake: FakeCoordinator, logs: tuple[logging.Logger, Records]) -> None:
    log, records = logs
    fake.answer("Claim", pb.ClaimResponse(jobs=[claimed(1)]))
    w = worker(fake, Gated(), poll_interval=0.05, logger=log)
    r = Running(w)
    wait(lambda: w.stats().completed == 1, "the claimed job written back")
    wait(lambda: fake.count("Claim") >= 3, "claims after the fallback")
    r.stop()
    assert fake.count("Work") == 1, "the stream was tried again"
    assert fake.count("Complete", via="unary") == 1
    assert "the coordinator has no worker stream; claiming with Claim calls" in records.msgs()
    assert w.stats().claim_failures == 0


def test_no_stream_never_opens_one(sfake: FakeCoordinator) -> None:
    sfake.answer("Claim", pb.ClaimResponse(jobs=[claimed(1)]))
    w = worker(sfake, Gated(), no_stream=True, poll_interval=0.05)
    r = Running(w)
    wait(lambda: w.stats().completed == 1, "the claimed job written back")
    r.stop()
    assert sfake.count("Work") == 0 and sfake.count("Complete", via="unary") == 1
