package jobfence

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Worker defaults.
const (
	DefaultProviderTimeout = 10 * time.Second
	DefaultPollInterval    = time.Second
	DefaultDrainTimeout    = 30 * time.Second
	DefaultLateAnswerGrace = time.Second
)

// WorkerOptions configures a Worker. WorkerID is required; every other zero
// value takes its default.
type WorkerOptions struct {
	// WorkerID names this worker in the job history and in the source of its
	// observations ("worker:<id>"); 1..128 characters.
	WorkerID string
	// Concurrency is how many jobs run at once (1..100, default 1). The
	// worker claims only as many as it has free slots (R18).
	Concurrency int
	// Lease is the lease to ask for (1s..15m); zero: the coordinator's
	// default. The worker renews it while the handler runs (R27), so it
	// bounds how long a crashed or paused worker holds a job, not how long
	// a provider call may take: a short lease (e.g. 5s) recovers a dead
	// worker's job quickly without taking over live ones.
	Lease time.Duration
	// RenewInterval is how often a running job's lease is renewed; zero: a
	// third of the lease it was granted, within ±10 %. All the jobs due
	// are renewed in one RenewLeases call.
	RenewInterval time.Duration
	// NoLeaseRenewal turns renewal off: a job's lease then must outlast its
	// provider call (ProviderTimeout plus LateAnswerGrace, R17).
	NoLeaseRenewal bool
	// Provider limits claims to this provider's jobs, when set.
	Provider string
	// ProviderTimeout is the deadline of each handler call (default
	// DefaultProviderTimeout). With NoLeaseRenewal keep it well under Lease
	// (R17), or slow calls turn into takeovers; the fencing keeps them
	// harmless either way.
	ProviderTimeout time.Duration
	// LateAnswerGrace is how long, after the provider-call deadline, a
	// handler that ignores its context is waited for (default
	// DefaultLateAnswerGrace). After that the outcome counts as unknown, and
	// whatever the handler returns later is filed as an observation (R15).
	LateAnswerGrace time.Duration
	// Policy is the decision table's policy for every provider not in
	// Policies (see ProviderPolicy; by default same-key resends are not
	// trusted, so "no record" escalates, R16).
	Policy ProviderPolicy
	// Policies holds per-provider policies, by the job's provider name.
	Policies map[string]ProviderPolicy
	// NoStream turns the worker stream off: the worker then claims with
	// Claim calls (polling, or long polls with ClaimWait) and writes back
	// with unary calls. By default it opens one stream (Coordinator.Work)
	// on which the coordinator pushes grants as slots free up, at once when
	// a job is enqueued on the same coordinator, and its write-backs,
	// renewals and receipts go on it, answered exactly as the unary calls;
	// a call cut with its stream is repeated (R21), on the next stream or
	// as a unary call. Each grant is acknowledged (a WorkAck) as soon as it
	// is read, before its jobs start: the coordinator hands back a grant
	// left unacknowledged for 5 s, so a worker that stops reading holds no
	// job; one read after the drain's half-close is not started and goes
	// back to the coordinator. A coordinator without Work is claimed from
	// as with NoStream.
	NoStream bool
	// PollInterval is the pause after a claim that found less work than it
	// asked for (default DefaultPollInterval). Ignored with ClaimWait, and
	// on the worker stream.
	PollInterval time.Duration
	// ClaimWait makes each claim a long poll of up to this long (0..60s).
	// On shutdown the waiting claim is cancelled; a job it may still have
	// granted returns through a takeover after its lease (R7). Ignored on
	// the worker stream, which waits as long as it is open.
	ClaimWait time.Duration
	// ClaimBackoff is the first pause after a failed claim, doubling up to
	// MaxClaimBackoff (defaults 200ms and 5s).
	ClaimBackoff    time.Duration
	MaxClaimBackoff time.Duration
	// DrainTimeout bounds the drain after Run's context ends or Shutdown is
	// called (default DefaultDrainTimeout): in-flight jobs may finish their
	// provider calls and write-backs until then; after it their contexts are
	// cancelled and Run returns ErrDrainTimeout.
	DrainTimeout time.Duration
	// Logger receives one record per notable event, with job_id,
	// operation_key and attempt (R3); nil: no logging.
	Logger *slog.Logger
	// OnEvent, when set, receives every WorkerEvent, from the worker's
	// goroutines; it must not block.
	OnEvent func(WorkerEvent)
	// ReceiptSpool is the file that keeps the receipts this worker could not
	// file (R28): a provider's answer whose ReportObservation failed in a way
	// that may succeed later (UNAVAILABLE, DATABASE_* included,
	// DEADLINE_EXCEEDED, a transport error, UNAUTHENTICATED, INTERNAL) is
	// appended to it as one JSON line, fsynced before the worker moves on,
	// and filed again by Run: before its first claim, every
	// ReceiptRefileInterval, and as soon as a call succeeds after such a
	// failure. The coordinator deduplicates a receipt filed twice. A
	// permanent refusal (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED…)
	// is logged at ERROR and not spooled. A receipt the job has no room for
	// is kept by the coordinator in its unmatched log (KeptAsideID). The file holds
	// lease tokens: it is created 0600, its folder 0700, and no log line
	// carries a token. It is bounded by MaxSpooledReceipts and
	// MaxReceiptSpoolBytes; past them a receipt is logged at ERROR only.
	//
	// Empty: DefaultReceiptSpool(WorkerID), under the user's cache folder.
	// A restarted worker refiles the receipts of its predecessor only if it
	// finds the same file: give it the same WorkerID, or the same
	// ReceiptSpool. ReceiptSpoolOff ("off"): no spool; a receipt the
	// coordinator does not take, after retrying for up to two minutes, is
	// only in the log. NewWorker takes an exclusive lock on the spool (a
	// file beside it, <path>.lock), which Run releases when it returns (and
	// Shutdown, for a Worker never run).
	ReceiptSpool string
	// TracerProvider makes each job's attempt span (R35, "Tracing" in the
	// README): a span named jobfence.attempt around the handler, linked to
	// the trace context of the job's enqueue, current in the handler's
	// context, and carried by every call the Worker makes for the job. Nil:
	// OpenTelemetry's global provider (otel.GetTracerProvider), a no-op
	// unless the application set one, so that without tracing nothing is
	// recorded and no call carries a trace context.
	TracerProvider trace.TracerProvider
}

// withDefaults is o with its zero values replaced by their defaults, checked.
// Errors: an invalid option (see NewWorker).
func (o WorkerOptions) withDefaults() (WorkerOptions, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
	}
	def(&o.ProviderTimeout, DefaultProviderTimeout)
	def(&o.LateAnswerGrace, DefaultLateAnswerGrace)
	def(&o.PollInterval, DefaultPollInterval)
	def(&o.ClaimBackoff, 200*time.Millisecond)
	def(&o.MaxClaimBackoff, 5*time.Second)
	def(&o.DrainTimeout, DefaultDrainTimeout)
	switch {
	case o.WorkerID == "" || len(o.WorkerID) > 128:
		return o, fmt.Errorf("jobfence: WorkerID must be 1..128 characters, got %q", o.WorkerID)
	case o.Concurrency < 1 || o.Concurrency > 100:
		return o, fmt.Errorf("jobfence: Concurrency must be 1..100, got %d", o.Concurrency)
	case o.ClaimWait < 0 || o.ClaimWait > time.Minute:
		return o, fmt.Errorf("jobfence: ClaimWait must be 0..60s, got %s", o.ClaimWait)
	}
	for name, d := range map[string]time.Duration{
		"Lease": o.Lease, "ProviderTimeout": o.ProviderTimeout, "LateAnswerGrace": o.LateAnswerGrace,
		"PollInterval": o.PollInterval, "ClaimBackoff": o.ClaimBackoff, "MaxClaimBackoff": o.MaxClaimBackoff,
		"DrainTimeout": o.DrainTimeout, "RenewInterval": o.RenewInterval,
	} {
		if d < 0 {
			return o, fmt.Errorf("jobfence: %s must not be negative, got %s", name, d)
		}
	}
	return o, nil
}
