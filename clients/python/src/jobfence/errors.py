"""Typed errors decoded from the coordinator's google.rpc.ErrorInfo (R24).

The coordinator attaches an ErrorInfo{domain: "jobfence", reason, metadata} to
every error it returns, in the status details of the ``grpc-status-details-bin``
trailer. This module turns it into one exception class per reason; callers
branch with ``except`` and ``isinstance``, never on message text. A worker
stream's reply carries the same status, serialized (decode_rpc_status), and
decodes through the same code.

    CoordinatorError                 every error a Client call raises
    ├── FencedError                  the fence refused the write (R9, R25)
    │   ├── StaleAttemptError        STALE_ATTEMPT
    │   └── JobNotRunningError       JOB_NOT_RUNNING
    ├── JobNotInReviewError          JOB_NOT_IN_REVIEW
    ├── CancelRequestedError         CANCEL_REQUESTED (a reschedule to REFUND, R32)
    ├── JobNotCancellableError       JOB_NOT_CANCELLABLE (CancelRefund, R32)
    ├── NotOnAttentionListError      NOT_ON_ATTENTION_LIST (AcknowledgeAttention, R34)
    ├── OperationKeyConflictError    OPERATION_KEY_CONFLICT (R1)
    ├── NotFoundError                NOT_FOUND
    ├── InvalidArgumentError         INVALID_ARGUMENT, with field violations
    ├── GrantTooOldError             GRANT_TOO_OLD (RenewLeases, R27)
    ├── ObservationLimitError        OBSERVATION_LIMIT
    ├── TooManyCallsError            TOO_MANY_CALLS
    ├── UnauthenticatedError         code UNAUTHENTICATED
    ├── PermissionDeniedError        code PERMISSION_DENIED
    ├── DeadlineExceededError        code DEADLINE_EXCEEDED
    └── UnavailableError             code UNAVAILABLE, whatever the reason
        ├── ClaimOutcomeUnknownError     CLAIM_OUTCOME_UNKNOWN (R7)
        ├── WriteOutcomeUnknownError     WRITE_OUTCOME_UNKNOWN (R21)
        ├── DatabaseUnavailableError     DATABASE_UNAVAILABLE
        ├── DatabaseFullError            DATABASE_FULL
        └── DatabaseAccessDeniedError    DATABASE_ACCESS_DENIED
    BudgetExhaustedError             Claim: due jobs wait on the provider's budget (R19)

The Worker's own errors: GrantLostError and ProviderDeadlineError (why a
handler's context was cancelled), DrainTimeoutError (run() cut jobs off).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import grpc

from ._rpc import error_details_pb2, status_pb2
from .types import JobState, state_from_name
from .v1 import coordinator_pb2 as pb

__all__ = [
    "ERROR_DOMAIN",
    "BudgetExhaustedError",
    "CancelRequestedError",
    "ClaimOutcomeUnknownError",
    "CoordinatorError",
    "DatabaseAccessDeniedError",
    "DatabaseFullError",
    "DatabaseUnavailableError",
    "DeadlineExceededError",
    "DrainTimeoutError",
    "FencedError",
    "FieldViolation",
    "GrantLostError",
    "GrantTooOldError",
    "InvalidArgumentError",
    "JobNotCancellableError",
    "JobNotInReviewError",
    "JobNotRunningError",
    "NotFoundError",
    "NotOnAttentionListError",
    "ObservationLimitError",
    "OperationKeyConflictError",
    "PermissionDeniedError",
    "ProviderDeadlineError",
    "TooManyCallsError",
    "Reason",
    "StaleAttemptError",
    "UnauthenticatedError",
    "UnavailableError",
    "WriteOutcomeUnknownError",
    "decode_error",
    "decode_rpc_status",
]

#: The google.rpc.ErrorInfo domain of every error the coordinator returns.
ERROR_DOMAIN = "jobfence"

_DETAILS_KEY = "grpc-status-details-bin"


def _reason_name(value: int) -> str:
    """The reason on the wire: the proto value's name without ERROR_REASON_."""
    return str(pb.ErrorReason.Name(value)).removeprefix("ERROR_REASON_")


class Reason:
    """The ErrorInfo reasons of the API (R24), from the proto's ErrorReason, the one list of them."""

    STALE_ATTEMPT = _reason_name(pb.ERROR_REASON_STALE_ATTEMPT)
    JOB_NOT_RUNNING = _reason_name(pb.ERROR_REASON_JOB_NOT_RUNNING)
    JOB_NOT_IN_REVIEW = _reason_name(pb.ERROR_REASON_JOB_NOT_IN_REVIEW)
    OPERATION_KEY_CONFLICT = _reason_name(pb.ERROR_REASON_OPERATION_KEY_CONFLICT)
    CLAIM_OUTCOME_UNKNOWN = _reason_name(pb.ERROR_REASON_CLAIM_OUTCOME_UNKNOWN)
    WRITE_OUTCOME_UNKNOWN = _reason_name(pb.ERROR_REASON_WRITE_OUTCOME_UNKNOWN)
    DATABASE_UNAVAILABLE = _reason_name(pb.ERROR_REASON_DATABASE_UNAVAILABLE)
    DATABASE_FULL = _reason_name(pb.ERROR_REASON_DATABASE_FULL)
    DATABASE_ACCESS_DENIED = _reason_name(pb.ERROR_REASON_DATABASE_ACCESS_DENIED)
    OBSERVATION_LIMIT = _reason_name(pb.ERROR_REASON_OBSERVATION_LIMIT)
    NOT_FOUND = _reason_name(pb.ERROR_REASON_NOT_FOUND)
    INVALID_ARGUMENT = _reason_name(pb.ERROR_REASON_INVALID_ARGUMENT)
    UNAUTHENTICATED = _reason_name(pb.ERROR_REASON_UNAUTHENTICATED)
    PERMISSION_DENIED = _reason_name(pb.ERROR_REASON_PERMISSION_DENIED)
    GRANT_TOO_OLD = _reason_name(pb.ERROR_REASON_GRANT_TOO_OLD)
    TOO_MANY_CALLS = _reason_name(pb.ERROR_REASON_TOO_MANY_CALLS)
    JOB_NOT_CANCELLABLE = _reason_name(pb.ERROR_REASON_JOB_NOT_CANCELLABLE)
    CANCEL_REQUESTED = _reason_name(pb.ERROR_REASON_CANCEL_REQUESTED)
    NOT_ON_ATTENTION_LIST = _reason_name(pb.ERROR_REASON_NOT_ON_ATTENTION_LIST)


class CoordinatorError(Exception):
    """An error answered by the coordinator, or by the gRPC transport on its
    behalf. ``reason`` and ``metadata`` come from the ErrorInfo of domain
    "jobfence"; both are empty for transport failures, which carry none."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str = "",
        metadata: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(code, message, reason)
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, grpc.StatusCode) else str(self.code)
        if self.reason:
            return f"jobfence: {name} ({self.reason}): {self.message}"
        return f"jobfence: {name}: {self.message}"

    def _int(self, key: str) -> int:
        try:
            return int(self.metadata.get(key, "0"))
        except ValueError:
            return 0


class FencedError(CoordinatorError):
    """A write-back refused by the fence (R9, R25): nothing was written, and
    repeating it cannot change that. ``attempt`` is what the write carried;
    ``current_attempt`` and ``current_state`` what the job holds now."""

    @property
    def job_id(self) -> int:
        return self._int("job_id")

    @property
    def attempt(self) -> int:
        return self._int("attempt")

    @property
    def current_attempt(self) -> int:
        return self._int("current_attempt")

    @property
    def current_state(self) -> JobState:
        return state_from_name(self.metadata.get("current_state", ""))


class StaleAttemptError(FencedError):
    """STALE_ATTEMPT (FAILED_PRECONDITION): the write does not carry the job's
    current grant — taken over (an older attempt), another or no lease token
    (R25: the right attempt is not enough), or an attempt this database never
    granted (a grant lost in a failover, R26). Never repeat it, not even with
    current_attempt: file what the provider said with report_observation (R15)."""


class JobNotRunningError(FencedError):
    """JOB_NOT_RUNNING (FAILED_PRECONDITION): this grant already wrote a
    different outcome, so the job left running; nothing was written (R21)."""


class JobNotInReviewError(CoordinatorError):
    """JOB_NOT_IN_REVIEW (FAILED_PRECONDITION): an operator's resolution named a
    job no longer in manual review under that attempt (R29)."""


class CancelRequestedError(CoordinatorError):
    """CANCEL_REQUESTED (FAILED_PRECONDITION): a reschedule asked to send the
    refund (next action REFUND) of a job whose cancel was requested (R32);
    nothing was written. Do not repeat it: only a reconcile may follow, so
    reschedule to RECONCILE, or complete or escalate. The Worker never asks
    for it (ClaimedJob.cancel_requested)."""


class JobNotCancellableError(CoordinatorError):
    """JOB_NOT_CANCELLABLE (FAILED_PRECONDITION): an operator's CancelRefund
    named a job that cannot be cancelled: it succeeded, was cancelled for
    another reason, or was archived (R32). Not to be repeated."""


class NotOnAttentionListError(CoordinatorError):
    """NOT_ON_ATTENTION_LIST (FAILED_PRECONDITION): an operator's
    AcknowledgeAttention named a job that is not on the attention list (R34).
    Not to be repeated."""


class OperationKeyConflictError(CoordinatorError):
    """OPERATION_KEY_CONFLICT (ALREADY_EXISTS): the operation key is bound to a
    refund with other order, payment, amount, currency or provider (R1)."""


class NotFoundError(CoordinatorError):
    """NOT_FOUND: no such job."""


class GrantTooOldError(CoordinatorError):
    """GRANT_TOO_OLD (FAILED_PRECONDITION, a renewal's refusal): the grant has
    lived as long as the coordinator lets one grant live (--max-grant-age,
    R27). Renew it no more; it stays valid, and its holder may write back,
    until a takeover commits after its lease runs out (R8)."""


class ObservationLimitError(CoordinatorError):
    """OBSERVATION_LIMIT (RESOURCE_EXHAUSTED): the job has 1,000 receipts on
    file; this one was not filed. Someone floods the job: a person should look."""


class TooManyCallsError(CoordinatorError):
    """TOO_MANY_CALLS (RESOURCE_EXHAUSTED): the credential, or the coordinator,
    has as many calls of this kind in flight as it allows (expensive reads,
    worker streams); nothing was done. Try again after the RetryInfo's delay."""


class UnauthenticatedError(CoordinatorError):
    """UNAUTHENTICATED: the call carried no valid credential; or, raised by the
    Client before anything was sent, a bearer token would have gone in
    plaintext."""


class PermissionDeniedError(CoordinatorError):
    """PERMISSION_DENIED: the credential's roles do not allow the call."""


class DeadlineExceededError(CoordinatorError):
    """DEADLINE_EXCEEDED: the call ran out of time; its outcome is unknown."""


class UnavailableError(CoordinatorError):
    """UNAVAILABLE: the coordinator or its database could not be reached, or a
    commit was cut off. The Client repeats the calls that are safe to repeat
    (never Claim, R7)."""


class ClaimOutcomeUnknownError(UnavailableError):
    """CLAIM_OUTCOME_UNKNOWN: the claim may or may not have committed. Nothing
    was granted: act on nothing, claim again (R7). A job it did commit comes
    back through a takeover once its lease expires."""


class WriteOutcomeUnknownError(UnavailableError):
    """WRITE_OUTCOME_UNKNOWN: a write-back's commit was cut off. Repeating the
    same write is safe (R21); the Client does it."""


class DatabaseUnavailableError(UnavailableError):
    """DATABASE_UNAVAILABLE: the coordinator could not reach its database, or
    it refused writes for now (read-only during a failover); nothing changed."""


class DatabaseFullError(UnavailableError):
    """DATABASE_FULL: the database is out of space; nothing changed."""


class DatabaseAccessDeniedError(UnavailableError):
    """DATABASE_ACCESS_DENIED: the coordinator's database user lacks a privilege; nothing changed."""


class FieldViolation:
    """One bad request field: ``field`` is the proto field name, e.g. "max_jobs"."""

    __slots__ = ("field", "description")

    def __init__(self, field: str, description: str) -> None:
        self.field = field
        self.description = description

    def __repr__(self) -> str:
        return f"FieldViolation({self.field!r}, {self.description!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldViolation) and (other.field, other.description) == (self.field, self.description)

    def __hash__(self) -> int:
        return hash((self.field, self.description))


class InvalidArgumentError(CoordinatorError):
    """INVALID_ARGUMENT: the request was refused before anything happened;
    ``violations`` names each bad field (google.rpc.BadRequest)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str = "",
        metadata: Optional[Mapping[str, str]] = None,
        violations: Sequence[FieldViolation] = (),
    ) -> None:
        super().__init__(code, message, reason, metadata)
        self.violations: tuple[FieldViolation, ...] = tuple(violations)

    @property
    def fields(self) -> list[str]:
        """The names of the violated fields."""
        return [v.field for v in self.violations]

    def field(self, name: str) -> Optional[FieldViolation]:
        """The violation of the named field, if any."""
        return next((v for v in self.violations if v.field == name), None)

    def __str__(self) -> str:
        if not self.violations:
            return super().__str__()
        return "jobfence: invalid argument: " + ", ".join(f"{v.field} {v.description}" for v in self.violations)


class BudgetExhaustedError(Exception):
    """Raised by Client.claim when jobs are due but their providers' outbound
    budgets allow none now (R19): nothing was granted; claim again after
    ``retry_after`` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"jobfence: provider budget exhausted; retry after {retry_after:.3f}s")
        self.retry_after = retry_after


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


_BY_REASON: dict[str, type[CoordinatorError]] = {
    Reason.STALE_ATTEMPT: StaleAttemptError,
    Reason.JOB_NOT_RUNNING: JobNotRunningError,
    Reason.JOB_NOT_IN_REVIEW: JobNotInReviewError,
    Reason.OPERATION_KEY_CONFLICT: OperationKeyConflictError,
    Reason.CLAIM_OUTCOME_UNKNOWN: ClaimOutcomeUnknownError,
    Reason.WRITE_OUTCOME_UNKNOWN: WriteOutcomeUnknownError,
    Reason.DATABASE_UNAVAILABLE: DatabaseUnavailableError,
    Reason.DATABASE_FULL: DatabaseFullError,
    Reason.DATABASE_ACCESS_DENIED: DatabaseAccessDeniedError,
    Reason.OBSERVATION_LIMIT: ObservationLimitError,
    Reason.NOT_FOUND: NotFoundError,
    Reason.INVALID_ARGUMENT: InvalidArgumentError,
    Reason.UNAUTHENTICATED: UnauthenticatedError,
    Reason.PERMISSION_DENIED: PermissionDeniedError,
    Reason.GRANT_TOO_OLD: GrantTooOldError,
    Reason.TOO_MANY_CALLS: TooManyCallsError,
    Reason.JOB_NOT_CANCELLABLE: JobNotCancellableError,
    Reason.CANCEL_REQUESTED: CancelRequestedError,
    Reason.NOT_ON_ATTENTION_LIST: NotOnAttentionListError,
}

# Codes that mean a class whatever the reason (transport failures carry none).
_BY_CODE: dict[grpc.StatusCode, type[CoordinatorError]] = {
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
}


def error_of(
    code: grpc.StatusCode,
    message: str,
    reason: str,
    metadata: Mapping[str, str],
    violations: Sequence[FieldViolation] = (),
) -> CoordinatorError:
    """The CoordinatorError subclass of an ErrorInfo reason (R24), or of the
    status code when the reason is empty or newer than this SDK."""
    cls = _BY_REASON.get(reason)
    if cls is None:
        if code == grpc.StatusCode.INVALID_ARGUMENT and violations:
            cls = InvalidArgumentError
        else:
            cls = _BY_CODE.get(code, CoordinatorError)
    if cls is InvalidArgumentError:
        return InvalidArgumentError(code, message, reason, metadata, violations)
    return cls(code, message, reason, metadata)


def decode_status(code: grpc.StatusCode, message: str, details: Optional[bytes]) -> CoordinatorError:
    """Decodes a status and its serialized google.rpc.Status details."""
    reason = ""
    metadata: dict[str, str] = {}
    violations: list[FieldViolation] = []
    if details:
        try:
            st = status_pb2.Status.FromString(details)
        except Exception:  # an undecodable trailer leaves the error without details
            st = status_pb2.Status()
        for any_ in st.details:
            kind = str(any_.type_url).rsplit("/", 1)[-1]
            try:
                if kind == "google.rpc.ErrorInfo":
                    info = error_details_pb2.ErrorInfo.FromString(any_.value)
                    if info.domain == ERROR_DOMAIN and not reason:
                        reason = str(info.reason)
                        metadata.update({str(k): str(v) for k, v in info.metadata.items()})
                elif kind == "google.rpc.BadRequest":
                    br = error_details_pb2.BadRequest.FromString(any_.value)
                    violations.extend(FieldViolation(str(v.field), str(v.description)) for v in br.field_violations)
            except Exception:
                continue
    return error_of(code, message, reason, metadata, violations)


def decode_error(err: BaseException) -> BaseException:
    """Turns an exception from a gRPC call into this package's errors, by the
    ErrorInfo reason of domain "jobfence" (R24), never by its message. An
    exception that is not a gRPC status is returned as is."""
    orig: BaseException = err
    if isinstance(err, CoordinatorError) or not isinstance(err, grpc.RpcError):
        return orig
    call: Any = err
    try:
        code = call.code()
        message = call.details() or ""
        trailers = call.trailing_metadata() or ()
    except Exception:
        return orig
    details: Optional[bytes] = None
    for key, value in trailers:
        if key == _DETAILS_KEY and isinstance(value, bytes):
            details = value
    out = decode_status(code, str(message), details)
    out.__cause__ = orig
    return out


# The gRPC codes by their numbers, as a google.rpc.Status carries them.
_CODE_OF: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def decode_rpc_status(serialized: bytes) -> CoordinatorError:
    """Decodes a serialized google.rpc.Status, the bytes of a
    ``grpc-status-details-bin`` trailer: the error of a worker stream's reply
    (WorkReply.error), which is the unary call's status to the byte. Its code,
    message and details go through decode_status, as a unary call's do, so
    the class, reason, metadata and violations are the ones the unary call
    raises (R24). Bytes that do not decode are an INTERNAL error."""
    try:
        st = status_pb2.Status.FromString(serialized)
    except Exception:
        return CoordinatorError(grpc.StatusCode.INTERNAL, "jobfence: a worker stream reply's error does not decode")
    code = _CODE_OF.get(int(st.code), grpc.StatusCode.UNKNOWN)
    return decode_status(code, str(st.message), serialized)


def refusal_of(r: pb.LeaseRenewal) -> CoordinatorError:
    """The error of one grant's refusal in a RenewLeases answer (R27): the
    class, code and metadata the same refusal of a write-back carries, chosen
    by the reason, never by the message (R24). ``job_id`` and ``attempt``
    name the grant when the metadata does not."""
    try:
        name = _reason_name(r.refused)
    except ValueError:  # a reason newer than this SDK keeps its number
        name = f"ERROR_REASON_{int(r.refused)}"
    meta = {"job_id": str(int(r.job_id)), "attempt": str(int(r.attempt))}
    meta.update({str(k): str(v) for k, v in r.metadata.items()})
    return error_of(_reason_code(int(r.refused)), str(r.message), name, meta)


def _reason_code(r: int) -> grpc.StatusCode:
    """The gRPC code each reason comes with (the proto's ErrorReason comments)."""
    if r == pb.ERROR_REASON_NOT_FOUND:
        return grpc.StatusCode.NOT_FOUND
    if r == pb.ERROR_REASON_OPERATION_KEY_CONFLICT:
        return grpc.StatusCode.ALREADY_EXISTS
    if r in (
        pb.ERROR_REASON_CLAIM_OUTCOME_UNKNOWN,
        pb.ERROR_REASON_WRITE_OUTCOME_UNKNOWN,
        pb.ERROR_REASON_DATABASE_UNAVAILABLE,
        pb.ERROR_REASON_DATABASE_FULL,
        pb.ERROR_REASON_DATABASE_ACCESS_DENIED,
    ):
        return grpc.StatusCode.UNAVAILABLE
    if r in (pb.ERROR_REASON_OBSERVATION_LIMIT, pb.ERROR_REASON_TOO_MANY_CALLS):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if r == pb.ERROR_REASON_INVALID_ARGUMENT:
        return grpc.StatusCode.INVALID_ARGUMENT
    if r == pb.ERROR_REASON_UNAUTHENTICATED:
        return grpc.StatusCode.UNAUTHENTICATED
    if r == pb.ERROR_REASON_PERMISSION_DENIED:
        return grpc.StatusCode.PERMISSION_DENIED
    return grpc.StatusCode.FAILED_PRECONDITION
