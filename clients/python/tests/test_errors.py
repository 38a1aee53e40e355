"""Errors decoded by their ErrorInfo reason (R24), over a real gRPC
connection, from the grpc-status-details-bin trailer: never by message."""

from __future__ import annotations

import grpc
import pytest

import jobfence
from jobfence import (
    CancelRequestedError,
    ClaimOutcomeUnknownError,
    Client,
    CoordinatorError,
    DatabaseAccessDeniedError,
    DatabaseFullError,
    DatabaseUnavailableError,
    DeadlineExceededError,
    FencedError,
    GrantTooOldError,
    InvalidArgumentError,
    JobNotCancellableError,
    JobNotInReviewError,
    JobNotRunningError,
    JobState,
    NotFoundError,
    NotOnAttentionListError,
    ObservationLimitError,
    OperationKeyConflictError,
    PermissionDeniedError,
    Reason,
    RetryPolicy,
    StaleAttemptError,
    TooManyCallsError,
    UnauthenticatedError,
    UnavailableError,
    WriteOutcomeUnknownError,
)
from jobfence.errors import _BY_REASON, refusal_of
from jobfence.v1 import coordinator_pb2 as pb

from fakecoord import Fail, FakeCoordinator

FP, UN = grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE

CASES = [
    (FP, Reason.STALE_ATTEMPT, StaleAttemptError),
    (FP, Reason.JOB_NOT_RUNNING, JobNotRunningError),
    (FP, Reason.JOB_NOT_IN_REVIEW, JobNotInReviewError),
    (grpc.StatusCode.ALREADY_EXISTS, Reason.OPERATION_KEY_CONFLICT, OperationKeyConflictError),
    (UN, Reason.CLAIM_OUTCOME_UNKNOWN, ClaimOutcomeUnknownError),
    (UN, Reason.WRITE_OUTCOME_UNKNOWN, WriteOutcomeUnknownError),
    (UN, Reason.DATABASE_UNAVAILABLE, DatabaseUnavailableError),
    (UN, Reason.DATABASE_FULL, DatabaseFullError),
    (UN, Reason.DATABASE_ACCESS_DENIED, DatabaseAccessDeniedError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.OBSERVATION_LIMIT, ObservationLimitError),
    (grpc.StatusCode.NOT_FOUND, Reason.NOT_FOUND, NotFoundError),
    (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, InvalidArgumentError),
    (grpc.StatusCode.UNAUTHENTICATED, Reason.UNAUTHENTICATED, UnauthenticatedError),
    (grpc.StatusCode.PERMISSION_DENIED, Reason.PERMISSION_DENIED, PermissionDeniedError),
    (FP, Reason.GRANT_TOO_OLD, GrantTooOldError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.TOO_MANY_CALLS, TooManyCallsError),
    (FP, Reason.JOB_NOT_CANCELLABLE, JobNotCancellableError),
    (FP, Reason.CANCEL_REQUESTED, CancelRequestedError),
    (FP, Reason.NOT_ON_ATTENTION_LIST, NotOnAttentionListError),
]


def client(fake: FakeCoordinator) -> Client:
    return Client(fake.address, retry=RetryPolicy(attempts=1), call_timeout=5)


def test_every_error_reason_has_a_class_of_its_own_R24() -> None:
    # Every reason of the proto's ErrorReason, the one list, decodes to a class
    # of its own; a reason added to the proto without one fails here.
    seen: dict[type, str] = {}
    for value in pb.ErrorReason.values():
        if value == pb.ERROR_REASON_UNSPECIFIED:
            continue
        name = pb.ErrorReason.Name(value).removeprefix("ERROR_REASON_")
        cls = _BY_REASON.get(name)
        assert cls is not None, f"reason {name} has no error class"
        assert cls not in seen, f"reasons {seen.get(cls)} and {name} share {cls.__name__}"
        seen[cls] = name
    assert len(CASES) == len(seen)


@pytest.mark.parametrize("code,reason,cls", CASES, ids=[c[1] for c in CASES])
def test_errors_are_decoded_by_reason_R24(fake: FakeCoordinator, code: grpc.StatusCode, reason: str, cls: type) -> None:
    # The message says something else on purpose: only the reason counts.
    fake.answer("GetJob", Fail(code, reason, message="job not found, stale attempt, whatever"))
    with client(fake) as c, pytest.raises(CoordinatorError) as info:
        c.get_job(1)
    assert type(info.value) is cls
    assert info.value.reason == reason and info.value.code == code
    if code == UN:
        assert isinstance(info.value, UnavailableError)


def test_stale_attempt_carries_where_the_job_stands_R9_R25(fake: FakeCoordinator) -> None:
    fake.answer("Complete", Fail(FP, Reason.STALE_ATTEMPT, metadata={
        "job_id": "9007199254740993", "attempt": "7", "current_attempt": "8", "current_state": "JOB_STATE_SUCCEEDED"}))
    with client(fake) as c, pytest.raises(StaleAttemptError) as info:
        c.complete(9007199254740993, 7, jobfence.LeaseToken("tok"), "re_1")
    e = info.value
    assert isinstance(e, FencedError)
    assert (e.job_id, e.attempt, e.current_attempt, e.current_state) == (9007199254740993, 7, 8, JobState.SUCCEEDED)
    assert "tok" not in str(e) and "tok" not in repr(e)


def test_invalid_argument_names_each_field(fake: FakeCoordinator) -> None:
    fake.answer("Claim", Fail(grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT,
                              violations=[("max_jobs", "must be 1..100"), ("worker_id", "required")]))
    with client(fake) as c, pytest.raises(InvalidArgumentError) as info:
        c.claim("w", 1)
    assert info.value.fields == ["max_jobs", "worker_id"]
    v = info.value.field("max_jobs")
    assert v is not None and v.description == "must be 1..100"
    assert info.value.field("lease_duration") is None
    # A BadRequest without an ErrorInfo is an invalid argument too.
    fake.answer("Claim", Fail(grpc.StatusCode.INVALID_ARGUMENT, violations=[("provider", "bad")]))
    with client(fake) as c, pytest.raises(InvalidArgumentError):
        c.claim("w", 1)


def test_errors_without_error_info_keep_their_code(fake: FakeCoordinator) -> None:
    fake.answer("GetJob", Fail(UN), Fail(grpc.StatusCode.UNAUTHENTICATED), Fail(FP, message="STALE_ATTEMPT"),
                Fail(FP, "STALE_ATTEMPT", domain="other.example"))
    with client(fake) as c:
        with pytest.raises(UnavailableError) as un:
            c.get_job(1)
        assert type(un.value) is UnavailableError and un.value.reason == ""
        with pytest.raises(UnauthenticatedError):
            c.get_job(1)
        # A message naming a reason is not the reason (R24) ...
        with pytest.raises(CoordinatorError) as msg:
            c.get_job(1)
        assert type(msg.value) is CoordinatorError
        # ... nor is another domain's ErrorInfo.
        with pytest.raises(CoordinatorError) as dom:
            c.get_job(1)
        assert type(dom.value) is CoordinatorError


def test_a_coordinator_that_cannot_be_reached_is_unavailable() -> None:
    with Client("127.0.0.1:1", retry=RetryPolicy(attempts=1), call_timeout=5) as c:
        with pytest.raises(UnavailableError):
            c.get_job(1)


def test_deadline_exceeded(fake: FakeCoordinator) -> None:
    from fakecoord import Sleep

    fake.answer("GetJob", Sleep(1.0))
    with Client(fake.address, retry=RetryPolicy(attempts=1), call_timeout=0.2) as c:
        with pytest.raises(DeadlineExceededError):
            c.get_job(1)


def test_renewal_refusals_decode_like_write_back_refusals_R27() -> None:
    r = pb.LeaseRenewal(job_id=5, attempt=3, refused=pb.ERROR_REASON_STALE_ATTEMPT, message="taken over",
                        metadata={"current_attempt": "4", "current_state": "JOB_STATE_RUNNING"})
    e = refusal_of(r)
    assert isinstance(e, StaleAttemptError) and e.code == FP
    assert (e.job_id, e.attempt, e.current_attempt, e.current_state) == (5, 3, 4, JobState.RUNNING)
    assert isinstance(refusal_of(pb.LeaseRenewal(job_id=5, attempt=3, refused=pb.ERROR_REASON_GRANT_TOO_OLD)),
                      GrantTooOldError)
    nf = refusal_of(pb.LeaseRenewal(job_id=5, attempt=3, refused=pb.ERROR_REASON_NOT_FOUND))
    assert isinstance(nf, NotFoundError) and nf.code == grpc.StatusCode.NOT_FOUND
    assert isinstance(refusal_of(pb.LeaseRenewal(job_id=5, attempt=3, refused=pb.ERROR_REASON_JOB_NOT_RUNNING)),
                      JobNotRunningError)
    assert isinstance(refusal_of(pb.LeaseRenewal(job_id=5, attempt=3, refused=pb.ERROR_REASON_DATABASE_UNAVAILABLE)),
                      DatabaseUnavailableError)
