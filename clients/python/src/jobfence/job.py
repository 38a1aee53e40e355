"""The run of one job: the handler's call under its deadline, the decision
(decide_at), and the fenced write-back under the claim's grant; what the
fence refuses is filed as an observation (jobfence.receipts)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional, Protocol

from .client import Client
from .decide import Decision, DecisionKind, ProviderPolicy, Result, ResultKind, cancel_requested, decide_at, sends
from .errors import FencedError, GrantLostError, ProviderDeadlineError
from .events import Reporter, WorkerEvent, WorkerEventKind, job_fields
from .options import WorkerOptions
from .receipts import Receipts
from .renewer import Renewer
from .tracing import Attempt, Tracing
from .types import ClaimedJob, NextAction, clip

__all__ = ["Handler", "HandlerContext"]


class HandlerContext:
    """What a handler gets beside its job: the provider-call deadline and a
    cancellation, set when the deadline passes or when a renewal finds the
    grant lost (R27). Check :meth:`cancelled` before sending anything to the
    provider: a lost grant sends nothing new. A request already sent runs to
    its answer or to the deadline (:meth:`remaining` is the time left, for a
    socket timeout); return that answer: the Worker files it as an
    observation when the fence refuses it (R15).
    """

    def __init__(self, deadline: float, trace_context: Any = None, traceparent: Optional[str] = None) -> None:
        self._deadline = deadline
        self._trace_context = trace_context
        self._traceparent = traceparent
        self._done = threading.Event()
        self._cause: Optional[BaseException] = None
        self._lock = threading.Lock()

    @property
    def trace_context(self) -> Any:
        """The OpenTelemetry context of this attempt's span (R35), current
        while the handler runs; None when OpenTelemetry is not installed. The
        enqueue's own trace context is job.traceparent and job.tracestate."""
        return self._trace_context

    @property
    def traceparent(self) -> Optional[str]:
        """The attempt span's W3C traceparent, for a provider call the
        handler propagates by hand; None when nothing is traced."""
        return self._traceparent

    @property
    def deadline(self) -> float:
        """The provider-call deadline, on time.monotonic()'s clock."""
        return self._deadline

    def remaining(self) -> float:
        """Seconds left until the provider-call deadline (0 once it passed)."""
        return max(0.0, self._deadline - time.monotonic())

    def cancelled(self) -> bool:
        """Whether the handler should stop: the deadline passed or the grant is lost."""
        return self._done.is_set() or time.monotonic() >= self._deadline

    @property
    def cause(self) -> Optional[BaseException]:
        """Why it was cancelled: a GrantLostError, a ProviderDeadlineError, or None."""
        if self._cause is None and time.monotonic() >= self._deadline:
            return ProviderDeadlineError("provider-call deadline passed")
        return self._cause

    @property
    def grant_lost(self) -> Optional[GrantLostError]:
        """The GrantLostError when a renewal found the grant gone (R27), else None."""
        return self._cause if isinstance(self._cause, GrantLostError) else None

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Sleeps up to timeout seconds (and never past the deadline); True
        when cancelled meanwhile. A handler's pause that a lost grant ends."""
        t = self.remaining() if timeout is None else min(timeout, self.remaining())
        return self._done.wait(t) or self.cancelled()

    def raise_if_cancelled(self) -> None:
        """Raises the cause when cancelled."""
        if self.cancelled():
            raise self.cause or ProviderDeadlineError("cancelled")

    def _cancel(self, cause: BaseException) -> None:
        with self._lock:
            if self._cause is None:
                self._cause = cause
        self._done.set()


class Handler(Protocol):
    """Calls the payment provider for claimed jobs. ``refund`` sends the refund
    with job.job.operation_key as the Idempotency-Key (R1), never anything
    derived from the attempt (R2). ``reconcile`` asks the provider what
    happened under that key (R14). Either returns what the provider said; a
    call whose outcome is unknown returns Result.unknown() (or raises),
    never a guess. Both must watch ctx: see HandlerContext.

    A job whose cancel was requested (job.cancel_requested, R32) goes to
    ``reconcile`` only, whatever its next_action, and whatever it returns the
    job is never sent again: succeeded completes it (the cancel came too
    late), pending and unknown reconcile later, no_record and failed
    escalate it to a person, who alone may close a maybe-sent refund as
    cancelled."""

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result: ...

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result: ...


class JobRunner:
    """Works the jobs a Worker is granted, one call of work() per job, on the
    job's own thread: it dispatches by next action (REFUND to
    handler.refund, anything else to handler.reconcile, R14; a job whose
    cancel was requested to handler.reconcile whatever it says, R32),
    refuses a same-key resend whose window is closing (R22), renews the
    lease while the handler runs (R27, with a renewer), decides (R14, R16)
    and writes back under the grant (R9, R25), filing the provider's answer
    when the fence refuses it (R15)."""

    def __init__(self, client: Client, handler: Handler, options: WorkerOptions, report: Reporter,
                 renewer: Optional[Renewer], receipts: Receipts, tracing: Optional[Tracing] = None) -> None:
        self._tracing = tracing if tracing is not None else Tracing(None, options.worker_id)
        self._client = client
        self._handler = handler
        self._options = options
        self._report = report
        self._renewer = renewer
        self._receipts = receipts
        self._lock = threading.Lock()
        self._late: set[threading.Thread] = set()

    def late(self) -> list[threading.Thread]:
        """The threads waiting for handlers that outlived their deadline, to
        file their answers; the drain waits for them too."""
        with self._lock:
            return list(self._late)

    def _policy(self, provider: str) -> ProviderPolicy:
        return self._options.policies.get(provider, self._options.policy)

    def work(self, c: ClaimedJob) -> None:
        """Works c: the provider call, the decision, the write-back, in the
        job's attempt span (R35), current in this thread meanwhile: the calls
        made for the job carry it."""
        attempt = self._tracing.start(c)
        with attempt.current():
            self._work(c, attempt)

    def _work(self, c: ClaimedJob, attempt: Attempt) -> None:
        rep = self._report
        rep.count("claimed")
        if c.takeover:
            rep.count("takeovers")
        rep.emit(WorkerEvent(WorkerEventKind.CLAIMED, job=c))
        f = job_fields(c)
        rep.log.log(logging.INFO if c.takeover else logging.DEBUG,
                    "job taken over" if c.takeover else "job claimed",
                    extra={**f, "next_action": c.next_action.value, "takeover": c.takeover,
                           "cancel_requested": c.cancel_requested})
        pol = self._policy(c.job.provider)
        if cancel_requested(c) and c.next_action is NextAction.REFUND:
            # R32: no grant of a job whose cancel was requested should carry
            # refund; whatever this one says, the job is only reconciled.
            rep.log.warning("a grant asks to send the refund of a job whose cancel was requested; "
                            "reconciling instead (R32)", extra=f)
        if sends(c) and c.sends_again() and pol.same_key_resend_safe:
            # R14, R22: the reconcile that chose this resend checked the
            # window, but time has passed since; check again, on the
            # coordinator's clock, before anything leaves.
            ok, why = pol.resend_allowed(c, c.coordinator_now())
            if not ok:
                d = Decision(DecisionKind.ESCALATE, reason=f"same-key resend refused before sending: {why} (R14, R16)")
                rep.count("resends_refused")
                rep.emit(WorkerEvent(WorkerEventKind.RESEND_REFUSED, job=c, decision=d))
                rep.log.warning("same-key resend refused; escalating", extra={**f, "why": why})
                self._write(c, d, Result(), attempt)
                return
        res = self._call(c, attempt)
        attempt.handled(res.kind.value)
        rep.emit(WorkerEvent(WorkerEventKind.HANDLED, job=c, result=res))
        self._write(c, decide_at(res, c, pol, c.coordinator_now()), res, attempt)

    def _call(self, c: ClaimedJob, attempt: Attempt) -> Result:
        """Runs the handler under the provider-call deadline, on a thread of
        its own. A handler that ignores its context is given
        late_answer_grace; after that its outcome is unknown and its eventual
        answer is filed as an observation (R15)."""
        o = self._options
        rep = self._report
        ctx = HandlerContext(time.monotonic() + o.provider_timeout, attempt.context, attempt.traceparent())
        held = self._renewer.hold(c, ctx._cancel, attempt.context) if self._renewer is not None else None
        box: list[Result] = []
        answered = threading.Event()

        def call() -> None:
            try:
                # R35: the attempt's span is current while the handler runs.
                with attempt.current():
                    # R14: only a first send refunds; anything else asks first.
                    # R32: a job whose cancel was requested is only ever asked about.
                    if sends(c):
                        r = self._handler.refund(c, ctx)
                    else:
                        r = self._handler.reconcile(c, ctx)
                if not isinstance(r, Result):
                    attempt.handler_failed("handler_error")
                    r = Result.unknown(TypeError(f"handler returned {type(r).__name__}, not a Result"))
                elif r.kind is ResultKind.UNKNOWN and r.error is not None:
                    attempt.handler_failed("handler_error")
            except BaseException as e:  # noqa: BLE001 - a handler that raises leaves the outcome unknown
                rep.log.info("provider call failed; outcome unknown", extra={**job_fields(c), "error": repr(e)})
                attempt.handler_failed("handler_error")
                r = Result.unknown(e)
            box.append(r)
            answered.set()

        t = threading.Thread(target=call, name=f"jobfence-handler-{c.job.id}", daemon=True)
        t.start()
        try:
            if not answered.wait(o.provider_timeout):
                ctx._cancel(ProviderDeadlineError(f"provider-call deadline of {o.provider_timeout:g}s passed"))
                answered.wait(o.late_answer_grace)
            if answered.is_set():
                return box[0]
        finally:
            # Renew no more once the handler returned or was given up on.
            if self._renewer is not None and held is not None:
                self._renewer.release(held)
            if ctx.grant_lost is not None:
                attempt.grant_lost()
        attempt.handler_failed("provider_deadline")
        rep.count("late_answers")
        rep.emit(WorkerEvent(WorkerEventKind.PROVIDER_DEADLINE, job=c))
        rep.log.warning("handler outlived the provider-call deadline; outcome unknown",
                        extra={**job_fields(c), "deadline": o.provider_timeout})

        def late() -> None:
            try:
                answered.wait()
                with attempt.current():
                    self._receipts.file(c, box[0], "answer arrived after the provider-call deadline")
            finally:
                with self._lock:
                    self._late.discard(threading.current_thread())

        lt = threading.Thread(target=late, name=f"jobfence-late-{c.job.id}", daemon=True)
        with self._lock:
            self._late.add(lt)
        lt.start()
        return Result.unknown(ProviderDeadlineError(f"provider call outlived its deadline of {o.provider_timeout:g}s"))

    def _write(self, c: ClaimedJob, d: Decision, res: Result, attempt: Attempt) -> None:
        """The fenced write-back under the claimed grant (R9, R25). The Client
        repeats it after UNAVAILABLE (R21); the fence's refusal is final. The
        attempt's span ends with it, after the receipt it may file (R35)."""
        rep = self._report
        f = job_fields(c)
        try:
            if d.kind is DecisionKind.COMPLETE:
                wr = self._client.complete(c.job.id, c.attempt, c.lease_token, d.provider_refund_id)
            elif d.kind is DecisionKind.ESCALATE:
                wr = self._client.escalate(c.job.id, c.attempt, c.lease_token, clip(d.reason, 1024))
            else:
                wr = self._client.reschedule(c.job.id, c.attempt, c.lease_token, next_action=d.next_action,
                                             delay=d.delay, reason=clip(d.reason, 1024))
        except FencedError as e:
            # R9, R21: the fence said no and a repeat cannot change that. Keep
            # the provider's answer as evidence for the current holder (R15).
            rep.count("stale_rejected")
            rep.emit(WorkerEvent(WorkerEventKind.STALE, job=c, result=res, decision=d, error=e))
            rep.log.info("write-back rejected by the fence; filing the answer as an observation",
                         extra={**f, "decision": d.kind.value, "reason": e.reason,
                                "current_attempt": e.current_attempt})
            self._receipts.file(c, res, f"write-back {d.kind.value} rejected: {e}")
            attempt.end(d.kind.value, error=e)
            return
        except Exception as e:  # noqa: BLE001
            # The lease will lapse and a takeover reconciles (R6, R14); the
            # receipt is kept if the coordinator takes it.
            rep.count("write_failures")
            rep.emit(WorkerEvent(WorkerEventKind.WRITE_FAILED, job=c, result=res, decision=d, error=e))
            rep.log.warning("write-back failed; the lease will expire and a takeover reconciles",
                            extra={**f, "decision": d.kind.value, "error": str(e)})
            self._receipts.file(c, res, f"write-back {d.kind.value} failed: {e}")
            attempt.end(d.kind.value, error=e)
            return
        self._receipts.kick()
        rep.count({DecisionKind.COMPLETE: "completed", DecisionKind.ESCALATE: "escalated"}.get(d.kind, "rescheduled"))
        if wr.replayed:
            rep.count("replayed")
        rep.emit(WorkerEvent(WorkerEventKind.WRITTEN, job=c, result=res, decision=d, replayed=wr.replayed))
        attempt.end(d.kind.value, replayed=wr.replayed)
        rep.log.info("job written", extra={
            **f, "decision": d.kind.value, "next_action": d.next_action.value, "delay": d.delay,
            "reason": d.reason, "provider_refund_id": d.provider_refund_id, "replayed": wr.replayed,
        })
