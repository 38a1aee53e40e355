"""jobfence: the Python worker SDK of the jobfence coordinator.

- :class:`Client`: a typed, thread-safe client of jobfence.v1.Coordinator,
  with TLS, bearer tokens and deadlines; it repeats only the calls that are
  safe to repeat, never Claim (R7); errors are decoded by their ErrorInfo
  reason into the classes of :mod:`jobfence.errors` (R24).
- :func:`decide_at` / :func:`decide`: the decision table of R14 and R16, the
  resend window judged on the coordinator's clock (R22).
- :class:`Worker`: takes only free slots (R18), pushed to it on the worker
  stream (:mod:`jobfence.session`; claimed with Claim calls with
  ``no_stream`` or from a coordinator without it), dispatches by next action,
  writes back under the claim's grant (attempt and lease token, R9, R25),
  files what the fence refuses as an observation (R15), renews leases while
  handlers run (R27), spools the receipts the coordinator cannot take and
  files them later (R28, :mod:`jobfence.spool`) and drains on stop() or
  SIGTERM.

One module per part: ``client`` (the RPC client and its options),
``session`` (the worker stream), ``worker`` (the Worker's lifecycle: start,
stop, slots), ``job`` (the run of one job: handler call, decision,
write-back), ``renewer`` (R27), ``receipts`` (observations filed and
spooled, R15, R28), ``spool`` (the spool file), ``options``, ``events``
(events, counters, logs), ``decide``, ``errors`` and ``types``. No module
imports ``worker`` but this one.
"""

from .client import DEFAULT_CALL_TIMEOUT, KEEPALIVE_OPTIONS, MAX_RENEW_BATCH, Client, RetryPolicy, TokenSource
from .decide import (
    DEFAULT_NOT_SENT_DELAY,
    DEFAULT_PENDING_DELAY,
    DEFAULT_RESEND_MARGIN,
    DEFAULT_UNKNOWN_DELAY,
    MAX_RESCHEDULE_DELAY,
    Decision,
    DecisionKind,
    ProviderPolicy,
    Result,
    ResultKind,
    decide,
    decide_at,
)
from .errors import (
    ERROR_DOMAIN,
    BudgetExhaustedError,
    CancelRequestedError,
    ClaimOutcomeUnknownError,
    CoordinatorError,
    DatabaseAccessDeniedError,
    DatabaseFullError,
    DatabaseUnavailableError,
    DeadlineExceededError,
    DrainTimeoutError,
    FencedError,
    FieldViolation,
    GrantLostError,
    GrantTooOldError,
    InvalidArgumentError,
    JobNotCancellableError,
    JobNotInReviewError,
    JobNotRunningError,
    NotFoundError,
    NotOnAttentionListError,
    ObservationLimitError,
    OperationKeyConflictError,
    PermissionDeniedError,
    ProviderDeadlineError,
    Reason,
    StaleAttemptError,
    TooManyCallsError,
    UnauthenticatedError,
    UnavailableError,
    WriteOutcomeUnknownError,
    decode_error,
    decode_rpc_status,
)
from .spool import (
    MAX_RECEIPT_SPOOL_BYTES,
    MAX_SPOOLED_RECEIPTS,
    RECEIPT_REFILE_INTERVAL,
    RECEIPT_SPOOL_OFF,
    ReceiptSpoolLockedError,
    SpooledReceipt,
    default_receipt_spool,
)
from .types import (
    ClaimedJob,
    Event,
    EventKind,
    Grant,
    Job,
    JobDetail,
    JobState,
    LeaseToken,
    NextAction,
    Observation,
    Outcome,
    Renewal,
    WriteResult,
)
from .events import WorkerEvent, WorkerEventKind, WorkerStats
from .job import Handler, HandlerContext
from .options import WorkerOptions
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_NOT_SENT_DELAY",
    "DEFAULT_PENDING_DELAY",
    "DEFAULT_RESEND_MARGIN",
    "DEFAULT_UNKNOWN_DELAY",
    "ERROR_DOMAIN",
    "KEEPALIVE_OPTIONS",
    "MAX_RECEIPT_SPOOL_BYTES",
    "MAX_RENEW_BATCH",
    "MAX_RESCHEDULE_DELAY",
    "MAX_SPOOLED_RECEIPTS",
    "RECEIPT_REFILE_INTERVAL",
    "RECEIPT_SPOOL_OFF",
    "BudgetExhaustedError",
    "CancelRequestedError",
    "ClaimOutcomeUnknownError",
    "ClaimedJob",
    "Client",
    "CoordinatorError",
    "DatabaseAccessDeniedError",
    "DatabaseFullError",
    "DatabaseUnavailableError",
    "DeadlineExceededError",
    "Decision",
    "DecisionKind",
    "DrainTimeoutError",
    "Event",
    "EventKind",
    "FencedError",
    "FieldViolation",
    "Grant",
    "GrantLostError",
    "GrantTooOldError",
    "Handler",
    "HandlerContext",
    "InvalidArgumentError",
    "Job",
    "JobDetail",
    "JobNotCancellableError",
    "JobNotInReviewError",
    "JobNotRunningError",
    "JobState",
    "LeaseToken",
    "NextAction",
    "NotFoundError",
    "NotOnAttentionListError",
    "Observation",
    "ObservationLimitError",
    "OperationKeyConflictError",
    "Outcome",
    "PermissionDeniedError",
    "ProviderDeadlineError",
    "ProviderPolicy",
    "Reason",
    "ReceiptSpoolLockedError",
    "Renewal",
    "Result",
    "ResultKind",
    "RetryPolicy",
    "SpooledReceipt",
    "StaleAttemptError",
    "TooManyCallsError",
    "TokenSource",
    "UnauthenticatedError",
    "UnavailableError",
    "Worker",
    "WorkerEvent",
    "WorkerEventKind",
    "WorkerOptions",
    "WorkerStats",
    "WriteOutcomeUnknownError",
    "decide",
    "decide_at",
    "decode_error",
    "decode_rpc_status",
    "default_receipt_spool",
]
