// Package jobfence is the Go worker SDK of the jobfence coordinator: a typed
// client of the jobfence.v1.Coordinator gRPC service and a Worker runtime
// that keeps its rules for you.
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
// R14), and what cannot be decided safely goes to manual review (R16).
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
// # Time
//
// Every time the coordinator sends comes from its database's clock (R12). A
// claim carries ResendDeadline, the end of the provider's idempotency-key
// window for the job (R22); ClaimedJob.CoordinatorNow estimates the
// coordinator's clock from the claim's database time plus this machine's
// monotonic clock, never its wall clock, and ProviderPolicy.ResendMargin
// keeps a safety distance from the deadline.
package jobfence
