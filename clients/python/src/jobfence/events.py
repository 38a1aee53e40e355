"""What a Worker did: its events (WorkerEvent, for metrics and tests), its
counters (WorkerStats) and its log records; and the Reporter through which
the worker's parts (the job runner, the renewer, the receipts, the worker
stream's owner) report all three."""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

import grpc

from .decide import Decision, Result
from .errors import CoordinatorError
from .spool import SpooledReceipt
from .types import ClaimedJob

__all__ = ["WorkerEvent", "WorkerEventKind", "WorkerStats"]


class WorkerEventKind(enum.Enum):
    """What a Worker did."""

    CLAIMED = "claimed"  # a job was granted
    CLAIM_FAILED = "claim_failed"  # a claim, or the worker stream, failed; nothing acted on (R7; error set)
    HANDLED = "handled"  # a handler returned (result set)
    PROVIDER_DEADLINE = "provider_deadline"  # a handler outlived its deadline and grace
    WRITTEN = "written"  # the write-back was accepted (replayed set)
    STALE = "stale"  # the fence refused the write-back (error set)
    WRITE_FAILED = "write_failed"  # the write-back failed otherwise (error set)
    OBSERVED = "observed"  # an observation was filed (duplicate set)
    OBSERVE_FAILED = "observe_failed"  # filing an observation failed and it was not spooled (error set)
    SPOOLED = "spooled"  # an observation not filed was spooled (error, receipt, spool set; R28)
    REFILED = "refiled"  # a spooled receipt was filed (duplicate, receipt set; job None)
    SPOOL_ERROR = "spool_error"  # the spool itself: a torn line cut, unreadable lines kept, a failed rewrite (error, spool set)
    RESEND_REFUSED = "resend_refused"  # a same-key resend refused before calling the provider
    RENEWED = "renewed"  # a running job's lease was renewed (R27)
    RENEW_FAILED = "renew_failed"  # a renewal call failed; tried again soon (error set)
    GRANT_LOST = "grant_lost"  # a renewal found the grant gone; the handler was cancelled (error set, R27)
    GRANT_TOO_OLD = "grant_too_old"  # the grant is renewed no more (R27); the handler runs on


@dataclass(frozen=True)
class WorkerEvent:
    """One thing a Worker did, for metrics and tests (M1)."""

    kind: WorkerEventKind
    job: Optional[ClaimedJob] = None
    result: Optional[Result] = None
    decision: Optional[Decision] = None
    replayed: bool = False
    duplicate: bool = False
    error: Optional[BaseException] = None
    #: The receipt spooled or refiled (SPOOLED, REFILED, and OBSERVE_FAILED
    #: for a spooled receipt refused for good). Its lease token prints redacted.
    receipt: Optional[SpooledReceipt] = None
    #: The spool's path (SPOOLED, SPOOL_ERROR).
    spool: str = ""


@dataclass
class WorkerStats:
    """What a Worker did since it was made."""

    claimed: int = 0
    takeovers: int = 0  # of which taken over from an expired lease (M1)
    claim_failures: int = 0  # failed claims and worker streams that failed
    completed: int = 0
    rescheduled: int = 0
    escalated: int = 0
    replayed: int = 0  # write-backs answered replayed=True (R21)
    stale_rejected: int = 0  # write-backs refused by the fence (M1)
    write_failures: int = 0
    observations: int = 0  # observations filed (duplicates not counted), spooled ones included once filed
    late_answers: int = 0  # handlers that outlived their deadline and grace
    resends_refused: int = 0
    renewals: int = 0  # leases renewed (R27)
    renew_failures: int = 0  # renewal calls that failed (each tried again)
    grants_lost: int = 0  # grants a renewal found gone: handlers cancelled (R27)
    spooled: int = 0  # receipts written to the receipt spool (R28)
    refiled: int = 0  # spooled receipts the coordinator took, duplicates included
    spool_errors: int = 0  # the spool's own troubles (SPOOL_ERROR events); no receipt is dropped for them

    def as_dict(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}


class Reporter:
    """A Worker's counters, its on_event listener and its logger, shared by
    its parts. Safe from any thread."""

    def __init__(self, log: logging.Logger, on_event: Optional[Callable[[WorkerEvent], None]]) -> None:
        self.log = log
        self._on_event = on_event
        self._stats = WorkerStats()
        self._lock = threading.Lock()

    def stats(self) -> WorkerStats:
        """A copy of the counters."""
        with self._lock:
            return WorkerStats(**self._stats.as_dict())

    def count(self, name: str, n: int = 1) -> None:
        """Adds n to the counter name (a WorkerStats field)."""
        with self._lock:
            setattr(self._stats, name, getattr(self._stats, name) + n)

    def emit(self, e: WorkerEvent) -> None:
        """Hands e to the listener, if any; a listener that raises is logged."""
        if self._on_event is None:
            return
        try:
            self._on_event(e)
        except Exception:  # a failing listener must not break the fencing protocol
            self.log.exception("on_event raised")


def job_fields(c: ClaimedJob) -> dict[str, Any]:
    """The log fields that name c's job and grant."""
    # grant names the grant without revealing its token (R25).
    return {"job_id": c.job.id, "operation_key": c.job.operation_key, "attempt": c.attempt,
            "grant": c.lease_token.fingerprint()}


def error_fields(e: BaseException) -> dict[str, Any]:
    """The log fields of e: its code and reason when the coordinator sent it."""
    if isinstance(e, CoordinatorError):
        return {"error": str(e), "code": e.code.name if isinstance(e.code, grpc.StatusCode) else str(e.code),
                "reason": e.reason}
    return {"error": str(e)}

