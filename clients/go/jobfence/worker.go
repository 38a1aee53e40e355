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

	"go.opentelemetry.io/otel/trace"
)

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
//     to Handler.Reconcile (R14); a job whose cancel was requested goes to
//     Reconcile whatever its grant says, and is never sent (R32);
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

	// tracing makes each job's attempt span (R35).
	tracing tracing

	stats counters
}

// NewWorker returns a Worker that claims through c and calls h, with its
// receipt spool open and locked (see WorkerOptions.ReceiptSpool). Errors:
// an invalid option (empty WorkerID, Concurrency outside 1..100, a negative
// duration, ClaimWait over 60s); ErrReceiptSpoolLocked when another worker
// holds the spool; the file system's error when the spool cannot be
// created or opened.
func NewWorker(c *Client, h Handler, o WorkerOptions) (*Worker, error) {
	if c == nil || h == nil {
		return nil, errors.New("jobfence: NewWorker needs a Client and a Handler")
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Worker{
		client: c, handler: h, o: o, log: log.With("worker_id", o.WorkerID),
		stop: make(chan struct{}), done: make(chan struct{}), freed: make(chan struct{}, 1),
		refileKick: make(chan struct{}, 1), tracing: newTracing(o.TracerProvider, o.WorkerID),
	}
	if !o.NoStream {
		w.session = newWorkSession(c.rpc, workStart(o), o.Concurrency, w)
		w.client = &Client{rpc: streamRPC{CoordinatorClient: c.rpc, s: w.session}, cfg: c.cfg, jitter: c.jitter}
	}
	if !o.NoLeaseRenewal {
		w.renewer = newRenewer(w.client, o.Lease, o.RenewInterval, w)
		w.renewer.tracing = w.tracing
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
	// Nor are they part of a span ctx may carry: each attempt is a trace's
	// root of its own, linked to its enqueue (R35).
	jobCtx, cutOff := context.WithCancel(trace.ContextWithSpanContext(context.WithoutCancel(ctx), trace.SpanContext{}))
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
		err := w.streamLoop(jobCtx)
		if !errors.Is(err, errStreamUnsupported) {
			return
		}
		w.log.Info("the coordinator has no worker stream; claiming with Claim calls")
	}
	w.claimLoop(jobCtx)
}

// streamLoop keeps a worker stream open until the worker stops, opening a
// new one after a pause when one ends, and returns once the coordinator has
// answered the half-close. errStreamUnsupported: the coordinator has no
// Work; nothing was granted.
func (w *Worker) streamLoop(jobCtx context.Context) error {
	backoff := w.o.ClaimBackoff
	for {
		opened, err := w.session.serve(jobCtx)
		switch {
		case errors.Is(err, errStreamUnsupported):
			return err
		case w.stopping():
			return nil
		case opened:
			// The coordinator took the stream: it is there, and the next
			// stream opens after the first pause, not a grown one.
			backoff = w.o.ClaimBackoff
		}
		if err != nil {
			w.stats.claimFailures.Add(1)
			w.emit(WorkerEvent{Kind: WorkerClaimFailed, Err: err})
			w.log.Warn("worker stream ended; opening it again", "error", err, "backoff", backoff)
		}
		w.pause(time.Duration(float64(backoff)*(0.5+rand.Float64())), nil)
		backoff = min(2*backoff, w.o.MaxClaimBackoff)
	}
}

// granted, dropped, retryAfter and heard make the Worker its session's
// sessionHooks (stopping is its own).

func (w *Worker) granted(ctx context.Context, c ClaimedJob) { w.start(ctx, c) }

func (w *Worker) dropped(ids []int64, err error) {
	w.log.Info("grants read after the stream's half-close or failure left unstarted; the coordinator hands them back",
		"jobs", len(ids), "job_ids", ids, "error", err)
}

func (w *Worker) retryAfter(d time.Duration) {
	// R19: due work waits on the provider's budget; not a failure.
	w.log.Debug("provider budget exhausted", "retry_after", d)
}

func (w *Worker) heard() { w.kickRefile() }

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
