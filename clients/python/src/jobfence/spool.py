"""The receipt spool (R28): an append-only file of the receipts a Worker
could not file, one JSON line each, so that a receipt outlives the process.

The lines and the lock are those of the Go SDK (clients/go/jobfence/spool.go;
clients/spec/spool.json pins them) and the TypeScript SDK
(clients/node/src/spool.ts): each SDK reads and files the others' spools.
A line is a JSON object with ``"v": 1``, int64s as JSON strings (exact in
JavaScript too), and the grant's lease token in clear
(R25): the file is 0600 in a 0700 folder and no log line carries the token::

    {"v":1,"job_id":"101","operation_key":"op-1","attempt":"1","lease_token":"…",
     "source":"worker:w","outcome":"succeeded","provider_refund_id":"re_1",
     "provider_event_id":"","detail":"…","spooled_at":"2025-01-02T03:04:05.000006Z"}

A line of another version, or one this version cannot read, is kept as it
is, never dropped.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None  # type: ignore[assignment]

from .types import LeaseToken, Outcome

__all__ = [
    "MAX_RECEIPT_SPOOL_BYTES",
    "MAX_SPOOLED_RECEIPTS",
    "RECEIPT_REFILE_INTERVAL",
    "RECEIPT_SPOOL_OFF",
    "ReceiptSpool",
    "ReceiptSpoolClosedError",
    "ReceiptSpoolFullError",
    "ReceiptSpoolLockedError",
    "SpoolLine",
    "SpooledReceipt",
    "decode_receipt",
    "default_receipt_spool",
    "encode_receipt",
    "spool_file_name",
]

#: As ``WorkerOptions.receipt_spool``, turns the receipt spool off: a receipt
#: the coordinator does not take is then only logged.
RECEIPT_SPOOL_OFF = "off"

#: The spool's bounds (the Go and TypeScript SDKs' too). A spooled receipt is
#: a few hundred bytes (about 5 KB with a full detail), so 10,000 of them hold
#: hours of a busy worker's late receipts while the coordinator is away, and
#: 16 MiB caps the worst case: a refile pass reads the whole file into memory
#: and files one receipt per call. Past either bound a receipt is refused and
#: logged at ERROR.
MAX_SPOOLED_RECEIPTS = 10_000
MAX_RECEIPT_SPOOL_BYTES = 16 << 20

#: How often a running Worker files its spool again, in seconds.
RECEIPT_REFILE_INTERVAL = 30.0

# The version of a spooled line; a line of another version is kept as it is.
_SPOOL_FORMAT = 1

_OUTCOMES = {o.value: o for o in (Outcome.SUCCEEDED, Outcome.PENDING, Outcome.FAILED, Outcome.NOT_FOUND)}
_INT64 = re.compile(r"-?[0-9]+")


class ReceiptSpoolLockedError(Exception):
    """Another worker holds the receipt spool: two workers with the same id on
    one machine (a process, or another Worker of this one), which would write
    one file. Give each its own worker_id or receipt_spool. ``pid`` is the
    holder's, as its lock file names it (0: unknown)."""

    def __init__(self, spool: str, pid: int) -> None:
        super().__init__(
            f"jobfence: receipt spool {spool} is in use by another worker (pid {pid}): "
            "give each worker its own worker_id or receipt_spool"
        )
        self.spool = spool
        self.pid = pid


class ReceiptSpoolFullError(Exception):
    """The receipt would pass MAX_SPOOLED_RECEIPTS or MAX_RECEIPT_SPOOL_BYTES."""

    def __init__(self, count: int, size: int, max_count: int, max_bytes: int) -> None:
        super().__init__(
            f"jobfence: receipt spool full: {count} receipts, {size} bytes (bounds {max_count}, {max_bytes})"
        )


class ReceiptSpoolClosedError(Exception):
    """The spool was released (the Worker's run() returned)."""

    def __init__(self) -> None:
        super().__init__("jobfence: receipt spool closed")


@dataclass(frozen=True)
class SpooledReceipt:
    """One receipt as spooled: everything report_observation needs to file it
    again with the same dedupe key (job, attempt, source, outcome, provider
    refund id; the provider event id alone when set, R15), and the grant's
    lease token, so that the coordinator verifies the attempt (R25). The
    token prints redacted; only the spool file holds it in clear."""

    job_id: int
    operation_key: str
    attempt: int
    lease_token: LeaseToken
    source: str
    outcome: Outcome
    provider_refund_id: str = ""
    provider_event_id: str = ""
    detail: str = ""
    #: RFC 3339, UTC, this machine's clock when spooled: for people, never for
    #: a decision (R12).
    spooled_at: str = ""

    def request(self) -> dict[str, Any]:
        """The keyword arguments of Client.report_observation that file the
        receipt field for field as first tried. By operation key when it has
        one, as the Worker files (R1, R26)."""
        kw: dict[str, Any] = dict(
            attempt=self.attempt, lease_token=self.lease_token, source=self.source, outcome=self.outcome,
            provider_refund_id=self.provider_refund_id, provider_event_id=self.provider_event_id, detail=self.detail,
        )
        if self.operation_key:
            kw["operation_key"] = self.operation_key
        else:
            kw["job_id"] = self.job_id
        return kw

    def log_fields(self) -> dict[str, Any]:
        """The receipt in a log record, without its lease token (R25)."""
        return {"job_id": self.job_id, "operation_key": self.operation_key, "attempt": self.attempt,
                "grant": self.lease_token.fingerprint(), "source": self.source, "outcome": self.outcome.value,
                "provider_refund_id": self.provider_refund_id, "provider_event_id": self.provider_event_id,
                "spooled_at": self.spooled_at}


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def encode_receipt(r: SpooledReceipt) -> bytes:
    """The receipt's line, without its newline, as the Go SDK writes it: the
    same fields in the same order, int64s as strings."""
    return json.dumps(
        {
            "v": _SPOOL_FORMAT,
            "job_id": str(int(r.job_id)),
            "operation_key": r.operation_key,
            "attempt": str(int(r.attempt)),
            "lease_token": r.lease_token.reveal(),
            "source": r.source,
            "outcome": r.outcome.value,
            "provider_refund_id": r.provider_refund_id,
            "provider_event_id": r.provider_event_id,
            "detail": r.detail,
            "spooled_at": r.spooled_at,
        },
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode("ascii")


def _int64(v: object) -> Optional[int]:
    if not isinstance(v, str) or not _INT64.fullmatch(v):
        return None
    n = int(v)
    return n if -(1 << 63) <= n < (1 << 63) else None


def decode_receipt(raw: bytes) -> Optional[SpooledReceipt]:
    """Reads a line (without its newline); None when it is not a receipt this
    version reads: another format version, a field missing or malformed."""
    try:
        o = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError included
        return None
    if not isinstance(o, dict):
        return None
    v = o.get("v")
    if type(v) is not int or v != _SPOOL_FORMAT:  # not True, not 1.0
        return None
    job_id, attempt = _int64(o.get("job_id")), _int64(o.get("attempt"))
    source, name = o.get("source"), o.get("outcome")
    outcome = _OUTCOMES.get(name) if isinstance(name, str) else None
    if job_id is None or attempt is None or not isinstance(source, str) or outcome is None:
        return None

    def s(k: str) -> str:
        x = o.get(k)
        return x if isinstance(x, str) else ""

    return SpooledReceipt(
        job_id=job_id, operation_key=s("operation_key"), attempt=attempt, lease_token=LeaseToken(s("lease_token")),
        source=source, outcome=outcome, provider_refund_id=s("provider_refund_id"),
        provider_event_id=s("provider_event_id"), detail=s("detail"), spooled_at=s("spooled_at"),
    )


def default_receipt_spool(worker_id: str) -> str:
    """The spool file of a worker with this id when ``receipt_spool`` is not
    set: ``<user cache folder>/jobfence/<name>.receipts.jsonl``, where the
    user cache folder is Go's ``os.UserCacheDir()`` ($XDG_CACHE_HOME, else
    ~/.cache; ~/Library/Caches on macOS) and name is :func:`spool_file_name`'s,
    so that the Go and TypeScript SDKs name the same file for the same id.
    Raises ValueError when $XDG_CACHE_HOME is relative, or neither it nor
    $HOME is set."""
    if sys.platform == "darwin":
        home = os.environ.get("HOME", "")
        if not home:
            raise ValueError("jobfence: receipt spool: $HOME is not defined")
        cache = os.path.join(home, "Library", "Caches")
    else:
        cache = os.environ.get("XDG_CACHE_HOME", "")
        if cache and not os.path.isabs(cache):
            raise ValueError("jobfence: receipt spool: path in $XDG_CACHE_HOME is relative")
        if not cache:
            home = os.environ.get("HOME", "")
            if not home:
                raise ValueError("jobfence: receipt spool: neither $XDG_CACHE_HOME nor $HOME are defined")
            cache = os.path.join(home, ".cache")
    return os.path.join(cache, "jobfence", spool_file_name(worker_id))


def spool_file_name(worker_id: str) -> str:
    """The file name of a worker id's spool: the id with every byte outside
    [A-Za-z0-9._-] (and a leading dot) replaced by '_', cut to 100 bytes, and
    followed by '-' and 12 hex digits of the id's SHA-256 whenever it differs
    from the id; then ``.receipts.jsonl``."""
    raw = worker_id.encode("utf-8", "surrogatepass")
    b = bytearray(raw)
    for i, c in enumerate(b):
        ok = (0x61 <= c <= 0x7A or 0x41 <= c <= 0x5A or 0x30 <= c <= 0x39 or c in (0x5F, 0x2D)
              or (c == 0x2E and i > 0))
        if not ok:
            b[i] = 0x5F
    name = b.decode("ascii")
    if bytes(b) != raw or len(b) > 100:
        name = name[:100] + "-" + hashlib.sha256(raw).hexdigest()[:12]
    return name + ".receipts.jsonl"


@dataclass(frozen=True)
class SpoolLine:
    """One line of the spool as read: ``receipt`` is None when this version
    cannot read it; the line is then kept as it is."""

    raw: bytes  # without its newline
    receipt: Optional[SpooledReceipt]


def parse_spool(data: bytes) -> list[SpoolLine]:
    """The lines of a spool's contents; an unfinished last line (never
    acknowledged) is left out."""
    lines = data.split(b"\n")
    return [SpoolLine(raw, decode_receipt(raw)) for raw in lines[:-1]]


class ReceiptSpool:
    """The file of receipts a Worker could not file (R28), held under an
    exclusive lock on a file beside it, ``<path>.lock`` (flock, and the
    holder's pid in it, which the TypeScript SDK, which cannot flock, honours
    and sets), so that two workers with the same id never write one file.
    Appends are fsynced before they return; a rewrite replaces the file
    atomically (temp file, fsync, rename, fsync of the folder). A crash at any
    point leaves every acknowledged receipt in the file, at worst one already
    filed, which the coordinator deduplicates. Thread-safe."""

    def __init__(self, path: str, lock_fd: int) -> None:
        # Use ReceiptSpool.open.
        self.path = path
        self._lock_fd = lock_fd
        #: The bounds: MAX_SPOOLED_RECEIPTS and MAX_RECEIPT_SPOOL_BYTES.
        self.max_count = MAX_SPOOLED_RECEIPTS
        self.max_bytes = MAX_RECEIPT_SPOOL_BYTES
        #: Bytes of an unfinished last line that open cut off: a crash in the
        #: middle of an append that was never acknowledged.
        self.torn = 0
        self._mu = threading.Lock()
        self._fd = -1
        self._count = 0
        self._size = 0
        self._closed = False

    @classmethod
    def open(cls, path: str, wait: float = 0.0) -> ReceiptSpool:
        """Opens the spool at path, creating it (0600) and its folder (0700)
        when missing, takes its lock, trying for up to ``wait`` seconds, and
        cuts off a torn last line. Raises ReceiptSpoolLockedError, or the file
        system's OSError."""
        path = os.path.abspath(path)
        _mkdirs(os.path.dirname(path))
        deadline = time.monotonic() + wait
        while True:
            try:
                lock_fd = _lock(path + ".lock", path)
                break
            except ReceiptSpoolLockedError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        s = cls(path, lock_fd)
        try:
            s._open()
        except BaseException:
            _unlock(lock_fd, path + ".lock")
            raise
        return s

    def _open(self) -> None:
        try:
            os.remove(self.path + ".tmp")  # a rewrite a crash left unfinished: the file is still whole
        except FileNotFoundError:
            pass
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the file holds lease tokens (R25), whoever created it
            data = _read(self.path)
            end = data.rfind(b"\n") + 1
            if end < len(data):
                os.ftruncate(fd, end)
                self.torn = len(data) - end
                data = data[:end]
            os.fsync(fd)
            _sync_dir(os.path.dirname(self.path))
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._count, self._size = fd, data.count(b"\n"), len(data)

    @property
    def closed(self) -> bool:
        """Whether close() released the spool."""
        with self._mu:
            return self._closed

    def pending(self) -> int:
        """How many receipts (lines) the file holds."""
        with self._mu:
            return self._count

    def append(self, r: SpooledReceipt) -> None:
        """Writes r as one line and fsyncs it; ``spooled_at`` is set to now
        when empty. Raises ReceiptSpoolFullError, ReceiptSpoolClosedError, or
        the file system's OSError (the file is cut back to what it held)."""
        if not r.spooled_at:
            r = replace(r, spooled_at=_now_rfc3339())
        line = encode_receipt(r) + b"\n"
        with self._mu:
            if self._closed:
                raise ReceiptSpoolClosedError()
            if self._count >= self.max_count or self._size + len(line) > self.max_bytes:
                raise ReceiptSpoolFullError(self._count, self._size, self.max_count, self.max_bytes)
            try:
                at = 0
                while at < len(line):
                    at += os.write(self._fd, line[at:])
                os.fsync(self._fd)
            except BaseException:
                # Not acknowledged: take it back, so that count and size stay true.
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    pass  # a torn line is cut at the next open anyway
                raise
            self._count += 1
            self._size += len(line)

    def snapshot(self) -> tuple[list[SpoolLine], int]:
        """The lines on file and the offset they end at. Raises
        ReceiptSpoolClosedError or the file system's OSError."""
        with self._mu:
            if self._closed:
                raise ReceiptSpoolClosedError()
            data = _read(self.path)
        return parse_spool(data), len(data)

    def rewrite(self, up_to: int, keep: list[bytes]) -> None:
        """Replaces the file's first ``up_to`` bytes (a snapshot) with the
        lines ``keep`` and keeps what was appended since, atomically: a temp
        file, fsync, rename, fsync of the folder. Raises
        ReceiptSpoolClosedError or the file system's OSError, the old file
        intact."""
        with self._mu:
            if self._closed:
                raise ReceiptSpoolClosedError()
            data = _read(self.path)
            if up_to > len(data):
                raise OSError(errno.EIO, f"the spool shrank under its lock: {len(data)} bytes, snapshot of {up_to}")
            buf = b"".join(raw + b"\n" for raw in keep) + data[up_to:]
            tmp = self.path + ".tmp"
            try:
                _write_synced(tmp, buf)
                os.replace(tmp, self.path)
            except BaseException:
                try:
                    os.remove(tmp)
                except OSError:
                    pass
                raise
            # The rename is durable once the folder is; until then a crash
            # leaves the old file, whose receipts are filed again and
            # deduplicated.
            _sync_dir(os.path.dirname(self.path))
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            os.close(self._fd)
            self._fd, self._count, self._size = fd, buf.count(b"\n"), len(buf)

    def close(self) -> None:
        """Releases the spool and its lock; an empty spool's file is removed
        with it, so that a worker that spooled nothing, or filed all it
        spooled, leaves nothing behind. Raises the file system's OSError
        (the lock is released all the same)."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
            try:
                os.close(self._fd)
                if self._count == 0:
                    try:
                        os.remove(self.path)
                    except FileNotFoundError:
                        pass
                    else:
                        _sync_dir(os.path.dirname(self.path))
            finally:
                _unlock(self._lock_fd, self.path + ".lock")


def _mkdirs(d: str) -> None:
    """Creates d and its missing parents, each 0700."""
    missing: list[str] = []
    while d and not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for m in reversed(missing):
        try:
            os.mkdir(m, 0o700)
        except FileExistsError:
            pass


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_synced(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        at = 0
        while at < len(data):
            at += os.write(fd, data[at:])
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock_holder(fd: int) -> int:
    """The pid a lock file names; 0 when none."""
    try:
        return int(os.pread(fd, 32, 0).decode("ascii", "replace").strip())
    except (OSError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    """Signal 0 reaches the process, or it exists under another user."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _lock(path: str, spool: str) -> int:
    """Takes the spool's lock file: an exclusive flock, which the kernel drops
    when the holder dies, and the holder's pid in the file, so that a
    TypeScript worker, which cannot flock, sees this one holding it, and this
    one sees a TypeScript worker holding it by a live pid. Raises
    ReceiptSpoolLockedError naming the holder, or the file system's OSError."""
    if fcntl is None:  # pragma: no cover
        raise OSError(errno.ENOTSUP, "jobfence: locking the receipt spool needs flock, which this platform lacks "
                                     f"(set receipt_spool to {RECEIPT_SPOOL_OFF!r})")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _lock_holder(fd)
            os.close(fd)
            raise ReceiptSpoolLockedError(spool, pid) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            # A holder that released between our open and our flock removed
            # the file: this lock is on a name nobody else will open. Again.
            held, named = os.fstat(fd), os.stat(path)
        except FileNotFoundError:
            os.close(fd)
            continue
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            os.close(fd)
            continue
        pid = _lock_holder(fd)
        if pid and pid != os.getpid() and _alive(pid):
            # No flock, yet a live pid: a TypeScript worker's lock. Leave it.
            os.close(fd)
            raise ReceiptSpoolLockedError(spool, pid)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd


def _unlock(fd: int, path: str) -> None:
    """Removes the lock file while still holding it, then lets go."""
    try:
        os.remove(path)
    except OSError:
        pass  # a lock file left behind is stale by its pid and flock alike
    os.close(fd)
