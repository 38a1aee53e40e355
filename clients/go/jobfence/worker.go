package jobfence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
)

// Handler calls the payment provider for claimed jobs. Both methods get a
// context that ends at the provider-call deadline (WorkerOptions.ProviderTimeout)
// and must pass it to the provider call.
//
// Refund sends the refund with job.Job.OperationKey as the Idempotency-Key
// (R1) — never anything derived from the attempt (R2). Reconcile asks the
// provider what happened under that key (R14). Either returns what the
// provider said; a call whose outcome is unknown returns Unknown (the zero
// Result), never a guess.
type Handler interface {
	Refund(ctx context.Context, job ClaimedJob) Result
	Reconcile(ctx context.Context, job ClaimedJob) Result
}

// HandlerFuncs adapts two functions to Handler.
type HandlerFuncs struct {
	RefundFunc    func(ctx context.Context, job ClaimedJob) Result
	ReconcileFunc func(ctx context.Context, job ClaimedJob) Result
}

// Refund calls RefundFunc.
func (h HandlerFuncs) Refund(ctx context.Context, job ClaimedJob) Result {
	return h.RefundFunc(ctx, job)
}

// Reconcile calls ReconcileFunc.
func (h HandlerFuncs) Reconcile(ctx context.Context, job ClaimedJob) Result {
	return h.ReconcileFunc(ctx, job)
}

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
}

// WorkerEventKind names what a Worker did.
type WorkerEventKind string

// The worker events.
const (
	WorkerClaimed       WorkerEventKind = "claimed"           // a job was granted
	WorkerClaimFailed   WorkerEventKind = "claim_failed"      // a claim failed; nothing acted on (R7)
	WorkerHandled       WorkerEventKind = "handled"           // a handler returned (Result set)
	WorkerDeadline      WorkerEventKind = "provider_deadline" // a handler outlived its deadline and grace
	WorkerWritten       WorkerEventKind = "written"           // the write-back was accepted (Replayed set)
	WorkerStale         WorkerEventKind = "stale"             // the fence rejected the write-back (Err set)
	WorkerWriteFailed   WorkerEventKind = "write_failed"      // the write-back failed otherwise (Err set)
	WorkerObserved      WorkerEventKind = "observed"          // an observation was filed (Duplicate set)
	WorkerObserveFailed WorkerEventKind = "observe_failed"    // filing an observation failed and it was not spooled (Err set)
	WorkerSpooled       WorkerEventKind = "spooled"           // an observation not filed was spooled (Err set, R28)
	WorkerRefiled       WorkerEventKind = "refiled"           // a spooled receipt was filed (Duplicate set; Job has only ids)
	WorkerResendRefused WorkerEventKind = "resend_refused"    // a resend was refused before calling the provider
	WorkerGrantLost     WorkerEventKind = "grant_lost"        // a renewal found the grant gone; the handler was cancelled (Err set, R27)
	WorkerRenewFailed   WorkerEventKind = "renew_failed"      // a renewal call failed; tried again soon (Err set)
)

// WorkerEvent reports one thing a Worker did, for metrics and tests (M1).
type WorkerEvent struct {
	Kind      WorkerEventKind
	Job       ClaimedJob // zero for WorkerClaimFailed
	Result    Result     // WorkerHandled, WorkerStale, WorkerObserved…
	Decision  Decision   // WorkerWritten, WorkerStale, WorkerWriteFailed
	Replayed  bool       // WorkerWritten
	Duplicate bool       // WorkerObserved
	Err       error
}

// WorkerStats counts what a Worker did since it was made.
type WorkerStats struct {
	Claimed       int64 // jobs granted
	Takeovers     int64 // of which taken over from an expired lease (M1)
	ClaimFailures int64
	Completed     int64
	Rescheduled   int64
	Escalated     int64
	Replayed      int64 // write-backs answered replayed=true (R21)
	StaleRejected int64 // write-backs rejected by the fence (M1)
	WriteFailures int64
	Observations  int64 // observations filed (duplicates not counted), spooled ones included once filed
	LateAnswers   int64 // handlers that outlived their deadline and grace
	Spooled       int64 // receipts written to the receipt spool (R28)
	Refiled       int64 // spooled receipts the coordinator took, duplicates included
	Renewals      int64 // leases renewed (R27)
	RenewFailures int64 // renewal calls that failed (each tried again)
	GrantsLost    int64 // grants a renewal found gone: handlers cancelled (R27)
}

// ErrDrainTimeout is returned by Run when in-flight jobs were still running
// at the end of the drain. Their leases expire and a takeover reconciles
// them (R6, R14).
var ErrDrainTimeout = errors.New("jobfence: drain timeout: in-flight jobs were cut off")

// ErrWorkerStarted is returned by a second call to Run.
var ErrWorkerStarted = errors.New("jobfence: worker already started")

// Worker runs the claim → provider call → fenced write-back loop:
//
//   - it claims only what it can start now, max_jobs = free slots (R18);
//   - while a handler runs it renews the job's lease, all due jobs in one
//     call (R27), and when a renewal finds the grant gone (taken over) it
//     cancels the handler's context with ErrGrantLost, so that the handler
//     sends nothing new;
//   - it dispatches by next action: refund to Handler.Refund, anything else
//     to Handler.Reconcile (R14);
//   - before a same-key resend it checks the coordinator's resend deadline
//     again (R22) and escalates instead when the window is closing;
//   - it turns the answer into Complete, Reschedule or Escalate with the
//     claimed attempt, by DecideAt (R9, R14, R16);
//   - a write-back rejected by the fence (STALE_ATTEMPT, JOB_NOT_RUNNING) is
//     never repeated: the provider's answer is filed with ReportObservation,
//     source "worker:<id>", attempt the stale one (R15);
//   - a receipt the coordinator cannot take now is spooled to a local file
//     and filed later, after a restart too (R28, WorkerOptions.ReceiptSpool);
//   - a failed claim, CLAIM_OUTCOME_UNKNOWN included, is never acted on: it
//     backs off and claims again (R7);
//   - when Run's context ends or Shutdown is called it stops claiming and
//     drains: in-flight provider calls and write-backs run on, untouched by
//     the cancellation, until they finish or DrainTimeout passes; a grant
//     the worker stream delivers after its half-close is not started (the
//     coordinator hands it back).
type Worker struct {
	client  *Client
	handler Handler
	o       WorkerOptions
	log     *slog.Logger

	started  atomic.Bool
	stopOnce sync.Once
	stop     chan struct{} // closed: claim no more
	done     chan struct{} // closed when Run returns

	mu     sync.Mutex
	active int
	freed  chan struct{} // signalled when a job finishes
	jobs   sync.WaitGroup
	late   sync.WaitGroup

	// spool keeps the receipts not filed (R28); nil when off. refileMu
	// serialises refile passes; backlog is set while the spool holds
	// receipts the coordinator has not been reachable for, so that the
	// next successful call kicks a pass (refileKick).
	spool      *receiptSpool
	refileMu   sync.Mutex
	backlog    atomic.Bool
	refileKick chan struct{}

	// renewer renews the leases of running jobs (R27); nil with
	// NoLeaseRenewal.
	renewer *renewer

	// session is the worker stream; nil with NoStream. client then sends
	// write-backs, renewals and receipts on it (streamRPC).
	session *workSession

	stats struct {
		claimed, takeovers, claimFailures, completed, rescheduled, escalated, replayed,
		stale, writeFailures, observations, late, spooled, refiled, renewals, renewFailures, grantsLost atomic.Int64
	}
}

// NewWorker returns a Worker that claims through c and calls h, with its
// receipt spool open and locked (see WorkerOptions.ReceiptSpool). Errors:
// an invalid option (empty WorkerID, Concurrency outside 1..100, a negative
// duration, ClaimWait over 60s); ErrReceiptSpoolLocked when another worker
// holds the spool; the file system's error when the spool cannot be
// created or opened.
func NewWorker(c *Client, h Handler, o WorkerOptions) (*Worker, error) {
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
	case c == nil || h == nil:
		return nil, errors.New("jobfence: NewWorker needs a Client and a Handler")
	case o.WorkerID == "" || len(o.WorkerID) > 128:
		return nil, fmt.Errorf("jobfence: WorkerID must be 1..128 characters, got %q", o.WorkerID)
	case o.Concurrency < 1 || o.Concurrency > 100:
		return nil, fmt.Errorf("jobfence: Concurrency must be 1..100, got %d", o.Concurrency)
	case o.ClaimWait < 0 || o.ClaimWait > time.Minute:
		return nil, fmt.Errorf("jobfence: ClaimWait must be 0..60s, got %s", o.ClaimWait)
	}
	for name, d := range map[string]time.Duration{
		"Lease": o.Lease, "ProviderTimeout": o.ProviderTimeout, "LateAnswerGrace": o.LateAnswerGrace,
		"PollInterval": o.PollInterval, "ClaimBackoff": o.ClaimBackoff, "MaxClaimBackoff": o.MaxClaimBackoff,
		"DrainTimeout": o.DrainTimeout, "RenewInterval": o.RenewInterval,
	} {
		if d < 0 {
			return nil, fmt.Errorf("jobfence: %s must not be negative, got %s", name, d)
		}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Worker{
		client: c, handler: h, o: o, log: log.With("worker_id", o.WorkerID),
		stop: make(chan struct{}), done: make(chan struct{}), freed: make(chan struct{}, 1),
		refileKick: make(chan struct{}, 1),
	}
	if !o.NoStream {
		w.session = newWorkSession(w)
		w.client = &Client{rpc: streamRPC{CoordinatorClient: c.rpc, s: w.session}, cfg: c.cfg, jitter: c.jitter}
	}
	if !o.NoLeaseRenewal {
		w.renewer = newRenewer(w)
	}
	if o.ReceiptSpool == ReceiptSpoolOff {
		return w, nil
	}
	path := o.ReceiptSpool
	if path == "" {
		var err error
		if path, err = DefaultReceiptSpool(o.WorkerID); err != nil {
			return nil, fmt.Errorf("%w (set ReceiptSpool to a file, or to %q)", err, ReceiptSpoolOff)
		}
	}
	// A short wait: the lock of a worker that is just exiting.
	s, err := openReceiptSpool(path, spoolLockWait)
	if err != nil {
		return nil, err
	}
	w.spool = s
	if s.torn > 0 {
		w.log.Warn("receipt spool: cut off an unfinished last line, a crash in the middle of an append that was "+
			"never acknowledged", "spool", path, "bytes", s.torn)
	}
	if n := s.pending(); n > 0 {
		w.log.Warn("receipt spool holds receipts not filed yet; Run files them before claiming (R28)",
			"spool", path, "receipts", n)
	}
	return w, nil
}

// spoolLockWait is how long NewWorker waits for a held spool lock.
const spoolLockWait = time.Second

// Stats returns the worker's counters.
func (w *Worker) Stats() WorkerStats {
	s := &w.stats
	return WorkerStats{
		Claimed: s.claimed.Load(), Takeovers: s.takeovers.Load(), ClaimFailures: s.claimFailures.Load(),
		Completed: s.completed.Load(), Rescheduled: s.rescheduled.Load(), Escalated: s.escalated.Load(),
		Replayed: s.replayed.Load(), StaleRejected: s.stale.Load(), WriteFailures: s.writeFailures.Load(),
		Observations: s.observations.Load(), LateAnswers: s.late.Load(), Spooled: s.spooled.Load(),
		Refiled: s.refiled.Load(), Renewals: s.renewals.Load(), RenewFailures: s.renewFailures.Load(),
		GrantsLost: s.grantsLost.Load(),
	}
}

// Shutdown stops the worker from claiming and waits until Run has drained
// and returned, or ctx ends. It returns nil at once when Run was never
// called, after releasing the receipt spool. Errors: ctx.Err() when ctx
// ended first (the drain goes on).
func (w *Worker) Shutdown(ctx context.Context) error {
	w.stopOnce.Do(func() { close(w.stop) })
	if !w.started.Load() {
		// Never run: nothing to drain; a Run now would stop at once.
		w.closeSpool()
		return nil
	}
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run claims and works jobs until ctx ends or Shutdown is called, then
// drains (see Worker). Cancelling ctx is the SIGTERM path of a rolling
// deploy: jobs already claimed are finished, not abandoned. Claim and
// write-back failures are handled inside and never end Run.
//
// Errors: nil after a complete drain; ErrDrainTimeout when jobs were cut off
// at DrainTimeout; ErrWorkerStarted on a second call.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return ErrWorkerStarted
	}
	defer close(w.done)
	go func() {
		select {
		case <-ctx.Done():
			w.stopOnce.Do(func() { close(w.stop) })
		case <-w.done:
		}
	}()
	// In-flight jobs outlive ctx: their provider calls and write-backs must
	// not be cut by the shutdown signal, or a known outcome turns unknown.
	jobCtx, cutOff := context.WithCancel(context.WithoutCancel(ctx))
	defer cutOff()

	if w.spool != nil {
		// R28: what a predecessor (or this worker) could not file goes
		// first, then every ReceiptRefileInterval and after a failure heals.
		w.refile(jobCtx)
		quit, refiled := make(chan struct{}), make(chan struct{})
		go func() { defer close(refiled); w.refileLoop(jobCtx, quit) }()
		defer func() {
			close(quit)
			<-refiled
			// A last pass for what the drain spooled; skipped when the
			// drain was cut off (jobCtx is done then).
			if jobCtx.Err() == nil && w.spool.pending() > 0 {
				last, cancel := context.WithTimeout(jobCtx, finalRefileTimeout)
				w.refile(last)
				cancel()
			}
			w.closeSpool()
		}()
	}

	if w.renewer != nil {
		// Renewals go on through the drain, while handlers run (R27).
		quit, stopped := make(chan struct{}), make(chan struct{})
		go func() { defer close(stopped); w.renewer.run(jobCtx, quit) }()
		defer func() { close(quit); <-stopped }()
	}

	w.grantLoop(jobCtx)

	drained := make(chan struct{})
	go func() { w.jobs.Wait(); w.late.Wait(); close(drained) }()
	timer := time.NewTimer(w.o.DrainTimeout)
	defer timer.Stop()
	select {
	case <-drained:
		w.log.Info("worker drained")
		return nil
	case <-timer.C:
	}
	w.log.Warn("drain timeout: cutting in-flight jobs off; their leases will expire", "active", w.inFlight())
	cutOff()
	// Cut-off calls return promptly; wait for them so that no goroutine of
	// this worker outlives Run, but not for handlers that ignore ctx.
	w.jobs.Wait()
	return ErrDrainTimeout
}

func (w *Worker) stopping() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// pause waits d, or less when the worker stops or wake fires.
func (w *Worker) pause(d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.stop:
	case <-wake:
	}
}

func (w *Worker) inFlight() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.active
}

// grantLoop takes jobs until the worker stops: from the worker stream, or
// by claiming when it is off or the coordinator has none.
func (w *Worker) grantLoop(jobCtx context.Context) {
	if w.session != nil {
		go func() {
			select {
			case <-w.stop:
				w.session.closeSend()
			case <-w.done:
			}
		}()
		err := w.session.run(jobCtx, func(c ClaimedJob) { w.start(jobCtx, c) })
		if !errors.Is(err, errStreamUnsupported) {
			return
		}
		w.log.Info("the coordinator has no worker stream; claiming with Claim calls")
	}
	w.claimLoop(jobCtx)
}

func (w *Worker) claimLoop(jobCtx context.Context) {
	backoff := w.o.ClaimBackoff
	for !w.stopping() {
		free := w.o.Concurrency - w.inFlight()
		if free <= 0 {
			w.pause(time.Minute, w.freed)
			continue
		}
		jobs, err := w.claim(jobCtx, free)
		var budget *BudgetExhaustedError
		if errors.As(err, &budget) {
			// R19: due work waits on the provider's budget; not a failure.
			w.log.Debug("provider budget exhausted", "retry_after", budget.RetryAfter)
			w.pause(budget.RetryAfter, nil)
			continue
		}
		if err != nil && w.stopping() {
			break // the long poll was cancelled by the shutdown, not failed
		}
		if err != nil {
			// R7: a failed claim, CLAIM_OUTCOME_UNKNOWN included, grants
			// nothing to act on. A job it did commit comes back through a
			// takeover after its lease.
			w.stats.claimFailures.Add(1)
			w.emit(WorkerEvent{Kind: WorkerClaimFailed, Err: err})
			if !w.stopping() {
				w.log.Warn("claim failed; nothing acted on", "error", err, "backoff", backoff)
			}
			w.pause(time.Duration(float64(backoff)*(0.5+rand.Float64())), nil)
			backoff = min(2*backoff, w.o.MaxClaimBackoff)
			continue
		}
		backoff = w.o.ClaimBackoff
		w.kickRefile()
		for _, j := range jobs {
			w.start(jobCtx, j)
		}
		if w.o.ClaimWait == 0 && len(jobs) < free {
			w.pause(w.o.PollInterval, nil)
		}
	}
}

// claim asks for n jobs. A plain claim runs to its end even when the worker
// stops meanwhile (its jobs are then worked during the drain); a long poll
// is cancelled.
func (w *Worker) claim(jobCtx context.Context, n int) ([]ClaimedJob, error) {
	ctx := jobCtx
	if w.o.ClaimWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(jobCtx)
		defer cancel()
		go func() {
			select {
			case <-w.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	// R18: ask only for what can start now.
	return w.client.Claim(ctx, ClaimRequest{
		WorkerID: w.o.WorkerID, MaxJobs: n, Lease: w.o.Lease, Provider: w.o.Provider, Wait: w.o.ClaimWait,
	})
}

func (w *Worker) start(ctx context.Context, c ClaimedJob) {
	w.mu.Lock()
	w.active++
	w.mu.Unlock()
	w.jobs.Add(1)
	go func() {
		defer func() {
			w.mu.Lock()
			w.active--
			w.mu.Unlock()
			if w.session != nil {
				w.session.freed()
			}
			select {
			case w.freed <- struct{}{}:
			default:
			}
			w.jobs.Done()
		}()
		w.work(ctx, c)
	}()
}

func (w *Worker) policy(provider string) ProviderPolicy {
	if p, ok := w.o.Policies[provider]; ok {
		return p
	}
	return w.o.Policy
}

func jobAttrs(c ClaimedJob) []any {
	// grant names the grant without revealing its token (R25).
	return []any{"job_id", c.Job.ID, "operation_key", c.Job.OperationKey, "attempt", c.Attempt,
		"grant", c.LeaseToken.Fingerprint()}
}

// work handles one claimed job from provider call to write-back.
func (w *Worker) work(ctx context.Context, c ClaimedJob) {
	w.stats.claimed.Add(1)
	if c.Takeover {
		w.stats.takeovers.Add(1)
	}
	w.emit(WorkerEvent{Kind: WorkerClaimed, Job: c})
	log := w.log.With(jobAttrs(c)...)
	log.Debug("job claimed", "next_action", c.NextAction, "takeover", c.Takeover)
	pol := w.policy(c.Job.Provider)

	// R14, R22: the reconcile that chose a resend checked the window, but
	// time has passed since; check again before anything leaves.
	if d, why, refused := resendRefused(c, pol, c.CoordinatorNow()); refused {
		w.emit(WorkerEvent{Kind: WorkerResendRefused, Job: c, Decision: d})
		log.Warn("same-key resend refused; escalating", "why", why)
		w.write(ctx, log, c, d, Result{})
		return
	}
	res := w.call(ctx, log, c)
	w.emit(WorkerEvent{Kind: WorkerHandled, Job: c, Result: res})
	w.write(ctx, log, c, DecideAt(res, c, pol, c.CoordinatorNow()), res)
}

// call runs the handler under the provider-call deadline. A handler that
// ignores its context is given LateAnswerGrace; after that its outcome is
// unknown and its eventual answer is filed as an observation (R15).
func (w *Worker) call(ctx context.Context, log *slog.Logger, c ClaimedJob) Result {
	pctx, cancel := context.WithTimeout(ctx, w.o.ProviderTimeout)
	defer cancel()
	// The handler's context also ends when a renewal finds the grant gone
	// (R27); pctx, which bounds the wait for its answer, does not: a request
	// already sent (SendContext) is waited for, and its answer filed (R15).
	// The write-back's context is ctx: its refusal files the answer.
	hctx, released := w.handlerContext(pctx, c)
	defer released() // renew no more once the handler returned or timed out
	answer := make(chan Result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				answer <- Unknown(fmt.Errorf("handler panicked: %v", p))
			}
		}()
		if sends(c) {
			answer <- w.handler.Refund(hctx, c)
		} else {
			// R14: anything but a first send asks the provider first.
			answer <- w.handler.Reconcile(hctx, c)
		}
	}()
	select {
	case r := <-answer:
		return r
	case <-pctx.Done():
	}
	grace := time.NewTimer(w.o.LateAnswerGrace)
	defer grace.Stop()
	select {
	case r := <-answer:
		return r
	case <-grace.C:
	}
	w.stats.late.Add(1)
	w.emit(WorkerEvent{Kind: WorkerDeadline, Job: c})
	log.Warn("handler outlived the provider-call deadline; outcome unknown", "deadline", w.o.ProviderTimeout)
	w.late.Add(1)
	go func() {
		defer w.late.Done()
		r := <-answer
		w.observe(context.WithoutCancel(ctx), log, c, r, "answer arrived after the provider-call deadline")
	}()
	return Unknown(fmt.Errorf("provider call outlived its deadline of %s", w.o.ProviderTimeout))
}

// write makes the fenced write-back under the claimed grant (R9, R25). The
// Client repeats it after UNAVAILABLE (R21); the fence's refusal is final.
func (w *Worker) write(ctx context.Context, log *slog.Logger, c ClaimedJob, d Decision, res Result) {
	var wr WriteResult
	var err error
	switch d.Kind {
	case DecideComplete:
		wr, err = w.client.Complete(ctx, CompleteRequest{JobID: c.Job.ID, Attempt: c.Attempt, LeaseToken: c.LeaseToken,
			ProviderRefundID: d.ProviderRefundID})
	case DecideEscalate:
		wr, err = w.client.Escalate(ctx, EscalateRequest{JobID: c.Job.ID, Attempt: c.Attempt, LeaseToken: c.LeaseToken,
			Reason: clip(d.Reason, 1024)})
	default:
		wr, err = w.client.Reschedule(ctx, RescheduleRequest{JobID: c.Job.ID, Attempt: c.Attempt, LeaseToken: c.LeaseToken,
			NextAction: d.NextAction, Delay: d.Delay, Reason: clip(d.Reason, 1024)})
	}
	switch {
	case err == nil:
		w.kickRefile()
		switch d.Kind {
		case DecideComplete:
			w.stats.completed.Add(1)
		case DecideEscalate:
			w.stats.escalated.Add(1)
		default:
			w.stats.rescheduled.Add(1)
		}
		if wr.Replayed {
			w.stats.replayed.Add(1)
		}
		w.emit(WorkerEvent{Kind: WorkerWritten, Job: c, Result: res, Decision: d, Replayed: wr.Replayed})
		log.Info("job written", "decision", d.Kind.String(), "next_action", d.NextAction, "reason", d.Reason,
			"provider_refund_id", d.ProviderRefundID, "replayed", wr.Replayed)
	case errors.Is(err, ErrFenced):
		// R9, R21: the fence said no and a repeat cannot change that. Keep
		// the provider's answer as evidence for the current holder (R15).
		w.stats.stale.Add(1)
		w.emit(WorkerEvent{Kind: WorkerStale, Job: c, Result: res, Decision: d, Err: err})
		log.Info("write-back rejected by the fence; filing the answer as an observation",
			"decision", d.Kind.String(), "error", err)
		w.observe(ctx, log, c, res, "write-back "+d.Kind.String()+" rejected: "+err.Error())
	default:
		// The lease will lapse and a takeover reconciles (R6, R14); the
		// receipt is kept if the coordinator takes it.
		w.stats.writeFailures.Add(1)
		w.emit(WorkerEvent{Kind: WorkerWriteFailed, Job: c, Result: res, Decision: d, Err: err})
		log.Warn("write-back failed; the lease will expire and a takeover reconciles",
			"decision", d.Kind.String(), "error", err)
		w.observe(ctx, log, c, res, "write-back "+d.Kind.String()+" failed: "+err.Error())
	}
}

// observeRetryFor bounds how long a worker without a receipt spool keeps
// trying to file one receipt while the coordinator is unreachable.
const observeRetryFor = 2 * time.Minute

// observe files a provider answer as an observation under the claimed
// attempt (R15); results that carry no word from the provider are skipped.
// What the coordinator cannot take now is spooled (R28).
func (w *Worker) observe(ctx context.Context, log *slog.Logger, c ClaimedJob, res Result, detail string) {
	outcome, ok := res.observed()
	if !ok {
		return
	}
	if res.Reason != "" {
		detail += "; provider: " + res.Reason
	}
	// By operation key, not id: a database that lost recent commits in a
	// failover may give the lost job's id to another refund, while the key is
	// this refund's own (R1, R26).
	req := ObservationRequest{
		OperationKey: c.Job.OperationKey, Attempt: c.Attempt, LeaseToken: c.LeaseToken,
		Source: clip("worker:"+w.o.WorkerID, 128), Outcome: outcome,
		ProviderRefundID: res.ProviderRefundID, ProviderEventID: res.ProviderEventID, Detail: clip(detail, 4096),
	}
	// The receipt may be the only trace of a refund the provider made. With
	// a spool, one call (the Client repeats it after UNAVAILABLE) and then
	// the spool, which outlives this process: the job's slot is not held
	// while the coordinator is away. Without one, keep trying for up to
	// observeRetryFor or until the worker's drain gives up (the coordinator
	// deduplicates repeats).
	retryFor := observeRetryFor
	if w.spool != nil {
		retryFor = 0
	}
	var obs Observation
	var dup bool
	var err error
	pause := 100 * time.Millisecond
	for deadline := time.Now().Add(retryFor); ; {
		obs, dup, err = w.client.ReportObservation(ctx, req)
		if err == nil || !errors.Is(err, ErrUnavailable) || time.Now().Add(pause).After(deadline) || ctx.Err() != nil {
			break
		}
		log.Warn("observation not filed yet; retrying", "outcome", outcome, "error", err, "in", pause)
		select {
		case <-time.After(pause):
		case <-ctx.Done():
		}
		pause = min(2*pause, 5*time.Second)
	}
	receipt := []any{"outcome", outcome, "provider_refund_id", res.ProviderRefundID,
		"provider_event_id", res.ProviderEventID, "source", req.Source}
	switch {
	case err == nil:
		w.kickRefile()
		if !dup {
			w.stats.observations.Add(1)
		}
		w.emit(WorkerEvent{Kind: WorkerObserved, Job: c, Result: res, Duplicate: dup})
		log.Info("observation filed", append(receipt, "observation_id", obs.ID, "duplicate", dup)...)
		return
	case w.spool == nil || !refileLater(err):
		w.emit(WorkerEvent{Kind: WorkerObserveFailed, Job: c, Result: res, Err: err})
		log.Error("observation not filed: the provider's answer is only in this log", append(receipt, "error", err)...)
		return
	}
	// R28: durable before the worker moves on.
	if serr := w.spool.append(receiptOf(c.Job.ID, req, time.Now())); serr != nil {
		w.emit(WorkerEvent{Kind: WorkerObserveFailed, Job: c, Result: res, Err: errors.Join(err, serr)})
		log.Error("observation neither filed nor spooled: the provider's answer is only in this log",
			append(receipt, "error", err, "spool_error", serr, "spool", w.spool.path)...)
		return
	}
	w.backlog.Store(true)
	w.stats.spooled.Add(1)
	w.emit(WorkerEvent{Kind: WorkerSpooled, Job: c, Result: res, Err: err})
	log.Warn("observation not filed; spooled, to be filed when the coordinator takes it (R28)",
		append(receipt, "error", err, "spool", w.spool.path)...)
}

// refileLater reports whether a ReportObservation that failed with err may
// succeed when made again later (R28): nothing answered (transport,
// context), UNAVAILABLE (DATABASE_* included), DEADLINE_EXCEEDED, a
// credential being rotated, an internal error a fixed coordinator may not
// have, RESOURCE_EXHAUSTED (OBSERVATION_LIMIT of an earlier coordinator
// included). INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED and the other
// refusals of the request itself are permanent.
func refileLater(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return true
	}
	switch e.Code {
	case codes.InvalidArgument, codes.NotFound, codes.PermissionDenied, codes.FailedPrecondition,
		codes.AlreadyExists, codes.OutOfRange, codes.Unimplemented:
		return false
	case codes.ResourceExhausted:
		// OBSERVATION_LIMIT comes from coordinators of earlier releases
		// only: kept in the spool until one that keeps it aside takes it
		// (R28: no receipt is dropped for a per-job limit).
		return true
	}
	return true
}

// coordinatorAway reports whether err says the coordinator cannot take any
// receipt now, so that a refile pass stops instead of trying the rest.
func coordinatorAway(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return true
	}
	switch e.Code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unauthenticated:
		return true
	}
	return false
}

// Refile timing: a pass kicked by a healed call waits at least
// refileMinGap after the previous one; the pass at the end of Run is
// bounded by finalRefileTimeout.
const (
	refileMinGap       = 5 * time.Second
	finalRefileTimeout = 10 * time.Second
)

// kickRefile asks for a refile pass when the spool holds receipts the
// coordinator was away for: a call just succeeded, so it is back.
func (w *Worker) kickRefile() {
	if w.spool == nil || !w.backlog.Load() {
		return
	}
	select {
	case w.refileKick <- struct{}{}:
	default:
	}
}

// refileLoop runs refile passes every ReceiptRefileInterval and when
// kicked, until quit is closed.
func (w *Worker) refileLoop(ctx context.Context, quit <-chan struct{}) {
	tick := time.NewTicker(ReceiptRefileInterval)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-quit:
			return
		case <-tick.C:
		case <-w.refileKick:
			if wait := refileMinGap - time.Since(last); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-quit:
					t.Stop()
					return
				case <-t.C:
				}
			}
		}
		if w.spool.pending() > 0 {
			w.refile(ctx)
		}
		last = time.Now()
	}
}

// refile files every spooled receipt again, exactly as first tried, so that
// the coordinator deduplicates one that had landed (R15, R28), and then
// rewrites the spool without the receipts filed or refused for good. It
// stops at the first failure that says the coordinator is away; the rest
// waits for the next pass. Lines this version cannot read are kept.
func (w *Worker) refile(ctx context.Context) {
	w.refileMu.Lock()
	defer w.refileMu.Unlock()
	lines, upTo, err := w.spool.snapshot()
	if err != nil {
		w.log.Error("receipt spool unreadable; its receipts wait", "spool", w.spool.path, "error", err)
		return
	}
	var keep [][]byte
	var filed, dropped, unreadable int
	var away error
	for _, l := range lines {
		if l.r == nil {
			unreadable++
			keep = append(keep, l.raw)
			continue
		}
		if away != nil {
			keep = append(keep, l.raw)
			continue
		}
		r := *l.r
		obs, dup, err := w.client.ReportObservation(ctx, r.request())
		ids := ClaimedJob{Job: Job{ID: r.JobID, OperationKey: r.OperationKey}, Attempt: r.Attempt}
		switch {
		case err == nil:
			filed++
			w.stats.refiled.Add(1)
			if !dup {
				w.stats.observations.Add(1)
			}
			w.emit(WorkerEvent{Kind: WorkerRefiled, Job: ids, Duplicate: dup})
			w.log.Info("spooled receipt filed", append(r.logAttrs(), "observation_id", obs.ID, "duplicate", dup)...)
		case !refileLater(err):
			dropped++
			w.emit(WorkerEvent{Kind: WorkerObserveFailed, Job: ids, Err: err})
			w.log.Error("spooled receipt refused for good, dropped from the spool: the provider's answer is only in this log",
				append(r.logAttrs(), "error", err)...)
		default:
			keep = append(keep, l.raw)
			if coordinatorAway(err) {
				away = err
			} else {
				w.log.Warn("spooled receipt not filed yet; kept", append(r.logAttrs(), "error", err)...)
			}
		}
	}
	if unreadable > 0 {
		w.log.Error("receipt spool: lines this version cannot read are kept as they are; file them by hand",
			"spool", w.spool.path, "lines", unreadable)
	}
	if filed+dropped > 0 {
		if err := w.spool.rewrite(upTo, keep); err != nil {
			// The old file stands: what was filed is filed again next
			// time, and deduplicated.
			w.log.Error("receipt spool not rewritten", "spool", w.spool.path, "error", err)
		}
	}
	w.backlog.Store(away != nil)
	switch {
	case away != nil:
		w.log.Warn("spooled receipts wait for the coordinator", "spool", w.spool.path, "filed", filed,
			"left", len(keep), "error", away)
	case filed+dropped > 0:
		w.log.Info("receipt spool refiled", "spool", w.spool.path, "filed", filed, "dropped", dropped, "left", len(keep))
	}
}

// closeSpool releases the spool, removing its file when empty.
func (w *Worker) closeSpool() {
	if w.spool == nil {
		return
	}
	left := w.spool.pending()
	if err := w.spool.close(); err != nil {
		w.log.Error("receipt spool not closed cleanly", "spool", w.spool.path, "error", err)
	}
	if left > 0 {
		w.log.Warn("receipt spool released with receipts not filed; the next worker on this spool files them (R28)",
			"spool", w.spool.path, "receipts", left)
	}
}

func (w *Worker) emit(e WorkerEvent) {
	if w.o.OnEvent != nil {
		w.o.OnEvent(e)
	}
}

// clip cuts s to at most n bytes without splitting a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
