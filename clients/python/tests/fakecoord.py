"""An in-process gRPC server implementing jobfence.v1.Coordinator with
scripted answers: each method answers from a queue of responses and
errors, records every request and its metadata, and sends errors the way
the coordinator does, a google.rpc.Status with an ErrorInfo (and a
BadRequest) in the grpc-status-details-bin trailer (R24).

The worker stream (Work) is served only with ``FakeCoordinator(stream=True)``;
without it Work is UNIMPLEMENTED, as from a coordinator that predates it, and
a Worker falls back to Claim calls. On a stream the calls answer from the
same scripts as the unary calls, their errors as the WorkReply's serialized
status; the test grants jobs and ends streams by hand (FakeStream). With
``answer_stream_calls=False`` the calls on a stream are only recorded, and
the test answers each itself (FakeStream.send), as a transcript does; the
unary calls of the methods in ``held`` wait for the test's answer
(FakeCoordinator.reply)."""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict, deque
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import grpc

from jobfence._rpc import error_details_pb2, status_pb2
from jobfence.v1 import coordinator_pb2 as pb
from jobfence.v1 import coordinator_pb2_grpc as pb_grpc

METHODS = [
    "EnqueueRefund", "Claim", "Complete", "Reschedule", "Escalate", "RenewLeases", "ReportObservation",
    "GetJob", "ListJobs", "ResolveReview", "WhoAmI", "GetOverview",
]


def claimed(job_id: int, attempt: int = 1, action: int = pb.NEXT_ACTION_REFUND) -> pb.ClaimedJob:
    """A grant of job job_id at provider "acme", its lease token tok-<job_id>,
    to script as a Claim answer or a stream's grant."""
    c = pb.ClaimedJob(job=pb.Job(id=job_id, operation_key=f"op-{job_id}", provider="acme"), attempt=attempt,
                      next_action=action, lease_token=f"tok-{job_id}")
    c.claimed_at.FromSeconds(1_900_000_000)
    c.lease_until.FromSeconds(1_900_000_030)
    return c


@dataclass
class Fail:
    """A scripted error: code, reason (empty: no ErrorInfo), metadata, field violations."""

    code: grpc.StatusCode
    reason: str = ""
    message: str = "scripted"
    metadata: dict[str, str] = field(default_factory=dict)
    violations: list[tuple[str, str]] = field(default_factory=list)
    domain: str = "jobfence"


@dataclass
class Cut:
    """On a worker stream: the call is taken and never answered, and the
    stream ends with this code. As a unary answer, an error of that code."""

    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    message: str = "stream cut"


@dataclass
class Sleep:
    """Answer after this many seconds (to run past the caller's deadline)."""

    seconds: float
    then: Any = None


def status_details(f: Fail) -> bytes:
    st = status_pb2.Status(code=f.code.value[0], message=f.message)
    if f.reason:
        st.details.add().Pack(error_details_pb2.ErrorInfo(reason=f.reason, domain=f.domain, metadata=f.metadata))
    if f.violations:
        br = error_details_pb2.BadRequest()
        for fld, desc in f.violations:
            br.field_violations.add(field=fld, description=desc)
        st.details.add().Pack(br)
    return bytes(st.SerializeToString())


_OK = object()  # a FakeStream's clean end


class FakeStream:
    """One worker stream as the fake serves it: every request the worker
    sent (the WorkStart first), and what the test sends it."""

    def __init__(self, metadata: dict[str, str]) -> None:
        self.metadata = metadata
        self.requests: list[pb.WorkRequest] = []
        self.times: list[float] = []  # when each request came, by time.monotonic()
        self.half_closed = threading.Event()  # the worker's request side ended
        self.ended = threading.Event()
        self._out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._cv = threading.Condition()

    @property
    def start(self) -> pb.WorkStart:
        return self.requests[0].start

    def credits(self) -> list[int]:
        """The credits given back, in order (WorkStart's and heartbeats not included)."""
        with self._cv:
            return [r.credit.credits for r in self.requests
                    if r.WhichOneof("kind") == "credit" and r.credit.credits != 0]

    def heartbeats(self) -> list[float]:
        """When each heartbeat (a WorkCredit of 0 credits) came, by time.monotonic()."""
        with self._cv:
            return [t for r, t in zip(self.requests, self.times)
                    if r.WhichOneof("kind") == "credit" and r.credit.credits == 0]

    def calls(self) -> list[pb.WorkCall]:
        with self._cv:
            return [r.call for r in self.requests if r.WhichOneof("kind") == "call"]

    def grant(self, *jobs: pb.ClaimedJob) -> None:
        self._out.put(pb.WorkResponse(grant=pb.WorkGrant(jobs=jobs)))

    def retry_after(self, seconds: float) -> None:
        m = pb.WorkResponse()
        m.retry_after.FromNanoseconds(int(seconds * 1e9))
        self._out.put(m)

    def send(self, m: pb.WorkResponse) -> None:
        """Sends m on the stream."""
        self._out.put(m)

    def end(self, code: Optional[grpc.StatusCode] = None, message: str = "scripted end") -> None:
        """Ends the stream: cleanly, or with code."""
        self._out.put(_OK if code is None else Cut(code, message))

    def _got(self, r: pb.WorkRequest) -> None:
        with self._cv:
            self.requests.append(r)
            self.times.append(time.monotonic())
            self._cv.notify_all()

    def wait_for(self, pred: Callable[[FakeStream], bool], what: str, timeout: float = 10) -> None:
        with self._cv:
            if not self._cv.wait_for(lambda: pred(self), timeout):
                raise TimeoutError(f"no {what} within {timeout}s: {self.requests}")


class FakeCoordinator:
    def __init__(self, stream: bool = False, answer_stream_calls: bool = True) -> None:
        self.script: dict[str, deque[Any]] = defaultdict(deque)
        self.calls: dict[str, list[tuple[Any, dict[str, str]]]] = defaultdict(list)
        self.via: dict[str, list[str]] = defaultdict(list)  # "unary" or "stream", by call
        self.unary: list[tuple[str, Any]] = []  # every unary call, method and request, in order
        self.serve_stream = stream
        self.answer_stream_calls = answer_stream_calls
        #: Methods whose unary calls wait for reply(), oldest first.
        self.held: set[str] = set()
        self._waiting: dict[str, deque[queue.SimpleQueue[Any]]] = defaultdict(deque)
        self.streams: list[FakeStream] = []
        #: What a stream does when the worker half-closes it: by default it ends cleanly.
        self.on_half_close: Any = lambda st: st.end()
        self.lock = threading.Lock()
        self._streams_cv = threading.Condition(self.lock)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((_Handler(self),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def answer(self, method: str, *answers: Any) -> None:
        with self.lock:
            self.script[method].extend(answers)

    def count(self, method: str, via: str = "") -> int:
        """The calls of method; via "unary" or "stream": only those."""
        with self.lock:
            return len([v for v in self.via[method] if not via or v == via])

    def stream(self, i: int, timeout: float = 10) -> FakeStream:
        """The i-th worker stream (from 0), once its WorkStart came."""
        with self._streams_cv:
            if not self._streams_cv.wait_for(lambda: len(self.streams) > i and self.streams[i].requests, timeout):
                raise TimeoutError(f"no worker stream {i} within {timeout}s ({len(self.streams)} opened)")
            return self.streams[i]

    def reply(self, method: str, answer: Any) -> None:
        """Answers the oldest unary call of a held method still waiting."""
        with self.lock:
            assert self._waiting[method], f"no {method} call waits for an answer"
            q = self._waiting[method].popleft()
        q.put(answer)

    def stop(self) -> None:
        with self.lock:
            waiting = [q for qs in self._waiting.values() for q in qs]
            self._waiting.clear()
        for q in waiting:
            q.put(Fail(grpc.StatusCode.UNAVAILABLE, message="the scripted coordinator stopped"))
        self.server.stop(0)

    def _next(self, method: str, request: Any, md: dict[str, str], via: str) -> Any:
        with self.lock:
            self.calls[method].append((request, md))
            self.via[method].append(via)
            held: Optional[queue.SimpleQueue[Any]] = None
            if via == "unary":
                self.unary.append((method, request))
                if method in self.held:
                    held = queue.SimpleQueue()
                    self._waiting[method].append(held)
            nxt = self.script[method].popleft() if self.script[method] and held is None else None
        if held is not None:
            nxt = held.get()
        if isinstance(nxt, Sleep):
            time.sleep(nxt.seconds)
            nxt = nxt.then
        if nxt is None:
            nxt = getattr(pb, method + "Response")()
        return nxt

    def handle(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        nxt = self._next(method, request, {k: v for k, v in context.invocation_metadata()}, "unary")
        if isinstance(nxt, Cut):
            nxt = Fail(nxt.code, message=nxt.message)
        if isinstance(nxt, Fail):
            context.set_trailing_metadata((("grpc-status-details-bin", status_details(nxt)),))
            context.abort(nxt.code, nxt.message)
        return nxt

    def work(self, requests: Any, context: grpc.ServicerContext) -> Any:
        """Serves one worker stream: a thread reads the worker's messages and
        answers its calls from the scripts; this generator sends."""
        st = FakeStream({k: v for k, v in context.invocation_metadata()})
        with self._streams_cv:
            self.streams.append(st)
            self.calls["Work"].append((None, st.metadata))
            self.via["Work"].append("stream")

        def read() -> None:
            try:
                for r in requests:
                    st._got(r)
                    with self._streams_cv:
                        self._streams_cv.notify_all()
                    if r.WhichOneof("kind") != "call" or not self.answer_stream_calls:
                        continue
                    kind = str(r.call.WhichOneof("call"))
                    method = "".join(w.capitalize() for w in kind.split("_"))
                    nxt = self._next(method, getattr(r.call, kind), st.metadata, "stream")
                    if isinstance(nxt, Cut):
                        st._out.put(nxt)
                        return
                    reply = pb.WorkReply(call_id=r.call.call_id)
                    if isinstance(nxt, Fail):
                        reply.error = status_details(nxt)
                    else:
                        getattr(reply, kind).CopyFrom(nxt)
                    st._out.put(pb.WorkResponse(reply=reply))
            except Exception:  # noqa: BLE001 - the stream was cancelled
                st._out.put(_OK)
                return
            st.half_closed.set()
            self.on_half_close(st)

        threading.Thread(target=read, daemon=True).start()
        try:
            while True:
                m = st._out.get()
                if m is _OK:
                    return
                if isinstance(m, Cut):
                    context.abort(m.code, m.message)
                yield m
        finally:
            st.ended.set()


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, fake: FakeCoordinator) -> None:
        self.fake = fake

    def service(self, details: Any) -> Optional[grpc.RpcMethodHandler]:
        name = details.method.rsplit("/", 1)[-1]
        fake = self.fake
        if name == "Work":
            if not fake.serve_stream:
                with fake.lock:
                    fake.calls["Work"].append((None, {}))
                    fake.via["Work"].append("unimplemented")
                return None  # UNIMPLEMENTED: a coordinator without the worker stream
            return grpc.stream_stream_rpc_method_handler(
                fake.work, request_deserializer=pb.WorkRequest.FromString,
                response_serializer=lambda m: m.SerializeToString())
        if name not in METHODS:
            return None
        req_cls = getattr(pb, name + "Request")
        return grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: fake.handle(name, req, ctx),
            request_deserializer=req_cls.FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )


_ = pb_grpc  # the generated stub is what the Client calls through
