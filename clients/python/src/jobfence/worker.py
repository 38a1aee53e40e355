"""The Worker: grant → provider call → fenced write-back, on threads.

Threads, not asyncio: grpcio's blocking API is the one that is mature in
the versions Debian ships (1.51), and a provider client is most often a
blocking one (http.client, requests). One thread (run()'s) reads the worker
stream, on which the coordinator pushes grants, and grpcio's own thread
sends on it (jobfence.session); with no_stream, or against a coordinator
without it, that thread claims instead. One thread per job in flight runs
its provider call and write-back (jobfence.job), one thread renews the
leases of every job whose handler runs (R27, jobfence.renewer), and, with a
receipt spool, one files the receipts the coordinator could not take again
(R28, jobfence.receipts). This module holds the Worker's lifecycle: its
slots, how it takes jobs, its stop and its drain.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Optional

from .client import Client, _duration
from .errors import BudgetExhaustedError, DrainTimeoutError
from .events import Reporter, WorkerEvent, WorkerEventKind, WorkerStats, job_fields
from .job import Handler, JobRunner
from .options import WorkerOptions
from .receipts import Receipts
from .renewer import Renewer
from .session import StreamStub, StreamUnsupported, WorkSession
from .tracing import Tracing
from .types import ClaimedJob
from .v1 import coordinator_pb2 as pb

__all__ = ["Worker"]

_log = logging.getLogger("jobfence.worker")


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
      to handler.reconcile (R14); a job whose cancel was requested goes to
      handler.reconcile whatever its grant says, and is never sent (R32);
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
        self._log = opts.logger or _log
        self._report = Reporter(self._log, opts.on_event)
        self._cv = threading.Condition()  # guards _active, _stopping; notified on both
        self._active = 0
        self._stopping = False
        self._stop_event = threading.Event()  # set with _stopping, to cancel a waiting claim
        self._started = False
        self._done = threading.Event()
        # The worker stream; None with no_stream. The worker's calls then go
        # through a stub that sends write-backs, renewals and receipts on it.
        self._session: Optional[WorkSession] = None
        if not opts.no_stream:
            start = pb.WorkStart(worker_id=opts.worker_id, provider=opts.provider)
            if opts.lease:
                start.lease_duration.CopyFrom(_duration(opts.lease))
            self._session = WorkSession(client, start, opts.concurrency, _Hooks(self))
            self._client = client._through(StreamStub(client.stub, self._session))
        tracing = Tracing(opts.tracer_provider, opts.worker_id)
        self._renewer = Renewer(self._client, opts, self._report, tracing) if opts.lease_renewal else None
        self._receipts = Receipts(self._client, opts.worker_id, opts.receipt_spool, self._report)
        self._jobs = JobRunner(self._client, handler, opts, self._report, self._renewer, self._receipts, tracing)

    # -- public ------------------------------------------------------------

    def stats(self) -> WorkerStats:
        """A copy of the worker's counters."""
        return self._report.stats()

    @property
    def receipt_spool(self) -> Optional[str]:
        """The receipt spool's path; None when it is off."""
        return self._receipts.path

    @property
    def spooled_receipts(self) -> int:
        """How many receipts the spool holds now (0 when it is off)."""
        return self._receipts.pending()

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
            self._session.close_send(self.options.drain_timeout)

    def shutdown(self, timeout: Optional[float] = None) -> bool:
        """stop(), then waits up to timeout seconds for run() to return; True
        when it did. For a Worker never run it releases the receipt spool."""
        self.stop()
        if not self._started:
            # Never run: nothing to drain; a run() now stops at once.
            self._receipts.close()
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
        drained = False
        try:
            # R28: what a predecessor (or this worker) could not file goes
            # first, then every RECEIPT_REFILE_INTERVAL and after a failure heals.
            self._receipts.start()
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
            # A last refile pass for what the drain spooled; skipped when the
            # drain was cut off.
            self._receipts.finish(last_pass=drained)
            if restore is not None:
                restore()
            self._done.set()
        if not drained:
            raise DrainTimeoutError(
                f"jobfence: drain timeout: {self.in_flight} jobs in flight were cut off; their leases will expire"
            )

    # -- taking jobs ---------------------------------------------------------

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

    def _grant_loop(self) -> None:
        """Takes jobs until the worker stops: from the worker stream, or by
        claiming when it is off or the coordinator has none."""
        if self._session is not None:
            if self._stream_loop(self._session):
                return
            self._log.info("the coordinator has no worker stream; claiming with Claim calls")
        self._claim_loop()

    def _stream_loop(self, session: WorkSession) -> bool:
        """Keeps a stream open until the worker stops, one after another,
        with backoff after one that failed. True once the last stream ended
        after close_send; False when the coordinator has no Work: nothing
        was granted, and the worker claims with Claim calls for good."""
        o = self.options
        backoff = o.claim_backoff
        while True:
            err: Optional[BaseException] = None
            delivered: Optional[bool] = False
            try:
                delivered = session.serve()
                if delivered is None:
                    return True
            except StreamUnsupported:
                return False
            except Exception as e:  # noqa: BLE001 - the stream failed: open another
                err = e
            if self._is_stopping():
                return True
            if delivered or err is None:
                # The stream worked (or the coordinator ended it cleanly): the
                # next one should too.
                backoff = o.claim_backoff
            if err is not None:
                self._report.count("claim_failures")
                self._report.emit(WorkerEvent(WorkerEventKind.CLAIM_FAILED, error=err))
                self._log.warning("worker stream ended; opening it again",
                                  extra={"error": str(err), "backoff": backoff})
            self._pause(backoff * (0.5 + random.random()))
            backoff = min(2 * backoff, o.max_claim_backoff)

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
                self._report.count("claim_failures")
                self._report.emit(WorkerEvent(WorkerEventKind.CLAIM_FAILED, error=e))
                self._log.warning("claim failed; nothing acted on (R7)", extra={"error": str(e), "backoff": backoff})
                self._pause(backoff * (0.5 + random.random()))
                backoff = min(2 * backoff, o.max_claim_backoff)
                continue
            backoff = o.claim_backoff
            self._receipts.kick()
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
            self._jobs.work(c)
        except Exception:  # never lose the slot to a bug in a callback
            self._log.exception("job thread failed", extra=job_fields(c))
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
        late = self._jobs.late()
        for t in late:
            t.join(max(0.0, end - time.monotonic()))
        if active > 0 or any(t.is_alive() for t in late):
            self._receipts.cut.set()
            self._log.warning("drain timeout: cutting in-flight jobs off; their leases will expire",
                              extra={"active": active})
            return False
        self._log.info("worker drained")
        return True


class _Hooks:
    """The Worker as its WorkSession sees it (SessionHooks)."""

    def __init__(self, w: Worker) -> None:
        self._w = w

    @property
    def log(self) -> logging.Logger:
        return self._w._log

    def granted(self, jobs: list[ClaimedJob]) -> None:
        self._w._receipts.kick()
        for c in jobs:
            self._w._start(c)

    def retry_after(self, seconds: float) -> None:
        # R19: due work waits on the provider's budget; the coordinator
        # offers it again after the wait, holding the credits.
        self._w._log.debug("provider budget exhausted", extra={"retry_after": seconds})
