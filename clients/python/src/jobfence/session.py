"""The worker stream (Coordinator.Work): one bidirectional stream per Worker,
held by a WorkSession.

The coordinator pushes grants on it as the worker's slots free up: the stream
opens with every free slot as credits, a grant uses one per job (R18), a
finished job gives one back (WorkCredit). Write-backs, renewals and receipts
go on it as WorkCalls, each answered by a WorkReply with the unary call's
response, or its error as the serialized google.rpc.Status the unary call's
trailer would carry. That status is decoded by errors.decode_rpc_status, the
code that decodes a unary call's error, so the typed errors (R24) and the
Client's retries (R21) apply unchanged: a call cut with its stream is
answered UNAVAILABLE and the Client repeats it, on the next stream or as a
unary call (every call that may go on the stream is idempotent: R15, R21,
R27). Calls made while no stream is open, or while the worker drains, go as
unary calls.

While a stream is open and not half-closed, the worker sends a heartbeat, a
WorkCredit of 0 credits ("still here, no new slot"), whenever it has sent
nothing else for STREAM_HEARTBEAT_INTERVAL: the coordinator offers work only
to a stream that spoke within the last few seconds, so a frozen process (a
SIGSTOP, a long pause) is granted nothing it cannot start.

Every grant is acknowledged as it is read (WorkStart.acknowledges): one
WorkAck naming each job of the WorkGrant with its attempt and lease token,
queued ahead of anything else waiting to be sent, before any of its jobs
starts. The coordinator hands back a grant left unacknowledged for 5 s (or
half its lease), so a worker that stops reading holds no job. A grant read
after the half-close (the drain) can no longer be acknowledged: it is not
started, and the coordinator takes it back when the stream ends.

A WorkSession is built from the Client, the WorkStart its streams open with,
the worker's slot count and a SessionHooks, through which it hands over the
jobs it is granted; it knows nothing else of the Worker, which opens stream
after stream with serve() and half-closes the last one with close_send().

Threads: grpcio sends a stream's requests from an iterator fed by a queue
(its own thread takes from it: put never blocks), and the Worker's run()
thread reads the responses (serve()) and starts the jobs granted. The
heartbeats come from that iterator too: after STREAM_HEARTBEAT_INTERVAL
waiting on an empty queue it hands grpcio a heartbeat, on grpcio's thread,
which no handler can block; one that cannot be sent fails the stream as any
failed send does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Optional, Protocol

import grpc

from .client import Client
from .errors import CoordinatorError, DeadlineExceededError, UnavailableError, decode_error, decode_rpc_status
from .tracing import trace_headers
from .types import ClaimedJob, claimed_of
from .v1 import coordinator_pb2 as pb

# The calls that may go on the stream: the stub's method and the WorkCall's
# (and WorkReply's) field of each.
STREAM_CALLS = {
    "Complete": "complete",
    "Reschedule": "reschedule",
    "Escalate": "escalate",
    "RenewLeases": "renew_leases",
    "ReportObservation": "report_observation",
}


# Seconds of silence after which an open stream sends a heartbeat
# (WorkCredit of 0 credits); well inside the coordinator's 3 s
# (server.StreamSilence) after which a silent stream is granted nothing.
STREAM_HEARTBEAT_INTERVAL = 1.0


# The grants one WorkAck names at most.
MAX_ACK_GRANTS = 100


def _heartbeat() -> pb.WorkRequest:
    return pb.WorkRequest(credit=pb.WorkCredit(credits=0))


class SessionHooks(Protocol):
    """What a WorkSession reports to its owner."""

    @property
    def log(self) -> logging.Logger:
        """Where the session logs."""
        ...

    def granted(self, jobs: list[ClaimedJob]) -> None:
        """Starts the jobs of one grant, acknowledged: each took a slot."""
        ...

    def retry_after(self, seconds: float) -> None:
        """R19: due work waits on the provider's budget; the coordinator
        offers it again after seconds, holding the credits."""
        ...


class StreamUnsupported(Exception):
    """The coordinator does not serve Work: claim with Claim calls instead."""


class NoStream(Exception):
    """The call was not sent on a stream (none open, or the worker drains):
    it goes as a unary call instead."""


class _Requests:
    """The request side of one stream. grpcio's thread takes the messages in
    order, those put with put_first (the acks) ahead of the rest, and
    half-closes the stream at close(), once it took what was put before;
    when none came for STREAM_HEARTBEAT_INTERVAL it takes a heartbeat
    instead. grpcio asks for the next message only once the last one was
    sent, so heartbeats never queue up behind a send held back by flow
    control."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._first: deque[pb.WorkRequest] = deque()
        self._rest: deque[pb.WorkRequest] = deque()
        self._closed = False

    def put(self, m: pb.WorkRequest) -> bool:
        """Queues m; False once closed (it is not sent)."""
        return self._put(self._rest, m)

    def put_first(self, m: pb.WorkRequest) -> bool:
        """Queues m ahead of every message waiting but those put first; False
        once closed (it is not sent)."""
        return self._put(self._first, m)

    def _put(self, q: deque[pb.WorkRequest], m: pb.WorkRequest) -> bool:
        with self._cv:
            if self._closed:
                return False
            q.append(m)
            self._cv.notify()
            return True

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def __iter__(self) -> _Requests:
        return self

    def __next__(self) -> pb.WorkRequest:
        idle = time.monotonic() + STREAM_HEARTBEAT_INTERVAL
        with self._cv:
            while True:
                if self._first:
                    return self._first.popleft()
                if self._rest:
                    return self._rest.popleft()
                if self._closed:
                    raise StopIteration
                left = idle - time.monotonic()
                if left <= 0:
                    return _heartbeat()
                self._cv.wait(left)


class _Pending:
    """A call waiting for its reply; set under the session's lock."""

    __slots__ = ("done", "reply", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: Optional[pb.WorkReply] = None
        self.error: Optional[BaseException] = None


class _Stream:
    """One open stream: its requests, the call, the calls waiting for their replies."""

    def __init__(self, requests: _Requests, call: Any) -> None:
        self.requests = requests
        self.call = call
        self.pending: dict[int, _Pending] = {}
        self.half_closed = False
        self.timer: Optional[threading.Timer] = None


class WorkSession:
    """A Worker's stream to the coordinator. It keeps the count of free slots
    the coordinator may fill (credits): a new stream opens with all of them, a
    grant uses one per job, a finished job (freed) gives one back; a grant it
    cannot acknowledge (read after the half-close) uses none.

    ``start`` is what each stream opens with (worker, provider, lease); the
    session sets its credits and that it acknowledges its grants. ``slots``
    is the worker's concurrency, all free at first."""

    def __init__(self, client: Client, start: pb.WorkStart, slots: int, hooks: SessionHooks) -> None:
        self._stub = client.stub  # the generated stub: Work itself is never wrapped
        self._metadata = client._metadata
        self._start = start
        self._hooks = hooks
        self._lock = threading.Lock()
        self._stream: Optional[_Stream] = None  # None while none is open
        self._free = slots  # slots running no job
        self._closing = False  # the worker stops: no more streams, calls go unary
        self._next_id = 0

    def serve(self) -> Optional[bool]:
        """Opens one stream with every free slot as credits and reads it
        until it ends: each grant is acknowledged, then its jobs go to
        hooks.granted; each retry_after to hooks.retry_after. Whether anything
        came on it; None when nothing was opened (after close_send). Raises
        how it ended, decoded (StreamUnsupported when the coordinator has no
        Work: claim with Claim calls for good); nothing after a clean end,
        such as the end that follows close_send (every call sent answered,
        every grant in flight received and left unstarted)."""
        st = self._open()
        if st is None:
            return None
        return self._receive(st)

    def _open(self) -> Optional[_Stream]:
        """Opens a stream with every free slot as credits; None once the worker stops."""
        md = self._metadata()  # asked per stream, as per call
        with self._lock:
            if self._closing:
                return None
            start = pb.WorkStart()
            start.CopyFrom(self._start)
            start.credits = max(self._free, 0)
            start.acknowledges = True
            requests = _Requests()
            requests.put(pb.WorkRequest(start=start))
            try:
                call = self._stub.Work(requests, metadata=md)
            except BaseException:
                requests.close()
                raise
            st = _Stream(requests, call)
            self._stream = st
        self._hooks.log.debug("worker stream opened", extra={"credits": start.credits})
        return st

    def _receive(self, st: _Stream) -> bool:
        """Reads st until it ends: grants are acknowledged and handed to
        hooks.granted, replies to their calls; at the end the calls still
        waiting are answered UNAVAILABLE (safe to repeat, R21). Whether
        anything came; raises how it ended (StreamUnsupported when the
        coordinator has no Work), nothing after a clean end."""
        hooks = self._hooks
        delivered = False
        end: Optional[grpc.RpcError] = None
        try:
            for m in st.call:
                delivered = True
                kind = m.WhichOneof("kind")
                if kind == "grant":
                    received = time.monotonic()
                    jobs = list(m.grant.jobs)
                    if not jobs:
                        continue
                    with self._lock:
                        # The ack goes first, ahead of calls and credits
                        # waiting to be sent and before a job takes a slot:
                        # the coordinator hands back what is not acknowledged
                        # within 5 s. After the half-close none can go.
                        acked = not (self._closing or st.half_closed) and self._acknowledge(st, jobs)
                        if acked:
                            self._free -= len(jobs)
                    if not acked:
                        # The coordinator hands these back when the stream
                        # ends; a handler started on one would run on a grant
                        # already ended (R25). They never took a slot.
                        hooks.log.info("grants read after the stream's half-close left unstarted; the coordinator "
                                       "hands them back",
                                       extra={"jobs": len(jobs), "job_ids": [j.job.id for j in jobs]})
                        continue
                    hooks.granted([claimed_of(j, received) for j in jobs])
                elif kind == "reply":
                    with self._lock:
                        p = st.pending.pop(int(m.reply.call_id), None)
                        if p is not None:
                            p.reply = m.reply
                            p.done.set()
                elif kind == "retry_after":
                    ra = m.retry_after
                    hooks.retry_after(int(ra.seconds) + int(ra.nanos) / 1e9)
        except grpc.RpcError as e:
            end = e
        finally:
            self._ended(st, end)
        if end is None:
            return delivered
        if _code(end) == grpc.StatusCode.UNIMPLEMENTED:
            raise StreamUnsupported()
        raise decode_error(end)

    @staticmethod
    def _acknowledge(st: _Stream, jobs: list[pb.ClaimedJob]) -> bool:
        """Queues the WorkAck of one grant's jobs (at most 100: one message)
        ahead of everything waiting to be sent; False once the stream takes
        nothing more."""
        for i in range(0, len(jobs), MAX_ACK_GRANTS):
            refs = [pb.GrantRef(job_id=j.job.id, attempt=j.attempt, lease_token=j.lease_token)
                    for j in jobs[i:i + MAX_ACK_GRANTS]]
            if not st.requests.put_first(pb.WorkRequest(ack=pb.WorkAck(grants=refs))):
                return False
        return True

    def _ended(self, st: _Stream, end: Optional[grpc.RpcError]) -> None:
        why = "closed by the coordinator" if end is None else str(decode_error(end))
        with self._lock:
            if self._stream is st:
                self._stream = None
            for p in st.pending.values():
                p.error = UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                           f"jobfence: worker stream ended before the answer: {why}")
                p.done.set()
            st.pending = {}
            if st.timer is not None:
                st.timer.cancel()
        st.requests.close()  # frees grpcio's thread, which may wait on the queue
        st.call.cancel()  # a no-op once the call ended; else it ends it

    def freed(self) -> None:
        """Gives a slot back: one credit more for the coordinator."""
        with self._lock:
            self._free += 1
            st = self._stream
            if st is None or self._closing or st.half_closed:
                return  # the next stream opens with it
            st.requests.put(pb.WorkRequest(credit=pb.WorkCredit(credits=1)))

    def close_send(self, drain_timeout: float) -> None:
        """Half-closes the stream when the worker stops: no more grants;
        those in flight still arrive and are not started (they can no longer
        be acknowledged: the coordinator hands them back), every call sent is
        answered, then the coordinator ends the stream. Calls from now on go as unary calls. A
        stream still open drain_timeout seconds later is cancelled (its calls are
        answered UNAVAILABLE and repeated as unary calls)."""
        with self._lock:
            self._closing = True
            st = self._stream
            if st is None or st.half_closed:
                return
            st.half_closed = True
            st.requests.close()
            st.timer = threading.Timer(drain_timeout, self._give_up, args=(st, drain_timeout))
            st.timer.daemon = True
            st.timer.start()

    def _give_up(self, st: _Stream, drain_timeout: float) -> None:
        with self._lock:
            if self._stream is not st:
                return
        self._hooks.log.warning("worker stream still open after the half-close; cancelling it",
                                extra={"drain_timeout": drain_timeout})
        st.call.cancel()

    def call(self, c: pb.WorkCall, timeout: Optional[float]) -> pb.WorkReply:
        """Sends c on the stream and waits up to timeout seconds for its
        reply. Raises NoStream when no stream takes calls; UnavailableError
        when the stream ended before the reply; DeadlineExceededError after
        timeout; the reply's error, decoded as the unary call's."""
        p = _Pending()
        with self._lock:
            st = self._stream
            if st is None or self._closing or st.half_closed:
                raise NoStream()
            self._next_id += 1
            c.call_id = self._next_id
            st.pending[c.call_id] = p
            st.requests.put(pb.WorkRequest(call=c))
        if not p.done.wait(timeout):
            with self._lock:
                st.pending.pop(c.call_id, None)
                answered = p.done.is_set()
            if not answered:
                raise DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                            f"jobfence: no answer on the worker stream within {timeout:g}s")
        if p.error is not None:
            raise p.error
        assert p.reply is not None
        if p.reply.error:
            raise decode_rpc_status(bytes(p.reply.error))
        return p.reply


class StreamStub:
    """The Worker's view of the coordinator: the generated stub, but for
    write-backs, renewals and receipts, which go on the worker stream when
    one is open (STREAM_CALLS). Their answers and errors are the unary
    calls', so the Client calls through it as through the stub."""

    def __init__(self, stub: Any, session: WorkSession) -> None:
        self._stub = stub
        self._session = session
        for method, fld in STREAM_CALLS.items():
            setattr(self, method, self._on_stream(method, fld))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    def _on_stream(self, method: str, fld: str) -> Callable[..., Any]:
        unary = getattr(self._stub, method)

        def call(req: Any, timeout: Optional[float] = None, metadata: Any = None) -> Any:
            c = pb.WorkCall(**{fld: req})
            # R35: the trace context of the span current in this thread, in
            # the call itself: one stream carries many jobs' calls, and its
            # metadata is the stream's.
            traced = trace_headers()
            if traced is not None:
                c.traceparent, c.tracestate = traced
            try:
                reply = self._session.call(c, timeout)
            except NoStream:
                return unary(req, timeout=timeout, metadata=metadata)
            if reply.WhichOneof("result") != fld:
                raise CoordinatorError(grpc.StatusCode.INTERNAL,
                                       f"jobfence: the worker stream answered a {method} without its response")
            return getattr(reply, fld)

        return call


def _code(e: grpc.RpcError) -> Optional[grpc.StatusCode]:
    call: Any = e
    try:
        return call.code()
    except Exception:  # noqa: BLE001
        return None
