"""Tracing (R35), with OpenTelemetry when it is installed.

Each job a Worker works is one attempt span (``jobfence.attempt``, kind
CONSUMER), a root linked to the trace context its enqueue stored (the
grant's ``traceparent`` and ``tracestate``), and every call the Worker makes
for the job carries the attempt span's context: a unary call as W3C
``traceparent`` and ``tracestate`` metadata, a call on the worker stream in
the WorkCall's ``traceparent`` and ``tracestate`` fields. The handler runs
with the span current (``opentelemetry.context``), so the span of an
instrumented HTTP client is its child; ``HandlerContext.trace_context``
holds it too.

OpenTelemetry is optional: the SDK uses the ``opentelemetry-api`` package
(``opentelemetry.trace``, ``opentelemetry.context``) when it is importable,
with the Worker's ``tracer_provider`` or the global one, a no-op until the
application sets one. Without the package there is no span at all: no call
carries a trace context (the SDK makes up no span ids), and the handler sees
the enqueue's trace context as it came (``job.traceparent``,
``job.tracestate``) to propagate itself if it wants. README, "Tracing".
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator, Optional, Sequence

from .errors import CoordinatorError, FencedError

__all__ = ["ATTEMPT_SPAN_NAME", "RENEW_SPAN_NAME", "TRACER_NAME", "OUTCOMES", "otel_available", "trace_headers"]

#: The instrumentation scope of the SDK's spans.
TRACER_NAME = "jobfence"
#: The span of one attempt: the same in the three SDKs, in the family of the
#: coordinator's jobfence.grant and jobfence.writeback spans.
ATTEMPT_SPAN_NAME = "jobfence.attempt"
#: The span a renewal of several jobs' leases is made in, linked to each
#: job's attempt span; a renewal of one job is made in its attempt span.
RENEW_SPAN_NAME = "jobfence.renew"
#: An attempt span's jobfence.outcome values.
OUTCOMES = ("completed", "rescheduled", "escalated", "stale", "grant_lost", "write_failed")

# A W3C traceparent of version 00: the only one the coordinator stores.
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

class _Otel:
    """The parts of the OpenTelemetry API the SDK uses."""

    def __init__(self) -> None:
        from opentelemetry import context, trace

        self.context = context
        self.trace = trace


_loaded = False
_otel: Optional[_Otel] = None


def _api() -> Optional[_Otel]:
    """The OpenTelemetry API when it is importable, else None; looked up once."""
    global _loaded, _otel
    if not _loaded:
        try:
            _otel = _Otel()
        except ImportError:
            _otel = None
        _loaded = True
    return _otel


def _reset() -> None:
    """Looks the API up again at next use (for tests that change sys.path)."""
    global _loaded, _otel
    _loaded, _otel = False, None


def otel_available() -> bool:
    """Whether the OpenTelemetry API is importable: without it nothing is traced."""
    return _api() is not None


def trace_headers(ctx: Any = None) -> Optional[tuple[str, str]]:
    """The W3C (traceparent, tracestate) of the span current in ctx (the
    current context when None), as a call made in it carries them; None when
    it holds no valid span or OpenTelemetry is not installed, which is what
    an untraced call costs."""
    otel = _api()
    if otel is None:
        return None
    sc = otel.trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return None
    state = sc.trace_state.to_header() if sc.trace_state else ""
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags) & 1:02x}", state


def grant_link(traceparent: str, tracestate: str) -> Any:
    """The link to the enqueue's trace context a grant carries (an
    opentelemetry.trace.Link); None when it carries none, one that is not
    valid, or OpenTelemetry is not installed. A tracestate that does not
    parse is dropped alone."""
    otel = _api()
    m = _TRACEPARENT.match(traceparent)
    if otel is None or m is None:
        return None
    trace_id, span_id = int(m.group(1), 16), int(m.group(2), 16)
    if trace_id == 0 or span_id == 0:
        return None
    t = otel.trace
    state = None
    if tracestate:
        try:
            state = t.TraceState.from_header([tracestate])
        except Exception:  # noqa: BLE001 - a malformed tracestate is dropped alone
            state = None
    sc = t.SpanContext(trace_id=trace_id, span_id=span_id, is_remote=True,
                       trace_flags=t.TraceFlags(int(m.group(3), 16) & 1), trace_state=state)
    return t.Link(sc, {"jobfence.link": "enqueue"})


class Tracing:
    """A Worker's tracer: provider is its WorkerOptions.tracer_provider, None
    for the global one."""

    def __init__(self, provider: Any, worker_id: str) -> None:
        self._worker_id = worker_id
        otel = _api()
        self._otel = otel
        self._tracer: Any = None
        if otel is not None:
            # The global provider is a proxy: one the application sets later
            # is used from then on.
            self._tracer = (provider or otel.trace.get_tracer_provider()).get_tracer(TRACER_NAME)

    def start(self, c: Any) -> Attempt:
        """Starts the attempt span of c (a ClaimedJob): a root of its own,
        linked to its enqueue."""
        otel = self._otel
        if otel is None:
            return Attempt(None, None, None)
        link = grant_link(c.traceparent, c.tracestate)
        span = self._tracer.start_span(ATTEMPT_SPAN_NAME, context=otel.context.Context(),
                                       kind=otel.trace.SpanKind.CONSUMER, links=[link] if link is not None else None)
        if span.is_recording():
            span.set_attributes({
                "messaging.system": "jobfence",
                "messaging.operation.type": "process",
                "messaging.operation.name": "attempt",
                "messaging.destination.name": c.job.provider,
                "messaging.message.id": str(c.job.id),
                "jobfence.job.id": int(c.job.id),
                # Recorded as the coordinator records it: the business
                # identifier people search by, not a credential (R35 in
                # docs/DESIGN.md).
                "jobfence.operation_key": c.job.operation_key,
                "jobfence.attempt": int(c.attempt),
                "jobfence.provider": c.job.provider,
                "jobfence.next_action": c.next_action.value,
                "jobfence.takeover": bool(c.takeover),
                "jobfence.cancel_requested": bool(c.cancel_requested),
                "jobfence.worker_id": self._worker_id,
            })
        return Attempt(otel, span, otel.trace.set_span_in_context(span, otel.context.Context()))

    @contextlib.contextmanager
    def renewing(self, contexts: Sequence[Any]) -> Iterator[None]:
        """Makes current, for a renewal of the jobs whose attempt contexts
        these are: the one job's attempt span, or a jobfence.renew span linked
        to each sampled attempt span (none when no attempt span is sampled)."""
        otel = self._otel
        if otel is None:
            yield
            return
        if len(contexts) == 1:
            with _attached(otel, contexts[0]):
                yield
            return
        t = otel.trace
        links = []
        for ctx in contexts:
            if ctx is None:
                continue
            sc = t.get_current_span(ctx).get_span_context()
            if sc.is_valid and int(sc.trace_flags) & 1:
                links.append(t.Link(sc, {"jobfence.link": "attempt"}))
        if not links:
            yield
            return
        span = self._tracer.start_span(RENEW_SPAN_NAME, context=otel.context.Context(), kind=t.SpanKind.CLIENT,
                                       links=links, attributes={"messaging.system": "jobfence",
                                                                "jobfence.worker_id": self._worker_id,
                                                                "jobfence.renew.size": len(contexts)})
        try:
            with _attached(otel, t.set_span_in_context(span, otel.context.Context())):
                yield
        finally:
            span.end()


@contextlib.contextmanager
def _attached(otel: Optional[_Otel], ctx: Any) -> Iterator[None]:
    """ctx current in this thread meanwhile; nothing when it is None."""
    if otel is None or ctx is None:
        yield
        return
    token = otel.context.attach(ctx)
    try:
        yield
    finally:
        otel.context.detach(token)


class Attempt:
    """The span of one attempt, and what the attempt learns on its way to the
    write-back. Without OpenTelemetry every method does nothing."""

    def __init__(self, otel: Optional[_Otel], span: Any, context: Any) -> None:
        self._otel = otel
        self._span = span
        #: The OpenTelemetry context holding the span; None without OpenTelemetry.
        self.context = context
        self._lost = False
        self._handler_error: Optional[str] = None

    def current(self) -> contextlib.AbstractContextManager[None]:
        """Makes the attempt's span current in this thread meanwhile."""
        return _attached(self._otel, self.context)

    def traceparent(self) -> Optional[str]:
        """The attempt span's W3C traceparent; None when nothing is traced."""
        h = trace_headers(self.context) if self.context is not None else None
        return h[0] if h is not None else None

    def handled(self, result_kind: str) -> None:
        """Records what the handler returned (decide.json's kind names)."""
        if self._span is not None and self._span.is_recording():
            self._span.set_attribute("jobfence.result", result_kind)

    def handler_failed(self, error_type: str) -> None:
        """The handler raised or returned no Result ("handler_error"), or
        outlived its deadline ("provider_deadline")."""
        self._handler_error = error_type

    def grant_lost(self) -> None:
        """A renewal found the grant gone while the handler ran (R27)."""
        self._lost = True

    def end(self, decision_kind: str, replayed: bool = False, error: Optional[BaseException] = None) -> None:
        """Ends the span with the write-back's outcome: the decision written
        ("complete", "reschedule", "escalate"), or error, its failure."""
        span, otel = self._span, self._otel
        if span is None or otel is None:
            return
        if not span.is_recording():
            span.end()
            return
        error_type: Optional[str] = None
        description = ""
        attrs: dict[str, Any] = {}
        if error is None:
            outcome = {"complete": "completed", "escalate": "escalated"}.get(decision_kind, "rescheduled")
            attrs["jobfence.writeback.replayed"] = bool(replayed)
            if self._handler_error is not None:
                error_type, description = self._handler_error, "the provider call failed; outcome unknown"
        elif self._lost:
            outcome, error_type = "grant_lost", "grant_lost"
            description = "the grant was lost while the handler ran (R27)"
        elif isinstance(error, FencedError):
            outcome, error_type = "stale", _error_type(error)
            description = "the write-back was refused by the fence"
        else:
            outcome, error_type = "write_failed", _error_type(error)
            description = "the write-back failed; the lease lapses"
        attrs["jobfence.outcome"] = outcome
        if error_type is not None:
            attrs["error.type"] = error_type
            t = otel.trace
            span.set_status(t.Status(t.StatusCode.ERROR, description))
        span.set_attributes(attrs)
        span.end()


def _error_type(e: BaseException) -> str:
    """A coordinator error for error.type: its ErrorInfo reason
    (STALE_ATTEMPT, …), else its gRPC code's name. Never its message."""
    if not isinstance(e, CoordinatorError):
        return "UNKNOWN"
    if e.reason:
        return str(e.reason)
    name = getattr(e.code, "name", None)  # grpc.StatusCode: UNAVAILABLE, CANCELLED, …
    return name if isinstance(name, str) else "UNKNOWN"
