"""The SDKs' executable spec (clients/spec, its README the schema), run
against this SDK: every file of the folder and of stream/, every vector its
own test named after it. A file of a spec or version this runner does not
know fails, and so does a field it does not know, in a vector or in what
the vector expects: the spec moved, the runner did not. A dispute (the SDKs
disagree) is checked against this SDK's answer, merged over ``expect``.

The vectors run against the real code: the decision table through the job
runner a Worker uses (JobRunner, with a handler and a recording client), the
errors through a Client's unary calls to a real gRPC server (fakecoord) and
a Receipts refile pass, the spool through jobfence.spool on real files, the
defaults read from the SDK's own constants and options, and the stream
transcripts (spec_stream.py) by a Worker against a scripted coordinator."""

from __future__ import annotations

import json
import logging
import os
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import grpc
import pytest

from jobfence import (
    DEFAULT_CALL_TIMEOUT,
    KEEPALIVE_OPTIONS,
    MAX_RECEIPT_SPOOL_BYTES,
    MAX_RENEW_BATCH,
    MAX_RESCHEDULE_DELAY,
    MAX_SPOOLED_RECEIPTS,
    RECEIPT_REFILE_INTERVAL,
    CancelRequestedError,
    ClaimedJob,
    ClaimOutcomeUnknownError,
    Client,
    CoordinatorError,
    DatabaseAccessDeniedError,
    DatabaseFullError,
    DatabaseUnavailableError,
    DeadlineExceededError,
    FencedError,
    GrantTooOldError,
    HandlerContext,
    InvalidArgumentError,
    Job,
    JobNotCancellableError,
    JobNotInReviewError,
    JobNotRunningError,
    JobState,
    LeaseToken,
    NextAction,
    NotFoundError,
    NotOnAttentionListError,
    ObservationLimitError,
    OperationKeyConflictError,
    Outcome,
    PermissionDeniedError,
    ProviderPolicy,
    ReceiptSpoolLockedError,
    Result,
    RetryPolicy,
    SpooledReceipt,
    StaleAttemptError,
    TooManyCallsError,
    UnauthenticatedError,
    UnavailableError,
    WorkerOptions,
    WriteOutcomeUnknownError,
    WriteResult,
    default_receipt_spool,
)
from jobfence import receipts as receipts_module
from jobfence import renewer as renewer_module
from jobfence import session as session_module
from jobfence.events import Reporter
from jobfence.job import JobRunner
from jobfence.receipts import Receipts, coordinator_away, refile_later
from jobfence.renewer import Renewer
from jobfence.spool import ReceiptSpool, decode_receipt, encode_receipt, parse_spool, spool_file_name
from jobfence.v1 import coordinator_pb2 as pb

from fakecoord import Fail, FakeCoordinator
from spec_stream import play
from speclib import SDK, SPEC, fail_of, known, result_of

#: The spec files this runner was written for, by ``spec``: their version.
#: The stream transcripts are played by spec_stream.py.
KNOWN = {"decide": 1, "errors": 1, "spool": 1, "defaults": 1, "stream": 1}


class Vector:
    """One vector of one spec file, with what it expects of this SDK."""

    def __init__(self, path: Path, spec: str, raw: dict[str, Any]) -> None:
        self.path = path
        self.spec = spec
        self.raw = raw
        self.name = str(raw.get("name", ""))

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(SPEC)}: {self.name}"

    def fields(self, allowed: set[str]) -> None:
        """Fails on a field of the vector this runner does not read."""
        known(self.raw, allowed | {"name", "expect", "dispute", "answers"}, "the vector")

    def expect(self) -> dict[str, Any]:
        """``expect``, with this SDK's answer of a dispute merged over it."""
        want = dict(self.raw.get("expect") or {})
        if "dispute" in self.raw or "answers" in self.raw:
            answers = self.raw.get("answers") or {}
            if SDK not in answers:
                pytest.fail(f"the dispute has no answer for {SDK}: {self.raw.get('dispute')}")
            want.update(answers[SDK])
        elif "expect" not in self.raw:
            pytest.fail("the vector has neither expect nor a dispute's answers")
        return want


def spec_files() -> list[Path]:
    return sorted(SPEC.glob("*.json")) + sorted(SPEC.glob("stream/*.json"))


def load() -> list[Any]:
    """A pytest param per vector; one per file that cannot be run, which fails."""
    out: list[Any] = []
    for path in spec_files():
        doc = json.loads(path.read_text())
        spec, version = doc.get("spec"), doc.get("version")
        rel = path.relative_to(SPEC)
        if KNOWN.get(spec) != version:
            out.append(pytest.param(path, None, id=f"{rel}"))
            continue
        if spec == "stream":
            out.append(pytest.param(path, Vector(path, spec, doc), id=f"{rel}: {doc.get('name', '')}"))
            continue
        for raw in doc.get("vectors", []):
            v = Vector(path, spec, raw)
            out.append(pytest.param(path, v, id=v.id))
    return out


VECTORS = load()


def test_the_spec_is_there() -> None:
    # A runner that finds nothing passes nothing: the folder and each topic must be there.
    names = {p.name for p in spec_files()}
    assert {"decide.json", "errors.json", "spool.json", "defaults.json"} <= names, names


def test_spec_files_have_only_known_fields() -> None:
    for path in spec_files():
        doc = json.loads(path.read_text())
        if doc.get("spec") != "stream":  # a transcript is one vector: spec_stream reads it
            known(doc, {"spec", "version", "vectors"}, path.name)


def test_vector_names_are_unique_within_a_file() -> None:
    for path in spec_files():
        doc = json.loads(path.read_text())
        names = [v.get("name") for v in doc.get("vectors", [])]
        assert len(names) == len(set(names)), f"{path.name}: {sorted(n for n in names if names.count(n) > 1)}"


@pytest.mark.parametrize("path,vector", VECTORS)
def test_spec(path: Path, vector: Optional[Vector], request: pytest.FixtureRequest) -> None:
    if vector is None:
        doc = json.loads(path.read_text())
        pytest.fail(f"{path.name}: spec {doc.get('spec')!r} version {doc.get('version')!r} is not one this "
                    f"runner knows ({KNOWN}): the spec moved, the runner did not")
    RUNNERS[vector.spec](vector, request)


# -- decide.json ---------------------------------------------------------------

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def _ms(v: dict[str, Any], key: str) -> Optional[float]:
    return None if key not in v else v[key] / 1000


class _Recorder:
    """The job runner's client and handler at once: records the handler
    called and the write-back, answers each write-back accepted."""

    def __init__(self, result: Result) -> None:
        self.result = result
        self.called: list[str] = []
        self.writes: list[tuple[str, dict[str, Any]]] = []

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        self.called.append("refund")
        return self.result

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        self.called.append("reconcile")
        return self.result

    def _write(self, method: str, **kw: Any) -> WriteResult:
        self.writes.append((method, kw))
        return WriteResult(job=_job(), replayed=False)

    def complete(self, job_id: int, attempt: int, token: Any, provider_refund_id: str) -> WriteResult:
        return self._write("complete", provider_refund_id=provider_refund_id)

    def escalate(self, job_id: int, attempt: int, token: Any, reason: str) -> WriteResult:
        return self._write("escalate", reason=reason)

    def reschedule(self, job_id: int, attempt: int, token: Any, *, next_action: NextAction, delay: float,
                   reason: str) -> WriteResult:
        return self._write("reschedule", next_action=next_action, delay=delay, reason=reason)

    def report_observation(self, **kw: Any) -> Any:
        raise AssertionError("no receipt is filed for an accepted write-back")


def _job(first_sent_at: Optional[datetime] = None) -> Job:
    return Job(id=7, operation_key="op-7", order_id="o", payment_id="p", amount_minor=4200, currency="EUR",
               provider="acme", state=JobState.RUNNING, attempt=1, next_action=NextAction.REFUND,
               next_attempt_at=None, lease_until=None, provider_refund_id="", worker_id="spec", last_reason="",
               first_sent_at=first_sent_at, created_at=None, updated_at=None)


def _claimed(j: dict[str, Any]) -> ClaimedJob:
    known(j, {"next_action", "attempt", "takeover", "first_sent_ms", "resend_deadline_ms", "cancel_requested"}, "job")
    first = _ms(j, "first_sent_ms")
    deadline = _ms(j, "resend_deadline_ms")
    # claimed_at is now and no time passed since the answer arrived: the
    # SDK's estimate of the coordinator's clock is exactly now.
    return ClaimedJob(
        job=_job(None if first is None else NOW + timedelta(seconds=first)), attempt=int(j["attempt"]),
        lease_token=LeaseToken("tok-7"), lease_until=None, next_action=NextAction(j["next_action"]),
        takeover=bool(j.get("takeover", False)), observations=(), observation_count=0,
        resend_deadline=None if deadline is None else NOW + timedelta(seconds=deadline), claimed_at=NOW,
        received_monotonic=None, cancel_requested=bool(j.get("cancel_requested", False)))


def _policy(p: dict[str, Any]) -> ProviderPolicy:
    names = {"same_key_resend_safe": "same_key_resend_safe", "resend_margin_ms": "resend_margin",
             "pending_delay_ms": "pending_delay", "unknown_delay_ms": "unknown_delay",
             "not_sent_delay_ms": "not_sent_delay"}
    known(p, set(names), "policy")
    return ProviderPolicy(**{names[k]: (v if k == "same_key_resend_safe" else v / 1000) for k, v in p.items()})


def run_decide(v: Vector, request: pytest.FixtureRequest) -> None:
    v.fields({"step", "job", "policy", "result"})
    step = v.raw["step"]
    assert step in ("before_send", "result"), f"step {step!r}"
    if step == "before_send" and "result" in v.raw:
        pytest.fail("a before_send vector has no result")
    want = v.expect()
    known(want, {"call", "decision", "provider_refund_id", "next_action", "delay_ms", "reason", "reason_includes"},
          "expect")
    c = _claimed(v.raw["job"])
    rec = _Recorder(result_of(v.raw.get("result", {})))
    log = logging.getLogger("jobfence.test.spec")
    report = Reporter(log, None)
    opts = WorkerOptions(worker_id="spec", policy=_policy(v.raw["policy"]), lease_renewal=False,
                         receipt_spool="off")
    runner = JobRunner(rec, rec, opts, report, None, Receipts(rec, "spec", "off", report))  # type: ignore[arg-type]
    runner.work(c)

    if "call" in want:
        assert step == "before_send", "call is a before_send expectation"
        assert rec.called == [want["call"]], f"handler called: {rec.called}, want {want['call']}"
        return
    if step == "before_send":
        assert rec.called == [], f"a refused resend called {rec.called}: something left before the check"
    else:
        assert len(rec.called) == 1
    assert len(rec.writes) == 1, rec.writes
    method, kw = rec.writes[0]
    if "decision" in want:
        assert method == want["decision"], f"write-back {method} {kw}, want {want['decision']}"
    if method != "complete":
        assert kw["reason"], f"a {method} without a reason"
    if "provider_refund_id" in want:
        assert kw.get("provider_refund_id") == want["provider_refund_id"], kw
    if "next_action" in want:
        assert kw.get("next_action") == NextAction(want["next_action"]), kw
    if "delay_ms" in want:
        assert "delay" in kw and round(kw["delay"] * 1000) == want["delay_ms"], kw
    if "reason" in want:
        assert kw.get("reason") == want["reason"], kw
    for part in want.get("reason_includes", []):
        assert part in kw.get("reason", ""), f"reason {kw.get('reason')!r} lacks {part!r}"


# -- errors.json ---------------------------------------------------------------

#: The error kind of each class of jobfence.errors (the README's kinds).
KINDS: dict[type, str] = {
    StaleAttemptError: "stale_attempt",
    JobNotRunningError: "job_not_running",
    JobNotInReviewError: "job_not_in_review",
    OperationKeyConflictError: "operation_key_conflict",
    ClaimOutcomeUnknownError: "claim_outcome_unknown",
    WriteOutcomeUnknownError: "write_outcome_unknown",
    DatabaseUnavailableError: "database_unavailable",
    DatabaseFullError: "database_full",
    DatabaseAccessDeniedError: "database_access_denied",
    ObservationLimitError: "observation_limit",
    NotFoundError: "not_found",
    InvalidArgumentError: "invalid_argument",
    UnauthenticatedError: "unauthenticated",
    PermissionDeniedError: "permission_denied",
    GrantTooOldError: "grant_too_old",
    TooManyCallsError: "too_many_calls",
    JobNotCancellableError: "job_not_cancellable",
    CancelRequestedError: "cancel_requested",
    NotOnAttentionListError: "not_on_attention_list",
    UnavailableError: "unavailable",
    DeadlineExceededError: "deadline_exceeded",
}


def kind_of(e: CoordinatorError) -> str:
    """The README's kind of e: by its class; the plain CoordinatorError (this
    SDK has no class for CANCELLED) by its code."""
    if type(e) in KINDS:
        return KINDS[type(e)]
    assert type(e) is CoordinatorError, type(e)
    return "canceled" if e.code == grpc.StatusCode.CANCELLED else "other"


@pytest.fixture(scope="module")
def errors_coord() -> Iterator[FakeCoordinator]:
    """The scripted coordinator of the errors' vectors, one for the module."""
    f = FakeCoordinator()
    yield f
    f.stop()


def _receipt(job_id: int) -> SpooledReceipt:
    return SpooledReceipt(job_id=job_id, operation_key=f"op-{job_id}", attempt=1, lease_token=LeaseToken("t"),
                          source="worker:spec", outcome=Outcome.SUCCEEDED, provider_refund_id=f"re_{job_id}")


def _refile(fake: FakeCoordinator, f: Fail, tmp_path: Path) -> tuple[bool, bool]:
    """A refile pass of two spooled receipts whose first ReportObservation
    fails with f: whether the first was kept in the spool, and whether the
    pass stopped before the second."""
    path = tmp_path / "refile.receipts.jsonl"
    path.write_bytes(encode_receipt(_receipt(1)) + b"\n" + encode_receipt(_receipt(2)) + b"\n")
    before = fake.count("ReportObservation")
    fake.answer("ReportObservation", f, pb.ReportObservationResponse())
    client = Client(fake.address, retry=RetryPolicy(attempts=1), call_timeout=5)
    try:
        r = Receipts(client, "spec", str(path), Reporter(logging.getLogger("jobfence.test.spec"), None))
        r.start()
        r.finish(last_pass=False)
    finally:
        client.close()
    calls = fake.count("ReportObservation") - before
    with fake.lock:
        fake.script["ReportObservation"].clear()
    left = [line.receipt for line in parse_spool(path.read_bytes())] if path.exists() else []
    return any(x is not None and x.job_id == 1 for x in left), calls == 1


def run_errors(v: Vector, request: pytest.FixtureRequest) -> None:
    fake: FakeCoordinator = request.getfixturevalue("errors_coord")
    v.fields({"status"})
    want = v.expect()
    known(want, {"kind", "reason", "fenced", "unavailable", "retry_write", "refile_later", "refile_stops",
                 "taken_over", "job_id", "attempt", "current_attempt", "current_state", "violations"}, "expect")
    f = fail_of(v.raw["status"])
    # Decoded as a unary call's error is (R24): from a real server's trailer.
    once = Client(fake.address, retry=RetryPolicy(attempts=1), call_timeout=5)
    twice = Client(fake.address, retry=RetryPolicy(attempts=2, backoff=0.001), call_timeout=5)
    try:
        fake.answer("Complete", f)
        with pytest.raises(CoordinatorError) as info:
            once.complete(7, 1, "tok-7", "re_1")
        e = info.value
        # A write-back answered with it once more: repeated (R21) or not.
        before = fake.count("Complete")
        fake.answer("Complete", f, pb.CompleteResponse())
        try:
            twice.complete(7, 1, "tok-7", "re_1")
        except CoordinatorError:
            pass
        repeated = fake.count("Complete") - before == 2
        with fake.lock:
            fake.script["Complete"].clear()
    finally:
        once.close()
        twice.close()
    got: dict[str, Any] = {
        "kind": kind_of(e), "reason": e.reason, "fenced": isinstance(e, FencedError),
        "unavailable": isinstance(e, UnavailableError), "retry_write": repeated,
        "refile_later": refile_later(e), "refile_stops": coordinator_away(e),
    }
    assert e.code == f.code, (e.code, f.code)
    if {"refile_later", "refile_stops"} & set(want):
        kept, stopped = _refile(fake, f, request.getfixturevalue("tmp_path"))
        assert (kept, stopped) == (refile_later(e), coordinator_away(e) and refile_later(e)), (
            "the refile pass does not do what refile_later and coordinator_away say", kept, stopped)
        got["refile_later"], got["refile_stops"] = kept, stopped
    if isinstance(e, FencedError):
        got.update(job_id=e.job_id, attempt=e.attempt, current_attempt=e.current_attempt,
                   current_state=e.current_state.value, taken_over=e.current_attempt > e.attempt)
    if isinstance(e, InvalidArgumentError):
        got["violations"] = e.fields
    missing = sorted(set(want) - set(got))
    assert not missing, f"{type(e).__name__} has no {missing}"
    assert {k: got[k] for k in want} == want, f"decoded as {type(e).__name__}: {e}"


# -- spool.json ----------------------------------------------------------------

_RECEIPT_KEYS = ["job_id", "operation_key", "attempt", "lease_token", "source", "outcome", "provider_refund_id",
                 "provider_event_id", "detail", "spooled_at"]


def _spooled(r: dict[str, Any]) -> SpooledReceipt:
    known(r, set(_RECEIPT_KEYS), "receipt")
    return SpooledReceipt(job_id=int(r["job_id"]), operation_key=r["operation_key"], attempt=int(r["attempt"]),
                          lease_token=LeaseToken(r["lease_token"]), source=r["source"], outcome=Outcome(r["outcome"]),
                          provider_refund_id=r["provider_refund_id"], provider_event_id=r["provider_event_id"],
                          detail=r["detail"], spooled_at=r["spooled_at"])


def _as_dict(r: SpooledReceipt) -> dict[str, str]:
    return {"job_id": str(r.job_id), "operation_key": r.operation_key, "attempt": str(r.attempt),
            "lease_token": r.lease_token.reveal(), "source": r.source, "outcome": r.outcome.value,
            "provider_refund_id": r.provider_refund_id, "provider_event_id": r.provider_event_id,
            "detail": r.detail, "spooled_at": r.spooled_at}


def _line(raw: bytes, receipt: Optional[SpooledReceipt]) -> dict[str, Any]:
    if receipt is None:
        return {"unreadable": True, "raw": raw.decode("utf-8", "replace")}
    return {"receipt": _as_dict(receipt)}


def _check_line(got: dict[str, Any], want: dict[str, Any]) -> None:
    known(want, {"receipt", "unreadable", "raw"}, "a line")
    assert {k: got.get(k) for k in want} == want, got


def _files(spool: Path, want: dict[str, Optional[str]]) -> None:
    for suffix, contents in want.items():
        p = Path(str(spool) + suffix)
        got = p.read_text() if p.exists() else None
        assert got == contents, f"{p.name}: {got!r}, want {contents!r}"


def _mode(p: Path) -> str:
    return f"{stat.S_IMODE(p.stat().st_mode):04o}"


def _pid(state: str) -> int:
    return {"own_pid": os.getpid(), "live_other_pid": os.getppid(), "dead_pid": 2147483647}[state]


def run_spool(v: Vector, request: pytest.FixtureRequest) -> None:
    op = v.raw.get("op")
    spool = request.getfixturevalue("tmp_path") / "d" / "w.receipts.jsonl"
    if op == "write_line":
        v.fields({"op", "receipt", "line", "exact"})
        r = _spooled(v.raw["receipt"])
        ours, theirs = encode_receipt(r), v.raw["line"].encode("utf-8")
        if v.raw.get("exact"):
            assert ours == theirs, ours
        else:
            assert list(json.loads(ours).items()) == list(json.loads(theirs).items()), ours
        assert decode_receipt(ours) == r and decode_receipt(theirs) == r
    elif op == "read_line":
        v.fields({"op", "line"})
        want = v.expect()
        [line] = parse_spool(v.raw["line"].encode("utf-8") + b"\n")
        _check_line(_line(line.raw, line.receipt), want)
    elif op == "parse_file":
        v.fields({"op", "contents"})
        want = v.expect()
        known(want, {"lines"}, "expect")
        got = parse_spool(v.raw["contents"].encode("utf-8"))
        assert len(got) == len(want["lines"]), [_line(x.raw, x.receipt) for x in got]
        for g, w in zip(got, want["lines"]):
            _check_line(_line(g.raw, g.receipt), w)
    elif op == "open_file":
        v.fields({"op", "files"})
        want = v.expect()
        known(want, {"files", "pending", "torn_bytes", "mode", "dir_mode"}, "expect")
        if v.raw["files"]:
            spool.parent.mkdir()
        for suffix, contents in v.raw["files"].items():
            p = Path(str(spool) + suffix)
            p.write_text(contents)
            p.chmod(0o644)
        s = ReceiptSpool.open(str(spool), receipts_module._SPOOL_LOCK_WAIT)  # as a Worker opens it
        try:
            _files(spool, want.get("files", {}))
            if "pending" in want:
                assert s.pending() == want["pending"]
            if "torn_bytes" in want:
                assert s.torn == want["torn_bytes"]
            if "mode" in want:
                assert _mode(spool) == want["mode"]
            if "dir_mode" in want:
                assert _mode(spool.parent) == want["dir_mode"]
        finally:
            s.close()
    elif op == "close":
        v.fields({"op", "appends"})
        want = v.expect()
        known(want, {"files", "pending"}, "expect")
        s = ReceiptSpool.open(str(spool))
        for i in range(v.raw["appends"]):
            s.append(_receipt(i + 1))
        s.close()
        _files(spool, want.get("files", {}))
        if "pending" in want:
            assert len(parse_spool(spool.read_bytes()) if spool.exists() else []) == want["pending"]
    elif op == "lock":
        v.fields({"op", "lock_file"})
        want = v.expect()
        known(want, {"locked", "holder", "lock_file"}, "expect")
        state = v.raw["lock_file"]
        spool.parent.mkdir()
        lock = Path(str(spool) + ".lock")
        first: Optional[ReceiptSpool] = None
        if state == "held_here":
            first = ReceiptSpool.open(str(spool))
        elif state == "garbage":
            lock.write_text("no pid here\n")
        elif state != "absent":
            lock.write_text(f"{_pid(state)}\n")
        try:
            try:
                s = ReceiptSpool.open(str(spool))
            except ReceiptSpoolLockedError as e:
                assert want.get("locked", True), f"refused: {e}"
                if "holder" in want:
                    assert e.pid == _pid(want["holder"]), e
                assert "lock_file" not in want, "a refused open leaves the lock file alone"
                return
            try:
                assert not want.get("locked", False), "opened a spool another worker holds"
                if "lock_file" in want:
                    assert lock.read_text() == f"{_pid(want['lock_file'])}\n"
            finally:
                s.close()
        finally:
            if first is not None:
                first.close()
    elif op == "file_name":
        v.fields({"op", "worker_id", "file_name"})
        assert spool_file_name(v.raw["worker_id"]) == v.raw["file_name"]
    elif op == "default_path":
        v.fields({"op", "worker_id", "env"})
        want = v.expect()
        known(want, {"path", "error"}, "expect")
        env = v.raw["env"]
        known(env, {"XDG_CACHE_HOME", "HOME"}, "env")
        monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
        for k in ("XDG_CACHE_HOME", "HOME"):
            monkeypatch.delenv(k, raising=False)
        for k, val in env.items():
            monkeypatch.setenv(k, val)
        try:
            got: dict[str, Any] = {"path": default_receipt_spool(v.raw["worker_id"]), "error": False}
        except ValueError:
            got = {"error": True}
        assert {k: got.get(k) for k in want} == want, got
    else:
        pytest.fail(f"op {op!r} is not one this runner knows (the spec moved, the runner did not)")


# -- defaults.json -------------------------------------------------------------


def _ms_of(seconds: float) -> int:
    return round(seconds * 1000)


def _acknowledges() -> bool:
    """Whether the WorkStart a WorkSession opens its stream with asks to acknowledge grants."""
    sent: list[pb.WorkRequest] = []

    class Opened(Exception):
        pass

    class Stub:
        def Work(self, requests: Iterator[pb.WorkRequest], metadata: Any = None) -> Any:  # noqa: N802
            sent.append(next(requests))
            raise Opened()

    class Hooks:
        log = logging.getLogger("jobfence.test.spec")

        def granted(self, jobs: list[ClaimedJob]) -> None: ...

        def retry_after(self, seconds: float) -> None: ...

    class FakeClient:
        stub = Stub()

        def _metadata(self) -> list[tuple[str, str]]:
            return []

    s = session_module.WorkSession(FakeClient(), pb.WorkStart(worker_id="w"), 1, Hooks())  # type: ignore[arg-type]
    with pytest.raises(Opened):
        s.serve()
    return bool(sent[0].start.acknowledges)


def _renewer_jitter(monkeypatch: pytest.MonkeyPatch) -> float:
    """The ± fraction of a renewal interval's jitter: the interval drawn at
    random()'s two ends."""
    ends = []
    for r in (0.0, 1.0):
        monkeypatch.setattr(renewer_module.random, "random", lambda r=r: r)
        ends.append(renewer_module._jitter(1.0))
    return round((ends[1] - ends[0]) / 2, 9)


def defaults(monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[[], Any]]:
    """This SDK's real default of each name of defaults.json."""
    o = WorkerOptions(worker_id="w")
    p = ProviderPolicy()
    retry = RetryPolicy()
    keepalive = dict(KEEPALIVE_OPTIONS)
    renewer = Renewer(None, o, Reporter(logging.getLogger("jobfence.test.spec"), None))  # type: ignore[arg-type]
    return {
        "worker.concurrency": lambda: o.concurrency,
        "worker.provider_timeout_ms": lambda: _ms_of(o.provider_timeout),
        "worker.late_answer_grace_ms": lambda: _ms_of(o.late_answer_grace),
        "worker.poll_interval_ms": lambda: _ms_of(o.poll_interval),
        "worker.claim_wait_ms": lambda: _ms_of(o.claim_wait),
        "worker.claim_backoff_ms": lambda: _ms_of(o.claim_backoff),
        "worker.max_claim_backoff_ms": lambda: _ms_of(o.max_claim_backoff),
        "worker.drain_timeout_ms": lambda: _ms_of(o.drain_timeout),
        "worker.stream": lambda: not o.no_stream,
        "worker.renew_leases": lambda: o.lease_renewal,
        "worker.observe_retry_for_ms": lambda: _ms_of(receipts_module._OBSERVE_RETRY_FOR),
        "renew.interval_divisor": lambda: round(30.0 / renewer._interval(30.0), 9),
        "renew.jitter": lambda: _renewer_jitter(monkeypatch),
        "renew.retry_divisor": lambda: renewer_module._RENEW_RETRY_DIVISOR,
        "renew.max_batch": lambda: MAX_RENEW_BATCH,
        "stream.heartbeat_ms": lambda: _ms_of(session_module.STREAM_HEARTBEAT_INTERVAL),
        "stream.max_ack_grants": lambda: session_module.MAX_ACK_GRANTS,
        "stream.acknowledges": _acknowledges,
        "client.call_timeout_ms": lambda: _ms_of(DEFAULT_CALL_TIMEOUT),
        "client.retry_attempts": lambda: retry.attempts,
        "client.retry_backoff_ms": lambda: _ms_of(retry.backoff),
        "client.retry_max_backoff_ms": lambda: _ms_of(retry.max_backoff),
        "keepalive.time_ms": lambda: keepalive["grpc.keepalive_time_ms"],
        "keepalive.timeout_ms": lambda: keepalive["grpc.keepalive_timeout_ms"],
        "keepalive.without_calls": lambda: bool(keepalive["grpc.keepalive_permit_without_calls"]),
        "spool.max_receipts": lambda: MAX_SPOOLED_RECEIPTS,
        "spool.max_bytes": lambda: MAX_RECEIPT_SPOOL_BYTES,
        "spool.refile_interval_ms": lambda: _ms_of(RECEIPT_REFILE_INTERVAL),
        "spool.refile_min_gap_ms": lambda: _ms_of(receipts_module._REFILE_MIN_GAP),
        "spool.final_refile_timeout_ms": lambda: _ms_of(receipts_module._FINAL_REFILE_TIMEOUT),
        "spool.lock_wait_ms": lambda: _ms_of(receipts_module._SPOOL_LOCK_WAIT),
        "policy.same_key_resend_safe": lambda: p.same_key_resend_safe,
        "policy.resend_margin_ms": lambda: _ms_of(p.resend_margin),
        "policy.pending_delay_ms": lambda: _ms_of(p.pending_delay),
        "policy.unknown_delay_ms": lambda: _ms_of(p.unknown_delay),
        "policy.not_sent_delay_ms": lambda: _ms_of(p.not_sent_delay),
        "policy.max_reschedule_delay_ms": lambda: _ms_of(MAX_RESCHEDULE_DELAY),
    }


def run_defaults(v: Vector, request: pytest.FixtureRequest) -> None:
    v.fields(set())
    want = v.expect()
    known(want, {"value"}, "expect")
    table = defaults(request.getfixturevalue("monkeypatch"))
    if v.name not in table:
        pytest.fail(f"default {v.name!r} is not one this runner maps to the SDK (the spec moved, the runner did not)")
    got = table[v.name]()
    assert type(got) is type(want["value"]) or (isinstance(got, (int, float)) and not isinstance(got, bool)
                                                 and isinstance(want["value"], (int, float))
                                                 and not isinstance(want["value"], bool)), (got, want)
    assert got == want["value"], f"{v.name}: {got}, want {want['value']}"


def run_stream(v: Vector, request: pytest.FixtureRequest) -> None:
    play(v.raw)


RUNNERS: dict[str, Callable[[Vector, pytest.FixtureRequest], None]] = {
    "decide": run_decide,
    "errors": run_errors,
    "spool": run_spool,
    "defaults": run_defaults,
    "stream": run_stream,
}
