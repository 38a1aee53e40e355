"""The player of the spec's worker-stream transcripts (clients/spec/stream,
the README's "stream/*.json"): this SDK's real Worker, on a real Client,
against a scripted coordinator (fakecoord's, a real gRPC server on a
loopback socket) that answers nothing on the stream by itself: the
transcript's steps send every grant, reply and end, and expect every message
the worker sends, every unary call, every handler call."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import grpc
import pytest
from google.protobuf import json_format

from jobfence import ClaimedJob, Client, GrantLostError, HandlerContext, Result, RetryPolicy, Worker, tracing
from jobfence.v1 import coordinator_pb2 as pb

from fakecoord import FakeCoordinator, FakeStream, status_details
from speclib import fail_of, known, result_of
from workerrun import Running

#: The OpenTelemetry stand-in (tests/otel_standin/opentelemetry).
STANDIN = str(Path(__file__).resolve().parent / "otel_standin")

#: How long a step waits by default.
DEFAULT_WITHIN = 5.0


def _is_heartbeat(r: pb.WorkRequest) -> bool:
    return r.WhichOneof("kind") == "credit" and r.credit.credits == 0


def _dict(m: Any) -> Any:
    return json_format.MessageToDict(m, preserving_proto_field_name=True, including_default_value_fields=True)


def _contains(got: Any, want: Any, where: str = "") -> Optional[str]:
    """Why got does not contain want (a subset match: every field given, lists
    of the same length element by element); None when it does."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{where or 'the message'}: {got!r}, want an object"
        for k, v in want.items():
            if k not in got:
                return f"{where}.{k}: missing"
            why = _contains(got[k], v, f"{where}.{k}")
            if why:
                return why
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{where}: {got!r}, want {len(want)} elements"
        for i, (g, w) in enumerate(zip(got, want)):
            why = _contains(g, w, f"{where}[{i}]")
            if why:
                return why
        return None
    return None if got == want else f"{where}: {got!r}, want {want!r}"


class _Handler:
    """The transcript's handlers: each job's result, returned at once, when
    released, or once its context is cancelled. Every call and every
    cancellation seen goes to ``events``."""

    def __init__(self, handlers: dict[str, Any]) -> None:
        self.cv = threading.Condition()
        self.events: list[tuple[str, str, Any]] = []
        self.plans: dict[str, tuple[Result, str]] = {}
        self.released: dict[str, threading.Event] = {}
        #: The traceparent of the span each job's handler ran in (R35):
        #: "$attempt:<job id>" in the steps.
        self.attempts: dict[str, str] = {}
        for job_id, h in handlers.items():
            known(h, {"result", "until"}, f"handler {job_id}")
            until = h.get("until", "")
            assert until in ("", "released", "cancelled"), f"handler {job_id}: until {until!r}"
            self.plans[job_id] = (result_of(h.get("result", {})), until)
            self.released[job_id] = threading.Event()

    def _run(self, call: str, job: ClaimedJob, ctx: HandlerContext) -> Result:
        job_id = str(job.job.id)
        if ctx.traceparent is not None:
            with self.cv:
                self.attempts[job_id] = ctx.traceparent
        self._event(("call", job_id, call))
        if job_id not in self.plans:
            raise AssertionError(f"no handler for job {job_id}")
        result, until = self.plans[job_id]
        if until == "released":
            self.released[job_id].wait(60)
        elif until == "cancelled":
            while not ctx.wait(0.05):
                pass
            self._event(("cancelled", job_id, ctx.cause))
        return result

    def _event(self, ev: tuple[str, str, Any]) -> None:
        with self.cv:
            self.events.append(ev)
            self.cv.notify_all()

    def take(self, kind: str, job_id: str, within: float) -> tuple[str, str, Any]:
        """The first unread event of this kind for this job, waiting up to
        within seconds: jobs granted together start in any order."""
        end = time.monotonic() + within
        with self.cv:
            while True:
                for i, ev in enumerate(self.events):
                    if ev[:2] == (kind, job_id):
                        return self.events.pop(i)
                left = end - time.monotonic()
                if left <= 0:
                    pytest.fail(f"no {kind} of job {job_id}'s handler within {within:g}s; unread: {self.events}")
                self.cv.wait(left)

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        return self._run("refund", job, ctx)

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        return self._run("reconcile", job, ctx)


class _Player:
    def __init__(self, t: dict[str, Any]) -> None:
        known(t, {"spec", "version", "name", "worker", "coordinator", "jobs", "handlers", "steps"}, "the transcript")
        coord = t.get("coordinator", {})
        known(coord, {"work"}, "coordinator")
        assert coord.get("work", "") in ("", "unimplemented"), f"coordinator work {coord['work']!r}"
        self.jobs = {k: json_format.ParseDict(v, pb.ClaimedJob()) for k, v in t.get("jobs", {}).items()}
        self.handler = _Handler(t.get("handlers", {}))
        # Work UNIMPLEMENTED, as from a coordinator that predates the stream;
        # every Claim waits for a step's unary_reply.
        self.fake = FakeCoordinator(stream=coord.get("work") != "unimplemented", answer_stream_calls=False)
        self.fake.held = {"Claim"}
        # The transcript ends each stream itself.
        self.fake.on_half_close = lambda st: None
        self.stream: Optional[FakeStream] = None
        self.streams = 0  # streams the transcript has taken up
        self.read = 0  # messages of the current stream the transcript has read
        self.unary = 0  # unary calls it has read
        self.labels: dict[str, int] = {}
        w = t.get("worker", {})
        known(w, {"worker_id", "concurrency", "renew", "lease_ms", "tracing"}, "worker")
        # R35: spans recorded in memory when the transcript traces, through
        # the OpenTelemetry stand-in (tests/otel_standin): this machine has
        # no OpenTelemetry for Python.
        self.spans: Any = None
        if w.get("tracing", False):
            _forget_otel()
            sys.path.insert(0, STANDIN)
            import standin_sdk

            self.spans = standin_sdk.RecordingTracerProvider()
        self.client = Client(self.fake.address, retry=RetryPolicy(attempts=3, backoff=0.01), call_timeout=5)
        kw: dict[str, Any] = {}
        if "lease_ms" in w:
            kw["lease"] = w["lease_ms"] / 1000
        self.worker = Worker(self.client, self.handler, worker_id=w["worker_id"], concurrency=w.get("concurrency", 1),
                             lease_renewal=w.get("renew", True), receipt_spool="off",
                             tracer_provider=self.spans, **kw)
        self.running: Optional[Running] = None

    def close(self) -> None:
        self.worker.stop()
        if self.stream is not None:
            self.stream.end()
        if self.running is not None:
            self.running.t.join(10)
        self.client.close()
        self.fake.stop()
        if self.spans is not None:
            sys.path.remove(STANDIN)
            _forget_otel()

    # -- the worker's messages on the current stream --------------------------

    def _next(self, within: float, skip_heartbeats: bool, what: str) -> pb.WorkRequest:
        st = self.stream
        assert st is not None, f"{what}: no stream yet (a request with start opens one)"
        end = time.monotonic() + within
        with st._cv:
            while True:
                while self.read < len(st.requests):
                    r = st.requests[self.read]
                    self.read += 1
                    if skip_heartbeats and _is_heartbeat(r):
                        continue
                    return r
                left = end - time.monotonic()
                if left <= 0:
                    pytest.fail(f"no {what} within {within:g}s; the stream's messages: {st.requests}")
                st._cv.wait(left)

    def _unread(self) -> list[pb.WorkRequest]:
        st = self.stream
        if st is None:
            return []
        with st._cv:
            return [r for r in st.requests[self.read:] if not _is_heartbeat(r)]

    # -- steps ---------------------------------------------------------------

    def play(self, steps: list[dict[str, Any]]) -> None:
        self.running = Running(self.worker)
        for i, step in enumerate(steps):
            try:
                if "expect" in step:
                    known(step, {"expect", "within_ms", "as"}, "the step")
                    self._expect(step["expect"], step.get("within_ms", DEFAULT_WITHIN * 1000) / 1000, step.get("as"))
                elif "send" in step:
                    known(step, {"send"}, "the step")
                    self._send(step["send"])
                elif "do" in step:
                    known(step, {"do", "job_id"}, "the step")
                    self._do(step["do"], step.get("job_id"))
                else:
                    pytest.fail(f"a step this runner does not know: {step}")
            except (AssertionError, pytest.fail.Exception) as e:
                raise AssertionError(f"step {i + 1} {step}: {e}") from None

    def _expect(self, want: dict[str, Any], within: float, label: Optional[str]) -> None:
        known(want, {"request", "heartbeat", "half_close", "unary", "handler", "handler_cancelled", "run",
                     "nothing_more", "span"}, "expect")
        assert len(want) == 1, f"one expectation a step: {want}"
        (kind, value), = want.items()
        if kind == "request":
            if "start" in value:
                self.stream = self.fake.stream(self.streams, within)
                self.streams += 1
                self.read = 0
            r = self._next(within, True, f"request {value}")
            got = _dict(r)
            if "call" in got:
                got["call"].pop("call_id", None)
                if label:
                    self.labels[label] = int(r.call.call_id)
            with self.handler.cv:
                value = _with_attempts(value, dict(self.handler.attempts))
            why = _contains(got, value)
            assert why is None, f"the worker sent {got}: {why}"
        elif kind == "heartbeat":
            assert value is True
            r = self._next(within, False, "heartbeat")
            assert _is_heartbeat(r), f"the worker sent {_dict(r)}, not a heartbeat"
        elif kind == "half_close":
            assert value is True
            st = self.stream
            assert st is not None, "no stream to half-close"
            assert st.half_closed.wait(within), f"the worker did not half-close the stream within {within:g}s"
            unread = self._unread()
            assert not unread, f"the worker sent before its half-close, unread: {unread}"
        elif kind == "unary":
            known(value, {"method", "request"}, "unary")
            end = time.monotonic() + within
            while True:
                with self.fake.lock:
                    calls = list(self.fake.unary)
                if len(calls) > self.unary:
                    break
                assert time.monotonic() < end, f"no unary call within {within:g}s"
                time.sleep(0.01)
            method, req = calls[self.unary]
            self.unary += 1
            got = _dict(req)
            assert method == value["method"], f"unary {method} {got}, want {value['method']}"
            why = _contains(got, value.get("request", {}))
            assert why is None, f"unary {method} {got}: {why}"
        elif kind == "handler":
            known(value, {"job_id", "call"}, "handler")
            ev = self.handler.take("call", str(value["job_id"]), within)
            assert ev[2] == value["call"], f"job {value['job_id']}'s {ev[2]} handler called, want {value['call']}"
        elif kind == "handler_cancelled":
            ev = self.handler.take("cancelled", str(value), within)
            assert isinstance(ev[2], GrantLostError), f"cancelled by {ev[2]!r}, not a lost grant (R27)"
        elif kind == "run":
            assert value == "returned", f"run {value!r}"
            assert self.running is not None
            self.running.t.join(within)
            assert not self.running.t.is_alive(), f"run() did not return within {within:g}s"
            assert self.running.error is None, f"run() raised {self.running.error!r}"
        elif kind == "span":
            self._expect_span(value, within)
        elif kind == "nothing_more":
            assert value is True
            time.sleep(0.1)  # what the worker sends last comes a moment after it acts
            unread = self._unread()
            assert not unread, f"unread messages on the stream: {unread}"
            with self.fake.lock:
                calls = self.fake.unary[self.unary:]
            assert not calls, f"unread unary calls: {calls}"
            with self.handler.cv:
                assert not self.handler.events, f"unread handler events: {self.handler.events}"
            assert len(self.fake.streams) == self.streams, f"{len(self.fake.streams) - self.streams} more streams opened"

    def _expect_span(self, want: dict[str, Any], within: float) -> None:
        """The ended attempt span of the job: what the step pins, and no lease
        token anywhere in it (R25, R35)."""
        known(want, {"job_id", "name", "kind", "root", "links", "attributes", "status"}, "span")
        assert self.spans is not None, "a span expected of a worker without tracing"
        job_id = str(want["job_id"])
        end = time.monotonic() + within
        while True:
            found = [s for s in self.spans.ended() if str(s.attributes.get("jobfence.job.id")) == job_id]
            if found:
                s = found[0]
                break
            assert time.monotonic() < end, f"no ended span of job {job_id} within {within:g}s"
            time.sleep(0.005)
        token = self.jobs[job_id].lease_token if job_id in self.jobs else ""
        assert not token or token not in json.dumps(s.to_json()), "the span carries the grant's lease token (R25)"
        if "name" in want:
            assert s.name == want["name"], f"name {s.name!r}"
        if "kind" in want:
            assert s.kind.name.lower() == want["kind"], f"kind {s.kind}"
        if "root" in want:
            assert (s.parent is None) == want["root"], f"parent {s.parent}"
        if "links" in want:
            assert len(s.links) == len(want["links"]), f"links {[l.context for l in s.links]}"
            for i, (l, wl) in enumerate(zip(s.links, want["links"])):
                known(wl, {"traceparent", "tracestate", "attributes"}, f"links[{i}]")
                sc = l.context
                got = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags) & 1:02x}"
                assert got == wl["traceparent"], f"links[{i}] {got}"
                if "tracestate" in wl:
                    assert sc.trace_state.to_header() == wl["tracestate"], f"links[{i}] tracestate"
                why = _contains(dict(l.attributes), wl.get("attributes", {}), f"links[{i}].attributes")
                assert why is None, why
        why = _contains(s.attributes, want.get("attributes", {}), "attributes")
        assert why is None, f"{why}: {s.attributes}"
        if "status" in want:
            got_status = s.status.status_code.name.lower()
            assert got_status == want["status"], f"status {got_status} ({s.status.description})"

    def _send(self, send: dict[str, Any]) -> None:
        known(send, {"grant", "reply_to", "response", "error", "end", "unary_reply"}, "send")
        if "unary_reply" in send:
            known(send["unary_reply"], {"response"}, "unary_reply")
            self.fake.reply("Claim", json_format.ParseDict(send["unary_reply"].get("response", {}), pb.ClaimResponse()))
            return
        st = self.stream
        assert st is not None, "nothing to send on: no stream yet"
        if "grant" in send:
            st.grant(*[self.jobs[str(j)] for j in send["grant"]])
        elif "reply_to" in send:
            m = json_format.ParseDict(send.get("response", {}), pb.WorkResponse())
            m.reply.call_id = self.labels[send["reply_to"]]
            if "error" in send:
                m.reply.error = status_details(fail_of(send["error"]))
            st.send(m)
        elif "response" in send:
            st.send(json_format.ParseDict(send["response"], pb.WorkResponse()))
        elif "end" in send:
            end = send["end"]
            known(end, {"code", "message"}, "end")
            code = end.get("code", "OK")
            st.end(None if code == "OK" else grpc.StatusCode[code], end.get("message", "scripted end"))
        else:
            pytest.fail(f"nothing to send in {send}")

    def _do(self, what: str, job_id: Optional[str]) -> None:
        if what == "stop":
            self.worker.stop()
        elif what == "release":
            assert job_id is not None and str(job_id) in self.handler.released, f"release {job_id}"
            self.handler.released[str(job_id)].set()
        else:
            pytest.fail(f"do {what!r} is not one this runner knows")


def _with_attempts(want: Any, attempts: dict[str, str]) -> Any:
    """want with every string "$attempt:<job id>" replaced by the traceparent
    of the span that job's handler ran in (R35)."""
    if isinstance(want, str) and want.startswith("$attempt:"):
        job_id = want[len("$attempt:"):]
        assert job_id in attempts, f"{want}: the job's handler ran in no span"
        return attempts[job_id]
    if isinstance(want, dict):
        return {k: _with_attempts(v, attempts) for k, v in want.items()}
    if isinstance(want, list):
        return [_with_attempts(v, attempts) for v in want]
    return want


def _forget_otel() -> None:
    """Forgets the OpenTelemetry modules imported, so that the next look-up
    sees sys.path as it is then."""
    for name in list(sys.modules):
        if name == "opentelemetry" or name.startswith("opentelemetry.") or name == "standin_sdk":
            del sys.modules[name]
    tracing._reset()


def play(t: dict[str, Any]) -> None:
    """Plays the transcript t against this SDK's Worker; fails at the first
    step that does not happen as written."""
    p = _Player(t)
    try:
        p.play(t["steps"])
    finally:
        p.close()
