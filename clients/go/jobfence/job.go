package jobfence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
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
//
// A job whose cancel was requested (job.CancelRequested, R32) goes to
// Reconcile only, whatever its NextAction, and whatever Reconcile returns it
// is never sent again: Succeeded completes it (the cancel came too late),
// Pending and Unknown reconcile later, NoRecord and Failed escalate it to a
// person, who alone may close a maybe-sent refund as cancelled.
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

// work handles one claimed job from provider call to write-back, in the
// job's attempt span (R35): the handler's context and every call made for
// the job carry it.
func (w *Worker) work(ctx context.Context, c ClaimedJob) {
	ctx, at := w.tracing.start(ctx, c)
	w.stats.claimed.Add(1)
	if c.Takeover {
		w.stats.takeovers.Add(1)
	}
	w.emit(WorkerEvent{Kind: WorkerClaimed, Job: c})
	log := w.log.With(jobAttrs(c)...)
	log.Debug("job claimed", "next_action", c.NextAction, "takeover", c.Takeover,
		"cancel_requested", c.CancelRequested)
	pol := w.policy(c.Job.Provider)
	if cancelRequested(c) && c.NextAction == ActionRefund {
		// R32: no grant of a job whose cancel was requested should carry
		// refund; whatever this one says, the job is only reconciled (sends).
		log.Warn("a grant asks to send the refund of a job whose cancel was requested; reconciling instead (R32)")
	}

	// R14, R22: the reconcile that chose a resend checked the window, but
	// time has passed since; check again before anything leaves.
	if d, why, refused := resendRefused(c, pol, c.CoordinatorNow()); refused {
		w.emit(WorkerEvent{Kind: WorkerResendRefused, Job: c, Decision: d})
		log.Warn("same-key resend refused; escalating", "why", why)
		w.write(ctx, log, c, d, Result{}, at)
		return
	}
	res := w.call(ctx, log, c, at)
	at.handled(res)
	w.emit(WorkerEvent{Kind: WorkerHandled, Job: c, Result: res})
	w.write(ctx, log, c, DecideAt(res, c, pol, c.CoordinatorNow()), res, at)
}

// call runs the handler under the provider-call deadline. A handler that
// ignores its context is given LateAnswerGrace; after that its outcome is
// unknown and its eventual answer is filed as an observation (R15).
func (w *Worker) call(ctx context.Context, log *slog.Logger, c ClaimedJob, at *attemptSpan) Result {
	pctx, cancel := context.WithTimeout(ctx, w.o.ProviderTimeout)
	defer cancel()
	// The handler's context also ends when a renewal finds the grant gone
	// (R27); pctx, which bounds the wait for its answer, does not: a request
	// already sent (SendContext) is waited for, and its answer filed (R15).
	// The write-back's context is ctx: its refusal files the answer.
	hctx, released := w.handlerContext(pctx, c)
	defer released() // renew no more once the handler returned or timed out
	defer func() {
		if errors.Is(context.Cause(hctx), ErrGrantLost) {
			at.grantLost()
		}
	}()
	answer := make(chan Result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				answer <- Unknown(&handlerPanic{p})
			}
		}()
		if sends(c) {
			answer <- w.handler.Refund(hctx, c)
		} else {
			// R14: anything but a first send asks the provider first; R32:
			// a job whose cancel was requested is only ever asked about.
			answer <- w.handler.Reconcile(hctx, c)
		}
	}()
	select {
	case r := <-answer:
		return handlerResult(r, at)
	case <-pctx.Done():
	}
	grace := time.NewTimer(w.o.LateAnswerGrace)
	defer grace.Stop()
	select {
	case r := <-answer:
		return handlerResult(r, at)
	case <-grace.C:
	}
	at.handlerFailed("provider_deadline")
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

// handlerPanic is the error of a handler that panicked.
type handlerPanic struct{ v any }

func (p *handlerPanic) Error() string { return fmt.Sprintf("handler panicked: %v", p.v) }

// handlerResult is r, the handler's answer, recorded on its attempt span: a
// handler that failed (an error, a panic) left the outcome unknown.
func handlerResult(r Result, at *attemptSpan) Result {
	if r.Kind == ResultUnknown && r.Err != nil {
		at.handlerFailed("handler_error")
	}
	return r
}

// write makes the fenced write-back under the claimed grant (R9, R25). The
// Client repeats it after UNAVAILABLE (R21); the fence's refusal is final.
// The attempt's span ends with it, after a receipt it files.
func (w *Worker) write(ctx context.Context, log *slog.Logger, c ClaimedJob, d Decision, res Result, at *attemptSpan) {
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
	defer at.end(d, wr.Replayed, err)
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
