"""A real coordinator process on a fresh MariaDB/MySQL database.

MySQL is mandatory: when the server cannot be reached the tests fail, never
skip. The binaries come from JOBFENCE_COORDINATOR_BIN, JOBFENCE_FAKEPROVIDER_BIN
and JOBFENCE_REFUNDWORKER_BIN, or are built from the repository with
``go build`` once per test run. JOBFENCE_TEST_MYSQL_DSN names another server
(default root@tcp(127.0.0.1:3306)/), as for the Go and Node tests.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import jobfence

REPO = Path(__file__).resolve().parents[3]

_built: dict[str, str] = {}
_build_lock = threading.Lock()


@dataclass
class MySQLServer:
    user: str
    password: str
    host: str
    port: str

    def dsn(self, database: str) -> str:
        pw = f":{self.password}" if self.password else ""
        return f"{self.user}{pw}@tcp({self.host}:{self.port})/{database}"


def mysql_server() -> MySQLServer:
    dsn = os.environ.get("JOBFENCE_TEST_MYSQL_DSN") or "root@tcp(127.0.0.1:3306)/"
    m = re.match(r"^([^:@]*)(?::([^@]*))?@tcp\(([^:)]+)(?::(\d+))?\)/", dsn)
    if not m:
        raise RuntimeError(f"JOBFENCE_TEST_MYSQL_DSN {dsn!r} is not user[:password]@tcp(host:port)/")
    return MySQLServer(m.group(1), m.group(2) or "", m.group(3), m.group(4) or "3306")


def mysql(sql: str, database: Optional[str] = None) -> str:
    """Runs statements with the mysql CLI and returns its tab-separated output."""
    s = mysql_server()
    args = ["mysql", f"-h{s.host}", f"-P{s.port}", f"-u{s.user}", "--batch", "--skip-column-names", "-e", sql]
    if database:
        args.append(database)
    p = subprocess.run(args, capture_output=True, text=True, timeout=60, env={**os.environ, "MYSQL_PWD": s.password})
    if p.returncode != 0:
        raise RuntimeError(
            f"MySQL is required for these tests and the statement failed at {s.host}:{s.port}: "
            f"{p.stderr.strip()}\n(start MariaDB, or set JOBFENCE_TEST_MYSQL_DSN)"
        )
    return p.stdout


def go_binary(name: str, env_var: str) -> str:
    """The binary named by env_var, or ./cmd/<name> built once per test run."""
    if os.environ.get(env_var):
        return os.environ[env_var]
    with _build_lock:
        if name not in _built:
            d = tempfile.mkdtemp(prefix=f"jobfence-py-{name}-")
            atexit.register(shutil.rmtree, d, True)
            subprocess.run(["go", "build", "-o", d + "/", f"./cmd/{name}"], cwd=REPO, check=True, timeout=600)
            _built[name] = os.path.join(d, name)
        return _built[name]


class Proc:
    """A child process whose JSON log lines (stdout and stderr) are parsed as they come."""

    _live: set[Proc] = set()

    def __init__(self, name: str, args: list[str], env: Optional[dict[str, str]] = None) -> None:
        self.name = name
        self.records: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._cv = threading.Condition()
        self.p = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            env={**os.environ, **(env or {})},
        )
        Proc._live.add(self)
        self._readers = [threading.Thread(target=self._read, args=(s,), daemon=True) for s in (self.p.stdout, self.p.stderr)]
        for t in self._readers:
            t.start()

    @property
    def pid(self) -> int:
        return self.p.pid

    def _read(self, stream: Any) -> None:
        for line in stream:
            line = line.rstrip("\n")
            with self._cv:
                self.raw.append(line)
                if len(self.raw) > 5000:
                    del self.raw[:1000]
                if line.startswith("{"):
                    try:
                        self.records.append(json.loads(line))
                    except ValueError:
                        pass
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def wait_for(self, match: Callable[[dict[str, Any]], bool], what: str, timeout: float = 30) -> dict[str, Any]:
        end = time.monotonic() + timeout
        seen = 0
        with self._cv:
            while True:
                for rec in self.records[seen:]:
                    if match(rec):
                        return rec
                seen = len(self.records)
                if self.p.poll() is not None and all(not t.is_alive() for t in self._readers):
                    raise RuntimeError(f"{self.name} exited ({self.p.returncode}) before {what}\n{self.tail()}")
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.name}: no {what} within {timeout}s\n{self.tail()}")
                self._cv.wait(min(left, 0.5))

    def signal(self, sig: int) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def stop(self, grace: float = 15) -> int:
        """SIGCONT and SIGTERM, then SIGKILL after grace seconds; the exit code."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGCONT)
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        for t in self._readers:
            t.join(5)
        for stream in (self.p.stdout, self.p.stderr):
            if stream is not None and not any(t.is_alive() for t in self._readers):
                stream.close()
        Proc._live.discard(self)
        return self.p.returncode

    def tail(self, n: int = 40) -> str:
        with self._cv:
            return "\n".join(f"  {self.name}| {line}" for line in self.raw[-n:])


@atexit.register
def _kill_all() -> None:
    for p in list(Proc._live):
        if p.p.poll() is None:
            p.p.send_signal(signal.SIGCONT)
            p.p.kill()


@dataclass
class Coordinator:
    """A running coordinator process on its own database."""

    address: str
    database: str
    proc: Proc
    clients: list[jobfence.Client] = field(default_factory=list)

    @property
    def logs(self) -> list[dict[str, Any]]:
        return self.proc.records

    def client(self, **kw: Any) -> jobfence.Client:
        kw.setdefault("call_timeout", 15)
        c = jobfence.Client(self.address, **kw)
        self.clients.append(c)
        return c

    def metrics(self) -> dict[str, float]:
        """The coordinator's Prometheus metrics now, by series (name and
        labels as exposed, e.g. 'grpc_server_handled_total{grpc_code="OK",...}')."""
        rec = self.proc.wait_for(lambda r: r.get("msg") == "metrics serving", '"metrics serving"', 10)
        with urllib.request.urlopen(f"http://{rec['listen']}/metrics", timeout=15) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                series, _, value = line.rpartition(" ")
                out[series] = float(value)
        return out

    def rpc_count(self, method: str, metric: str = "grpc_server_started_total") -> int:
        """How many calls of method (its gRPC name: "Claim", "Work"…) the
        coordinator started; with metric="grpc_server_handled_total", how many
        it answered, whatever their code."""
        label = f'grpc_method="{method}"'
        return int(sum(v for k, v in self.metrics().items() if k.startswith(metric + "{") and label in k))

    def sql(self, statement: str) -> str:
        return mysql(statement, self.database)

    def expire_lease(self, job_id: int) -> None:
        """Ends a running job's lease in test data (T1: never by moving a clock).
        A running job's next_attempt_at is its lease end and moves with it:
        claims find expired leases by it (DESIGN.md, "One index for due work
        and expired leases")."""
        self.sql(f"UPDATE refund_jobs SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, "
                 f"next_attempt_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND "
                 f"WHERE id = {int(job_id)} AND state = 'running'")

    def stop(self, drop: bool = True) -> None:
        """Stops the coordinator and, unless drop is False (for a coordinator
        started again on the same database), drops its database."""
        for c in self.clients:
            c.close()
        self.proc.stop(10)
        if drop:
            mysql(f"DROP DATABASE IF EXISTS `{self.database}`")


def start_coordinator(*extra: str, database: Optional[str] = None) -> Coordinator:
    """Creates a fresh database jobfence_py_<random> (or takes the one named),
    starts the coordinator on it at 127.0.0.1:0 (extra may name another
    --listen) with its metrics at another port (Coordinator.metrics), and
    reads the address from its "coordinator serving" line."""
    binary = go_binary("coordinator", "JOBFENCE_COORDINATOR_BIN")
    fresh = database is None
    database = database or f"jobfence_py_{secrets.token_hex(6)}"
    if fresh:
        mysql(f"CREATE DATABASE `{database}`")
    s = mysql_server()
    proc = Proc("coordinator", [binary, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                "--log-format", "json", "--mysql-dsn", s.dsn(database), *extra])
    try:
        rec = proc.wait_for(lambda r: r.get("msg") == "coordinator serving" and isinstance(r.get("listen"), str),
                            '"coordinator serving"')
    except Exception:
        proc.stop(1)
        if fresh:
            mysql(f"DROP DATABASE IF EXISTS `{database}`")
        raise
    return Coordinator(str(rec["listen"]), database, proc)


class _DataFrames:
    """Finds the HTTP/2 DATA frames (messages, not pings or window updates)
    in what a client sends, after the connection preface."""

    def __init__(self) -> None:
        self._buf = b""
        self._preface = 24

    def feed(self, data: bytes) -> bool:
        """Whether data completed a DATA frame with a payload."""
        self._buf += data
        if self._preface:
            n = min(self._preface, len(self._buf))
            self._buf, self._preface = self._buf[n:], self._preface - n
        saw = False
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            if len(self._buf) < 9 + length:
                break
            saw = saw or (self._buf[3] == 0 and length > 0)
            self._buf = self._buf[9 + length:]
        return saw


class _Front:
    """A listener on a free loopback port in front of a coordinator at
    target, for the proxies below."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._lis = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._lis.getsockname()[1]}"
        self._lock = threading.Lock()


class CutProxy(_Front):
    """A TCP proxy to a coordinator, to cut a worker's connection at a chosen
    moment: after hold_replies(), once the worker has sent its next message
    (an HTTP/2 DATA frame: a write-back, not a ping or a window update),
    nothing the coordinator sends reaches the worker any more; cut() then
    closes every connection. Connections made after cut() are served
    normally."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self._conns: list[socket.socket] = []
        self._armed = False  # the worker's next message holds the replies
        self.holding = threading.Event()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def hold_replies(self) -> None:
        with self._lock:
            self._armed = True

    def cut(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
            self._armed = False
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        self.holding.clear()

    def close(self) -> None:
        self._closed = True
        self._lis.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._lis.accept()
                up = socket.create_connection(self._target)
            except OSError:
                continue
            with self._lock:
                self._conns += [down, up]
            threading.Thread(target=self._pump, args=(down, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        frames = _DataFrames()
        try:
            while data := src.recv(65536):
                if upstream:
                    saw = frames.feed(data)
                    with self._lock:
                        if self._armed and saw:
                            self._armed = False
                            self.holding.set()
                elif self.holding.is_set():
                    continue  # the coordinator's answer never arrives
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.close()
            except OSError:
                pass


class BlackholeProxy(_Front):
    """A TCP proxy to a coordinator that can blackhole the connections it
    carries: after blackhole() their sockets stay open and nothing more is
    forwarded, in either direction, and nothing is closed, as a coordinator
    host that vanished or a path dropping every packet would (no FIN, no
    RST): the bytes wait in the kernels' buffers, acknowledged by TCP and
    never delivered. Connections accepted after it are forwarded normally,
    as a new connection's path to another replica would be."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self._conns: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._closed = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def blackhole(self) -> None:
        """Nothing the connections open now carry is forwarded from when it returns."""
        with self._lock:
            for _, _, black in self._conns:
                black.set()

    def close(self) -> None:
        self._closed.set()
        self._lis.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for down, up, _ in conns:
            for sock in (down, up):
                try:
                    sock.close()
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                down, _ = self._lis.accept()
                up = socket.create_connection(self._target)
            except OSError:
                continue
            black = threading.Event()
            with self._lock:
                self._conns.append((down, up, black))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(down, up, black), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, black), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, black: threading.Event) -> None:
        try:
            while data := src.recv(65536):
                if black.is_set():
                    self._closed.wait()  # reads no more, closes nothing
                    return
                dst.sendall(data)
        except OSError:
            pass
        if black.is_set():
            return
        for sock in (src, dst):  # a close the blackhole did not make is forwarded
            try:
                sock.close()
            except OSError:
                pass


def start_provider() -> tuple[Proc, str]:
    """The fake provider (cmd/fakeprovider) at 127.0.0.1:0, and its base URL."""
    p = Proc("fakeprovider", [go_binary("fakeprovider", "JOBFENCE_FAKEPROVIDER_BIN"), "--listen", "127.0.0.1:0",
                              "--log-format", "json", "--shutdown-timeout", "1s"])
    rec = p.wait_for(lambda r: r.get("msg") == "fakeprovider serving", '"fakeprovider serving"')
    return p, f"http://{rec['listen']}"


def admin(url: str, method: str, path: str, body: Any = None) -> Any:
    """A call to the fake provider's admin and oracle API."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=15) as r:
        text = r.read()
    return json.loads(text) if text else None


_seq = 0
_seq_lock = threading.Lock()


def refund(**overrides: Any) -> dict[str, Any]:
    """A fresh, valid enqueue_refund request, with a provider of its own so a
    test claims only its jobs."""
    global _seq
    with _seq_lock:
        _seq += 1
        n = _seq
    tag = f"{os.getpid()}-{n}-{secrets.token_hex(3)}"
    r: dict[str, Any] = dict(operation_key=f"py-op-{tag}", order_id=f"ord-{tag}", payment_id=f"pay-{tag}",
                             amount_minor=4200, currency="USD", provider=f"p-{tag}".lower())
    r.update(overrides)
    return r


def eventually(check: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    """Polls check until it returns a truthy value without raising; re-raises after timeout."""
    end = time.monotonic() + timeout
    while True:
        try:
            v = check()
            if v:
                return v
            err: Optional[BaseException] = None
        except AssertionError as e:
            err = e
        if time.monotonic() > end:
            if err is not None:
                raise err
            raise TimeoutError(f"no {what} within {timeout}s")
        time.sleep(0.05)


def kinds(d: jobfence.JobDetail) -> list[str]:
    """A job's history as kind@attempt."""
    return [f"{e.kind}@{e.attempt}" for e in d.events]
