"""The receipt spool (R28) on its own: every acknowledged append survives a
crash and is fsynced before it returns, a torn last line is cut, a rewrite
is atomic and keeps what was appended meanwhile, lines of another version
are kept, the bounds hold, the lock keeps a second worker out (flock, and a
Node worker's pid), and the lines are the Go and Node SDKs'."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

import jobfence.spool as spool_mod
from jobfence import (
    MAX_RECEIPT_SPOOL_BYTES,
    MAX_SPOOLED_RECEIPTS,
    RECEIPT_REFILE_INTERVAL,
    RECEIPT_SPOOL_OFF,
    Client,
    CoordinatorError,
    InvalidArgumentError,
    LeaseToken,
    NotFoundError,
    ObservationLimitError,
    Outcome,
    PermissionDeniedError,
    Reason,
    ReceiptSpoolLockedError,
    SpooledReceipt,
    UnauthenticatedError,
    UnavailableError,
    Worker,
    default_receipt_spool,
)
from jobfence.spool import (
    ReceiptSpool,
    ReceiptSpoolClosedError,
    ReceiptSpoolFullError,
    decode_receipt,
    encode_receipt,
    parse_spool,
    spool_file_name,
)
from jobfence.receipts import refile_later

# The Go SDK writes GO_LINE for its test receipt (clients/go/jobfence/spool_test.go
# checks json.Marshal against it) and reads NODE_LINE, which the Node SDK
# writes (clients/node/test/spool.test.ts holds the same two).
GO_LINE = (
    '{"v":1,"job_id":"101","operation_key":"op-1","attempt":"1","lease_token":"tok-1-secret","source":"worker:w",'
    '"outcome":"succeeded","provider_refund_id":"re_1","provider_event_id":"","detail":"late\\nanswer",'
    '"spooled_at":"2025-01-02T03:04:05.000000006Z"}'
)
NODE_LINE = (
    '{"v":1,"job_id":"9007199254740993","operation_key":"op-n","attempt":"2","lease_token":"tok-n",'
    '"source":"worker:node-1","outcome":"not_found","provider_refund_id":"","provider_event_id":"evt_<1>",'
    '"detail":"a & b","spooled_at":"2025-01-02T03:04:05.006Z"}'
)


def receipt(n: int) -> SpooledReceipt:
    """The Go test's testReceipt(n), field for field."""
    return SpooledReceipt(
        job_id=100 + n, operation_key=f"op-{n}", attempt=1, lease_token=LeaseToken(f"tok-{n}-secret"),
        source="worker:w", outcome=Outcome.SUCCEEDED, provider_refund_id=f"re_{n}", detail="late\nanswer",
        spooled_at="2025-01-02T03:04:05.000000006Z",
    )


def crash(s: ReceiptSpool) -> None:
    """Drops the spool's descriptors as a killed process would: the kernel
    closes them, nothing is removed, the flock goes with them."""
    os.close(s._fd)
    os.close(s._lock_fd)
    s._closed = True


def receipts(s: ReceiptSpool) -> list[SpooledReceipt]:
    lines, _ = s.snapshot()
    out = []
    for line in lines:
        assert line.receipt is not None, f"unreadable line {line.raw!r}"
        out.append(line.receipt)
    return out


def mode(p: str) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def opened() -> Any:
    spools: list[ReceiptSpool] = []

    def open_spool(path: Any, wait: float = 0.0) -> ReceiptSpool:
        s = ReceiptSpool.open(str(path), wait)
        spools.append(s)
        return s

    yield open_spool
    for s in spools:
        if not s._closed:
            s.close()


def test_receipt_spool_keeps_every_append_across_a_crash_R28(tmp_path: Path, opened: Any) -> None:
    folder = tmp_path / "new" / "spool"
    path = str(folder / "w.receipts.jsonl")
    s = opened(path)
    want = [receipt(n) for n in range(3)]
    for r in want:
        s.append(r)
    crash(s)

    again = opened(path)
    assert receipts(again) == want and again.pending() == 3
    # Refiled field for field, the token in clear: the same dedupe key as the
    # first try (R15), the attempt verified (R25); by operation key (R1).
    req = receipts(again)[0].request()
    assert "job_id" not in req and req["lease_token"].reveal() == "tok-0-secret"
    assert {k: v for k, v in req.items() if k != "lease_token"} == dict(
        operation_key="op-0", attempt=1, source="worker:w", outcome=Outcome.SUCCEEDED, provider_refund_id="re_0",
        provider_event_id="", detail="late\nanswer")
    # Without an operation key, by id.
    assert SpooledReceipt(7, "", 1, LeaseToken("t"), "worker:w", Outcome.FAILED).request()["job_id"] == 7
    # The file holds lease tokens (R25).
    assert (mode(path), mode(path + ".lock"), mode(str(folder)), mode(str(folder.parent))) == (0o600, 0o600, 0o700, 0o700)


def test_receipt_spool_append_is_fsynced_before_it_returns_R28(tmp_path: Path, opened: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "w.receipts.jsonl")
    s = opened(path)
    synced: list[tuple[str, bytes]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        name = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((name, Path(name).read_bytes() if os.path.isfile(name) else b""))

    monkeypatch.setattr(spool_mod.os, "fsync", fsync)
    s.append(receipt(1))
    line = encode_receipt(receipt(1)) + b"\n"
    assert synced == [(path, line)], "the append returned before its line was fsynced"

    # A rewrite: the temp file synced whole, renamed, then the folder synced.
    synced.clear()
    s.append(receipt(2))
    _, up_to = s.snapshot()
    synced.clear()
    s.rewrite(up_to, [encode_receipt(receipt(2))])
    assert [name for name, _ in synced] == [path + ".tmp", str(tmp_path)], synced
    assert synced[0][1] == encode_receipt(receipt(2)) + b"\n"


def test_receipt_spool_cuts_a_torn_last_line_R28(tmp_path: Path, opened: Any) -> None:
    path = str(tmp_path / "w.receipts.jsonl")
    s = opened(path)
    s.append(receipt(1))
    crash(s)
    # A crash in the middle of the next append: never acknowledged.
    with open(path, "ab") as f:
        f.write(b'{"v":1,"job_id":"7","operation_key":"op-')
    again = opened(path)
    assert again.torn > 0 and again.pending() == 1
    again.append(receipt(2))
    assert receipts(again) == [receipt(1), receipt(2)]


def test_receipt_spool_rewrite_is_atomic_and_keeps_later_appends_R28(tmp_path: Path, opened: Any) -> None:
    path = str(tmp_path / "w.receipts.jsonl")
    s = opened(path)
    for n in range(3):
        s.append(receipt(n))
    lines, up_to = s.snapshot()
    s.append(receipt(3))  # while a refile pass is out filing the snapshot
    before = os.stat(path)
    s.rewrite(up_to, [lines[1].raw])
    after = os.stat(path)
    assert (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino), "rewritten in place, not renamed over"
    assert not os.path.exists(path + ".tmp") and mode(path) == 0o600
    want = [receipt(1), receipt(3)]
    assert receipts(s) == want and s.pending() == 2
    s.append(receipt(4))  # appends go to the new file
    crash(s)
    # A crash that left a rewrite's temp file: the spool itself is whole.
    Path(path + ".tmp").write_bytes(b"half a rewrite")
    again = opened(path)
    assert receipts(again) == want + [receipt(4)]
    assert not os.path.exists(path + ".tmp")


def test_receipt_spool_keeps_lines_it_cannot_read_R28(tmp_path: Path, opened: Any) -> None:
    path = str(tmp_path / "w.receipts.jsonl")
    foreign = [b'{"v":2,"something":"new"}', b'{"v":true,"job_id":"1","attempt":"1","source":"s","outcome":"failed"}',
               b"not json", b'{"v":1,"job_id":101,"attempt":"1","source":"s","outcome":"failed"}',
               b'{"v":1,"job_id":"1","attempt":"1","source":"s","outcome":"refunded"}', b"\xff\xfe"]
    Path(path).write_bytes(b"".join(line + b"\n" for line in foreign))
    s = opened(path)
    s.append(receipt(1))
    lines, up_to = s.snapshot()
    assert [line.receipt for line in lines] == [None] * len(foreign) + [receipt(1)]
    s.rewrite(up_to, [line.raw for line in lines if line.receipt is None])
    assert Path(path).read_bytes() == b"".join(line + b"\n" for line in foreign), "an unreadable line was changed"


def test_receipt_spool_is_bounded_R28(tmp_path: Path, opened: Any) -> None:
    assert (MAX_SPOOLED_RECEIPTS, MAX_RECEIPT_SPOOL_BYTES, RECEIPT_REFILE_INTERVAL) == (10_000, 16 << 20, 30.0)
    s = opened(tmp_path / "w.receipts.jsonl")
    assert (s.max_count, s.max_bytes) == (MAX_SPOOLED_RECEIPTS, MAX_RECEIPT_SPOOL_BYTES)
    s.max_count = 2
    s.append(receipt(0))
    s.append(receipt(1))
    with pytest.raises(ReceiptSpoolFullError):
        s.append(receipt(2))
    s.max_count, s.max_bytes = 100, s._size + 10
    with pytest.raises(ReceiptSpoolFullError):
        s.append(receipt(3))
    assert s.pending() == 2 and len(receipts(s)) == 2, "a refused receipt was written"


def test_receipt_spool_close_removes_an_empty_spool_R28(tmp_path: Path, opened: Any) -> None:
    path = tmp_path / "w.receipts.jsonl"
    opened(path).close()
    assert os.listdir(tmp_path) == []
    full = opened(path)
    full.append(receipt(1))
    full.close()
    assert sorted(os.listdir(tmp_path)) == ["w.receipts.jsonl"], "a spool holding a receipt was removed"
    with pytest.raises(ReceiptSpoolClosedError):
        full.append(receipt(2))


_HOLDER = """
import sys
sys.path.insert(0, sys.argv[1])
from jobfence.spool import ReceiptSpool
ReceiptSpool.open(sys.argv[2])
print("held", flush=True)
sys.stdin.readline()
"""


def test_receipt_spool_lock_refuses_a_second_opener_R28(tmp_path: Path, opened: Any) -> None:
    path = str(tmp_path / "w.receipts.jsonl")
    s = opened(path)
    assert Path(path + ".lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(ReceiptSpoolLockedError) as e:
        ReceiptSpool.open(path)  # the same process: another open file, another flock
    assert e.value.pid == os.getpid()
    t0 = time.monotonic()
    with pytest.raises(ReceiptSpoolLockedError):
        ReceiptSpool.open(path, 0.2)
    assert time.monotonic() - t0 >= 0.2, "a waiting opener gave up early"
    s.close()
    assert not os.path.exists(path + ".lock")
    opened(path).close()

    # Another process holds it, and dies without letting go (kill -9): the
    # kernel drops its flock.
    src = str(Path(__file__).resolve().parents[1] / "src")
    with subprocess.Popen([sys.executable, "-c", _HOLDER, src, path], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(ReceiptSpoolLockedError) as e:
                ReceiptSpool.open(path)
            assert e.value.pid == holder.pid and str(holder.pid) in str(e.value)
        finally:
            holder.kill()
    assert Path(path + ".lock").exists(), "the killed holder's lock file is left, stale"
    opened(path).close()


def test_receipt_spool_lock_honours_a_node_workers_pid_R28(tmp_path: Path, opened: Any) -> None:
    path = str(tmp_path / "w.receipts.jsonl")
    # A Node worker holds the lock by its live pid, with no flock.
    Path(path + ".lock").write_text(f"{os.getppid()}\n")
    with pytest.raises(ReceiptSpoolLockedError) as e:
        ReceiptSpool.open(path)
    assert e.value.pid == os.getppid()
    # Its holder is gone: the lock is stale.
    gone = subprocess.Popen(["true"])
    gone.wait()
    Path(path + ".lock").write_text(f"{gone.pid}\n")
    s = opened(path)
    assert Path(path + ".lock").read_text() == f"{os.getpid()}\n"
    s.close()
    assert not os.path.exists(path + ".lock")


def test_default_receipt_spool_names_a_file_after_the_worker_id_R28(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The Go and Node SDKs name the same files for the same ids.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for wid, want in {
        "w-1": "w-1.receipts.jsonl",
        "refundworker-host-42": "refundworker-host-42.receipts.jsonl",
        "a/b c": "a_b_c-0af99a609169.receipts.jsonl",
        "wörker": "w__rker-9288d7f04611.receipts.jsonl",
        "..": "_.-" + hashlib.sha256(b"..").hexdigest()[:12] + ".receipts.jsonl",
        "x" * 128: "x" * 100 + "-" + hashlib.sha256(b"x" * 128).hexdigest()[:12] + ".receipts.jsonl",
    }.items():
        assert default_receipt_spool(wid) == str(tmp_path / "jobfence" / want), wid
    assert spool_file_name("a/b") != spool_file_name("a_b")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    with pytest.raises(ValueError, match="relative"):
        default_receipt_spool("w")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_receipt_spool("w") == str(tmp_path / "home" / ".cache" / "jobfence" / "w.receipts.jsonl")


def test_receipt_spool_lines_are_the_go_and_node_sdks_R28(tmp_path: Path, opened: Any) -> None:
    assert encode_receipt(receipt(1)).decode() == GO_LINE
    assert decode_receipt(GO_LINE.encode()) == receipt(1)
    node = decode_receipt(NODE_LINE.encode())
    assert node == SpooledReceipt(
        job_id=9007199254740993, operation_key="op-n", attempt=2, lease_token=LeaseToken("tok-n"),
        source="worker:node-1", outcome=Outcome.NOT_FOUND, provider_event_id="evt_<1>", detail="a & b",
        spooled_at="2025-01-02T03:04:05.006Z")
    # A spool the others wrote opens and reads here.
    path = tmp_path / "w.receipts.jsonl"
    path.write_bytes((GO_LINE + "\n" + NODE_LINE + "\n").encode())
    s = opened(path)
    assert receipts(s) == [receipt(1), node]
    # What this SDK appends, the others read: their field names and types,
    # int64s as strings, spooled_at RFC 3339 in UTC (Go's time.Time needs it).
    s.append(SpooledReceipt(2**62 + 1, "op-py", 3, LeaseToken("tok-py"), "worker:py", Outcome.PENDING, "re_py",
                            detail="ü <&>"))
    last = json.loads(path.read_bytes().splitlines()[-1])
    assert list(last) == list(json.loads(GO_LINE))
    assert (last["v"], last["job_id"], last["attempt"], last["outcome"], last["lease_token"], last["detail"]) == (
        1, str(2**62 + 1), "3", "pending", "tok-py", "ü <&>")
    assert time.strptime(last["spooled_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert [line.receipt is not None for line in parse_spool(path.read_bytes())] == [True] * 3


def test_refile_later_only_what_may_succeed_later_R28() -> None:
    U = grpc.StatusCode
    for err, want in [
        (UnavailableError(U.UNAVAILABLE, "x"), True),
        (UnavailableError(U.UNAVAILABLE, "x", Reason.DATABASE_UNAVAILABLE), True),
        (UnavailableError(U.UNAVAILABLE, "x", Reason.DATABASE_FULL), True),
        (CoordinatorError(U.DEADLINE_EXCEEDED, "x"), True),
        (CoordinatorError(U.CANCELLED, "x"), True),
        (CoordinatorError(U.INTERNAL, "x"), True),
        (UnauthenticatedError(U.UNAUTHENTICATED, "x"), True),
        (ConnectionResetError("reset"), True),
        (InvalidArgumentError(U.INVALID_ARGUMENT, "x", Reason.INVALID_ARGUMENT), False),
        (NotFoundError(U.NOT_FOUND, "x", Reason.NOT_FOUND), False),
        (ObservationLimitError(U.RESOURCE_EXHAUSTED, "x", Reason.OBSERVATION_LIMIT), True),  # an earlier coordinator's (R28)
        (PermissionDeniedError(U.PERMISSION_DENIED, "x", Reason.PERMISSION_DENIED), False),
    ]:
        assert refile_later(err) is want, err


def test_worker_refuses_a_spool_in_use_R28(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client("127.0.0.1:1")  # never called: the workers are not run
    handler: Any = object()
    path = str(tmp_path / "w.receipts.jsonl")
    first = Worker(client, handler, worker_id="w", receipt_spool=path)
    assert first.receipt_spool == path and first.spooled_receipts == 0
    t0 = time.monotonic()
    with pytest.raises(ReceiptSpoolLockedError):
        Worker(client, handler, worker_id="w", receipt_spool=path)
    assert time.monotonic() - t0 >= 0.9, "a held spool was not waited for (a worker just exiting)"
    assert first.shutdown() is True  # never run: releases the spool
    Worker(client, handler, worker_id="w", receipt_spool=path).shutdown()

    # The default spool lives under the user's cache folder, named after the id.
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    w = Worker(client, handler, worker_id="w-default")
    assert w.receipt_spool == str(cache / "jobfence" / "w-default.receipts.jsonl")
    assert os.path.exists(str(w.receipt_spool)) and mode(str(cache / "jobfence")) == 0o700
    w.shutdown()
    assert os.listdir(cache / "jobfence") == [], "an empty spool was left behind"
    off = Worker(client, handler, worker_id="w-off", receipt_spool=RECEIPT_SPOOL_OFF)
    assert off.receipt_spool is None and not (cache / "jobfence" / "w-off.receipts.jsonl").exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError):
        Worker(client, handler, worker_id="w", receipt_spool=str(blocker / "not-a-folder" / "x"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    with pytest.raises(ValueError, match="receipt_spool"):
        Worker(client, handler, worker_id="w")
    client.close()
