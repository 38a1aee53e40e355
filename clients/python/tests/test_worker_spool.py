"""The Worker's receipt spool (R28): a receipt the coordinator cannot take is
spooled, durably, and filed again before the next worker on that spool
claims anything; it leaves the spool only once the coordinator answered it;
a final refusal is not spooled. Against a scripted coordinator, then end to
end: a real coordinator stopped under a late receipt and started again on
its database, and spools written by the Go worker and read by it."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Optional

import grpc

from jobfence import (
    ClaimedJob,
    Client,
    HandlerContext,
    JobState,
    LeaseToken,
    Outcome,
    Reason,
    Result,
    RetryPolicy,
    SpooledReceipt,
    UnavailableError,
    Worker,
    WorkerEvent,
    WorkerEventKind,
)
from jobfence.spool import ReceiptSpool, encode_receipt
from jobfence.v1 import coordinator_pb2 as pb

from fakecoord import Fail, FakeCoordinator, claimed
from harness import Coordinator, Proc, admin, eventually, go_binary, kinds, refund, start_coordinator, start_provider
from workerrun import Records, Running, run_for

SPOOLED_MSG = "observation not filed; spooled, to be filed when the coordinator takes it (R28)"


class Refunds:
    """Answers every refund with re_<job id>; records nothing."""

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        return Result.succeeded(f"re_{job.job.id}")

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        return Result.succeeded(f"re_{job.job.id}")


def fast_client(address: str) -> Client:
    return Client(address, retry=RetryPolicy(attempts=2, backoff=0.01), call_timeout=5)


def spool_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def kinds_of(events: list[WorkerEvent]) -> list[WorkerEventKind]:
    return [e.kind for e in events]


# -- against a scripted coordinator ------------------------------------------


def test_worker_spools_what_the_coordinator_cannot_take_and_files_it_before_claiming_R28(
        fake: FakeCoordinator, tmp_path: Path) -> None:
    fake.answer("Claim", pb.ClaimResponse(jobs=[claimed(1)]))
    fake.answer("Complete", Fail(grpc.StatusCode.FAILED_PRECONDITION, Reason.STALE_ATTEMPT,
                                 metadata={"current_attempt": "2"}))
    # The observation's two tries, then the two of the last pass at stop.
    fake.answer("ReportObservation", *[Fail(grpc.StatusCode.UNAVAILABLE, message="coordinator away")] * 4)
    spool = tmp_path / "spool" / "w.receipts.jsonl"
    events: list[WorkerEvent] = []
    w = Worker(fast_client(fake.address), Refunds(), worker_id="w", poll_interval=0.05, lease_renewal=False,
               receipt_spool=str(spool), on_event=events.append)
    run_for(w, 0.6)
    [line] = spool_lines(spool)
    assert {k: line[k] for k in ("v", "job_id", "operation_key", "attempt", "lease_token", "source", "outcome",
                                 "provider_refund_id")} == {
        "v": 1, "job_id": "1", "operation_key": "op-1", "attempt": "1", "lease_token": "tok-1", "source": "worker:w",
        "outcome": "succeeded", "provider_refund_id": "re_1"}
    assert "rejected" in line["detail"] and line["spooled_at"].endswith("Z")
    [spooled] = [e for e in events if e.kind is WorkerEventKind.SPOOLED]
    assert spooled.receipt is not None and spooled.receipt.operation_key == "op-1" and spooled.spool == str(spool)
    assert isinstance(spooled.error, UnavailableError)
    s = w.stats()
    assert (s.spooled, s.refiled, s.observations) == (1, 0, 0), s
    assert WorkerEventKind.OBSERVE_FAILED not in kinds_of(events)
    assert fake.count("ReportObservation") == 4, "the last pass at stop did not try again"
    assert not Path(str(spool) + ".lock").exists(), "the spool was not released"

    # The next worker on the spool files it before its first claim.
    fake.answer("Claim", pb.ClaimResponse(jobs=[claimed(2)]))
    events2: list[WorkerEvent] = []
    w2 = Worker(fast_client(fake.address), Refunds(), worker_id="w2", poll_interval=0.05, lease_renewal=False,
                receipt_spool=str(spool), on_event=events2.append)
    assert w2.spooled_receipts == 1
    run_for(w2, 0.5)
    k = kinds_of(events2)
    assert WorkerEventKind.REFILED in k and k.index(WorkerEventKind.REFILED) < k.index(WorkerEventKind.CLAIMED), k
    refiled = fake.calls["ReportObservation"][4][0]
    assert (refiled.operation_key, refiled.job_id, refiled.attempt, refiled.lease_token, refiled.source,
            refiled.outcome, refiled.provider_refund_id) == (
        "op-1", 0, 1, "tok-1", "worker:w", pb.OBSERVATION_OUTCOME_SUCCEEDED, "re_1")
    assert refiled.detail == line["detail"], "not refiled as first tried"
    assert (w2.stats().refiled, w2.stats().observations) == (1, 1)
    assert not spool.exists(), "the filed receipt's spool was left behind"


def test_worker_does_not_spool_a_final_refusal_R28(fake: FakeCoordinator, tmp_path: Path) -> None:
    fake.answer("Claim", pb.ClaimResponse(jobs=[claimed(1)]))
    fake.answer("Complete", Fail(grpc.StatusCode.FAILED_PRECONDITION, Reason.STALE_ATTEMPT))
    fake.answer("ReportObservation", Fail(grpc.StatusCode.PERMISSION_DENIED, Reason.PERMISSION_DENIED))
    spool = tmp_path / "w.receipts.jsonl"
    events: list[WorkerEvent] = []
    w = Worker(fast_client(fake.address), Refunds(), worker_id="w", poll_interval=0.05, lease_renewal=False,
               receipt_spool=str(spool), on_event=events.append)
    run_for(w, 0.5)
    assert WorkerEventKind.OBSERVE_FAILED in kinds_of(events) and w.stats().spooled == 0
    assert fake.count("ReportObservation") == 1 and not spool.exists()


def test_a_refile_removes_only_what_the_coordinator_answered_R28(fake: FakeCoordinator, tmp_path: Path) -> None:
    spool = tmp_path / "w.receipts.jsonl"

    def r(key: str) -> SpooledReceipt:
        return SpooledReceipt(7, key, 1, LeaseToken(f"tok-{key}"), "worker:old", Outcome.SUCCEEDED, f"re_{key}",
                              spooled_at="2025-01-02T03:04:05Z")

    foreign = b'{"v":2,"from":"a newer SDK"}'
    lines = [encode_receipt(r("filed")), encode_receipt(r("gone")), foreign, encode_receipt(r("away")),
             encode_receipt(r("after"))]
    spool.write_bytes(b"".join(line + b"\n" for line in lines))
    fake.answer("ReportObservation", pb.ReportObservationResponse(),  # filed
                Fail(grpc.StatusCode.NOT_FOUND, Reason.NOT_FOUND),  # refused for good: dropped
                Fail(grpc.StatusCode.UNAVAILABLE), Fail(grpc.StatusCode.UNAVAILABLE))  # away: this and the rest wait
    events: list[WorkerEvent] = []
    w = Worker(fast_client(fake.address), Refunds(), worker_id="w", poll_interval=0.05, lease_renewal=False,
               receipt_spool=str(spool), on_event=events.append)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    eventually(lambda: fake.count("Claim") > 0, 10, "the first claim")
    assert spool.read_bytes() == b"".join(line + b"\n" for line in (foreign, lines[3], lines[4]))
    assert [rq.operation_key for rq, _ in fake.calls["ReportObservation"]] == ["filed", "gone", "away", "away"]
    assert [e.receipt.operation_key for e in events if e.kind is WorkerEventKind.REFILED and e.receipt] == ["filed"]
    assert [e.receipt.operation_key for e in events if e.kind is WorkerEventKind.OBSERVE_FAILED and e.receipt] == [
        "gone"]
    assert WorkerEventKind.SPOOL_ERROR in kinds_of(events), "the unreadable line went unreported"
    # The coordinator is back: the last pass at stop files the rest; the
    # line of another version stays, untouched.
    w.stop()
    t.join(30)
    assert spool.read_bytes() == foreign + b"\n"
    assert w.stats().refiled == 3


def test_receipt_spool_off_keeps_no_file_R28(fake: FakeCoordinator, tmp_path: Path) -> None:
    cache = os.environ["XDG_CACHE_HOME"]
    w = Worker(fast_client(fake.address), Refunds(), worker_id="w", poll_interval=0.05, receipt_spool="off")
    assert w.receipt_spool is None
    run_for(w, 0.2)
    assert not os.path.exists(os.path.join(cache, "jobfence")), os.listdir(cache)


# -- end to end ---------------------------------------------------------------


class Gate:
    """A refund handler that signals when its call is out and answers
    re_late once released: the provider's answer, late."""

    def __init__(self) -> None:
        self.sent = threading.Event()
        self.answer = threading.Event()

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        self.sent.set()
        self.answer.wait(60)
        return Result.succeeded("re_late")

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        return Result.succeeded("re_late")


def take_over_and_complete(coord: Coordinator, job_id: int, provider: str, refund_id: str) -> int:
    """B takes the job over from its expired lease (T1: in test data) and
    completes it; B's attempt."""
    c = coord.client()
    coord.expire_lease(job_id)
    [b] = c.claim("py-B", 1, provider=provider, lease=30)
    assert b.job.id == job_id and b.takeover
    c.complete(job_id, b.attempt, b.lease_token, refund_id)
    return b.attempt


def require_one_receipt(coord: Coordinator, job_id: int, source: str, refund_id: str) -> None:
    d = coord.client().get_job(job_id)
    assert len(d.observations) == 1, d.observations
    [o] = d.observations
    assert (o.source, o.reported_attempt, o.job_attempt, o.attempt_verified, o.outcome, o.provider_refund_id) == (
        source, 1, 2, True, Outcome.SUCCEEDED, refund_id), o
    # Evidence moves no state (R28): B's completion stands.
    assert (d.job.state, d.job.attempt) == (JobState.SUCCEEDED, 2), d.job
    assert kinds(d) == ["enqueued@0", "claimed@1", "taken_over@2", "completed@2"]


def test_a_receipt_the_stopped_coordinator_could_not_take_is_filed_once_by_the_next_worker_R28(
        tmp_path: Path, logs: tuple[logging.Logger, Records]) -> None:
    log, records = logs
    coord = start_coordinator()
    again: Optional[Coordinator] = None
    running: list[Running] = []
    # A's own client, not the harness's: stopping the coordinator must leave
    # it dialling a coordinator that is gone.
    a_client = Client(coord.address, retry=RetryPolicy(attempts=2, backoff=0.05), call_timeout=2)
    try:
        r = refund()
        job, _ = coord.client().enqueue_refund(**r)
        spool = tmp_path / "spool" / "py-A.receipts.jsonl"
        gate = Gate()
        events_a: list[WorkerEvent] = []
        # A's lease is not renewed, so that nothing but the takeover ends its grant.
        a = Worker(a_client, gate,
                   worker_id="py-A", provider=r["provider"], lease=30, lease_renewal=False, provider_timeout=60,
                   poll_interval=0.1, receipt_spool=str(spool), on_event=events_a.append, logger=log)
        ra = Running(a)
        running.append(ra)
        assert gate.sent.wait(20), "A never called the provider"
        take_over_and_complete(coord, job.id, r["provider"], "re_late")
        # The coordinator goes away; then the provider's answer reaches A: its
        # write-back and its receipt both fail, and the receipt is spooled.
        coord.stop(drop=False)
        gate.answer.set()
        eventually(lambda: WorkerEventKind.SPOOLED in kinds_of(events_a), 30, "A's receipt spooled")
        [line] = spool_lines(spool)
        token = line["lease_token"]
        assert (line["operation_key"], line["attempt"], line["source"], line["outcome"], line["provider_refund_id"]) == (
            r["operation_key"], "1", "worker:py-A", "succeeded", "re_late") and len(token) >= 22, line
        assert oct(os.stat(spool).st_mode & 0o777) == oct(0o600)
        ra.stop()
        running.remove(ra)
        s = a.stats()
        assert (s.spooled, s.refiled, s.write_failures) == (1, 0, 1), s
        assert WorkerEventKind.OBSERVE_FAILED not in kinds_of(events_a)
        assert len(spool_lines(spool)) == 1, "the receipt left the spool without being filed"
        assert not Path(str(spool) + ".lock").exists()

        # The coordinator is back on its database; a new worker on A's spool,
        # with work waiting, files the receipt before its first claim.
        again = start_coordinator(database=coord.database)
        c = again.client()
        other, _ = c.enqueue_refund(**refund(provider=r["provider"]))
        assert c.get_job(job.id).observations == ()
        events_b: list[WorkerEvent] = []
        b = Worker(again.client(), Refunds(), worker_id="py-A2", provider=r["provider"], lease=30, poll_interval=0.1,
                   receipt_spool=str(spool), on_event=events_b.append, logger=log)
        rb = Running(b)
        running.append(rb)
        eventually(lambda: WorkerEventKind.REFILED in kinds_of(events_b), 30, "the spooled receipt filed")
        eventually(lambda: WorkerEventKind.CLAIMED in kinds_of(events_b), 30, "the other job claimed")
        k = kinds_of(events_b)
        assert k.index(WorkerEventKind.REFILED) < k.index(WorkerEventKind.CLAIMED), k
        # The receipt keeps its own source: it is A's, not A2's; verified by
        # its grant's token (R25).
        require_one_receipt(again, job.id, "worker:py-A", "re_late")
        assert spool_lines(spool) == []
        eventually(lambda: c.get_job(other.id).job.state is JobState.SUCCEEDED, 20, "the other job done")
        rb.stop()
        running.remove(rb)
        assert (b.stats().refiled, b.stats().observations) == (1, 1), b.stats()
        assert os.listdir(spool.parent) == [], "left behind after a clean stop"

        # A crash between filing and rewriting leaves the line in the spool:
        # filed again, it is a duplicate, and still one receipt is on file.
        spool.write_text(json.dumps(line, separators=(",", ":")) + "\n")
        events_c: list[WorkerEvent] = []
        w3 = Worker(again.client(), Gate(), worker_id="py-A3", provider="nobody", poll_interval=0.1,
                    receipt_spool=str(spool), on_event=events_c.append, logger=log)
        r3 = Running(w3)
        running.append(r3)
        eventually(lambda: WorkerEventKind.REFILED in kinds_of(events_c), 30, "the line filed again")
        [dup] = [e for e in events_c if e.kind is WorkerEventKind.REFILED]
        assert dup.duplicate
        require_one_receipt(again, job.id, "worker:py-A", "re_late")

        assert token not in records.text(), "a log line carries the lease token"
        assert SPOOLED_MSG in records.msgs() and "spooled receipt filed" in records.msgs()
    finally:
        for x in running:
            x.w.stop()
            x.t.join(60)
        a_client.close()
        if again is not None:
            again.stop()
        else:
            coord.stop()


# -- the Go worker's spools ----------------------------------------------------

# The Go coordinator's database refusing every new receipt the way a
# read-only server does (error 1290): ReportObservation answers UNAVAILABLE
# (DATABASE_UNAVAILABLE) and everything else is served. As in
# cmd/refundworker/spool_test.go.
REFUSE_RECEIPTS = ("CREATE TRIGGER test_refuse_receipts BEFORE INSERT ON refund_observations FOR EACH ROW "
                   "SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1290, MESSAGE_TEXT = 'The MariaDB server is running "
                   "with the --read-only option so it cannot execute this statement'")


def go_worker(coord: Coordinator, url: str, provider: str, wid: str, spool: Path, *extra: str) -> Proc:
    p = Proc(wid, [go_binary("refundworker", "JOBFENCE_REFUNDWORKER_BIN"), "--coordinator", coord.address,
                   "--provider", url, "--provider-name", provider, "--worker-id", wid, "--log-format", "json",
                   "--poll-interval", "100ms", "--receipt-spool", str(spool), *extra])
    p.wait_for(lambda rec: rec.get("msg") == "refundworker started", "its start")
    return p


def test_the_go_workers_spool_is_filed_by_this_worker_and_this_ones_by_the_go_worker_R28(
        tmp_path: Path) -> None:
    coord = start_coordinator()
    provider, url = start_provider()
    procs: list[Proc] = []
    try:
        c = coord.client()
        r = refund()
        key = r["operation_key"]
        admin(url, "POST", "/v1/_admin/payments", {"payment_id": r["payment_id"], "amount_minor": r["amount_minor"],
                                                   "currency": r["currency"]})
        job, _ = c.enqueue_refund(**r)
        # The provider makes the refund and holds the reply: the Go worker is
        # inside its provider call when it is frozen.
        admin(url, "POST", "/v1/_admin/faults", {"hang_after": 2, "key": key, "times": 1})
        go_spool = tmp_path / "go" / "go-A.receipts.jsonl"
        # One slot: frozen while it holds the job, A has no credit left, so its
        # stream cannot be granted the job's takeover before B claims it (with
        # a free slot, a poll round between the lease's end and B's claim
        # could hand it to the frozen A, which was not silent long enough yet).
        a = go_worker(coord, url, r["provider"], "go-A", go_spool, "--lease", "30s", "--no-lease-renewal",
                      "--provider-timeout", "20s", "--call-timeout", "2s", "--concurrency", "1")
        procs.append(a)
        refund_id = eventually(lambda: next((x["id"] for x in admin(url, "GET", "/v1/_oracle")["refunds"]
                                             if x.get("merchant_reference") == key), None), 20, "A's refund")
        a.signal(signal.SIGSTOP)
        take_over_and_complete(coord, job.id, r["provider"], refund_id)
        coord.sql(REFUSE_RECEIPTS)
        a.signal(signal.SIGCONT)
        a.wait_for(lambda rec: rec.get("msg") == SPOOLED_MSG, "A's receipt spooled", 60)
        assert a.stop(30) == 0, a.tail()
        procs.remove(a)
        [line] = spool_lines(go_spool)
        assert (line["v"], line["operation_key"], line["attempt"], line["source"]) == (1, key, "1", "worker:go-A")
        coord.sql("DROP TRIGGER test_refuse_receipts")

        # This worker reads and files the Go worker's line.
        events: list[WorkerEvent] = []
        w = Worker(coord.client(), Gate(), worker_id="py-after-go", provider="nobody", poll_interval=0.1,
                   receipt_spool=str(go_spool), on_event=events.append)
        assert w.spooled_receipts == 1
        run = Running(w)
        eventually(lambda: WorkerEventKind.REFILED in kinds_of(events), 30, "the Go receipt filed")
        run.stop()
        require_one_receipt(coord, job.id, "worker:go-A", refund_id)
        assert not go_spool.exists()

        # And the Go worker files a line this one wrote.
        job2, _ = c.enqueue_refund(**refund(provider=r["provider"]))
        [a2] = c.claim("py-A", 1, provider=r["provider"], lease=30)
        take_over_and_complete(coord, job2.id, r["provider"], "re_py")
        py_spool = tmp_path / "py" / "py-A.receipts.jsonl"
        s = ReceiptSpool.open(str(py_spool))
        s.append(SpooledReceipt(job2.id, job2.operation_key, a2.attempt, a2.lease_token, "worker:py-A",
                                Outcome.SUCCEEDED, "re_py", detail="late answer"))
        s.close()
        g = go_worker(coord, url, r["provider"], "go-after-py", py_spool)
        procs.append(g)
        filed = g.wait_for(lambda rec: rec.get("msg") == "spooled receipt filed", "the Python receipt filed", 30)
        assert filed["duplicate"] is False and filed["operation_key"] == job2.operation_key, filed
        assert g.stop(30) == 0, g.tail()
        procs.remove(g)
        require_one_receipt(coord, job2.id, "worker:py-A", "re_py")
        assert not py_spool.exists()
    finally:
        for p in procs:
            p.stop(5)
        provider.stop(5)
        coord.stop()
