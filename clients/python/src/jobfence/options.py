"""WorkerOptions: how a Worker is configured, and its checks."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from .decide import ProviderPolicy
from .events import WorkerEvent
from .spool import RECEIPT_SPOOL_OFF

__all__ = ["WorkerOptions"]


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
    #: Makes each job's attempt span (R35, README "Tracing"): an
    #: opentelemetry.trace.TracerProvider. None: the global one
    #: (opentelemetry.trace.get_tracer_provider()), a no-op until the
    #: application sets one. Used only when the opentelemetry-api package is
    #: installed; without it nothing is traced and no call carries a trace
    #: context.
    tracer_provider: Optional[Any] = None

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
