"""The Renewer: keeps the leases of a Worker's running jobs alive while their
handlers run (R27)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Optional

import grpc

from .client import MAX_RENEW_BATCH, Client
from .errors import (
    CoordinatorError,
    GrantLostError,
    GrantTooOldError,
    JobNotRunningError,
    NotFoundError,
    StaleAttemptError,
)
from .events import Reporter, WorkerEvent, WorkerEventKind, job_fields
from .options import WorkerOptions
from .tracing import Tracing
from .types import ClaimedJob

# After a renewal call that failed, the next try comes after a tenth of the lease.
_RENEW_RETRY_DIVISOR = 10

# The code of the refusals this SDK makes up itself.
_FP = grpc.StatusCode.FAILED_PRECONDITION


class Held:
    """One job whose handler runs, renewed by the renewer (R27). ``cancel``
    cancels its handler's context."""

    __slots__ = ("c", "cancel", "lease", "interval", "due", "too_old", "trace_context")

    def __init__(self, c: ClaimedJob, cancel: Callable[[BaseException], None], lease: float, interval: float,
                 due: float, trace_context: Any = None) -> None:
        self.c = c
        #: The job's attempt span's OpenTelemetry context (R35), which its
        #: renewals carry; None when nothing is traced.
        self.trace_context = trace_context
        self.cancel = cancel
        self.lease = lease
        self.interval = interval
        self.due = due  # time.monotonic() of the next renewal
        self.too_old = False


class Renewer:
    """Keeps the leases of a Worker's running jobs alive while their handlers
    run (R27): one thread for the whole worker (run()), each round one
    RenewLeases call for every job whose renewal is due, at about a third of
    its lease, with ±10 % jitter so that a fleet started together does not
    renew in step. A renewal that finds a grant gone cancels its handler."""

    def __init__(self, client: Client, options: WorkerOptions, report: Reporter,
                 tracing: Optional[Tracing] = None) -> None:
        self._tracing = tracing if tracing is not None else Tracing(None, options.worker_id)
        self._client = client
        self._options = options
        self._report = report
        self._cv = threading.Condition()
        self._held: dict[int, Held] = {}
        self._quit = False

    def _interval(self, lease: float) -> float:
        return self._options.renew_interval or lease / 3

    def hold(self, c: ClaimedJob, cancel: Callable[[BaseException], None], trace_context: Any = None) -> Held:
        """Starts renewing c's lease; a lost grant calls cancel with a
        GrantLostError. trace_context is its attempt span's (R35)."""
        lease = c.lease_seconds() or self._options.lease or 30.0
        interval = self._interval(lease)
        h = Held(c, cancel, lease, interval, time.monotonic() + _jitter(interval), trace_context)
        with self._cv:
            older = self._held.get(c.job.id)
            if older is not None and older.c.attempt < c.attempt:
                # This worker took its own job over: that takeover's commit
                # ended the older grant (R8), whatever its renewal would say.
                older.cancel(GrantLostError(c.job.id, older.c.attempt, StaleAttemptError(
                    _FP, f"job {c.job.id} was taken over by this worker's own claim of attempt {c.attempt}",
                    "STALE_ATTEMPT", {"current_attempt": str(c.attempt)})))
            self._held[c.job.id] = h
            self._cv.notify_all()
        return h

    def release(self, h: Held) -> None:
        """Stops renewing h: its handler returned."""
        with self._cv:
            if self._held.get(h.c.job.id) is h:
                del self._held[h.c.job.id]

    def quit(self) -> None:
        """Ends run()."""
        with self._cv:
            self._quit = True
            self._cv.notify_all()

    def run(self) -> None:
        """Renews what is due until quit()."""
        while True:
            with self._cv:
                if self._quit:
                    return
                now = time.monotonic()
                live = [h for h in self._held.values() if not h.too_old]
                due = [h for h in live if h.due <= now]
                if not due:
                    nxt = min((h.due for h in live), default=now + 3600)
                    self._cv.wait(max(0.0, nxt - now))
                    continue
                # Those due within half an interval more come along (a renewal
                # a little early is harmless): a worker's jobs share one call
                # instead of drifting apart with the jitter.
                due += [h for h in live if now < h.due <= now + h.interval / 2]
            for i in range(0, len(due), MAX_RENEW_BATCH):
                self._renew(due[i:i + MAX_RENEW_BATCH])

    def _renew(self, hs: list[Held]) -> None:
        rep = self._report
        # A renewal that takes longer than the interval is as good as failed.
        timeout = max(1.0, min(10.0, min(h.interval for h in hs)))
        try:
            # R35: in the one job's attempt span, or a span linked to each.
            with self._tracing.renewing([h.trace_context for h in hs]):
                out = self._client.renew_leases([h.c.grant() for h in hs], lease=self._options.lease, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - never a cancellation: the grant holds until a takeover commits (R8)
            self._failed(hs, e)
            return
        now = time.monotonic()
        retry: list[Held] = []
        retry_error: Optional[BaseException] = None
        for h, r in zip(hs, out):
            with self._cv:
                if self._held.get(h.c.job.id) is not h:
                    continue  # its handler returned meanwhile
            f = job_fields(h.c)
            if r.job_id != h.c.job.id or r.attempt != h.c.attempt:
                retry.append(h)
                retry_error = retry_error or CoordinatorError(_FP, "RenewLeases answered out of order")
            elif r.refused is None:
                rep.count("renewals")
                h.due = now + _jitter(h.interval)
                rep.emit(WorkerEvent(WorkerEventKind.RENEWED, job=h.c))
                if r.receipt_filed_at is not None:
                    rep.log.debug("a receipt of success or failure was filed for the job during this grant (R28)",
                                  extra={**f, "receipt_filed_at": r.receipt_filed_at.isoformat()})
            elif isinstance(r.refused, GrantTooOldError):
                # R27: renew no more; the lease runs out and the job is taken
                # over as usual. Until that takeover commits the grant may
                # still write (R8), so the handler runs on.
                h.too_old = True
                rep.emit(WorkerEvent(WorkerEventKind.GRANT_TOO_OLD, job=h.c, error=r.refused))
                rep.log.warning("the coordinator renews this grant no more (--max-grant-age); its lease runs out and "
                                "the job is taken over unless the handler finishes first (R27)",
                                extra={**f, "grant_expires_at": str(r.grant_expires_at)})
            elif isinstance(r.refused, (StaleAttemptError, JobNotRunningError, NotFoundError)):
                rep.count("grants_lost")
                with self._cv:
                    self._held.pop(h.c.job.id, None)
                h.cancel(GrantLostError(h.c.job.id, h.c.attempt, r.refused))
                rep.emit(WorkerEvent(WorkerEventKind.GRANT_LOST, job=h.c, error=r.refused))
                rep.log.warning("grant lost; cancelling the handler before it sends anything new (R27)",
                                extra={**f, "error": str(r.refused)})
            else:
                # Not decided for this grant (DATABASE_UNAVAILABLE, a reason
                # newer than this SDK): again soon.
                retry.append(h)
                retry_error = retry_error or r.refused
        if retry:
            self._failed(retry, retry_error or CoordinatorError(_FP, "not renewed"))

    def _failed(self, hs: list[Held], e: BaseException) -> None:
        rep = self._report
        rep.count("renew_failures")
        rep.log.warning("lease renewal failed; trying again soon", extra={"jobs": len(hs), "error": str(e)})
        now = time.monotonic()
        for h in hs:
            h.due = now + _jitter(h.lease / _RENEW_RETRY_DIVISOR)
            rep.emit(WorkerEvent(WorkerEventKind.RENEW_FAILED, job=h.c, error=e))


def _jitter(d: float) -> float:
    return d * (0.9 + 0.2 * random.random())
