"""An in-process gRPC server implementing jobfence.v1.Coordinator with
scripted answers: each method answers from a queue of responses and
errors, records every request and its metadata, and sends errors the way
the coordinator does, a google.rpc.Status with an ErrorInfo (and a
BadRequest) in the grpc-status-details-bin trailer (R24)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Optional

import grpc

from jobfence._rpc import error_details_pb2, status_pb2
from jobfence.v1 import coordinator_pb2 as pb
from jobfence.v1 import coordinator_pb2_grpc as pb_grpc

METHODS = [
    "EnqueueRefund", "Claim", "Complete", "Reschedule", "Escalate", "RenewLeases", "ReportObservation",
    "GetJob", "ListJobs", "ResolveReview", "WhoAmI", "GetOverview",
]


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


class FakeCoordinator:
    def __init__(self) -> None:
        self.script: dict[str, deque[Any]] = defaultdict(deque)
        self.calls: dict[str, list[tuple[Any, dict[str, str]]]] = defaultdict(list)
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((_Handler(self),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def answer(self, method: str, *answers: Any) -> None:
        with self.lock:
            self.script[method].extend(answers)

    def count(self, method: str) -> int:
        with self.lock:
            return len(self.calls[method])

    def stop(self) -> None:
        self.server.stop(0)

    def handle(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        with self.lock:
            self.calls[method].append((request, {k: v for k, v in context.invocation_metadata()}))
            nxt = self.script[method].popleft() if self.script[method] else None
        if isinstance(nxt, Sleep):
            time.sleep(nxt.seconds)
            nxt = nxt.then
        if isinstance(nxt, Fail):
            context.set_trailing_metadata((("grpc-status-details-bin", status_details(nxt)),))
            context.abort(nxt.code, nxt.message)
        if nxt is None:
            nxt = getattr(pb, method + "Response")() if method not in ("WhoAmI",) else pb.WhoAmIResponse()
        return nxt


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, fake: FakeCoordinator) -> None:
        self.fake = fake

    def service(self, details: Any) -> Optional[grpc.RpcMethodHandler]:
        name = details.method.rsplit("/", 1)[-1]
        if name not in METHODS:
            return None
        req_cls = getattr(pb, name + "Request")
        fake = self.fake
        return grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: fake.handle(name, req, ctx),
            request_deserializer=req_cls.FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )


_ = pb_grpc  # the generated stub is what the Client calls through
