package jobfence

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// ErrGrantLost is the cause of a handler's context when the Worker learns,
// from a refused lease renewal, that the job's grant is gone (R27): taken
// over (STALE_ATTEMPT), already written back (JOB_NOT_RUNNING) or the job
// not found. A handler that sees it stops before sending anything new to the
// provider; whatever it returns is still written back (the fence refuses
// it) and filed as an observation (R15). Match it with
// errors.Is(context.Cause(ctx), ErrGrantLost).
var ErrGrantLost = errors.New("jobfence: grant lost")

// renewRetryDivisor: after a renewal call that failed (the coordinator
// away), the next try comes after a tenth of the lease.
const renewRetryDivisor = 10

// renewer keeps the leases of a Worker's running jobs alive while their
// handlers run (R27): one loop for the whole worker, each round one
// RenewLeases call for every job whose renewal is due, at about a third of
// its lease, with jitter so that a fleet started together does not renew in
// step.
//
// It is built from the client, the lease and interval a worker asks for
// and a small hooks interface; it tells its owner what each renewal found.
type renewer struct {
	client *Client
	lease  time.Duration // asked for; zero: the coordinator's default
	every  time.Duration // RenewInterval; zero: a third of each lease
	hooks  renewerHooks
	// tracing makes the span a renewal of several jobs is made in (R35).
	tracing tracing

	mu   sync.Mutex
	held map[int64]*heldGrant
	wake chan struct{}
}

// renewerHooks is what a renewer tells the Worker that owns it.
type renewerHooks interface {
	// renewFailed: the call renewing jobs failed; each is tried again soon.
	renewFailed(jobs []ClaimedJob, err error)
	// renewed: c's lease was renewed; receiptFiledAt is set when a receipt
	// of success or failure was filed for the job during this grant (R28).
	renewed(c ClaimedJob, receiptFiledAt time.Time)
	// tooOld: the coordinator renews c's grant no more (GRANT_TOO_OLD, R27).
	tooOld(c ClaimedJob, expiresAt time.Time)
	// grantLost: c's grant is gone (R27); its handler was just cancelled.
	grantLost(c ClaimedJob, err error)
}

// heldGrant is one job the worker holds.
type heldGrant struct {
	c     ClaimedJob
	lease time.Duration
	due   time.Time // this machine's monotonic clock: when to renew next
	lost  context.CancelCauseFunc
	// span is the job's attempt span, which its renewals carry (R35).
	span trace.SpanContext
	// tooOld: the coordinator renews it no more (GRANT_TOO_OLD).
	tooOld bool
}

// newRenewer returns the renewer of a worker that renews through client,
// asking for lease and renewing every (see WorkerOptions.Lease and
// RenewInterval).
func newRenewer(client *Client, lease, every time.Duration, hooks renewerHooks) *renewer {
	return &renewer{client: client, lease: lease, every: every, hooks: hooks, held: map[int64]*heldGrant{},
		wake: make(chan struct{}, 1)}
}

// leaseOf is the lease c was granted: its end less the claim's time, both
// on the coordinator's clock (R12); the asked lease when the coordinator
// did not say when it claimed.
func (r *renewer) leaseOf(c ClaimedJob) time.Duration {
	if !c.ClaimedAt.IsZero() && c.LeaseUntil.After(c.ClaimedAt) {
		return c.LeaseUntil.Sub(c.ClaimedAt)
	}
	if r.lease > 0 {
		return r.lease
	}
	return 30 * time.Second
}

// interval is how long after a renewal (or the claim) the next one is due:
// RenewInterval, or a third of the lease, within ±10 %.
func (r *renewer) interval(lease time.Duration) time.Duration {
	d := r.every
	if d == 0 {
		d = lease / 3
	}
	return time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
}

// hold starts renewing c's lease; lost cancels its handler's context; span
// is the attempt's span, which its renewals carry.
func (r *renewer) hold(c ClaimedJob, lost context.CancelCauseFunc, span trace.SpanContext) {
	lease := r.leaseOf(c)
	r.mu.Lock()
	r.held[c.Job.ID] = &heldGrant{c: c, lease: lease, due: time.Now().Add(r.interval(lease)), lost: lost, span: span}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// release stops renewing job id's lease: its handler has returned.
func (r *renewer) release(id int64) {
	r.mu.Lock()
	delete(r.held, id)
	r.mu.Unlock()
}

// run renews until quit is closed.
func (r *renewer) run(ctx context.Context, quit <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		due, next := r.due(time.Now())
		if len(due) > 0 {
			r.renew(ctx, due)
			continue
		}
		if next.IsZero() {
			next = time.Now().Add(time.Hour)
		}
		t.Reset(time.Until(next)) // no draining: since Go 1.23 a reset timer delivers no stale value
		select {
		case <-quit:
			return
		case <-r.wake:
		case <-t.C:
		}
	}
}

// due returns the grants to renew now, at most MaxRenewBatch, and when the
// next of the others is due (zero when none is held). When one is due, those
// due within half an interval more come along (a renewal a little early is
// harmless), so that a worker's jobs share one call instead of drifting
// apart with the jitter.
func (r *renewer) due(now time.Time) ([]*heldGrant, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var due []*heldGrant
	var next time.Time
	for _, h := range r.held {
		switch {
		case h.tooOld:
		case !h.due.After(now) && len(due) < MaxRenewBatch:
			due = append(due, h)
		case next.IsZero() || h.due.Before(next):
			next = h.due
		}
	}
	if len(due) == 0 {
		return nil, next
	}
	for _, h := range r.held {
		if !h.tooOld && h.due.After(now) && len(due) < MaxRenewBatch && h.due.Sub(now) <= r.interval(h.lease)/2 {
			due = append(due, h)
		}
	}
	return due, next
}

// renew renews hs in one call and acts on each answer: a renewed lease is
// due again in an interval; a lost grant cancels its handler; a grant too
// old is renewed no more; a failed call is tried again soon.
func (r *renewer) renew(ctx context.Context, hs []*heldGrant) {
	grants := make([]Grant, len(hs))
	jobs := make([]ClaimedJob, len(hs))
	spans := make([]trace.SpanContext, len(hs))
	for i, h := range hs {
		grants[i], jobs[i], spans[i] = GrantOf(h.c), h.c, h.span
	}
	rctx, end := r.tracing.renewContext(ctx, spans)
	out, err := r.client.RenewLeases(rctx, grants, r.lease)
	end()
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		for _, h := range hs {
			h.due = now.Add(h.lease / renewRetryDivisor)
		}
		r.hooks.renewFailed(jobs, err)
		return
	}
	for i, h := range hs {
		if r.held[h.c.Job.ID] != h {
			continue // its handler returned meanwhile
		}
		o := out[i]
		switch {
		case o.Refused == nil:
			h.due = now.Add(r.interval(h.lease))
			r.hooks.renewed(h.c, o.ReceiptFiledAt)
		case errors.Is(o.Refused, ErrGrantTooOld):
			h.tooOld = true
			r.hooks.tooOld(h.c, o.GrantExpiresAt)
		default:
			delete(r.held, h.c.Job.ID)
			h.lost(fmt.Errorf("%w: %w", ErrGrantLost, o.Refused))
			r.hooks.grantLost(h.c, o.Refused)
		}
	}
}

// renewFailed, renewed, tooOld and grantLost make the Worker its renewer's
// renewerHooks: they count, report and log what the renewals found.

func (w *Worker) renewFailed(jobs []ClaimedJob, err error) {
	w.stats.renewFailures.Add(1)
	w.log.Warn("lease renewal failed; trying again soon", "jobs", len(jobs), "error", err)
	for _, c := range jobs {
		w.emit(WorkerEvent{Kind: WorkerRenewFailed, Job: c, Err: err})
	}
}

func (w *Worker) renewed(c ClaimedJob, receiptFiledAt time.Time) {
	w.stats.renewals.Add(1)
	if !receiptFiledAt.IsZero() {
		w.log.Debug("a receipt of success or failure was filed for the job during this grant (R28)",
			append(jobAttrs(c), "receipt_filed_at", receiptFiledAt)...)
	}
}

func (w *Worker) tooOld(c ClaimedJob, expiresAt time.Time) {
	w.log.Warn("the coordinator renews this grant no more (--max-grant-age); its lease runs out and the job "+
		"is taken over unless the handler finishes first (R27)", append(jobAttrs(c), "grant_expires_at", expiresAt)...)
}

func (w *Worker) grantLost(c ClaimedJob, err error) {
	w.stats.grantsLost.Add(1)
	w.emit(WorkerEvent{Kind: WorkerGrantLost, Job: c, Err: err})
	w.log.Warn("grant lost; cancelling the handler before it sends anything new (R27)",
		append(jobAttrs(c), "error", err)...)
}

// handlerContext is the context a handler of c runs under: pctx (the
// provider-call deadline), cancelled with ErrGrantLost when a renewal finds
// the grant gone, and carrying pctx for SendContext. done stops the
// renewals of c's lease.
func (w *Worker) handlerContext(pctx context.Context, c ClaimedJob) (hctx context.Context, done func()) {
	if w.renewer == nil {
		return pctx, func() {}
	}
	hctx, lost := context.WithCancelCause(context.WithValue(pctx, sendContextKey{}, pctx))
	w.renewer.hold(c, lost, trace.SpanContextFromContext(pctx))
	return hctx, func() {
		w.renewer.release(c.Job.ID)
		lost(nil)
	}
}

type sendContextKey struct{}

// SendContext returns the context for a provider request a handler is about
// to send under ctx, the context the Worker gave it: the same deadline and
// values, but not cancelled when the grant is lost (ErrGrantLost, R27). Check
// ctx.Err() before sending: a lost grant sends nothing new. A request
// already sent under SendContext runs to its answer (or the deadline), and
// the Worker files that answer as an observation (R15), as it did before
// renewal existed; cutting it would lose the receipt, not undo the refund.
// Outside a Worker's handler it returns ctx.
func SendContext(ctx context.Context) context.Context {
	if send, ok := ctx.Value(sendContextKey{}).(context.Context); ok {
		return send
	}
	return ctx
}
