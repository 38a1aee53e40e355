package tracing

import (
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// ScopeName is the instrumentation scope of jobfence's own spans.
const ScopeName = "github.com/jobfence/jobfence"

// The names of jobfence's own spans (docs/DEPLOY.md, "Tracing"). The gRPC
// calls' spans are otelgrpc's, named after the method
// ("jobfence.v1.Coordinator/EnqueueRefund"); the database's are named by
// their statement's summary ("UPDATE refund_jobs", "COMMIT").
const (
	// SpanBatch, followed by the kind of call ("jobfence.batch enqueue"),
	// is one shared transaction of a batch of calls, linked to every call
	// it served.
	SpanBatch = "jobfence.batch"
	// SpanGrant is one job granted, by a Claim or on a worker stream,
	// linked to its enqueue.
	SpanGrant = "jobfence.grant"
	// SpanWriteback is one write-back (Complete, Reschedule, Escalate,
	// ResolveReview), linked to its job's enqueue.
	SpanWriteback = "jobfence.writeback"
	// SpanStreamCall is one call a worker stream carries: its own trace,
	// linked to the stream's span.
	SpanStreamCall = "jobfence.stream_call"
)

// MessagingSystem is messaging.system on every messaging span of jobfence.
const MessagingSystem = "jobfence"

// The attributes of jobfence's spans: the messaging semantic conventions'
// where they fit (a job is a message; its provider the destination), and
// jobfence's own. Never a lease token (R25).
var (
	MessagingSystemKey    = semconv.MessagingSystemKey
	MessagingOpTypeKey    = semconv.MessagingOperationTypeKey
	MessagingOpNameKey    = semconv.MessagingOperationNameKey
	MessagingDestKey      = semconv.MessagingDestinationNameKey
	MessagingMessageIDKey = semconv.MessagingMessageIDKey
	ErrorTypeKey          = semconv.ErrorTypeKey

	JobIDKey        = attribute.Key("jobfence.job.id")
	AttemptKey      = attribute.Key("jobfence.attempt")
	ProviderKey     = attribute.Key("jobfence.provider")
	NextActionKey   = attribute.Key("jobfence.next_action")
	TakeoverKey     = attribute.Key("jobfence.takeover")
	WorkerIDKey     = attribute.Key("jobfence.worker_id")
	CreatedKey      = attribute.Key("jobfence.enqueue.created")
	WritebackKey    = attribute.Key("jobfence.writeback.kind")
	ReplayedKey     = attribute.Key("jobfence.writeback.replayed")
	StateKey        = attribute.Key("jobfence.state")
	BatchKindKey    = attribute.Key("jobfence.batch.kind")
	BatchSizeKey    = attribute.Key("jobfence.batch.size")
	BatchFailedKey  = attribute.Key("jobfence.batch.failed")
	BatchWaitersKey = attribute.Key("jobfence.batch.waiters")
	PollRoundKey    = attribute.Key("jobfence.batch.poll_round")
	RPCMethodKey    = semconv.RPCMethodKey
	// OperationKeyKey is the job's operation key: recorded. It is the
	// business identifier people search by (every log line about a job
	// carries it, R3) and the provider's idempotency key, not a credential:
	// knowing it lets nobody write (R25). Deployments whose keys embed
	// personal data should keep their traces as they keep their logs.
	OperationKeyKey = attribute.Key("jobfence.operation_key")
	// LinkKind says what a link points to: LinkEnqueue, LinkCall, LinkBatch,
	// LinkStream.
	LinkKind = attribute.Key("jobfence.link")
)

// The values of LinkKind.
const (
	LinkEnqueue = "enqueue" // a grant's or write-back's link to its job's enqueue
	LinkCall    = "call"    // a batch's link to a call it served
	LinkBatch   = "batch"   // a call's link to the batch that served it
	LinkStream  = "stream"  // a stream call's or grant's link to its worker stream
)

// The messaging operations of jobfence's spans (messaging.operation.type):
// an enqueue sends a message; a Claim receives (pulls) its jobs; a worker
// stream's grant is pushed, which the conventions call process; a
// write-back settles the job's attempt.
var (
	OpSend    = semconv.MessagingOperationTypeSend
	OpReceive = semconv.MessagingOperationTypeReceive
	OpProcess = semconv.MessagingOperationTypeProcess
	OpSettle  = semconv.MessagingOperationTypeSettle
)

// MessageID is a job id as messaging.message.id.
func MessageID(id int64) attribute.KeyValue {
	return MessagingMessageIDKey.String(strconv.FormatInt(id, 10))
}
