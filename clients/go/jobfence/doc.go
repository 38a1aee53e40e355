// Package jobfence is the Go worker SDK of the jobfence coordinator: a typed
// client of the jobfence.v1.Coordinator gRPC service and a Worker runtime
// that keeps its rules for you.
//
// It is the package github.com/jobfence/jobfence/clients/go/jobfence of the
// module github.com/jobfence/jobfence/clients/go, which requires gRPC,
// protobuf and the API's generated code and nothing of the coordinator's:
//
//	import "github.com/jobfence/jobfence/clients/go/jobfence"
//
// The module's README (clients/go/README.md) says how to require it from
// another module and shows a whole worker command.
//
// # The protocol in brief
//
// A worker claims a refund job and is granted it: an attempt, the fencing
// generation bumped on every claim and takeover (R2, R5), and a lease token,
// the grant's secret (R25). It calls the payment provider with the job's
// operation key as the Idempotency-Key (R1) and writes the outcome back —
// Complete, Reschedule or Escalate — carrying that attempt and token. The
// coordinator accepts only the current grant (R9, R25): a worker whose lease
// expired and whose job was taken over gets STALE_ATTEMPT, and must not
// retry, not even with the current attempt the error names (it lacks that
// grant's token); it files what the provider told it as an observation
// instead (R15). The Worker carries the token for you; the token prints
// redacted.
// A takeover always starts by asking the provider what happened (reconcile,
// R14), and what cannot be decided safely goes to manual review (R16). A
// job whose cancel was requested (ClaimedJob.CancelRequested) is only ever
// reconciled, never sent, whatever the provider answers (R32).
//
// # Client
//
// Dial returns a Client; its methods mirror the RPCs with Go types. Errors
// are decoded from the coordinator's google.rpc.ErrorInfo into typed errors
// matched with errors.Is and errors.As, never by message text (R24):
//
//	_, err := client.Complete(ctx, jobfence.CompleteRequest{
//		JobID: job.Job.ID, Attempt: job.Attempt, LeaseToken: job.LeaseToken, ProviderRefundID: ref})
//	var stale *jobfence.StaleAttemptError
//	switch {
//	case errors.As(err, &stale):
//		// not our grant any more (now attempt stale.CurrentAttempt, state
//		// stale.CurrentState): stop, file the answer with ReportObservation
//	case errors.Is(err, jobfence.ErrJobNotRunning):
//	case errors.Is(err, jobfence.ErrUnavailable):
//	}
//
// The Client repeats only what is safe to repeat: write-backs after
// UNAVAILABLE, with the same request (a repeat of a write that had landed
// answers Replayed=true, R21), observations, enqueues and reads. It never
// repeats a Claim (R7).
//
// # Worker
//
// NewWorker wraps a Client and a Handler (your provider calls) into a Worker
// with bounded concurrency that claims only what it can start (R18),
// dispatches by next action, applies the provider-call deadline, turns each
// answer into the fenced write-back with DecideAt's table (R14, R16), files
// observations when it is fenced off (R15), never acts on a failed claim
// (R7), and drains on shutdown (rolling deploys).
//
// A Handler says what the provider answered with a Result: Succeeded(id);
// Pending(id, retryAfter) when the provider holds the refund, not finished
// (an answer, not a success, R4); Failed(id, reason) when it refused for
// good, the refund id first and "" when it made none; NoRecord() when a
// reconcile finds nothing under the key; NotSent when the request provably
// never left; Unknown(err), the zero Result, when no answer came; Escalate
// for a person. Their documentation says which answer is which.
//
// # The worker stream
//
// By default the Worker opens one stream to the coordinator (Work) instead
// of polling with Claim: it announces its free slots as credits, and the
// coordinator pushes grants as they come, at once when a job is enqueued on
// the same coordinator, never more than the credits it holds (R18). The
// Worker's write-backs, renewals and receipts go on the same stream and are
// answered exactly as the unary calls, so errors decode to the same types;
// a call cut with its stream is repeated (R21), on the next stream or as a
// unary call. A stream that ends is opened again with every free slot. On
// shutdown the Worker half-closes it: the coordinator grants no more, and
// the jobs still running write back with unary calls. Against a coordinator
// without Work, or with WorkerOptions.NoStream, it claims with Claim.
//
// # A silently dead connection
//
// A coordinator that vanishes without closing its connections (a host gone,
// a path dropping packets) would leave the Worker's stream holding every
// free slot and its calls waiting out their timeouts. Dial's connection is
// checked with HTTP/2 pings: one after 10 s without reading anything
// (DefaultKeepaliveTime, the coordinator's minimum), also while idle,
// answered within 5 s (DefaultKeepaliveTimeout), and on Linux data left
// unacknowledged for those 5 s fails it too (TCP_USER_TIMEOUT). A dead
// connection is closed within about 15 s at most: the stream ends
// UNAVAILABLE, the calls it carried are repeated (R21) and the Worker opens a
// new stream, on a new connection. WithDialOptions with
// grpc.WithKeepaliveParams replaces the defaults; a connection given to
// NewClient keeps its own.
//
// # Lease renewal
//
// While a handler runs, the Worker renews the job's lease at about a third
// of the lease it was granted (WorkerOptions.RenewInterval), every job due
// in one RenewLeases call (R27). A worker that dies or freezes stops
// renewing, so a short lease (a few seconds) recovers its jobs quickly
// without taking over live ones whose provider calls are slow. When a
// renewal finds the grant gone (taken over: STALE_ATTEMPT), the handler's
// context is cancelled with ErrGrantLost: check ctx.Err() before sending a
// request, and send under SendContext(ctx), so that a request already on
// the wire still gets its answer, which the Worker files as an observation
// (R15). Renewal stops at the coordinator's --max-grant-age (GRANT_TOO_OLD):
// the lease then runs out and the job is taken over as usual.
// WorkerOptions.NoLeaseRenewal turns renewal off.
//
// # Receipts that outlive the process
//
// A receipt the coordinator cannot take now — ReportObservation failed with
// UNAVAILABLE (DATABASE_* included), DEADLINE_EXCEEDED, a transport error —
// is appended to the Worker's receipt spool, a local file of one JSON line
// per receipt, and fsynced before the Worker moves on (R28). Run files the
// spool again before its first claim, every ReceiptRefileInterval and as
// soon as a call succeeds after a failure, each receipt exactly as first
// tried, so that the coordinator deduplicates one whose reply was lost; it
// then rewrites the file atomically without what was filed. A crash at any
// point loses no acknowledged receipt and at worst files one twice, kept
// once. A permanent refusal (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED…)
// is logged, not spooled. A receipt its job has no room for is kept by the
// coordinator in its unmatched log (Observation.KeptAsideID), never refused;
// an earlier coordinator's OBSERVATION_LIMIT stays spooled (R28).
//
// The spool is WorkerOptions.ReceiptSpool, by default a file named after the
// worker id in <os.UserCacheDir()>/jobfence/ (DefaultReceiptSpool). A
// restarted worker files its predecessor's receipts only if it opens the
// same file: give it a stable WorkerID (an id with the pid in it names a new
// file each time), or a stable ReceiptSpool. The file holds lease tokens: it
// is 0600 in a 0700 folder, and no log line carries a token. NewWorker locks
// it (flock on <path>.lock, with the holder's pid, which the Node SDK's lock
// reads too), so two workers with the same id on one machine are refused
// rather than sharing it. It is bounded by MaxSpooledReceipts and
// MaxReceiptSpoolBytes; past them a receipt is logged at ERROR only.
// ReceiptSpoolOff ("off") disables it: a receipt the coordinator does not
// take is then retried for up to two minutes, and after that only logged.
//
// # Time
//
// Every time the coordinator sends comes from its database's clock (R12). A
// claim carries ResendDeadline, the end of the provider's idempotency-key
// window for the job (R22); ClaimedJob.CoordinatorNow estimates the
// coordinator's clock from the claim's database time plus this machine's
// monotonic clock, never its wall clock, and ProviderPolicy.ResendMargin
// keeps a safety distance from the deadline.
//
// # Tracing
//
// Each job a Worker works is one OpenTelemetry span, jobfence.attempt
// (AttemptSpanName), kind consumer: the root of a trace of its own, linked
// to the trace context the job's enqueue stored (ClaimedJob.TraceParent), with
// the job's attributes and the attempt's outcome (jobfence.outcome: completed,
// rescheduled, escalated, stale, grant_lost, write_failed), never its lease
// token (R25, R35). The handler's context holds it, and every call made for
// the job carries its W3C trace context: as traceparent metadata on a unary
// call (any Client call made under a span does), in the WorkCall's fields on
// the worker stream. WorkerOptions.TracerProvider provides the tracer, or
// OpenTelemetry's global provider, a no-op unless the application set one:
// then nothing is recorded and no call carries a trace context.
package jobfence
