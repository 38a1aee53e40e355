"""Receipts: a provider's answer filed as an observation (R15), and the
receipt spool that keeps those the coordinator cannot take now and files
them later, after a restart too (R28, jobfence.spool)."""

from __future__ import annotations

import threading
import time
from typing import Optional

import grpc

from .client import Client
from .decide import Result
from .errors import CoordinatorError, UnavailableError
from .events import Reporter, WorkerEvent, WorkerEventKind, error_fields, job_fields
from .spool import RECEIPT_REFILE_INTERVAL, RECEIPT_SPOOL_OFF, ReceiptSpool, SpooledReceipt, default_receipt_spool
from .types import ClaimedJob, clip

# How long a worker without a receipt spool tries again to file a receipt the
# coordinator cannot take (R15): the receipt lives only as long as the process.
_OBSERVE_RETRY_FOR = 120.0
# How long Receipts() waits for a held spool lock: that of a worker just exiting.
_SPOOL_LOCK_WAIT = 1.0
# Refile timing: a pass asked for by a call that succeeded after the
# coordinator was away comes at least this long after the previous pass; the
# pass at the end of run() is bounded by _FINAL_REFILE_TIMEOUT.
_REFILE_MIN_GAP = 5.0
_FINAL_REFILE_TIMEOUT = 10.0


class Receipts:
    """Files a Worker's receipts: each at once (report_observation), and,
    with a spool, those the coordinator could not take appended to it and
    refiled by a thread of their own (start() to finish()): every
    RECEIPT_REFILE_INTERVAL, and when a call succeeds after the coordinator
    was away (kick()).

    Receipts() opens and locks the spool named by ``spool`` (WorkerOptions.
    receipt_spool: "" for default_receipt_spool(worker_id), RECEIPT_SPOOL_OFF
    for none). Raises ValueError when there is no cache folder for the
    default spool, ReceiptSpoolLockedError when another worker holds it, and
    the file system's OSError when it cannot be created or opened."""

    def __init__(self, client: Client, worker_id: str, spool: str, report: Reporter) -> None:
        self._client = client
        self._worker_id = worker_id
        self._report = report
        #: Set when the drain cut the jobs off: a receipt is tried no more.
        self.cut = threading.Event()
        # The spool (R28); None when off. _refile_lock serialises refile
        # passes; _backlog is set while the spool holds receipts the
        # coordinator was away for, so that the next successful call asks
        # for a pass (kick).
        self._spool: Optional[ReceiptSpool] = None
        self._refile_lock = threading.Lock()
        self._refile_cv = threading.Condition()
        self._refile_kicked = False
        self._refile_quit = False
        self._backlog = False
        self._refiler: Optional[threading.Thread] = None
        if spool == RECEIPT_SPOOL_OFF:
            return
        path = spool
        if not path:
            try:
                path = default_receipt_spool(worker_id)
            except ValueError as e:
                raise ValueError(f"{e} (set receipt_spool to a file, or to {RECEIPT_SPOOL_OFF!r})") from None
        self._spool = ReceiptSpool.open(path, _SPOOL_LOCK_WAIT)
        if self._spool.torn:
            self._spool_error(OSError(f"cut off {self._spool.torn} bytes of an unfinished last line: a crash in "
                                      "the middle of an append that was never acknowledged"))
        if n := self._spool.pending():
            report.log.warning("receipt spool holds receipts not filed yet; run() files them before claiming (R28)",
                               extra={"spool": self._spool.path, "receipts": n})

    @property
    def path(self) -> Optional[str]:
        """The spool's path; None when it is off."""
        return self._spool.path if self._spool is not None else None

    def pending(self) -> int:
        """How many receipts the spool holds now (0 when it is off)."""
        return self._spool.pending() if self._spool is not None else 0

    def file(self, c: ClaimedJob, res: Result, detail: str) -> None:
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
        rep = self._report
        f = job_fields(c)
        receipt = SpooledReceipt(
            job_id=c.job.id, operation_key=c.job.operation_key, attempt=c.attempt, lease_token=c.lease_token,
            source=clip(f"worker:{self._worker_id}", 128), outcome=outcome,
            provider_refund_id=res.provider_refund_id, provider_event_id=res.provider_event_id,
            detail=clip(detail, 4096),
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
                if time.monotonic() + pause < end and not self.cut.is_set():
                    rep.log.warning("observation not filed yet; retrying",
                                    extra={**f, **fields, "error": str(e), "in": pause})
                    time.sleep(pause)
                    pause = min(2 * pause, 5.0)
                    continue
                err: Exception = e
            except Exception as e:  # noqa: BLE001
                err = e
            else:
                self.kick()
                if not dup:
                    rep.count("observations")
                rep.emit(WorkerEvent(WorkerEventKind.OBSERVED, job=c, result=res, duplicate=dup))
                rep.log.info("observation filed", extra={**f, **fields, "observation_id": obs.id, "duplicate": dup})
                return
            break
        spool = self._spool
        if spool is None or not refile_later(err):
            rep.emit(WorkerEvent(WorkerEventKind.OBSERVE_FAILED, job=c, result=res, error=err))
            rep.log.error("observation not filed: the provider's answer is only in this log",
                          extra={**f, **fields, **error_fields(err)})
            return
        # R28: durable before the worker moves on.
        try:
            spool.append(receipt)
        except Exception as se:  # noqa: BLE001 - full, closed, or the disk's error
            rep.emit(WorkerEvent(WorkerEventKind.OBSERVE_FAILED, job=c, result=res, error=err, receipt=receipt,
                                 spool=spool.path))
            rep.log.error("observation not filed: the provider's answer is only in this log",
                          extra={**f, **fields, **error_fields(err), "spool_error": str(se), "spool": spool.path})
            return
        with self._refile_cv:
            self._backlog = True
        rep.count("spooled")
        rep.emit(WorkerEvent(WorkerEventKind.SPOOLED, job=c, result=res, error=err, receipt=receipt, spool=spool.path))
        rep.log.warning("observation not filed; spooled, to be filed when the coordinator takes it (R28)",
                        extra={**f, **fields, "error": str(err), "spool": spool.path})

    def kick(self) -> None:
        """Asks for a refile pass when the spool holds receipts the
        coordinator was away for: a call just succeeded, so it is back."""
        if self._spool is None:
            return
        with self._refile_cv:
            if self._backlog and not self._refile_kicked:
                self._refile_kicked = True
                self._refile_cv.notify_all()

    def start(self) -> None:
        """Files what a predecessor (or this worker) could not file, then
        starts the refile passes (R28); nothing without a spool."""
        spool = self._spool
        if spool is None or spool.closed:
            return
        self._refile()
        self._refiler = threading.Thread(target=self._refile_loop, name="jobfence-refiler", daemon=True)
        self._refiler.start()

    def finish(self, last_pass: bool) -> None:
        """Stops the refile passes; with last_pass (the drain was not cut
        off), one more pass for what the drain spooled, bounded by
        _FINAL_REFILE_TIMEOUT. Then releases the spool (close())."""
        if self._refiler is not None:
            with self._refile_cv:
                self._refile_quit = True
                self._refile_cv.notify_all()
            self._refiler.join()
            if last_pass and self._spool is not None and self._spool.pending() > 0:
                self._refile(time.monotonic() + _FINAL_REFILE_TIMEOUT)
        self.close()

    def close(self) -> None:
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
            self._report.log.warning("receipt spool released with receipts not filed; the next worker on this spool "
                                     "files them (R28)", extra={"spool": spool.path, "receipts": left})

    def _refile_loop(self) -> None:
        """Refile passes every RECEIPT_REFILE_INTERVAL and when kicked, until finish()."""
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
        rep = self._report
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
                        rep.emit(WorkerEvent(WorkerEventKind.OBSERVE_FAILED, error=e, receipt=r, spool=spool.path))
                        rep.log.error("observation not filed: the provider's answer is only in this log",
                                      extra={**r.log_fields(), **error_fields(e), "spool": spool.path,
                                             "dropped_from_spool": True})
                        continue
                    keep.append(line.raw)
                    if coordinator_away(e):
                        away = e
                    else:
                        rep.log.warning("spooled receipt not filed yet; kept",
                                        extra={**r.log_fields(), "error": str(e)})
                    continue
                filed += 1
                rep.count("refiled")
                if not dup:
                    rep.count("observations")
                rep.emit(WorkerEvent(WorkerEventKind.REFILED, duplicate=dup, receipt=r, spool=spool.path))
                rep.log.info("spooled receipt filed", extra={
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
                rep.log.warning("spooled receipts wait for the coordinator", extra={
                    "spool": spool.path, "filed": filed, "left": len(keep), "error": str(away)})
            elif filed + dropped:
                rep.log.info("receipt spool refiled", extra={
                    "spool": spool.path, "filed": filed, "dropped": dropped, "left": len(keep)})

    def _spool_error(self, e: BaseException, what: str = "") -> None:
        spool = self._spool
        path = spool.path if spool is not None else ""
        rep = self._report
        rep.count("spool_errors")
        rep.emit(WorkerEvent(WorkerEventKind.SPOOL_ERROR, error=e, spool=path))
        rep.log.error("receipt spool", extra={"spool": path, "error": f"{what}: {e}" if what else str(e)})


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
