"""The Worker: grant → provider call → fenced write-back, on threads.

Threads, not asyncio: grpcio's blocking API is the one that is mature in
the versions Debian ships (1.51), and a provider client is most often a
blocking one (http.client, requests). One thread (run()'s) reads the worker
stream, on which the coordinator pushes grants, and grpcio's own thread
sends on it (see jobfence.stream); with no_stream, or against a coordinator
without it, that thread claims instead. One thread per job in flight runs
its provider call and write-back, one thread renews the leases of every job
whose handler runs (R27), and, with a receipt spool, one files the receipts
the coordinator could not take again (R28).
"""

from __future__ import annotations

import enum
import logging
import random
import signal
import threading
import time
from dataclasses import dataclass, field, fields
from types import FrameType
from typing import Any, Callable, Mapping, Optional, Protocol

import grpc

from .client import MAX_RENEW_BATCH, Client
from .decide import Decision, DecisionKind, ProviderPolicy, Result, decide_at
from .errors import (
    BudgetExhaustedError,
    CoordinatorError,
    FencedError,
    GrantTooOldError,
    JobNotRunningError,
    NotFoundError,
    Reason,
    StaleAttemptError,
    UnavailableError,
)
from .spool import (
    RECEIPT_REFILE_INTERVAL,
    RECEIPT_SPOOL_OFF,
    ReceiptSpool,
    SpooledReceipt,
    default_receipt_spool,
)
from .stream import StreamStub, WorkSession
from .types import ClaimedJob, JobState, NextAction

__all__ = [
    "DrainTimeoutError",
    "GrantLostError",
    "Handler",
    "HandlerContext",
    "ProviderDeadlineError",
    "Worker",
    "WorkerEvent",
    "WorkerEventKind",
    "WorkerOptions",
    "WorkerStats",
]

_log = logging.getLogger("jobfence.worker")

# How long a worker without a receipt spool tries again to file a receipt the
# coordinator cannot take (R15): the receipt lives only as long as the process.
_OBSERVE_RETRY_FOR = 120.0
# How long Worker() waits for a held spool lock: that of a worker just exiting.
_SPOOL_LOCK_WAIT = 1.0
# Refile timing: a pass asked for by a call that succeeded after the
# coordinator was away comes at least this long after the previous pass; the
# pass at the end of run() is bounded by _FINAL_REFILE_TIMEOUT.
_REFILE_MIN_GAP = 5.0
_FINAL_REFILE_TIMEOUT = 10.0
# After a renewal call that failed, the next try comes after a tenth of the lease.
_RENEW_RETRY_DIVISOR = 10


class GrantLostError(Exception):
    """Why a handler's context was cancelled when a renewal found the job's
    grant gone (R27): taken over (STALE_ATTEMPT), already written back
    (JOB_NOT_RUNNING) or the job not found. Send nothing new to the provider;
    an answer already received is still worth returning: the write-back is
    refused by the fence and the answer filed as an observation (R15).
    ``refusal`` is the coordinator's refusal, decoded by reason (R24). It
    never carries the lease token (R25)."""

    def __init__(self, job_id: int, attempt: int, refusal: CoordinatorError) -> None:
        where = ""
        if isinstance(refusal, FencedError) and refusal.current_attempt > 0:
            where = f"; the job is at attempt {refusal.current_attempt}, {refusal.current_state.value or 'state unknown'}"
        super().__init__(
            f"jobfence: grant lost: job {job_id} attempt {attempt} may write no more "
            f"({refusal.reason or 'refused'}{where}); send nothing new to the provider (R27)"
        )
        self.job_id = job_id
        self.attempt = attempt
        self.refusal = refusal

    @property
    def current_attempt(self) -> int:
        return self.refusal.current_attempt if isinstance(self.refusal, FencedError) else 0

    @property
    def current_state(self) -> JobState:
        return self.refusal.current_state if isinstance(self.refusal, FencedError) else JobState.UNSPECIFIED


class ProviderDeadlineError(Exception):
    """Why a handler's context was cancelled when its provider-call deadline passed."""


class DrainTimeoutError(Exception):
    """Raised by Worker.run when jobs were still in flight at the end of the
    drain. Their leases expire and a takeover reconciles them (R6, R14)."""


class HandlerContext:
    """What a handler gets beside its job: the provider-call deadline and a
    cancellation, set when the deadline passes or when a renewal finds the
    grant lost (R27). Check :meth:`cancelled` before sending anything to the
    provider: a lost grant sends nothing new. A request already sent runs to
    its answer or to the deadline (:meth:`remaining` is the time left, for a
    socket timeout); return that answer: the Worker files it as an
    observation when the fence refuses it (R15).
    """

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline
        self._done = threading.Event()
        self._cause: Optional[BaseException] = None
        self._lock = threading.Lock()

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
    never a guess. Both must watch ctx: see HandlerContext."""

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result: ...

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result: ...


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


@dataclass(frozen=True)
class WorkerOptions:
    """Configures a Worker; every duration is in seconds."""

    #: Names this worker in job histories and its observations' source
    #: ("worker:<id>"); 1..128 characters.
    worker_id: str
    #: How many jobs run at once (1..100). The worker claims only as many as
    #: it has free slots (R18).
    concurrency: int = 1
    #: The lease to ask for (1 s..15 min); None: the coordinator's default.
    #: Renewed while the handler runs (R27), it bounds how long a dead or
    #: frozen worker holds a job, not how long a provider call may take.
    lease: Optional[float] = None
    #: Renew the leases of running jobs (R27). False: a lease must outlast
    #: its provider call, provider_timeout plus late_answer_grace (R17).
    lease_renewal: bool = True
    #: How often a running job's lease is renewed; None: a third of the lease
    #: it was granted (its lease_until less claimed_at), within ±10 %.
    renew_interval: Optional[float] = None
    #: Take only this provider's jobs, when set.
    provider: str = ""
    #: The deadline of each handler call.
    provider_timeout: float = 10.0
    #: How long, after the deadline, a handler that ignores its context is
    #: waited for; then the outcome counts as unknown, and whatever the
    #: handler returns later is filed as an observation (R15).
    late_answer_grace: float = 1.0
    #: The decision table's policy for every provider not in ``policies``
    #: (by default same-key resends are not trusted: "no record" escalates, R16).
    policy: ProviderPolicy = ProviderPolicy()
    policies: Mapping[str, ProviderPolicy] = field(default_factory=dict)
    #: Turns the worker stream off: the worker then claims with Claim calls
    #: (polling every poll_interval, or long polls with claim_wait) and writes
    #: back with unary calls. By default it opens one stream
    #: (Coordinator.Work) on which the coordinator pushes grants as slots free
    #: up, at once when a job is enqueued on the same coordinator, and its
    #: write-backs, renewals and receipts go on it, answered exactly as the
    #: unary calls; a call cut with its stream is repeated (R21), on the next
    #: stream or as a unary call. Each grant is acknowledged (a WorkAck) as
    #: soon as it is read, before its jobs start: the coordinator hands back a
    #: grant left unacknowledged for 5 s, so a worker that stops reading holds
    #: no job. A coordinator without Work is claimed from as with no_stream.
    no_stream: bool = False
    #: The pause after a claim that found less work than asked for (not with
    #: claim_wait). Claims only: not on the worker stream.
    poll_interval: float = 1.0
    #: Long-poll each claim up to this long (0..60 s); stop() cancels a
    #: waiting claim. Claims only: the worker stream waits as long as it is open.
    claim_wait: float = 0.0
    #: The first pause after a failed claim (or a worker stream that failed),
    #: doubling up to max_claim_backoff.
    claim_backoff: float = 0.2
    max_claim_backoff: float = 5.0
    #: How long run() drains after stop(): jobs in flight may finish their
    #: provider calls and write-backs until then.
    drain_timeout: float = 30.0
    #: Receives every WorkerEvent, from the worker's threads; it must not block.
    on_event: Optional[Callable[[WorkerEvent], None]] = None
    #: Gets one record per notable event, with job_id, operation_key, attempt
    #: and grant (the lease token's fingerprint, never the token, R25) as
    #: ``extra`` fields (R3). Default: the "jobfence.worker" logger.
    logger: Optional[logging.Logger] = None
    #: The file that keeps the receipts this worker could not file (R28): a
    #: provider's answer whose report_observation failed in a way that may
    #: succeed later (UNAVAILABLE, DATABASE_* included, DEADLINE_EXCEEDED, a
    #: transport error, UNAUTHENTICATED, INTERNAL), after the Client's own
    #: repeats, is appended to it as one JSON line, fsynced before the worker
    #: moves on, and filed again by run(): before its first claim, every
    #: RECEIPT_REFILE_INTERVAL (30 s), and as soon as a call succeeds after
    #: such a failure. The coordinator deduplicates a receipt filed twice. A
    #: permanent refusal (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED…) is
    #: logged at ERROR and not spooled. The file holds
    #: lease tokens: it is created 0600, its folder 0700, and no log line
    #: carries a token. Bounded by MAX_SPOOLED_RECEIPTS and
    #: MAX_RECEIPT_SPOOL_BYTES; past them a receipt is logged at ERROR only.
    #: The lines are the Go and TypeScript SDKs': each files the others'.
    #:
    #: "" (the default): default_receipt_spool(worker_id), under the user's
    #: cache folder. A restarted worker refiles its predecessor's receipts
    #: only if it finds the same file: keep its worker_id, or this, stable.
    #: RECEIPT_SPOOL_OFF ("off"): no spool; a receipt the coordinator does not
    #: take, after trying for up to two minutes, is only in the log. Worker()
    #: takes an exclusive lock on the spool (a file beside it,
    #: ``<path>.lock``), which run() releases when it returns (and shutdown(),
    #: for a Worker never run).
    receipt_spool: str = ""

    def validate(self) -> None:
        if not 1 <= len(self.worker_id) <= 128:
            raise ValueError(f"jobfence: worker_id must be 1..128 characters, got {self.worker_id!r}")
        if not 1 <= self.concurrency <= 100:
            raise ValueError(f"jobfence: concurrency must be 1..100, got {self.concurrency}")
        if not 0 <= self.claim_wait <= 60:
            raise ValueError(f"jobfence: claim_wait must be 0..60 s, got {self.claim_wait}")
        for name in ("provider_timeout", "late_answer_grace", "poll_interval", "claim_backoff",
                     "max_claim_backoff", "drain_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"jobfence: {name} must not be negative")
        if self.provider_timeout <= 0:
            raise ValueError("jobfence: provider_timeout must be positive")
        if self.lease is not None and not 1 <= self.lease <= 900:
            raise ValueError(f"jobfence: lease must be 1..900 s, got {self.lease}")
        if self.renew_interval is not None and self.renew_interval <= 0:
            raise ValueError("jobfence: renew_interval must be positive")
        if self.renew_interval is not None and self.lease is not None and self.renew_interval >= self.lease:
            raise ValueError("jobfence: renew_interval must be shorter than lease")
        if not isinstance(self.receipt_spool, str):
            raise ValueError(f"jobfence: receipt_spool must be a path or {RECEIPT_SPOOL_OFF!r}, got {self.receipt_spool!r}")


class Worker:
    """Runs the grant → provider call → fenced write-back loop:

    - it takes only what it can start now (R18): on the worker stream it
      gives the coordinator one credit per free slot, and one back when a
      job's slot frees; claiming (no_stream, or a coordinator without the
      stream), it asks for max_jobs = free slots;
    - its write-backs, renewals and receipts go on the worker stream while
      one is open, answered and decoded exactly as the unary calls; one cut
      with its stream is repeated (R21), on the next stream or as a unary
      call; a stream that ends while the worker runs is opened again, with
      backoff and all free slots as credits;
    - while a handler runs it renews the job's lease, every due job of the
      worker in one RenewLeases call (R27); when a renewal finds the grant
      gone (STALE_ATTEMPT, JOB_NOT_RUNNING, NOT_FOUND) it cancels the
      handler's context with a GrantLostError, so the handler sends nothing
      new; GRANT_TOO_OLD stops the renewals and cancels nothing (R8);
    - it dispatches by next action: REFUND to handler.refund, anything else
      to handler.reconcile (R14);
    - before a same-key resend it checks the coordinator's resend deadline
      again (R22) and escalates instead when the window is closing;
    - it turns the answer into complete, reschedule or escalate carrying the
      claim's attempt and lease token, by decide_at (R9, R14, R16, R25);
    - a write-back refused by the fence is never repeated: the provider's
      answer is filed with report_observation, source "worker:<id>", with the
      stale attempt and its lease token (R15, R25);
    - a receipt the coordinator cannot take now is spooled to a local file
      and filed later, after a restart too (R28, WorkerOptions.receipt_spool);
    - a failed claim, CLAIM_OUTCOME_UNKNOWN included, is never acted on: it
      backs off and claims again (R7); a claim answered with retry_after
      waits that long (R19);
    - stop() (or SIGTERM, with ``run(install_signal_handlers=True)``) stops
      the claiming and drains: it half-closes the worker stream (grants
      still in flight arrive, cannot be acknowledged and are not started: the
      coordinator hands them back; later write-backs go as unary calls), and
      jobs in flight finish their provider calls and write-backs, until
      drain_timeout.

    Worker() opens and locks the receipt spool. Raises ValueError for an
    invalid option (or no cache folder for the default spool),
    ReceiptSpoolLockedError when another worker holds the spool, and the file
    system's OSError when the spool cannot be created or opened.
    """

    def __init__(self, client: Client, handler: Handler, options: Optional[WorkerOptions] = None, **kw: Any) -> None:
        opts = options if options is not None else WorkerOptions(**kw)
        if options is not None and kw:
            raise TypeError("jobfence: pass WorkerOptions or keyword options, not both")
        opts.validate()
        self.options = opts
        self._client = client
        self._handler = handler
        self._log = opts.logger or _log
        self._cv = threading.Condition()  # guards _active, _stopping; notified on both
        self._active = 0
        self._stopping = False
        self._stop_event = threading.Event()  # set with _stopping, to cancel a waiting claim
        self._started = False
        self._done = threading.Event()
        self._cut = threading.Event()  # the drain timed out
        self._late: set[threading.Thread] = set()
        self._stats = WorkerStats()
        self._stats_lock = threading.Lock()
        self._renewer = _Renewer(self) if opts.lease_renewal else None
        # The worker stream; None with no_stream. The worker's calls then go
        # through a stub that sends write-backs, renewals and receipts on it.
        self._session: Optional[WorkSession] = None
        if not opts.no_stream:
            self._session = WorkSession(self, client.stub, client._metadata)
            self._client = client._through(StreamStub(client.stub, self._session))
        # The receipt spool (R28); None when off. _refile_lock serialises
        # refile passes; _backlog is set while the spool holds receipts the
        # coordinator was away for, so that the next successful call asks
        # for a pass (_kick_refile).
        self._spool: Optional[ReceiptSpool] = None
        self._refile_lock = threading.Lock()
        self._refile_cv = threading.Condition()
        self._refile_kicked = False
        self._refile_quit = False
        self._backlog = False
        if opts.receipt_spool != RECEIPT_SPOOL_OFF:
            path = opts.receipt_spool
            if not path:
                try:
                    path = default_receipt_spool(opts.worker_id)
                except ValueError as e:
                    raise ValueError(f"{e} (set receipt_spool to a file, or to {RECEIPT_SPOOL_OFF!r})") from None
            self._spool = ReceiptSpool.open(path, _SPOOL_LOCK_WAIT)
            if self._spool.torn:
                self._spool_error(OSError(f"cut off {self._spool.torn} bytes of an unfinished last line: a crash in "
                                          "the middle of an append that was never acknowledged"))
            if n := self._spool.pending():
                self._log.warning("receipt spool holds receipts not filed yet; run() files them before claiming (R28)",
                                  extra={"spool": self._spool.path, "receipts": n})

    # -- public ------------------------------------------------------------

    def stats(self) -> WorkerStats:
        """A copy of the worker's counters."""
        with self._stats_lock:
            return WorkerStats(**self._stats.as_dict())

    @property
    def receipt_spool(self) -> Optional[str]:
        """The receipt spool's path; None when it is off."""
        return self._spool.path if self._spool is not None else None

    @property
    def spooled_receipts(self) -> int:
        """How many receipts the spool holds now (0 when it is off)."""
        return self._spool.pending() if self._spool is not None else 0

    @property
    def in_flight(self) -> int:
        """How many jobs are being worked now."""
        with self._cv:
            return self._active

    def stop(self) -> None:
        """Stops taking jobs; run() drains and returns. Safe from any thread.
        The worker stream is half-closed (grants still on their way are not
        started: the coordinator hands them back); a waiting long-poll claim
        is cancelled (a job it may still have granted returns through a
        takeover after its lease, R7)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._stop_event.set()
        if self._session is not None:
            self._session.close_send()

    def shutdown(self, timeout: Optional[float] = None) -> bool:
        """stop(), then waits up to timeout seconds for run() to return; True
        when it did. For a Worker never run it releases the receipt spool."""
        self.stop()
        if not self._started:
            # Never run: nothing to drain; a run() now stops at once.
            self._close_spool()
            return True
        return self._done.wait(timeout)

    def run(self, *, install_signal_handlers: bool = False) -> None:
        """Takes jobs (from the worker stream, or by claiming) and works them
        until stop(), then drains. Stream, claim and write-back failures are
        handled inside and never end it.

        With ``install_signal_handlers`` (from the main thread only) SIGTERM
        and SIGINT call stop(): the rolling-deploy path, jobs already claimed
        are finished, not abandoned. The handlers in place before are put
        back at the first signal, so a second one acts as it did before (by
        default: SIGINT raises KeyboardInterrupt, SIGTERM ends the process).

        Raises DrainTimeoutError when jobs were cut off at drain_timeout, and
        RuntimeError when called twice."""
        if self._started:
            raise RuntimeError("jobfence: worker already started")
        self._started = True
        restore = self._install_signals() if install_signal_handlers else None
        renewer: Optional[threading.Thread] = None
        refiler: Optional[threading.Thread] = None
        drained = False
        try:
            spool = self._spool
            if spool is not None and not spool.closed:
                # R28: what a predecessor (or this worker) could not file goes
                # first, then every RECEIPT_REFILE_INTERVAL and after a failure heals.
                self._refile()
                refiler = threading.Thread(target=self._refile_loop, name="jobfence-refiler", daemon=True)
                refiler.start()
            if self._renewer is not None:
                renewer = threading.Thread(target=self._renewer.run, name="jobfence-renewer", daemon=True)
                renewer.start()
            self._grant_loop()
            drained = self._drain()
        finally:
            if self._renewer is not None:
                self._renewer.quit()
            if renewer is not None:
                renewer.join(5)
            if refiler is not None:
                with self._refile_cv:
                    self._refile_quit = True
                    self._refile_cv.notify_all()
                refiler.join()
                # A last pass for what the drain spooled; skipped when the
                # drain was cut off.
                if drained and self._spool is not None and self._spool.pending() > 0:
                    self._refile(time.monotonic() + _FINAL_REFILE_TIMEOUT)
            self._close_spool()
            if restore is not None:
                restore()
            self._done.set()
        if not drained:
            raise DrainTimeoutError(
                f"jobfence: drain timeout: {self.in_flight} jobs in flight were cut off; their leases will expire"
            )

    # -- claiming ----------------------------------------------------------

    def _install_signals(self) -> Callable[[], None]:
        old: dict[int, Any] = {}

        def on_signal(signum: int, frame: Optional[FrameType]) -> None:
            for s, h in old.items():
                signal.signal(s, h)
            self._log.info("draining: no more claims; finishing the jobs in flight",
                           extra={"signal": signal.Signals(signum).name, "in_flight": self._active})
            # Not stop() itself: a signal handler must not take a lock the
            # interrupted code may hold.
            threading.Thread(target=self.stop, name="jobfence-stop", daemon=True).start()

        for s in (signal.SIGTERM, signal.SIGINT):
            old[s] = signal.signal(s, on_signal)

        def restore() -> None:
            for s, h in old.items():
                if signal.getsignal(s) is on_signal:
                    signal.signal(s, h)

        return restore

    def _pause(self, seconds: float, until_free: bool = False) -> None:
        """Waits seconds, less when the worker stops (or, until_free, a slot frees)."""
        end = time.monotonic() + seconds
        with self._cv:
            while not self._stopping and (not until_free or self._active >= self.options.concurrency):
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._cv.wait(left)

    def _is_stopping(self) -> bool:
        with self._cv:
            return self._stopping

    def _emit_claim_failed(self, e: BaseException) -> None:
        self._emit(WorkerEvent(WorkerEventKind.CLAIM_FAILED, error=e))

    def _grant_loop(self) -> None:
        """Takes jobs until the worker stops: from the worker stream, or by
        claiming when it is off or the coordinator has none."""
        if self._session is not None:
            if self._session.run(self._start):
                return
            self._log.info("the coordinator has no worker stream; claiming with Claim calls")
        self._claim_loop()

    def _claim_loop(self) -> None:
        o = self.options
        backoff = o.claim_backoff
        while True:
            with self._cv:
                if self._stopping:
                    return
                free = o.concurrency - self._active
            if free <= 0:
                self._pause(60.0, until_free=True)
                continue
            try:
                # R18: ask only for what can start now.
                jobs = self._client.claim(
                    o.worker_id,
                    free,
                    lease=o.lease,
                    provider=o.provider,
                    wait=o.claim_wait or None,
                    cancel=self._stop_event if o.claim_wait else None,
                )
            except BudgetExhaustedError as e:
                # R19: due work waits on the provider's budget; not a failure.
                self._log.debug("provider budget exhausted", extra={"retry_after": e.retry_after})
                self._pause(e.retry_after)
                continue
            except Exception as e:  # noqa: BLE001 - every failure of a claim grants nothing (R7)
                if self._stop_event.is_set():
                    return  # the long poll was cancelled by stop(), not failed
                # R7: a failed claim, CLAIM_OUTCOME_UNKNOWN included, grants
                # nothing to act on; a job it did commit comes back through a
                # takeover after its lease. Never repeated as such.
                self._count("claim_failures")
                self._emit(WorkerEvent(WorkerEventKind.CLAIM_FAILED, error=e))
                self._log.warning("claim failed; nothing acted on (R7)", extra={"error": str(e), "backoff": backoff})
                self._pause(backoff * (0.5 + random.random()))
                backoff = min(2 * backoff, o.max_claim_backoff)
                continue
            backoff = o.claim_backoff
            self._kick_refile()
            for c in jobs:
                self._start(c)
            if not o.claim_wait and len(jobs) < free:
                self._pause(o.poll_interval)

    def _start(self, c: ClaimedJob) -> None:
        with self._cv:
            self._active += 1
        t = threading.Thread(target=self._run_job, args=(c,), name=f"jobfence-job-{c.job.id}", daemon=True)
        t.start()

    def _run_job(self, c: ClaimedJob) -> None:
        try:
            self._work(c)
        except Exception:  # never lose the slot to a bug in a callback
            self._log.exception("job thread failed", extra=_job_fields(c))
        finally:
            with self._cv:
                self._active -= 1
                self._cv.notify_all()
            if self._session is not None:
                self._session.freed()

    def _drain(self) -> bool:
        end = time.monotonic() + self.options.drain_timeout
        with self._cv:
            while self._active > 0:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            active = self._active
        with self._cv:
            late = list(self._late)
        for t in late:
            t.join(max(0.0, end - time.monotonic()))
        if active > 0 or any(t.is_alive() for t in late):
            self._cut.set()
            self._log.warning("drain timeout: cutting in-flight jobs off; their leases will expire",
                              extra={"active": active})
            return False
        self._log.info("worker drained")
        return True

    # -- one job -----------------------------------------------------------

    def _policy(self, provider: str) -> ProviderPolicy:
        return self.options.policies.get(provider, self.options.policy)

    def _work(self, c: ClaimedJob) -> None:
        self._count("claimed")
        if c.takeover:
            self._count("takeovers")
        self._emit(WorkerEvent(WorkerEventKind.CLAIMED, job=c))
        f = _job_fields(c)
        self._log.log(logging.INFO if c.takeover else logging.DEBUG,
                      "job taken over" if c.takeover else "job claimed",
                      extra={**f, "next_action": c.next_action.value, "takeover": c.takeover})
        pol = self._policy(c.job.provider)
        if c.next_action is NextAction.REFUND and c.sends_again() and pol.same_key_resend_safe:
            # R14, R22: the reconcile that chose this resend checked the
            # window, but time has passed since; check again, on the
            # coordinator's clock, before anything leaves.
            ok, why = pol.resend_allowed(c, c.coordinator_now())
            if not ok:
                d = Decision(DecisionKind.ESCALATE, reason=f"same-key resend refused before sending: {why} (R14, R16)")
                self._count("resends_refused")
                self._emit(WorkerEvent(WorkerEventKind.RESEND_REFUSED, job=c, decision=d))
                self._log.warning("same-key resend refused; escalating", extra={**f, "why": why})
                self._write(c, d, Result())
                return
        res = self._call(c)
        self._emit(WorkerEvent(WorkerEventKind.HANDLED, job=c, result=res))
        self._write(c, decide_at(res, c, pol, c.coordinator_now()), res)

    def _call(self, c: ClaimedJob) -> Result:
        """Runs the handler under the provider-call deadline, on a thread of
        its own. A handler that ignores its context is given
        late_answer_grace; after that its outcome is unknown and its eventual
        answer is filed as an observation (R15)."""
        o = self.options
        ctx = HandlerContext(time.monotonic() + o.provider_timeout)
        held = self._renewer.hold(c, ctx) if self._renewer is not None else None
        box: list[Result] = []
        answered = threading.Event()

        def call() -> None:
            try:
                # R14: only a first send refunds; anything else asks first.
                if c.next_action is NextAction.REFUND:
                    r = self._handler.refund(c, ctx)
                else:
                    r = self._handler.reconcile(c, ctx)
                if not isinstance(r, Result):
                    r = Result.unknown(TypeError(f"handler returned {type(r).__name__}, not a Result"))
            except BaseException as e:  # noqa: BLE001 - a handler that raises leaves the outcome unknown
                self._log.info("provider call failed; outcome unknown", extra={**_job_fields(c), "error": repr(e)})
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
        self._count("late_answers")
        self._emit(WorkerEvent(WorkerEventKind.PROVIDER_DEADLINE, job=c))
        self._log.warning("handler outlived the provider-call deadline; outcome unknown",
                          extra={**_job_fields(c), "deadline": o.provider_timeout})

        def late() -> None:
            try:
                answered.wait()
                self._observe(c, box[0], "answer arrived after the provider-call deadline")
            finally:
                with self._cv:
                    self._late.discard(threading.current_thread())

        lt = threading.Thread(target=late, name=f"jobfence-late-{c.job.id}", daemon=True)
        with self._cv:
            self._late.add(lt)
        lt.start()
        return Result.unknown(ProviderDeadlineError(f"provider call outlived its deadline of {o.provider_timeout:g}s"))

    def _write(self, c: ClaimedJob, d: Decision, res: Result) -> None:
        """The fenced write-back under the claimed grant (R9, R25). The Client
        repeats it after UNAVAILABLE (R21); the fence's refusal is final."""
        f = _job_fields(c)
        try:
            if d.kind is DecisionKind.COMPLETE:
                wr = self._client.complete(c.job.id, c.attempt, c.lease_token, d.provider_refund_id)
            elif d.kind is DecisionKind.ESCALATE:
                wr = self._client.escalate(c.job.id, c.attempt, c.lease_token, _clip(d.reason, 1024))
            else:
                wr = self._client.reschedule(c.job.id, c.attempt, c.lease_token, next_action=d.next_action,
                                             delay=d.delay, reason=_clip(d.reason, 1024))
        except FencedError as e:
            # R9, R21: the fence said no and a repeat cannot change that. Keep
            # the provider's answer as evidence for the current holder (R15).
            self._count("stale_rejected")
            self._emit(WorkerEvent(WorkerEventKind.STALE, job=c, result=res, decision=d, error=e))
            self._log.info("write-back rejected by the fence; filing the answer as an observation",
                           extra={**f, "decision": d.kind.value, "reason": e.reason,
                                  "current_attempt": e.current_attempt})
            self._observe(c, res, f"write-back {d.kind.value} rejected: {e}")
            return
        except Exception as e:  # noqa: BLE001
            # The lease will lapse and a takeover reconciles (R6, R14); the
            # receipt is kept if the coordinator takes it.
            self._count("write_failures")
            self._emit(WorkerEvent(WorkerEventKind.WRITE_FAILED, job=c, result=res, decision=d, error=e))
            self._log.warning("write-back failed; the lease will expire and a takeover reconciles",
                              extra={**f, "decision": d.kind.value, "error": str(e)})
            self._observe(c, res, f"write-back {d.kind.value} failed: {e}")
            return
        self._kick_refile()
        self._count({DecisionKind.COMPLETE: "completed", DecisionKind.ESCALATE: "escalated"}.get(d.kind, "rescheduled"))
        if wr.replayed:
            self._count("replayed")
        self._emit(WorkerEvent(WorkerEventKind.WRITTEN, job=c, result=res, decision=d, replayed=wr.replayed))
        self._log.info("job written", extra={
            **f, "decision": d.kind.value, "next_action": d.next_action.value, "delay": d.delay,
            "reason": d.reason, "provider_refund_id": d.provider_refund_id, "replayed": wr.replayed,
        })

    def _observe(self, c: ClaimedJob, res: Result, detail: str) -> None:
        """Files a provider answer as an observation under the claimed grant
        (R15, R25); results that carry no word from the provider are skipped.
        By operation key, not id: a database that lost recent commits in a
        failover may give the lost job's id to another refund (R1, R26). What
        the coordinator cannot take now is spooled (R28)."""
        outcome = res.observed()
        if outcome is None:
            return
        if res.reason:
            detail += f"; provider: {res.reason}"
        f = _job_fields(c)
        receipt = SpooledReceipt(
            job_id=c.job.id, operation_key=c.job.operation_key, attempt=c.attempt, lease_token=c.lease_token,
            source=_clip(f"worker:{self.options.worker_id}", 128), outcome=outcome,
            provider_refund_id=res.provider_refund_id, provider_event_id=res.provider_event_id,
            detail=_clip(detail, 4096),
        )
        fields = {"outcome": outcome.value, "provider_refund_id": res.provider_refund_id,
                  "provider_event_id": res.provider_event_id, "source": receipt.source}
        # The receipt may be the only trace of a refund the provider made. With
        # a spool: one call (the Client repeats it after UNAVAILABLE), then the
        # spool, which outlives this process; the job's slot is not held while
        # the coordinator is away. Without one: try for up to two minutes or
        # until the drain gives up (the coordinator deduplicates repeats).
        end = time.monotonic() + (0.0 if self._spool is not None else _OBSERVE_RETRY_FOR)
        pause = 0.1
        while True:
            try:
                obs, dup, _ = self._client.report_observation(**receipt.request())
            except UnavailableError as e:
                if time.monotonic() + pause < end and not self._cut.is_set():
                    self._log.warning("observation not filed yet; retrying",
                                      extra={**f, **fields, "error": str(e), "in": pause})
                    time.sleep(pause)
                    pause = min(2 * pause, 5.0)
                    continue
                err: Exception = e
            except Exception as e:  # noqa: BLE001
                err = e
            else:
                self._kick_refile()
                if not dup:
                    self._count("observations")
                self._emit(WorkerEvent(WorkerEventKind.OBSERVED, job=c, result=res, duplicate=dup))
                self._log.info("observation filed", extra={**f, **fields, "observation_id": obs.id, "duplicate": dup})
                return
            break
        spool = self._spool
        if spool is None or not refile_later(err):
            self._emit(WorkerEvent(WorkerEventKind.OBSERVE_FAILED, job=c, result=res, error=err))
            self._log.error("observation not filed: the provider's answer is only in this log",
                            extra={**f, **fields, **_error_fields(err)})
            return
        # R28: durable before the worker moves on.
        try:
            spool.append(receipt)
        except Exception as se:  # noqa: BLE001 - full, closed, or the disk's error
            self._emit(WorkerEvent(WorkerEventKind.OBSERVE_FAILED, job=c, result=res, error=err, receipt=receipt,
                                   spool=spool.path))
            self._log.error("observation not filed: the provider's answer is only in this log",
                            extra={**f, **fields, **_error_fields(err), "spool_error": str(se), "spool": spool.path})
            return
        with self._refile_cv:
            self._backlog = True
        self._count("spooled")
        self._emit(WorkerEvent(WorkerEventKind.SPOOLED, job=c, result=res, error=err, receipt=receipt, spool=spool.path))
        self._log.warning("observation not filed; spooled, to be filed when the coordinator takes it (R28)",
                          extra={**f, **fields, "error": str(err), "spool": spool.path})

    # -- the receipt spool (R28) --------------------------------------------

    def _kick_refile(self) -> None:
        """Asks for a refile pass when the spool holds receipts the
        coordinator was away for: a call just succeeded, so it is back."""
        if self._spool is None:
            return
        with self._refile_cv:
            if self._backlog and not self._refile_kicked:
                self._refile_kicked = True
                self._refile_cv.notify_all()

    def _refile_loop(self) -> None:
        """Refile passes every RECEIPT_REFILE_INTERVAL and when kicked, until run() ends."""
        spool = self._spool
        assert spool is not None
        last = time.monotonic()
        while True:
            with self._refile_cv:
                due = time.monotonic() + RECEIPT_REFILE_INTERVAL
                while not self._refile_quit and not self._refile_kicked and time.monotonic() < due:
                    self._refile_cv.wait(due - time.monotonic())
                if self._refile_quit:
                    return
                if self._refile_kicked:
                    self._refile_kicked = False
                    # Kicked passes come at least _REFILE_MIN_GAP apart.
                    gap = last + _REFILE_MIN_GAP
                    while not self._refile_quit and time.monotonic() < gap:
                        self._refile_cv.wait(gap - time.monotonic())
                    if self._refile_quit:
                        return
            if spool.pending() > 0:
                self._refile()
            last = time.monotonic()

    def _refile(self, deadline: Optional[float] = None) -> None:
        """Files every spooled receipt again, exactly as first tried, so that
        the coordinator deduplicates one that had landed (R15, R28), then
        rewrites the spool without the receipts filed or refused for good.
        A receipt leaves the spool only once the coordinator answered it. It
        stops at the first failure that says the coordinator is away (or at
        ``deadline``, on time.monotonic()'s clock); the rest waits for the
        next pass. Lines this version cannot read are kept."""
        spool = self._spool
        assert spool is not None
        with self._refile_lock:
            try:
                lines, up_to = spool.snapshot()
            except Exception as e:  # noqa: BLE001
                self._spool_error(e, "unreadable; its receipts wait")
                return
            keep: list[bytes] = []
            filed = dropped = unreadable = 0
            away: Optional[BaseException] = None
            for line in lines:
                r = line.receipt
                if r is None:
                    unreadable += 1
                    keep.append(line.raw)
                    continue
                timeout: Optional[float] = None
                if away is None and deadline is not None:
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        away = TimeoutError("the refile pass ran out of time")
                if away is not None:
                    keep.append(line.raw)
                    continue
                try:
                    obs, dup, _ = self._client.report_observation(**r.request(), timeout=timeout)
                except Exception as e:  # noqa: BLE001
                    if not refile_later(e):
                        dropped += 1
                        self._emit(WorkerEvent(WorkerEventKind.OBSERVE_FAILED, error=e, receipt=r, spool=spool.path))
                        self._log.error("observation not filed: the provider's answer is only in this log",
                                        extra={**r.log_fields(), **_error_fields(e), "spool": spool.path,
                                               "dropped_from_spool": True})
                        continue
                    keep.append(line.raw)
                    if coordinator_away(e):
                        away = e
                    else:
                        self._log.warning("spooled receipt not filed yet; kept",
                                          extra={**r.log_fields(), "error": str(e)})
                    continue
                filed += 1
                self._count("refiled")
                if not dup:
                    self._count("observations")
                self._emit(WorkerEvent(WorkerEventKind.REFILED, duplicate=dup, receipt=r, spool=spool.path))
                self._log.info("spooled receipt filed", extra={
                    **r.log_fields(), "observation_id": obs.id, "duplicate": dup,
                    "attempt_verified": obs.attempt_verified})
            if unreadable:
                self._spool_error(OSError(f"{unreadable} lines this version cannot read are kept as they are; "
                                          "file them by hand"))
            if filed + dropped:
                try:
                    spool.rewrite(up_to, keep)
                except Exception as e:  # noqa: BLE001
                    # The old file stands: what was filed is filed again next
                    # time, and deduplicated.
                    self._spool_error(e, "not rewritten")
            with self._refile_cv:
                self._backlog = away is not None
            if away is not None:
                self._log.warning("spooled receipts wait for the coordinator", extra={
                    "spool": spool.path, "filed": filed, "left": len(keep), "error": str(away)})
            elif filed + dropped:
                self._log.info("receipt spool refiled", extra={
                    "spool": spool.path, "filed": filed, "dropped": dropped, "left": len(keep)})

    def _spool_error(self, e: BaseException, what: str = "") -> None:
        spool = self._spool
        path = spool.path if spool is not None else ""
        self._count("spool_errors")
        self._emit(WorkerEvent(WorkerEventKind.SPOOL_ERROR, error=e, spool=path))
        self._log.error("receipt spool", extra={"spool": path, "error": f"{what}: {e}" if what else str(e)})

    def _close_spool(self) -> None:
        """Releases the spool, removing its file when empty."""
        spool = self._spool
        if spool is None or spool.closed:
            return
        left = spool.pending()
        try:
            spool.close()
        except Exception as e:  # noqa: BLE001
            self._spool_error(e, "not closed cleanly")
        if left:
            self._log.warning("receipt spool released with receipts not filed; the next worker on this spool "
                              "files them (R28)", extra={"spool": spool.path, "receipts": left})

    # -- internals -----------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            setattr(self._stats, name, getattr(self._stats, name) + n)

    def _emit(self, e: WorkerEvent) -> None:
        if self.options.on_event is None:
            return
        try:
            self.options.on_event(e)
        except Exception:  # a failing listener must not break the fencing protocol
            self._log.exception("on_event raised")


class _Held:
    """One job whose handler runs, renewed by the worker's renewer (R27)."""

    __slots__ = ("c", "ctx", "lease", "interval", "due", "too_old")

    def __init__(self, c: ClaimedJob, ctx: HandlerContext, lease: float, interval: float, due: float) -> None:
        self.c = c
        self.ctx = ctx
        self.lease = lease
        self.interval = interval
        self.due = due  # time.monotonic() of the next renewal
        self.too_old = False


class _Renewer:
    """Keeps the leases of a Worker's running jobs alive while their handlers
    run (R27): one thread for the whole worker, each round one RenewLeases
    call for every job whose renewal is due, at about a third of its lease,
    with ±10 % jitter so that a fleet started together does not renew in step."""

    def __init__(self, w: Worker) -> None:
        self._w = w
        self._cv = threading.Condition()
        self._held: dict[int, _Held] = {}
        self._quit = False

    def _interval(self, lease: float) -> float:
        return self._w.options.renew_interval or lease / 3

    def hold(self, c: ClaimedJob, ctx: HandlerContext) -> _Held:
        """Starts renewing c's lease; a lost grant cancels ctx."""
        lease = c.lease_seconds() or self._w.options.lease or 30.0
        interval = self._interval(lease)
        h = _Held(c, ctx, lease, interval, time.monotonic() + _jitter(interval))
        with self._cv:
            older = self._held.get(c.job.id)
            if older is not None and older.c.attempt < c.attempt:
                # This worker took its own job over: that takeover's commit
                # ended the older grant (R8), whatever its renewal would say.
                older.ctx._cancel(GrantLostError(c.job.id, older.c.attempt, StaleAttemptError(
                    _FP, f"job {c.job.id} was taken over by this worker's own claim of attempt {c.attempt}",
                    "STALE_ATTEMPT", {"current_attempt": str(c.attempt)})))
            self._held[c.job.id] = h
            self._cv.notify_all()
        return h

    def release(self, h: _Held) -> None:
        """Stops renewing h: its handler returned."""
        with self._cv:
            if self._held.get(h.c.job.id) is h:
                del self._held[h.c.job.id]

    def quit(self) -> None:
        with self._cv:
            self._quit = True
            self._cv.notify_all()

    def run(self) -> None:
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

    def _renew(self, hs: list[_Held]) -> None:
        w = self._w
        # A renewal that takes longer than the interval is as good as failed.
        timeout = max(1.0, min(10.0, min(h.interval for h in hs)))
        try:
            out = w._client.renew_leases([h.c.grant() for h in hs], lease=w.options.lease, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - never a cancellation: the grant holds until a takeover commits (R8)
            self._failed(hs, e)
            return
        now = time.monotonic()
        retry: list[_Held] = []
        retry_error: Optional[BaseException] = None
        for h, r in zip(hs, out):
            with self._cv:
                if self._held.get(h.c.job.id) is not h:
                    continue  # its handler returned meanwhile
            f = _job_fields(h.c)
            if r.job_id != h.c.job.id or r.attempt != h.c.attempt:
                retry.append(h)
                retry_error = retry_error or CoordinatorError(_FP, "RenewLeases answered out of order")
            elif r.refused is None:
                w._count("renewals")
                h.due = now + _jitter(h.interval)
                w._emit(WorkerEvent(WorkerEventKind.RENEWED, job=h.c))
                if r.receipt_filed_at is not None:
                    w._log.debug("a receipt of success or failure was filed for the job during this grant (R28)",
                                 extra={**f, "receipt_filed_at": r.receipt_filed_at.isoformat()})
            elif isinstance(r.refused, GrantTooOldError):
                # R27: renew no more; the lease runs out and the job is taken
                # over as usual. Until that takeover commits the grant may
                # still write (R8), so the handler runs on.
                h.too_old = True
                w._emit(WorkerEvent(WorkerEventKind.GRANT_TOO_OLD, job=h.c, error=r.refused))
                w._log.warning("the coordinator renews this grant no more (--max-grant-age); its lease runs out and "
                               "the job is taken over unless the handler finishes first (R27)",
                               extra={**f, "grant_expires_at": str(r.grant_expires_at)})
            elif isinstance(r.refused, (StaleAttemptError, JobNotRunningError, NotFoundError)):
                w._count("grants_lost")
                with self._cv:
                    self._held.pop(h.c.job.id, None)
                lost = GrantLostError(h.c.job.id, h.c.attempt, r.refused)
                h.ctx._cancel(lost)
                w._emit(WorkerEvent(WorkerEventKind.GRANT_LOST, job=h.c, error=r.refused))
                w._log.warning("grant lost; cancelling the handler before it sends anything new (R27)",
                               extra={**f, "error": str(r.refused)})
            else:
                # Not decided for this grant (DATABASE_UNAVAILABLE, a reason
                # newer than this SDK): again soon.
                retry.append(h)
                retry_error = retry_error or r.refused
        if retry:
            self._failed(retry, retry_error or CoordinatorError(_FP, "not renewed"))

    def _failed(self, hs: list[_Held], e: BaseException) -> None:
        w = self._w
        w._count("renew_failures")
        w._log.warning("lease renewal failed; trying again soon", extra={"jobs": len(hs), "error": str(e)})
        now = time.monotonic()
        for h in hs:
            h.due = now + _jitter(h.lease / _RENEW_RETRY_DIVISOR)
            w._emit(WorkerEvent(WorkerEventKind.RENEW_FAILED, job=h.c, error=e))


# The code of the refusals this SDK makes up itself.
_FP = grpc.StatusCode.FAILED_PRECONDITION


def _jitter(d: float) -> float:
    return d * (0.9 + 0.2 * random.random())


def _job_fields(c: ClaimedJob) -> dict[str, Any]:
    # grant names the grant without revealing its token (R25).
    return {"job_id": c.job.id, "operation_key": c.job.operation_key, "attempt": c.attempt,
            "grant": c.lease_token.fingerprint()}


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n]


def _error_fields(e: BaseException) -> dict[str, Any]:
    if isinstance(e, CoordinatorError):
        return {"error": str(e), "code": e.code.name if isinstance(e.code, grpc.StatusCode) else str(e.code),
                "reason": e.reason}
    return {"error": str(e)}


# The codes of a report_observation refusal that no later try can change.
_FINAL = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED,
          grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE,
          grpc.StatusCode.UNIMPLEMENTED)


def refile_later(err: BaseException) -> bool:
    """Whether a report_observation that failed with err may succeed when made
    again later (R28): nothing answered (transport, a cut deadline),
    UNAVAILABLE (DATABASE_* included), DEADLINE_EXCEEDED, a credential being
    rotated, an internal error a fixed coordinator may not have,
    RESOURCE_EXHAUSTED (an earlier coordinator's OBSERVATION_LIMIT included).
    INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED and the other refusals of
    the request itself are final."""
    if not isinstance(err, CoordinatorError):
        return True
    if err.code in _FINAL:
        return False
    # RESOURCE_EXHAUSTED included: OBSERVATION_LIMIT comes from coordinators
    # of earlier releases only, and is kept in the spool until one that keeps
    # such a receipt aside takes it (R28: none is dropped for a per-job limit).
    return True


def coordinator_away(err: BaseException) -> bool:
    """Whether err says the coordinator cannot take any receipt now, so that a
    refile pass stops instead of trying the rest."""
    if not isinstance(err, CoordinatorError):
        return True
    return err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                        grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNKNOWN)

