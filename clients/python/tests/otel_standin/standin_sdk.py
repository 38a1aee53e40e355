"""A recording TracerProvider for the opentelemetry stand-in (this folder's
opentelemetry package): each span gets random ids, is sampled, keeps its
parent (the span current in the context it was started in, unless that
context is empty), links, attributes and status, and is kept when it ends,
in memory and, given a file, as one JSON line there. Not part of the real
API: the real SDK's TracerProvider, span processors and exporters do this
in production."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any, Mapping, Optional, Sequence

from opentelemetry import context as _context
from opentelemetry import trace


class RecordedSpan(trace.Span):
    def __init__(self, provider: RecordingTracerProvider, name: str, parent: trace.SpanContext,
                 kind: trace.SpanKind, attributes: Optional[Mapping[str, Any]], links: Sequence[trace.Link]) -> None:
        self._provider = provider
        self.name = name
        self.kind = kind
        self.parent = parent if parent.is_valid else None
        trace_id = parent.trace_id if parent.is_valid else random.getrandbits(128) or 1
        self._context = trace.SpanContext(trace_id, random.getrandbits(64) or 1, False,
                                          trace.TraceFlags(trace.TraceFlags.SAMPLED))
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.links = list(links)
        self.status = trace.Status(trace.StatusCode.UNSET)
        self.start = time.time_ns()
        self.ended = False
        self._lock = threading.Lock()

    def get_span_context(self) -> trace.SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return not self.ended

    def set_attribute(self, key: str, value: Any) -> None:
        if not self.ended:
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for k, v in attributes.items():
            self.set_attribute(k, v)

    def set_status(self, status: trace.Status, description: Optional[str] = None) -> None:
        if not self.ended:
            self.status = status

    def end(self, end_time: Optional[int] = None) -> None:
        with self._lock:
            if self.ended:
                return
            self.ended = True
        self._provider._ended(self)

    def to_json(self) -> dict[str, Any]:
        sc = self._context
        return {
            "name": self.name, "kind": self.kind.name, "trace_id": f"{sc.trace_id:032x}", "span_id": f"{sc.span_id:016x}",
            "parent_span_id": f"{self.parent.span_id:016x}" if self.parent else "",
            "attributes": self.attributes,
            "links": [{"trace_id": f"{l.context.trace_id:032x}", "span_id": f"{l.context.span_id:016x}",
                       "trace_flags": int(l.context.trace_flags), "trace_state": l.context.trace_state.to_header(),
                       "attributes": dict(l.attributes)} for l in self.links],
            "status": {"code": self.status.status_code.name, "description": self.status.description or ""},
        }


class _Tracer(trace.Tracer):
    def __init__(self, provider: RecordingTracerProvider, name: str) -> None:
        self._provider = provider
        self.name = name

    def start_span(self, name: str, context: Optional[_context.Context] = None,
                   kind: trace.SpanKind = trace.SpanKind.INTERNAL, attributes: Optional[Mapping[str, Any]] = None,
                   links: Optional[Sequence[trace.Link]] = None, start_time: Optional[int] = None,
                   record_exception: bool = True, set_status_on_exception: bool = True) -> trace.Span:
        parent = trace.get_current_span(context).get_span_context()
        return RecordedSpan(self._provider, name, parent, kind, attributes, links or [])


class RecordingTracerProvider(trace.TracerProvider):
    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path
        self.spans: list[RecordedSpan] = []
        self.tracers: list[str] = []
        self._lock = threading.Lock()

    def get_tracer(self, instrumenting_module_name: str, instrumenting_library_version: Optional[str] = None,
                   schema_url: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None) -> trace.Tracer:
        with self._lock:
            self.tracers.append(instrumenting_module_name)
        return _Tracer(self, instrumenting_module_name)

    def ended(self, name: Optional[str] = None) -> list[RecordedSpan]:
        with self._lock:
            return [s for s in self.spans if name is None or s.name == name]

    def _ended(self, s: RecordedSpan) -> None:
        with self._lock:
            self.spans.append(s)
            if self.path:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(s.to_json()) + "\n")
