from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
ERROR_REASON_CANCEL_REQUESTED: ErrorReason
ERROR_REASON_CLAIM_OUTCOME_UNKNOWN: ErrorReason
ERROR_REASON_DATABASE_ACCESS_DENIED: ErrorReason
ERROR_REASON_DATABASE_FULL: ErrorReason
ERROR_REASON_DATABASE_UNAVAILABLE: ErrorReason
ERROR_REASON_GRANT_TOO_OLD: ErrorReason
ERROR_REASON_INVALID_ARGUMENT: ErrorReason
ERROR_REASON_JOB_NOT_CANCELLABLE: ErrorReason
ERROR_REASON_JOB_NOT_IN_REVIEW: ErrorReason
ERROR_REASON_JOB_NOT_RUNNING: ErrorReason
ERROR_REASON_NOT_FOUND: ErrorReason
ERROR_REASON_NOT_ON_ATTENTION_LIST: ErrorReason
ERROR_REASON_OBSERVATION_LIMIT: ErrorReason
ERROR_REASON_OPERATION_KEY_CONFLICT: ErrorReason
ERROR_REASON_PERMISSION_DENIED: ErrorReason
ERROR_REASON_STALE_ATTEMPT: ErrorReason
ERROR_REASON_TOO_MANY_CALLS: ErrorReason
ERROR_REASON_UNAUTHENTICATED: ErrorReason
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_WRITE_OUTCOME_UNKNOWN: ErrorReason
JOB_STATE_CANCELLED: JobState
JOB_STATE_MANUAL_REVIEW: JobState
JOB_STATE_READY: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_UNSPECIFIED: JobState
NEXT_ACTION_RECONCILE: NextAction
NEXT_ACTION_REFUND: NextAction
NEXT_ACTION_UNSPECIFIED: NextAction
OBSERVATION_OUTCOME_FAILED: ObservationOutcome
OBSERVATION_OUTCOME_NOT_FOUND: ObservationOutcome
OBSERVATION_OUTCOME_PENDING: ObservationOutcome
OBSERVATION_OUTCOME_SUCCEEDED: ObservationOutcome
OBSERVATION_OUTCOME_UNSPECIFIED: ObservationOutcome
REVIEW_RESOLUTION_CANCELLED: ReviewResolution
REVIEW_RESOLUTION_RECONCILE: ReviewResolution
REVIEW_RESOLUTION_REFUNDED: ReviewResolution
REVIEW_RESOLUTION_UNSPECIFIED: ReviewResolution
ROLE_OPERATOR: Role
ROLE_PRODUCER: Role
ROLE_READER: Role
ROLE_UNSPECIFIED: Role
ROLE_WORKER: Role

class AcknowledgeAttentionRequest(_message.Message):
    __slots__ = ["attention_since", "job_id", "note"]
    ATTENTION_SINCE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    attention_since: _timestamp_pb2.Timestamp
    job_id: int
    note: str
    def __init__(self, job_id: _Optional[int] = ..., attention_since: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., note: _Optional[str] = ...) -> None: ...

class AcknowledgeAttentionResponse(_message.Message):
    __slots__ = ["job", "replayed"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., replayed: bool = ...) -> None: ...

class ActivityMinute(_message.Message):
    __slots__ = ["cancelled", "manual_review", "receipts", "reviews_resolved", "start", "succeeded", "takeovers"]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    MANUAL_REVIEW_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    REVIEWS_RESOLVED_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    TAKEOVERS_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    manual_review: int
    receipts: int
    reviews_resolved: int
    start: _timestamp_pb2.Timestamp
    succeeded: int
    takeovers: int
    def __init__(self, start: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., succeeded: _Optional[int] = ..., manual_review: _Optional[int] = ..., cancelled: _Optional[int] = ..., takeovers: _Optional[int] = ..., reviews_resolved: _Optional[int] = ..., receipts: _Optional[int] = ...) -> None: ...

class CancelRefundRequest(_message.Message):
    __slots__ = ["attempt", "job_id", "reason"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    job_id: int
    reason: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRefundResponse(_message.Message):
    __slots__ = ["cancelled", "job", "replayed"]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    job: Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., cancelled: bool = ..., replayed: bool = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ["lease_duration", "max_jobs", "provider", "wait", "worker_id"]
    LEASE_DURATION_FIELD_NUMBER: _ClassVar[int]
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    lease_duration: _duration_pb2.Duration
    max_jobs: int
    provider: str
    wait: _duration_pb2.Duration
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ..., max_jobs: _Optional[int] = ..., lease_duration: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., provider: _Optional[str] = ..., wait: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ["jobs", "retry_after"]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[ClaimedJob]
    retry_after: _duration_pb2.Duration
    def __init__(self, jobs: _Optional[_Iterable[_Union[ClaimedJob, _Mapping]]] = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ClaimedJob(_message.Message):
    __slots__ = ["attempt", "cancel_requested", "claimed_at", "job", "lease_token", "lease_until", "next_action", "observation_count", "observations", "resend_deadline", "takeover", "traceparent", "tracestate"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_AT_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    NEXT_ACTION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESEND_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TAKEOVER_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    cancel_requested: bool
    claimed_at: _timestamp_pb2.Timestamp
    job: Job
    lease_token: str
    lease_until: _timestamp_pb2.Timestamp
    next_action: NextAction
    observation_count: int
    observations: _containers.RepeatedCompositeFieldContainer[Observation]
    resend_deadline: _timestamp_pb2.Timestamp
    takeover: bool
    traceparent: str
    tracestate: str
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., attempt: _Optional[int] = ..., lease_until: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., next_action: _Optional[_Union[NextAction, str]] = ..., takeover: bool = ..., observations: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ..., resend_deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., claimed_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., lease_token: _Optional[str] = ..., observation_count: _Optional[int] = ..., cancel_requested: bool = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ["attempt", "job_id", "lease_token", "provider_refund_id"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFUND_ID_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    job_id: int
    lease_token: str
    provider_refund_id: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., provider_refund_id: _Optional[str] = ..., lease_token: _Optional[str] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ["job", "replayed"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., replayed: bool = ...) -> None: ...

class EnqueueRefundRequest(_message.Message):
    __slots__ = ["amount_minor", "currency", "not_before", "operation_key", "order_id", "payment_id", "provider"]
    AMOUNT_MINOR_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    PAYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    amount_minor: int
    currency: str
    not_before: _timestamp_pb2.Timestamp
    operation_key: str
    order_id: str
    payment_id: str
    provider: str
    def __init__(self, operation_key: _Optional[str] = ..., order_id: _Optional[str] = ..., payment_id: _Optional[str] = ..., amount_minor: _Optional[int] = ..., currency: _Optional[str] = ..., provider: _Optional[str] = ..., not_before: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EnqueueRefundResponse(_message.Message):
    __slots__ = ["created", "job"]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    created: bool
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., created: bool = ...) -> None: ...

class EscalateRequest(_message.Message):
    __slots__ = ["attempt", "job_id", "lease_token", "reason"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    job_id: int
    lease_token: str
    reason: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ..., lease_token: _Optional[str] = ...) -> None: ...

class EscalateResponse(_message.Message):
    __slots__ = ["job", "replayed"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., replayed: bool = ...) -> None: ...

class GetActivityRequest(_message.Message):
    __slots__ = ["minutes"]
    MINUTES_FIELD_NUMBER: _ClassVar[int]
    minutes: int
    def __init__(self, minutes: _Optional[int] = ...) -> None: ...

class GetActivityResponse(_message.Message):
    __slots__ = ["counted_since", "minutes", "now", "truncated"]
    COUNTED_SINCE_FIELD_NUMBER: _ClassVar[int]
    MINUTES_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    counted_since: _timestamp_pb2.Timestamp
    minutes: _containers.RepeatedCompositeFieldContainer[ActivityMinute]
    now: _timestamp_pb2.Timestamp
    truncated: bool
    def __init__(self, now: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., minutes: _Optional[_Iterable[_Union[ActivityMinute, _Mapping]]] = ..., truncated: bool = ..., counted_since: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ["job_id", "observations_page_size", "observations_page_token", "operation_key"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    observations_page_size: int
    observations_page_token: str
    operation_key: str
    def __init__(self, job_id: _Optional[int] = ..., operation_key: _Optional[str] = ..., observations_page_size: _Optional[int] = ..., observations_page_token: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ["events", "job", "ledger", "next_observations_page_token", "now", "observation_count", "observations", "resend_deadline"]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    NEXT_OBSERVATIONS_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESEND_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    job: Job
    ledger: LedgerEntry
    next_observations_page_token: str
    now: _timestamp_pb2.Timestamp
    observation_count: int
    observations: _containers.RepeatedCompositeFieldContainer[Observation]
    resend_deadline: _timestamp_pb2.Timestamp
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., observations: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ..., observation_count: _Optional[int] = ..., next_observations_page_token: _Optional[str] = ..., resend_deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., ledger: _Optional[_Union[LedgerEntry, _Mapping]] = ..., now: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetOverviewRequest(_message.Message):
    __slots__ = ["limit"]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class GetOverviewResponse(_message.Message):
    __slots__ = ["attention", "attention_jobs", "budgets", "coordinator_started_at", "manual_review_jobs", "now", "oldest_reviews", "oldest_unfinished_created_at", "paused_providers", "ready_jobs", "recent_pause_events", "recent_stale_rejections", "recent_takeovers", "recent_unmatched", "running_jobs", "stale_rejections_since_start", "takeovers_window", "unmatched_events"]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_JOBS_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    MANUAL_REVIEW_JOBS_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    OLDEST_REVIEWS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNFINISHED_CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    READY_JOBS_FIELD_NUMBER: _ClassVar[int]
    RECENT_PAUSE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    RECENT_STALE_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    RECENT_TAKEOVERS_FIELD_NUMBER: _ClassVar[int]
    RECENT_UNMATCHED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    STALE_REJECTIONS_SINCE_START_FIELD_NUMBER: _ClassVar[int]
    TAKEOVERS_WINDOW_FIELD_NUMBER: _ClassVar[int]
    UNMATCHED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    attention: _containers.RepeatedCompositeFieldContainer[Job]
    attention_jobs: int
    budgets: _containers.RepeatedCompositeFieldContainer[ProviderBudget]
    coordinator_started_at: _timestamp_pb2.Timestamp
    manual_review_jobs: int
    now: _timestamp_pb2.Timestamp
    oldest_reviews: _containers.RepeatedCompositeFieldContainer[Job]
    oldest_unfinished_created_at: _timestamp_pb2.Timestamp
    paused_providers: _containers.RepeatedCompositeFieldContainer[ProviderPause]
    ready_jobs: int
    recent_pause_events: _containers.RepeatedCompositeFieldContainer[ProviderPauseEvent]
    recent_stale_rejections: _containers.RepeatedCompositeFieldContainer[StaleRejection]
    recent_takeovers: _containers.RepeatedCompositeFieldContainer[JobEvent]
    recent_unmatched: _containers.RepeatedCompositeFieldContainer[UnmatchedEvent]
    running_jobs: int
    stale_rejections_since_start: int
    takeovers_window: int
    unmatched_events: int
    def __init__(self, now: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., ready_jobs: _Optional[int] = ..., running_jobs: _Optional[int] = ..., manual_review_jobs: _Optional[int] = ..., oldest_unfinished_created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., oldest_reviews: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., recent_takeovers: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., takeovers_window: _Optional[int] = ..., recent_stale_rejections: _Optional[_Iterable[_Union[StaleRejection, _Mapping]]] = ..., stale_rejections_since_start: _Optional[int] = ..., coordinator_started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., budgets: _Optional[_Iterable[_Union[ProviderBudget, _Mapping]]] = ..., unmatched_events: _Optional[int] = ..., recent_unmatched: _Optional[_Iterable[_Union[UnmatchedEvent, _Mapping]]] = ..., paused_providers: _Optional[_Iterable[_Union[ProviderPause, _Mapping]]] = ..., attention_jobs: _Optional[int] = ..., attention: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., recent_pause_events: _Optional[_Iterable[_Union[ProviderPauseEvent, _Mapping]]] = ...) -> None: ...

class GrantRef(_message.Message):
    __slots__ = ["attempt", "job_id", "lease_token"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    job_id: int
    lease_token: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., lease_token: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ["amount_minor", "archived_at", "attempt", "attention_reason", "attention_since", "cancel_requested_at", "created_at", "currency", "first_sent_at", "id", "last_reason", "lease_until", "next_action", "next_attempt_at", "operation_key", "order_id", "payment_id", "provider", "provider_refund_id", "state", "traceparent", "updated_at", "worker_id"]
    AMOUNT_MINOR_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_REASON_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_SINCE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    FIRST_SENT_AT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LAST_REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    NEXT_ACTION_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    PAYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFUND_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    amount_minor: int
    archived_at: _timestamp_pb2.Timestamp
    attempt: int
    attention_reason: str
    attention_since: _timestamp_pb2.Timestamp
    cancel_requested_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    currency: str
    first_sent_at: _timestamp_pb2.Timestamp
    id: int
    last_reason: str
    lease_until: _timestamp_pb2.Timestamp
    next_action: NextAction
    next_attempt_at: _timestamp_pb2.Timestamp
    operation_key: str
    order_id: str
    payment_id: str
    provider: str
    provider_refund_id: str
    state: JobState
    traceparent: str
    updated_at: _timestamp_pb2.Timestamp
    worker_id: str
    def __init__(self, id: _Optional[int] = ..., operation_key: _Optional[str] = ..., order_id: _Optional[str] = ..., payment_id: _Optional[str] = ..., amount_minor: _Optional[int] = ..., currency: _Optional[str] = ..., provider: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., attempt: _Optional[int] = ..., next_action: _Optional[_Union[NextAction, str]] = ..., next_attempt_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., lease_until: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., provider_refund_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., last_reason: _Optional[str] = ..., first_sent_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., archived_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_requested_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., attention_since: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., attention_reason: _Optional[str] = ..., traceparent: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ["attempt", "created_at", "from_state", "id", "job_id", "kind", "next_action", "provider_refund_id", "reason", "to_state", "worker_id"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NEXT_ACTION_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFUND_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    created_at: _timestamp_pb2.Timestamp
    from_state: JobState
    id: int
    job_id: int
    kind: str
    next_action: NextAction
    provider_refund_id: str
    reason: str
    to_state: JobState
    worker_id: str
    def __init__(self, id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., kind: _Optional[str] = ..., worker_id: _Optional[str] = ..., from_state: _Optional[_Union[JobState, str]] = ..., to_state: _Optional[_Union[JobState, str]] = ..., next_action: _Optional[_Union[NextAction, str]] = ..., provider_refund_id: _Optional[str] = ..., reason: _Optional[str] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LeaseRenewal(_message.Message):
    __slots__ = ["attempt", "grant_expires_at", "job_id", "lease_until", "message", "metadata", "receipt_filed_at", "refused"]
    class MetadataEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GRANT_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FILED_AT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    grant_expires_at: _timestamp_pb2.Timestamp
    job_id: int
    lease_until: _timestamp_pb2.Timestamp
    message: str
    metadata: _containers.ScalarMap[str, str]
    receipt_filed_at: _timestamp_pb2.Timestamp
    refused: ErrorReason
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., lease_until: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., refused: _Optional[_Union[ErrorReason, str]] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., grant_expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., receipt_filed_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LedgerEntry(_message.Message):
    __slots__ = ["amount_minor", "attempt", "currency", "provider_refund_id", "recorded_at"]
    AMOUNT_MINOR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFUND_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    amount_minor: int
    attempt: int
    currency: str
    provider_refund_id: str
    recorded_at: _timestamp_pb2.Timestamp
    def __init__(self, provider_refund_id: _Optional[str] = ..., amount_minor: _Optional[int] = ..., currency: _Optional[str] = ..., attempt: _Optional[int] = ..., recorded_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ["attention", "created_after", "created_before", "order_id", "page_size", "page_token", "payment_id", "provider", "provider_refund_id", "reason_prefix", "state"]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PAYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFUND_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_PREFIX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    attention: bool
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    order_id: str
    page_size: int
    page_token: str
    payment_id: str
    provider: str
    provider_refund_id: str
    reason_prefix: str
    state: JobState
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., provider: _Optional[str] = ..., order_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., payment_id: _Optional[str] = ..., provider_refund_id: _Optional[str] = ..., reason_prefix: _Optional[str] = ..., created_after: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., attention: bool = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ["jobs", "next_page_token", "observation_counts"]
    class ObservationCountsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_COUNTS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    observation_counts: _containers.ScalarMap[int, int]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., observation_counts: _Optional[_Mapping[int, int]] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ["attempt_verified", "created_at", "detail", "id", "job_attempt", "job_id", "operation_key", "outcome", "provider_event_id", "provider_refund_id", "reported_attempt", "reporter", "source"]
    ATTEMPT_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFUND_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTED_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REPORTER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    attempt_verified: bool
    created_at: _timestamp_pb2.Timestamp
    detail: str
    id: int
    job_attempt: int
    job_id: int
    operation_key: str
    outcome: ObservationOutcome
    provider_event_id: str
    provider_refund_id: str
    reported_attempt: int
    reporter: str
    source: str
    def __init__(self, id: _Optional[int] = ..., job_id: _Optional[int] = ..., operation_key: _Optional[str] = ..., reported_attempt: _Optional[int] = ..., job_attempt: _Optional[int] = ..., source: _Optional[str] = ..., outcome: _Optional[_Union[ObservationOutcome, str]] = ..., provider_refund_id: _Optional[str] = ..., provider_event_id: _Optional[str] = ..., detail: _Optional[str] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., attempt_verified: bool = ..., reporter: _Optional[str] = ...) -> None: ...

class PauseProviderRequest(_message.Message):
    __slots__ = ["provider", "reason"]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    provider: str
    reason: str
    def __init__(self, provider: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseProviderResponse(_message.Message):
    __slots__ = ["changed", "pause"]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    pause: ProviderPause
    def __init__(self, pause: _Optional[_Union[ProviderPause, _Mapping]] = ..., changed: bool = ...) -> None: ...

class ProviderBudget(_message.Message):
    __slots__ = ["available", "burst", "provider", "rate_per_second"]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    available: float
    burst: float
    provider: str
    rate_per_second: float
    def __init__(self, provider: _Optional[str] = ..., rate_per_second: _Optional[float] = ..., burst: _Optional[float] = ..., available: _Optional[float] = ...) -> None: ...

class ProviderPause(_message.Message):
    __slots__ = ["paused_at", "paused_by", "provider", "reason"]
    PAUSED_AT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_BY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    paused_at: _timestamp_pb2.Timestamp
    paused_by: str
    provider: str
    reason: str
    def __init__(self, provider: _Optional[str] = ..., paused_by: _Optional[str] = ..., reason: _Optional[str] = ..., paused_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ProviderPauseEvent(_message.Message):
    __slots__ = ["action", "actor", "created_at", "id", "provider", "reason"]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    action: str
    actor: str
    created_at: _timestamp_pb2.Timestamp
    id: int
    provider: str
    reason: str
    def __init__(self, id: _Optional[int] = ..., provider: _Optional[str] = ..., action: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RenewLeasesRequest(_message.Message):
    __slots__ = ["grants", "lease_duration"]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_DURATION_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[GrantRef]
    lease_duration: _duration_pb2.Duration
    def __init__(self, grants: _Optional[_Iterable[_Union[GrantRef, _Mapping]]] = ..., lease_duration: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RenewLeasesResponse(_message.Message):
    __slots__ = ["renewals"]
    RENEWALS_FIELD_NUMBER: _ClassVar[int]
    renewals: _containers.RepeatedCompositeFieldContainer[LeaseRenewal]
    def __init__(self, renewals: _Optional[_Iterable[_Union[LeaseRenewal, _Mapping]]] = ...) -> None: ...

class ReportObservationRequest(_message.Message):
    __slots__ = ["attempt", "detail", "job_id", "lease_token", "operation_key", "outcome", "provider_event_id", "provider_refund_id", "source"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFUND_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    detail: str
    job_id: int
    lease_token: str
    operation_key: str
    outcome: ObservationOutcome
    provider_event_id: str
    provider_refund_id: str
    source: str
    def __init__(self, job_id: _Optional[int] = ..., operation_key: _Optional[str] = ..., attempt: _Optional[int] = ..., source: _Optional[str] = ..., outcome: _Optional[_Union[ObservationOutcome, str]] = ..., provider_refund_id: _Optional[str] = ..., provider_event_id: _Optional[str] = ..., detail: _Optional[str] = ..., lease_token: _Optional[str] = ...) -> None: ...

class ReportObservationResponse(_message.Message):
    __slots__ = ["duplicate", "expedited", "kept_aside", "observation"]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    EXPEDITED_FIELD_NUMBER: _ClassVar[int]
    KEPT_ASIDE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    expedited: bool
    kept_aside: UnmatchedEvent
    observation: Observation
    def __init__(self, observation: _Optional[_Union[Observation, _Mapping]] = ..., duplicate: bool = ..., expedited: bool = ..., kept_aside: _Optional[_Union[UnmatchedEvent, _Mapping]] = ...) -> None: ...

class RescheduleRequest(_message.Message):
    __slots__ = ["attempt", "delay", "job_id", "lease_token", "next_action", "next_attempt_at", "reason"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEXT_ACTION_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    delay: _duration_pb2.Duration
    job_id: int
    lease_token: str
    next_action: NextAction
    next_attempt_at: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., next_action: _Optional[_Union[NextAction, str]] = ..., delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., next_attempt_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., lease_token: _Optional[str] = ...) -> None: ...

class RescheduleResponse(_message.Message):
    __slots__ = ["expedited", "job", "replayed"]
    EXPEDITED_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    expedited: bool
    job: Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., replayed: bool = ..., expedited: bool = ...) -> None: ...

class ResolveReviewRequest(_message.Message):
    __slots__ = ["attempt", "job_id", "note", "provider_refund_id", "resolution"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFUND_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    job_id: int
    note: str
    provider_refund_id: str
    resolution: ReviewResolution
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., resolution: _Optional[_Union[ReviewResolution, str]] = ..., provider_refund_id: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class ResolveReviewResponse(_message.Message):
    __slots__ = ["job", "replayed"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., replayed: bool = ...) -> None: ...

class ResumeProviderRequest(_message.Message):
    __slots__ = ["provider", "reason"]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    provider: str
    reason: str
    def __init__(self, provider: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResumeProviderResponse(_message.Message):
    __slots__ = ["changed"]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    def __init__(self, changed: bool = ...) -> None: ...

class StaleRejection(_message.Message):
    __slots__ = ["at", "attempt", "caller", "current_attempt", "job_id", "rpc"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RPC_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    attempt: int
    caller: str
    current_attempt: int
    job_id: int
    rpc: str
    def __init__(self, at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., current_attempt: _Optional[int] = ..., rpc: _Optional[str] = ..., caller: _Optional[str] = ...) -> None: ...

class UnmatchedEvent(_message.Message):
    __slots__ = ["detail", "event_type", "id", "operation_key", "outcome", "provider", "provider_event_id", "provider_refund_id", "received_at"]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_REFUND_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    detail: str
    event_type: str
    id: int
    operation_key: str
    outcome: ObservationOutcome
    provider: str
    provider_event_id: str
    provider_refund_id: str
    received_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., provider: _Optional[str] = ..., provider_event_id: _Optional[str] = ..., event_type: _Optional[str] = ..., provider_refund_id: _Optional[str] = ..., operation_key: _Optional[str] = ..., outcome: _Optional[_Union[ObservationOutcome, str]] = ..., detail: _Optional[str] = ..., received_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ["authenticated", "name", "roles"]
    AUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    authenticated: bool
    name: str
    roles: _containers.RepeatedScalarFieldContainer[Role]
    def __init__(self, name: _Optional[str] = ..., roles: _Optional[_Iterable[_Union[Role, str]]] = ..., authenticated: bool = ...) -> None: ...

class WorkAck(_message.Message):
    __slots__ = ["grants"]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[GrantRef]
    def __init__(self, grants: _Optional[_Iterable[_Union[GrantRef, _Mapping]]] = ...) -> None: ...

class WorkCall(_message.Message):
    __slots__ = ["call_id", "complete", "escalate", "renew_leases", "report_observation", "reschedule", "traceparent", "tracestate"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ESCALATE_FIELD_NUMBER: _ClassVar[int]
    RENEW_LEASES_FIELD_NUMBER: _ClassVar[int]
    REPORT_OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    RESCHEDULE_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    complete: CompleteRequest
    escalate: EscalateRequest
    renew_leases: RenewLeasesRequest
    report_observation: ReportObservationRequest
    reschedule: RescheduleRequest
    traceparent: str
    tracestate: str
    def __init__(self, call_id: _Optional[int] = ..., complete: _Optional[_Union[CompleteRequest, _Mapping]] = ..., reschedule: _Optional[_Union[RescheduleRequest, _Mapping]] = ..., escalate: _Optional[_Union[EscalateRequest, _Mapping]] = ..., renew_leases: _Optional[_Union[RenewLeasesRequest, _Mapping]] = ..., report_observation: _Optional[_Union[ReportObservationRequest, _Mapping]] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class WorkCredit(_message.Message):
    __slots__ = ["credits"]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    credits: int
    def __init__(self, credits: _Optional[int] = ...) -> None: ...

class WorkGrant(_message.Message):
    __slots__ = ["jobs"]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[ClaimedJob]
    def __init__(self, jobs: _Optional[_Iterable[_Union[ClaimedJob, _Mapping]]] = ...) -> None: ...

class WorkReply(_message.Message):
    __slots__ = ["call_id", "complete", "error", "escalate", "renew_leases", "report_observation", "reschedule"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ESCALATE_FIELD_NUMBER: _ClassVar[int]
    RENEW_LEASES_FIELD_NUMBER: _ClassVar[int]
    REPORT_OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    RESCHEDULE_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    complete: CompleteResponse
    error: bytes
    escalate: EscalateResponse
    renew_leases: RenewLeasesResponse
    report_observation: ReportObservationResponse
    reschedule: RescheduleResponse
    def __init__(self, call_id: _Optional[int] = ..., error: _Optional[bytes] = ..., complete: _Optional[_Union[CompleteResponse, _Mapping]] = ..., reschedule: _Optional[_Union[RescheduleResponse, _Mapping]] = ..., escalate: _Optional[_Union[EscalateResponse, _Mapping]] = ..., renew_leases: _Optional[_Union[RenewLeasesResponse, _Mapping]] = ..., report_observation: _Optional[_Union[ReportObservationResponse, _Mapping]] = ...) -> None: ...

class WorkRequest(_message.Message):
    __slots__ = ["ack", "call", "credit", "start"]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    ack: WorkAck
    call: WorkCall
    credit: WorkCredit
    start: WorkStart
    def __init__(self, start: _Optional[_Union[WorkStart, _Mapping]] = ..., credit: _Optional[_Union[WorkCredit, _Mapping]] = ..., call: _Optional[_Union[WorkCall, _Mapping]] = ..., ack: _Optional[_Union[WorkAck, _Mapping]] = ...) -> None: ...

class WorkResponse(_message.Message):
    __slots__ = ["grant", "reply", "retry_after"]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    grant: WorkGrant
    reply: WorkReply
    retry_after: _duration_pb2.Duration
    def __init__(self, grant: _Optional[_Union[WorkGrant, _Mapping]] = ..., reply: _Optional[_Union[WorkReply, _Mapping]] = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WorkStart(_message.Message):
    __slots__ = ["acknowledges", "credits", "lease_duration", "provider", "worker_id"]
    ACKNOWLEDGES_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    LEASE_DURATION_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    acknowledges: bool
    credits: int
    lease_duration: _duration_pb2.Duration
    provider: str
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ..., provider: _Optional[str] = ..., lease_duration: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., credits: _Optional[int] = ..., acknowledges: bool = ...) -> None: ...

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class NextAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ReviewResolution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ObservationOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
