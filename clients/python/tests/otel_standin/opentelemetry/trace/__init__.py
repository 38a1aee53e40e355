"""Stand-in of opentelemetry.trace: the API's names jobfence.tracing uses,
with the real signatures. The global provider is a proxy: a no-op (every
span INVALID_SPAN) until set_tracer_provider, then the provider set."""

from __future__ import annotations

import enum
import os
from typing import Any, Iterator, Mapping, Optional, Sequence

from opentelemetry import context as _context

_SPAN_KEY = "current-span"


class SpanKind(enum.Enum):
    INTERNAL = 0
    SERVER = 1
    CLIENT = 2
    PRODUCER = 3
    CONSUMER = 4


class StatusCode(enum.Enum):
    UNSET = 0
    OK = 1
    ERROR = 2


class Status:
    def __init__(self, status_code: StatusCode = StatusCode.UNSET, description: Optional[str] = None) -> None:
        self.status_code = status_code
        self.description = description


class TraceFlags(int):
    SAMPLED = 0x01
    DEFAULT = 0x00

    @property
    def sampled(self) -> bool:
        return bool(self & TraceFlags.SAMPLED)


class TraceState(Mapping[str, str]):
    """The W3C tracestate: ordered key=value pairs."""

    def __init__(self, entries: Optional[Sequence[tuple[str, str]]] = None) -> None:
        self._d: dict[str, str] = dict(entries or [])

    @classmethod
    def from_header(cls, header_list: list[str]) -> TraceState:
        pairs: list[tuple[str, str]] = []
        for header in header_list:
            for member in header.split(","):
                member = member.strip()
                if not member:
                    continue
                k, sep, v = member.partition("=")
                if not sep or not k or not v:
                    return cls()  # as the real one: a malformed header gives an empty state
                pairs.append((k, v))
        return cls(pairs)

    def to_header(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self._d.items())

    def __getitem__(self, key: str) -> str:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


DEFAULT_TRACE_OPTIONS = TraceFlags(0)
DEFAULT_TRACE_STATE = TraceState()
INVALID_SPAN_ID = 0
INVALID_TRACE_ID = 0


class SpanContext:
    def __init__(self, trace_id: int, span_id: int, is_remote: bool,
                 trace_flags: Optional[TraceFlags] = DEFAULT_TRACE_OPTIONS,
                 trace_state: Optional[TraceState] = DEFAULT_TRACE_STATE) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.is_remote = is_remote
        self.trace_flags = TraceFlags(trace_flags if trace_flags is not None else 0)
        self.trace_state = trace_state if trace_state is not None else DEFAULT_TRACE_STATE

    @property
    def is_valid(self) -> bool:
        return self.trace_id != INVALID_TRACE_ID and self.span_id != INVALID_SPAN_ID


INVALID_SPAN_CONTEXT = SpanContext(INVALID_TRACE_ID, INVALID_SPAN_ID, False)


class Link:
    def __init__(self, context: SpanContext, attributes: Optional[Mapping[str, Any]] = None) -> None:
        self._context = context
        self._attributes = dict(attributes or {})

    @property
    def context(self) -> SpanContext:
        return self._context

    @property
    def attributes(self) -> Mapping[str, Any]:
        return self._attributes


class Span:
    """The API's span: what the SDK calls on one."""

    def get_span_context(self) -> SpanContext:
        raise NotImplementedError

    def is_recording(self) -> bool:
        raise NotImplementedError

    def set_attribute(self, key: str, value: Any) -> None:
        raise NotImplementedError

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def set_status(self, status: Status, description: Optional[str] = None) -> None:
        raise NotImplementedError

    def end(self, end_time: Optional[int] = None) -> None:
        raise NotImplementedError


class NonRecordingSpan(Span):
    def __init__(self, context: SpanContext) -> None:
        self._context = context

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def set_status(self, status: Status, description: Optional[str] = None) -> None:
        pass

    def end(self, end_time: Optional[int] = None) -> None:
        pass


INVALID_SPAN = NonRecordingSpan(INVALID_SPAN_CONTEXT)


def get_current_span(context: Optional[_context.Context] = None) -> Span:
    span = _context.get_value(_SPAN_KEY, context=context)
    return span if isinstance(span, Span) else INVALID_SPAN


def set_span_in_context(span: Span, context: Optional[_context.Context] = None) -> _context.Context:
    return _context.set_value(_SPAN_KEY, span, context=context)


class Tracer:
    def start_span(self, name: str, context: Optional[_context.Context] = None, kind: SpanKind = SpanKind.INTERNAL,
                   attributes: Optional[Mapping[str, Any]] = None, links: Optional[Sequence[Link]] = None,
                   start_time: Optional[int] = None, record_exception: bool = True,
                   set_status_on_exception: bool = True) -> Span:
        raise NotImplementedError


class NoOpTracer(Tracer):
    def start_span(self, name: str, context: Optional[_context.Context] = None, kind: SpanKind = SpanKind.INTERNAL,
                   attributes: Optional[Mapping[str, Any]] = None, links: Optional[Sequence[Link]] = None,
                   start_time: Optional[int] = None, record_exception: bool = True,
                   set_status_on_exception: bool = True) -> Span:
        return INVALID_SPAN


class TracerProvider:
    def get_tracer(self, instrumenting_module_name: str, instrumenting_library_version: Optional[str] = None,
                   schema_url: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None) -> Tracer:
        raise NotImplementedError


class NoOpTracerProvider(TracerProvider):
    def get_tracer(self, instrumenting_module_name: str, instrumenting_library_version: Optional[str] = None,
                   schema_url: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None) -> Tracer:
        return NoOpTracer()


_provider: Optional[TracerProvider] = None


class _ProxyTracer(Tracer):
    """Delegates to the provider set, once one is; a no-op until then."""

    def __init__(self, name: str) -> None:
        self._name = name

    def start_span(self, name: str, context: Optional[_context.Context] = None, kind: SpanKind = SpanKind.INTERNAL,
                   attributes: Optional[Mapping[str, Any]] = None, links: Optional[Sequence[Link]] = None,
                   start_time: Optional[int] = None, record_exception: bool = True,
                   set_status_on_exception: bool = True) -> Span:
        if _provider is None:
            return INVALID_SPAN
        return _provider.get_tracer(self._name).start_span(name, context=context, kind=kind, attributes=attributes,
                                                          links=links)


class ProxyTracerProvider(TracerProvider):
    def get_tracer(self, instrumenting_module_name: str, instrumenting_library_version: Optional[str] = None,
                   schema_url: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None) -> Tracer:
        return _ProxyTracer(instrumenting_module_name)


_PROXY = ProxyTracerProvider()


def get_tracer_provider() -> TracerProvider:
    return _provider if _provider is not None else _PROXY


def set_tracer_provider(tracer_provider: TracerProvider) -> None:
    global _provider
    _provider = tracer_provider


def get_tracer(instrumenting_module_name: str, instrumenting_library_version: Optional[str] = None,
               tracer_provider: Optional[TracerProvider] = None) -> Tracer:
    return (tracer_provider or get_tracer_provider()).get_tracer(instrumenting_module_name,
                                                                 instrumenting_library_version)


def format_trace_id(trace_id: int) -> str:
    return f"{trace_id:032x}"


def format_span_id(span_id: int) -> str:
    return f"{span_id:016x}"


if os.environ.get("JOBFENCE_OTEL_STANDIN_SPANS"):
    # A worker process under a test: its spans go to the test's file.
    import standin_sdk  # noqa: E402 - beside the opentelemetry folder, on the same sys.path entry

    set_tracer_provider(standin_sdk.RecordingTracerProvider(os.environ["JOBFENCE_OTEL_STANDIN_SPANS"]))
