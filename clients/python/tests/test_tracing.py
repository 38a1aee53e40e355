"""R35 in the Python SDK: a Worker against the scripted coordinator
(fakecoord), granted one job whose enqueue carried a trace context. With
the OpenTelemetry stand-in (tests/otel_standin: the real API's names,
recording spans in memory) the attempt span, its link, attributes and
outcome are checked, and the trace context every call carries: WorkCall
fields on the worker stream, metadata on unary calls. Without OpenTelemetry
nothing is traced and no call carries a trace context, while the handler
still sees the enqueue's.

What only a real opentelemetry-api/-sdk install shows (README, "Tracing"):
that the real API behaves as the stand-in does, and the example worker's
exporter set-up."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import grpc
import pytest

from jobfence import Client, HandlerContext, Result, RetryPolicy, Worker, WorkerOptions
from jobfence import tracing
from jobfence.types import ClaimedJob
from jobfence.v1 import coordinator_pb2 as pb

from fakecoord import Fail, FakeCoordinator
from harness import eventually

STANDIN = str(Path(__file__).resolve().parent / "otel_standin")
GRANT_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
GRANT_TRACESTATE = "vendor=opaque,other=1"
TOKEN = "tok-secret-0123456789ab"  # the grant's lease token: never in a span (R25)
STALE = Fail(grpc.StatusCode.FAILED_PRECONDITION, "STALE_ATTEMPT",
             metadata={"job_id": "7", "attempt": "1", "current_attempt": "2"})


def _forget_otel() -> None:
    for name in list(sys.modules):
        if name == "opentelemetry" or name.startswith("opentelemetry.") or name == "standin_sdk":
            del sys.modules[name]
    tracing._reset()


@pytest.fixture
def otel() -> Iterator[Any]:
    """The stand-in on sys.path: `import opentelemetry` finds it."""
    _forget_otel()
    sys.path.insert(0, STANDIN)
    import standin_sdk

    yield standin_sdk
    sys.path.remove(STANDIN)
    _forget_otel()


@pytest.fixture
def no_otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OpenTelemetry at all: `import opentelemetry` fails, whatever is installed."""
    _forget_otel()
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # type: ignore[arg-type]
    yield
    monkeypatch.delitem(sys.modules, "opentelemetry")
    _forget_otel()


def granted(traceparent: str = GRANT_TRACEPARENT, lease: float = 60.0) -> pb.ClaimedJob:
    """Job 7, attempt 1, granted now with lease seconds, its enqueue's trace context unless traceparent is ""."""
    c = pb.ClaimedJob(job=pb.Job(id=7, operation_key="op-traced", provider="acme", traceparent=traceparent),
                      attempt=1, next_action=pb.NEXT_ACTION_REFUND, lease_token=TOKEN,
                      traceparent=traceparent, tracestate=GRANT_TRACESTATE)
    now = time.time_ns()
    c.claimed_at.FromNanoseconds(now)
    c.lease_until.FromNanoseconds(now + int(lease * 1e9))
    return c


class Seen:
    """What the handler saw."""

    def __init__(self) -> None:
        self.current: Any = None  # the span context current in the handler's thread
        self.ctx: Optional[HandlerContext] = None
        self.job: Optional[ClaimedJob] = None


def run(fake: FakeCoordinator, handler: Callable[[ClaimedJob, HandlerContext], Result], *, stream: bool = True,
        provider: Any = None, lease: float = 60.0, traceparent: str = GRANT_TRACEPARENT) -> Seen:
    """Runs a Worker until its one job is written back (and its receipt filed), then stops it."""
    seen = Seen()
    done = threading.Event()

    class H:
        def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
            if tracing.otel_available():
                from opentelemetry import trace

                seen.current = trace.get_current_span().get_span_context()
            seen.ctx, seen.job = ctx, job
            return handler(job, ctx)

        def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
            return self.refund(job, ctx)

    def on_event(e: Any) -> None:
        if e.kind.value in ("written", "write_failed", "observed", "observe_failed"):
            done.set()

    job = granted(traceparent, lease)
    if not stream:
        fake.answer("Claim", pb.ClaimResponse(jobs=[job]))
    client = Client(fake.address, retry=RetryPolicy(attempts=1, backoff=0.01), call_timeout=5)
    w = Worker(client, H(), WorkerOptions(worker_id="w-trace", receipt_spool="off", tracer_provider=provider,
                                          no_stream=not stream, poll_interval=0.05, on_event=on_event))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        if stream:
            fake.stream(0).grant(job)
        assert done.wait(10), "the job was not written back"
        # The attempt span ends right after: wait for it where spans are recorded.
        recorder = provider
        if recorder is None and tracing.otel_available():
            from opentelemetry import trace

            recorder = trace.get_tracer_provider()
        if hasattr(recorder, "ended"):
            eventually(lambda: recorder.ended(tracing.ATTEMPT_SPAN_NAME), what="the attempt span's end")
    finally:
        w.stop()
        t.join(30)
        client.close()
    assert not t.is_alive()
    return seen


def calls_of(fake: FakeCoordinator) -> list[tuple[str, bool, str, str]]:
    """Every call for the job: (method, on the stream, traceparent, tracestate)."""
    out: list[tuple[str, bool, str, str]] = []
    with fake.lock:
        for method, calls in fake.calls.items():
            for (req, md), via in zip(calls, fake.via[method]):
                if method in ("Work", "Claim"):
                    if method == "Claim":
                        out.append((method, False, md.get("traceparent", ""), md.get("tracestate", "")))
                    continue
                if via == "unary":
                    out.append((method, False, md.get("traceparent", ""), md.get("tracestate", "")))
    for st in fake.streams:
        for c in st.calls():
            kind = str(c.WhichOneof("call"))
            out.append(("".join(w.capitalize() for w in kind.split("_")), True, c.traceparent, c.tracestate))
    return out


def attempt_span(provider: Any) -> Any:
    spans = provider.ended(tracing.ATTEMPT_SPAN_NAME)
    assert len(spans) == 1, [s.name for s in provider.ended()]
    return spans[0]


def check_attempt_span(s: Any, outcome: str, error_type: Optional[str]) -> None:
    from opentelemetry import trace

    assert s.kind is trace.SpanKind.CONSUMER
    assert s.parent is None, "the attempt span is a root, linked to the enqueue (R35)"
    assert len(s.links) == 1
    link = s.links[0]
    assert f"{link.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert f"{link.context.span_id:016x}" == "00f067aa0ba902b7"
    assert int(link.context.trace_flags) == 1
    assert link.context.trace_state.to_header() == GRANT_TRACESTATE
    assert link.attributes == {"jobfence.link": "enqueue"}
    want = {
        "messaging.system": "jobfence", "messaging.operation.type": "process", "messaging.operation.name": "attempt",
        "messaging.destination.name": "acme", "messaging.message.id": "7", "jobfence.job.id": 7,
        "jobfence.attempt": 1, "jobfence.provider": "acme", "jobfence.next_action": "refund",
        "jobfence.takeover": False, "jobfence.cancel_requested": False, "jobfence.worker_id": "w-trace",
        "jobfence.outcome": outcome, "jobfence.operation_key": "op-traced",
    }
    for k, v in want.items():
        assert s.attributes.get(k) == v, (k, s.attributes.get(k), v)
    if error_type is None:
        assert s.status.status_code is not trace.StatusCode.ERROR
    else:
        assert s.status.status_code is trace.StatusCode.ERROR
        assert s.attributes.get("error.type") == error_type
    assert TOKEN not in json.dumps(s.to_json()), "the lease token is in the span (R25)"


def check_calls(calls: list[tuple[str, bool, str, str]], s: Any, on_stream: bool, *methods: str) -> None:
    sc = s.get_span_context()
    want = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-01"
    for method, stream, tp, _ in calls:
        if method == "Claim":
            assert tp == "", "a Claim is made in no span"
            continue
        assert tp == want, (method, stream, tp, want)
        assert stream == on_stream, (method, stream, calls)
    for m in methods:
        assert any(c[0] == m for c in calls), (m, calls)


def test_attempt_span_linked_to_enqueue_and_carried_by_work_calls_R35(otel: Any) -> None:
    provider = otel.RecordingTracerProvider()
    fake = FakeCoordinator(stream=True)
    try:
        seen = run(fake, lambda job, ctx: (ctx.wait(0.25), Result.succeeded("re_1"))[1], provider=provider, lease=0.3)
        s = attempt_span(provider)
        check_attempt_span(s, "completed", None)
        assert s.attributes["jobfence.result"] == "succeeded"
        assert s.attributes["jobfence.writeback.replayed"] is False
        sc = s.get_span_context()
        assert seen.current is not None and seen.current.span_id == sc.span_id, "the span is current in the handler"
        assert seen.ctx is not None and seen.ctx.traceparent == f"00-{sc.trace_id:032x}-{sc.span_id:016x}-01"
        check_calls(calls_of(fake), s, True, "Complete", "RenewLeases")
    finally:
        fake.stop()


def test_attempt_span_carried_by_unary_call_metadata_R35(otel: Any) -> None:
    provider = otel.RecordingTracerProvider()
    fake = FakeCoordinator(stream=False)
    try:
        run(fake, lambda job, ctx: (ctx.wait(0.25), Result.escalate("a person must look"))[1], stream=False,
            provider=provider, lease=0.3)
        s = attempt_span(provider)
        check_attempt_span(s, "escalated", None)
        check_calls(calls_of(fake), s, False, "Escalate", "RenewLeases")
    finally:
        fake.stop()


def test_attempt_span_records_stale_write_back_R35(otel: Any) -> None:
    provider = otel.RecordingTracerProvider()
    fake = FakeCoordinator(stream=True)
    fake.answer("Complete", STALE)
    try:
        run(fake, lambda job, ctx: Result.succeeded("re_1"), provider=provider)
        s = attempt_span(provider)
        check_attempt_span(s, "stale", "STALE_ATTEMPT")
        check_calls(calls_of(fake), s, True, "Complete", "ReportObservation")
    finally:
        fake.stop()


def test_attempt_span_records_grant_lost_R35(otel: Any) -> None:
    provider = otel.RecordingTracerProvider()
    fake = FakeCoordinator(stream=True)
    fake.answer("RenewLeases", pb.RenewLeasesResponse(renewals=[pb.LeaseRenewal(
        job_id=7, attempt=1, refused=pb.ERROR_REASON_STALE_ATTEMPT, message="taken over",
        metadata={"job_id": "7", "attempt": "1", "current_attempt": "2"})]))
    fake.answer("Complete", STALE)

    def handler(job: ClaimedJob, ctx: HandlerContext) -> Result:
        assert ctx.wait(5), "the grant was not lost"
        assert ctx.grant_lost is not None
        return Result.succeeded("re_1")  # a request already sent: its answer is filed (R15)

    try:
        run(fake, handler, provider=provider, lease=0.3)
        s = attempt_span(provider)
        check_attempt_span(s, "grant_lost", "grant_lost")
        check_calls(calls_of(fake), s, True, "RenewLeases", "Complete", "ReportObservation")
    finally:
        fake.stop()


def test_attempt_span_records_handler_failure_R35(otel: Any) -> None:
    provider = otel.RecordingTracerProvider()
    fake = FakeCoordinator(stream=True)

    def handler(job: ClaimedJob, ctx: HandlerContext) -> Result:
        raise ConnectionResetError("connection reset")

    try:
        run(fake, handler, provider=provider)
        s = attempt_span(provider)
        check_attempt_span(s, "rescheduled", "handler_error")
        assert s.attributes["jobfence.result"] == "unknown"
    finally:
        fake.stop()


def test_attempt_span_without_enqueue_context_R35(otel: Any) -> None:
    provider = otel.RecordingTracerProvider()
    fake = FakeCoordinator(stream=True)
    try:
        run(fake, lambda job, ctx: Result.succeeded("re_1"), provider=provider, traceparent="")
        s = attempt_span(provider)
        assert s.links == []
        check_calls(calls_of(fake), s, True, "Complete")
    finally:
        fake.stop()


def test_global_provider_used_when_set_R35(otel: Any) -> None:
    from opentelemetry import trace

    provider = otel.RecordingTracerProvider()
    trace.set_tracer_provider(provider)
    fake = FakeCoordinator(stream=True)
    try:
        run(fake, lambda job, ctx: Result.succeeded("re_1"))
        check_attempt_span(attempt_span(provider), "completed", None)
    finally:
        fake.stop()


@pytest.mark.parametrize("stream", [True, False])
def test_no_tracer_provider_sends_no_trace_context_R35(otel: Any, stream: bool) -> None:
    # OpenTelemetry's API installed, no provider set: its no-op spans.
    fake = FakeCoordinator(stream=stream)
    try:
        seen = run(fake, lambda job, ctx: (ctx.wait(0.25), Result.succeeded("re_1"))[1], stream=stream, lease=0.3)
        assert seen.current is not None and not seen.current.is_valid
        assert seen.ctx is not None and seen.ctx.traceparent is None
        calls = calls_of(fake)
        assert len(calls) >= 2, calls
        assert all(tp == "" and ts == "" for _, _, tp, ts in calls), calls
    finally:
        fake.stop()


@pytest.mark.parametrize("stream", [True, False])
def test_without_opentelemetry_nothing_traced_enqueue_context_handed_over_R35(no_otel: None, stream: bool) -> None:
    assert not tracing.otel_available()
    fake = FakeCoordinator(stream=stream)
    try:
        seen = run(fake, lambda job, ctx: (ctx.wait(0.25), Result.succeeded("re_1"))[1], stream=stream, lease=0.3)
        assert seen.ctx is not None and seen.ctx.trace_context is None and seen.ctx.traceparent is None
        # The enqueue's trace context, for a handler that propagates it itself.
        assert seen.job is not None and seen.job.traceparent == GRANT_TRACEPARENT
        assert seen.job.tracestate == GRANT_TRACESTATE
        calls = calls_of(fake)
        assert len(calls) >= 2, calls
        assert all(tp == "" and ts == "" for _, _, tp, ts in calls), calls
    finally:
        fake.stop()


def test_renewal_context_R35(otel: Any) -> None:
    from opentelemetry import trace

    from jobfence.types import claimed_of

    provider = otel.RecordingTracerProvider()
    tr = tracing.Tracing(provider, "w")
    c = claimed_of(granted(), time.monotonic())
    a1, a2 = tr.start(c), tr.start(c)
    with tr.renewing([a1.context]):
        assert trace.get_current_span().get_span_context().span_id == trace.get_current_span(
            a1.context).get_span_context().span_id
    with tr.renewing([a1.context, a2.context]):
        renew = trace.get_current_span().get_span_context()
    spans = provider.ended(tracing.RENEW_SPAN_NAME)
    assert len(spans) == 1 and spans[0].get_span_context().span_id == renew.span_id
    assert [l.context.span_id for l in spans[0].links] == [
        trace.get_current_span(a.context).get_span_context().span_id for a in (a1, a2)]


def test_grant_link_ignores_malformed_traceparent_R35(otel: Any) -> None:
    for tp in ["", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
               "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
               "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]:
        assert tracing.grant_link(tp, "") is None, tp
    link = tracing.grant_link(GRANT_TRACEPARENT, "")
    assert link is not None and link.context.span_id == 0x00F067AA0BA902B7


def _example() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "refund_worker.py"
    spec = importlib.util.spec_from_file_location("refund_worker_example", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("env", [
    {},
    {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
    {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
    {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
])
def test_example_tracing_off_unless_asked_R35(env: dict[str, str]) -> None:
    t = _example().setup_tracing(env)
    assert t.provider is None and t.describe == {"tracing": "off"}


def test_example_tracing_refuses_what_it_cannot_use_R35(otel: Any) -> None:
    ex = _example()
    for env, want in [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
         "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"),
        # The stand-in is the API alone: asked for, tracing needs the SDK and
        # its exporter, and says how to install them.
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "pip install opentelemetry-api opentelemetry-sdk"),
    ]:
        with pytest.raises(ex.TracingConfigError, match=want):
            ex.setup_tracing(env)
