// Package dispatch stands between the gRPC handlers and the store: it
// coalesces concurrent enqueues, claims and write-backs into shared
// transactions (one COMMIT for many calls), parks idle long-polling claims
// until work may be there, and hands new jobs to them in the enqueue's own
// transaction. It keeps no job state of its own: every decision about a job
// is made by the store under the database's row locks and clock.
package dispatch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/tracing"
)

// ClaimsPerTx bounds the claims sharing one transaction: claims are short
// and lock rows, so few at a time, and concurrent claimers share a COMMIT
// instead of contending in the database.
const ClaimsPerTx = 16

// batchTimeout bounds one shared transaction: it outlives any one caller.
const batchTimeout = time.Minute

// ErrClosed is what calls made after Close answer.
var ErrClosed = errors.New("dispatch: closed")

// Store is what a Dispatcher needs of the store: the batch calls it
// coalesces calls into, one transaction each, and the look idle long polls
// share. store.Store provides it; sqlbase.Backend implements it for both
// backends.
type Store interface {
	EnqueueAndClaim(ctx context.Context, ps []store.EnqueueParams, cs []store.ClaimParams) ([]store.EnqueueOutcome,
		[]store.ClaimOutcome)
	ClaimMany(ctx context.Context, ps []store.ClaimParams) []store.ClaimOutcome
	WriteMany(ctx context.Context, ws []store.Writeback) []store.WriteOutcome
	RenewMany(ctx context.Context, rs []store.Renewal) []store.RenewOutcome
	HasWork(ctx context.Context, provider string) (bool, error)
}

// Options configure a Dispatcher; zero values take Defaults.
type Options struct {
	// PollInterval is how often idle long polls look again for work they
	// were not woken for (another replica's enqueues, delays that ran out,
	// expired leases), together, at the multiples of it on the clock.
	PollInterval time.Duration
	// Flushers is how many enqueue, write-back and claim transactions
	// (each) may run at once; MaxBatch the most enqueues or write-backs one
	// carries (claims: ClaimsPerTx).
	Flushers, MaxBatch int
	// Window is the longest a batch of enqueues, write-backs or renewals is
	// held open for more calls when they come at least twice per Window (the
	// batcher's pace): under load one transaction then carries many calls; at
	// low rates nothing waits. Claims are never held. Negative: never held
	// open.
	Window time.Duration
	// Metrics receive what the dispatcher does; nil ones are not observed.
	Metrics Metrics
	// Logger is slog.Default() when nil.
	Logger *slog.Logger
	// TracerProvider, when set, traces each shared transaction as a span
	// linked to the calls it served (R35); nil traces nothing and costs
	// nothing.
	TracerProvider trace.TracerProvider
}

// Defaults are the options a zero field of Options takes; the server's
// options and the coordinator's flags default to them too.
var Defaults = Options{PollInterval: 200 * time.Millisecond, Flushers: 2, MaxBatch: 128, Window: 4 * time.Millisecond}

// Metrics are the observers a Dispatcher reports to.
type Metrics struct {
	// Batch sizes: claims, write-backs, enqueues and lease renewals per
	// transaction.
	ClaimTx, WriteBatch, EnqueueBatch, RenewBatch prometheus.Observer
	// Holds observes, by kind (enqueue, write, renew), how long
	// each batch held open under load waited for more calls (Window).
	Holds *prometheus.HistogramVec
	// Handoffs counts long polls answered in an enqueue's transaction;
	// IdleLooks the looks idle long polls share (one per poll instant and
	// provider filter).
	Handoffs, IdleLooks prometheus.Counter
}

// Dispatcher owns the coalescing of calls into transactions and the idle
// long polls of one coordinator. Its methods may be called from many
// goroutines.
type Dispatcher struct {
	store    Store
	opts     Options
	log      *slog.Logger
	tracer   trace.Tracer // nil: tracing is off
	waiters  waiters
	idle     idleLooks
	writes   *batcher[store.Writeback, store.WriteOutcome, writeFlush]
	enqueues *batcher[store.EnqueueParams, store.EnqueueOutcome, enqueueFlush]
	claims   *batcher[store.ClaimParams, store.ClaimOutcome, claimFlush]
	renewals *batcher[store.Renewal, store.RenewOutcome, renewFlush]
	// releasing counts the hand-backs in flight (releaseJobs): Close waits
	// for them before it closes the write path under them. relMu guards
	// closing and the Adds, so that none starts once Close waits.
	releasing sync.WaitGroup
	relMu     sync.Mutex
	closing   bool
}

// New returns a Dispatcher on st, with its flushers running until Close.
// Zero options take Defaults.
func New(st Store, o Options) *Dispatcher {
	if o.PollInterval == 0 {
		o.PollInterval = Defaults.PollInterval
	}
	if o.Flushers == 0 {
		o.Flushers = Defaults.Flushers
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = Defaults.MaxBatch
	}
	if o.Window == 0 {
		o.Window = Defaults.Window
	}
	window := max(o.Window, 0)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Metrics = o.Metrics.withDefaults()
	d := &Dispatcher{store: st, opts: o, log: o.Logger}
	if o.TracerProvider != nil {
		d.tracer = o.TracerProvider.Tracer(tracing.ScopeName)
	}
	d.writes = newBatcher[store.Writeback, store.WriteOutcome](writeFlush{st}, o.Flushers, o.MaxBatch, batchTimeout, window,
		o.Metrics.WriteBatch, o.Metrics.Holds, d.tracer)
	// Claims are never held open: a claim waits for free slots that a held
	// batch would idle (a stream's credits, a worker's long poll).
	d.claims = newBatcher[store.ClaimParams, store.ClaimOutcome](claimFlush{d}, o.Flushers, ClaimsPerTx, batchTimeout, 0,
		o.Metrics.ClaimTx, o.Metrics.Holds, d.tracer)
	d.enqueues = newBatcher[store.EnqueueParams, store.EnqueueOutcome](enqueueFlush{d}, o.Flushers, o.MaxBatch,
		batchTimeout, window, o.Metrics.EnqueueBatch, o.Metrics.Holds, d.tracer)
	d.renewals = newBatcher[store.Renewal, store.RenewOutcome](renewFlush{st}, o.Flushers, o.MaxBatch, batchTimeout, window,
		o.Metrics.RenewBatch, o.Metrics.Holds, d.tracer)
	return d
}

// withDefaults fills the observers left nil with ones nobody reads.
func (m Metrics) withDefaults() Metrics {
	h := func(o prometheus.Observer) prometheus.Observer {
		if o == nil {
			return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "unobserved"})
		}
		return o
	}
	c := func(o prometheus.Counter) prometheus.Counter {
		if o == nil {
			return prometheus.NewCounter(prometheus.CounterOpts{Name: "unobserved"})
		}
		return o
	}
	holds := m.Holds
	if holds == nil {
		holds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "unobserved"}, []string{"kind"})
	}
	return Metrics{ClaimTx: h(m.ClaimTx), WriteBatch: h(m.WriteBatch), EnqueueBatch: h(m.EnqueueBatch), RenewBatch: h(m.RenewBatch),
		Holds: holds, Handoffs: c(m.Handoffs), IdleLooks: c(m.IdleLooks)}
}

// Enqueue enqueues p in a shared transaction. An error is the caller's
// context ending (the enqueue may still land: repeating it is safe, R1) or
// ErrClosed; the store's answer is in the outcome.
func (d *Dispatcher) Enqueue(ctx context.Context, p store.EnqueueParams) (store.EnqueueOutcome, error) {
	return d.enqueues.do(ctx, p)
}

// Write applies w in a shared transaction, and wakes a waiting claimer when
// it made a job ready (a reschedule, a resolution back to reconcile). Errors
// as Enqueue (a repeat of the same write is safe, R21).
func (d *Dispatcher) Write(ctx context.Context, w store.Writeback) (store.WriteOutcome, error) {
	out, err := d.writes.do(ctx, w)
	if err == nil && out.Err == nil && !out.Result.Replayed && out.Result.Job.State == store.StateReady {
		d.waiters.wake(out.Result.Job.Provider) // it may be due now
	}
	return out, err
}

// Renew renews the leases rs in shared transactions (R27), each renewal
// coalesced with those of other calls like a write-back, and answers each
// in order. An error is the caller's context ending or ErrClosed: the
// renewals may still land, and repeating them is safe.
func (d *Dispatcher) Renew(ctx context.Context, rs []store.Renewal) ([]store.RenewOutcome, error) {
	out := make([]store.RenewOutcome, len(rs))
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = d.renewals.do(ctx, r)
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// Drain makes waiting and future long-poll claims return at once, so that a
// graceful stop is not held up by idle workers.
func (d *Dispatcher) Drain() { d.waiters.stop() }

// Draining reports whether Drain was called: long polls then no longer wait.
func (d *Dispatcher) Draining() bool { return d.waiters.isStopped() }

// HandBack hands back granted jobs that never reached their worker (a
// worker stream that could not send them), as a long poll's caller that
// left: a fenced Reschedule under each grant's attempt and token, due now
// (release).
func (d *Dispatcher) HandBack(jobs []store.ClaimedJob, reason string) {
	d.releaseJobs(jobs, reason)
}

// Close drains, waits for the hand-backs in flight (a worker stream that
// ended with the server hands its grants back: closing the write path
// under them would leave each job to wait out its lease), and stops the
// flushers: calls still queued or made later answer ErrClosed. Call it once
// the gRPC server has stopped.
func (d *Dispatcher) Close() {
	d.Drain()
	d.relMu.Lock()
	d.closing = true
	d.relMu.Unlock()
	d.releasing.Wait()
	d.writes.close()
	d.enqueues.close()
	d.claims.close()
	d.renewals.close()
}

// enqueueMany runs a batch of enqueues and, in the same transaction, the
// claims of idle long-polling workers that could take the new jobs
// (Store.EnqueueAndClaim): a job enqueued while a worker waits reaches it
// with the enqueue's own COMMIT. Each taken claim takes what it would take
// one call later, oldest due work first (Q1). A new job no claim took wakes
// one more waiter.
func (d *Dispatcher) enqueueMany(ctx context.Context, ps []store.EnqueueParams) []store.EnqueueOutcome {
	providers := make(map[string]bool, len(ps))
	for _, p := range ps {
		providers[p.Provider] = true
	}
	taken := d.waiters.take(len(ps), providers)
	claims := make([]store.ClaimParams, len(taken))
	for i, wt := range taken {
		claims[i] = *wt.claim
	}
	if span := trace.SpanFromContext(ctx); len(taken) > 0 && span.IsRecording() {
		// The long polls handed work in this transaction are calls it
		// serves too.
		span.SetAttributes(tracing.BatchWaitersKey.Int(len(taken)))
		for _, wt := range taken {
			wt.batch = span.SpanContext()
			if wt.call.IsValid() {
				span.AddLink(trace.Link{SpanContext: wt.call, Attributes: callLink})
			}
		}
	}
	out, claimed := d.store.EnqueueAndClaim(ctx, ps, claims)
	granted := map[int64]bool{}
	for i, wt := range taken {
		for _, c := range claimed[i].Jobs {
			granted[c.Job.ID] = true
		}
		if len(claimed[i].Jobs) > 0 {
			d.opts.Metrics.Handoffs.Inc()
		}
		d.waiters.hand(wt, claimed[i])
	}
	for _, o := range out {
		if o.Err == nil && o.Created && !granted[o.Job.ID] {
			d.waiters.wake(o.Job.Provider)
		}
	}
	return out
}

// Claim claims p, and when nothing is granted waits up to wait for a wake, a
// hand-off from an enqueue (enqueueMany) or the next poll instant, and claims
// again. At a poll instant the waiters share one look for work per provider
// filter (idleLooks); where it found some, the first waiter to wake claims
// for every armed waiter in one transaction (pollRound), and a waiter that
// round found nothing for waits on without a claim of its own. Waiting is
// not a lease decision: time.Now here only bounds the call (R12 concerns
// leases). Errors: the store's (*store.BudgetExhaustedError among them),
// the caller's context, ErrClosed.
func (d *Dispatcher) Claim(ctx context.Context, p store.ClaimParams, wait time.Duration) ([]store.ClaimedJob, error) {
	return d.ClaimNext(ctx, p, wait, nil)
}

// Shortfall is what a claim tells the next claim of the same caller (a
// worker stream's): whether it was granted fewer jobs than it asked for,
// and the wake count at that moment.
type Shortfall struct {
	short bool
	wakes uint64
}

// ClaimNext is Claim for a caller that claims again and again (a worker
// stream), carrying prev from one call to the next. When its previous claim
// was granted fewer jobs than it asked for, the database had no more due
// work for it at that claim's commit; if nothing woke a waiter since, it
// waits at once for a wake, a hand-off or the next poll instant instead of
// looking first, which saves an empty claim transaction per job at a low
// rate. Any wake since counts as work that may be there: it looks.
func (d *Dispatcher) ClaimNext(ctx context.Context, p store.ClaimParams, wait time.Duration, prev *Shortfall) ([]store.ClaimedJob, error) {
	deadline := time.Now().Add(wait)
	looked := false // a look or a poll round has just found nothing for this caller
	note := func(jobs []store.ClaimedJob, wakes uint64) {
		if prev != nil {
			*prev = Shortfall{short: len(jobs) > 0 && len(jobs) < p.MaxJobs, wakes: wakes}
		}
	}
	for {
		wt := d.waiters.add(p.Provider)
		if prev != nil && prev.short && d.waiters.wakeCount() == prev.wakes {
			looked = true // nothing due at the previous grant, and nothing since (a wake from now on reaches wt)
		}
		if prev != nil {
			prev.short = false
		}
		if !looked {
			var wakes uint64
			if prev != nil {
				wakes = d.waiters.wakeCount()
			}
			out, err := d.claims.do(ctx, p)
			if err == nil {
				err = out.Err
			}
			if err != nil || len(out.Jobs) > 0 {
				d.waiters.remove(wt) // not armed: it can only have been woken
				note(out.Jobs, wakes)
				return out.Jobs, err
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			d.waiters.remove(wt) // not armed: it can only have been woken
			return nil, nil
		}
		var call trace.SpanContext
		if d.tracer != nil {
			call = trace.SpanContextFromContext(ctx)
		}
		d.waiters.arm(wt, p, call)
		next := untilNextPoll(time.Now(), d.opts.PollInterval)
		timer := time.NewTimer(min(left, next))
		ticked := false // a poll instant came, not the deadline
		select {
		case <-wt.ch:
		case <-timer.C:
			ticked = next <= left
		case <-ctx.Done():
		}
		timer.Stop()
		if !d.waiters.remove(wt) {
			<-wt.ch // woken, or taken by an enqueue or a poll round: its outcome comes with its COMMIT
		} else if ticked && ctx.Err() == nil {
			if d.idle.nothingFor(d, p.Provider) {
				wt.handed, wt.looked = true, true // looked at this instant: wait for the next
			} else {
				d.pollRound(wt, p)
			}
		}
		if wt.handed {
			linkBatch(ctx, wt.batch) // an enqueue's or a poll round's transaction claimed for it
		}
		if wt.handed && (wt.out.Err != nil || len(wt.out.Jobs) > 0) {
			if ctx.Err() != nil {
				d.release(p, wt.out) // granted to a caller that left
				return nil, nil
			}
			note(wt.out.Jobs, wt.wakes)
			return wt.out.Jobs, wt.out.Err
		}
		looked = wt.handed && wt.looked
		if ctx.Err() != nil || d.waiters.isStopped() {
			return nil, nil
		}
	}
}

// pollRound claims, in one transaction, for wt (which its caller has taken
// out of the waiters) with p and for the other armed waiters, oldest first,
// up to ClaimsPerTx in all, and hands each its outcome. The transaction
// outlives any one caller, like a batch. Its waiters are out of the queue
// while it runs, so a wake then (an enqueue after its candidate walk) may
// have found none of them: if there was one, they all claim again at once,
// as woken waiters do, instead of waiting for the next instant.
func (d *Dispatcher) pollRound(wt *waiter, p store.ClaimParams) {
	wakes := d.waiters.wakeCount()
	peers := d.waiters.take(ClaimsPerTx-1, nil)
	claims := make([]store.ClaimParams, 0, len(peers)+1)
	claims = append(claims, p)
	for _, w := range peers {
		claims = append(claims, *w.claim)
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	var span trace.Span
	if d.tracer != nil {
		ctx, span = d.pollRoundSpan(ctx, append([]*waiter{wt}, peers...))
	}
	outs := d.store.ClaimMany(ctx, claims)
	cancel()
	if span != nil {
		span.End()
		wt.batch = span.SpanContext()
		for _, w := range peers {
			w.batch = span.SpanContext()
		}
	}
	d.opts.Metrics.ClaimTx.Observe(float64(len(claims)))
	looked := d.waiters.wakeCount() == wakes
	wt.out, wt.handed, wt.looked, wt.wakes = outs[0], true, looked, wakes
	for i, w := range peers {
		w.looked = looked
		d.waiters.hand(w, outs[i+1])
	}
}

// pollRoundSpan starts the span of a poll round's claim transaction, a
// batch of claims like the claims batcher's, linked to each waiting call
// it serves (R35).
func (d *Dispatcher) pollRoundSpan(ctx context.Context, served []*waiter) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(served))
	for _, w := range served {
		if w.call.IsValid() {
			links = append(links, trace.Link{SpanContext: w.call, Attributes: callLink})
		}
	}
	return d.tracer.Start(ctx, tracing.SpanBatch+" claim", trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithLinks(links...), trace.WithAttributes(tracing.BatchKindKey.String("claim"),
			tracing.BatchSizeKey.Int(len(served)), tracing.PollRoundKey.Bool(true)))
}

// idleLooks is the one look idle long polls share at each poll instant
// (Store.HasWork): a read without locks or a transaction, per provider
// filter, so that two thousand idle workers cost the database a few reads
// per instant rather than a claim transaction per sixteen of them. A poll
// round runs only for the filters the look found work for.
type idleLooks struct {
	mu      sync.Mutex
	instant time.Time       // the poll instant the looks are of
	wakes   uint64          // waiters.wakeCount() when they were taken
	nothing map[string]bool // provider filter → no work was found
}

// nothingFor reports whether this poll instant's look found no work for the
// filter provider, looking once per instant and filter. A wake since the look
// (an enqueue or reschedule this replica saw) voids it, and an error is
// taken for work: the poll round then looks for itself.
func (l *idleLooks) nothingFor(d *Dispatcher, provider string) bool {
	instant := time.Now().Truncate(d.opts.PollInterval)
	wakes := d.waiters.wakeCount()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.instant.Equal(instant) || l.wakes != wakes {
		l.instant, l.wakes, l.nothing = instant, wakes, map[string]bool{}
	}
	if nothing, looked := l.nothing[provider]; looked {
		return nothing
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.PollInterval)
	work, err := d.store.HasWork(ctx, provider)
	cancel()
	nothing := err == nil && !work
	if d.waiters.wakeCount() != wakes {
		return false // woken meanwhile: claim to be sure
	}
	l.nothing[provider] = nothing
	d.opts.Metrics.IdleLooks.Inc()
	return nothing
}

// untilNextPoll is the time from now to the next multiple of interval on the
// clock: the instants at which idle long polls look again, together.
func untilNextPoll(now time.Time, interval time.Duration) time.Duration {
	return now.Truncate(interval).Add(interval).Sub(now)
}

// release hands back the jobs of a claim whose caller left before it was
// answered (a cancelled long poll, a worker stopping): a fenced Reschedule
// under the granted attempt and token, due now, so they need not wait for
// their leases to expire. A takeover keeps its RECONCILE; a first claim sent
// nothing.
func (d *Dispatcher) release(_ store.ClaimParams, out store.ClaimOutcome) {
	d.releaseJobs(out.Jobs, "claim abandoned by its caller before the answer")
}

// releaseJobs hands jobs back with a fenced Reschedule each, kept in the
// history with reason.
// releaseTries bounds the tries of one hand-back: a database busy for a
// moment (a lock wait, a failover's seconds) must not leave the job to wait
// out a whole lease, which may be minutes.
const releaseTries = 4

// release1 writes one hand-back, trying again after a failure that changed
// nothing (the write is fenced and a repeat is a replay, R21), with a
// growing pause, unless the dispatcher closes meanwhile.
func (d *Dispatcher) release1(w store.Writeback) error {
	var err error
	for try := 1; try <= releaseTries; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
		var out store.WriteOutcome
		out, err = d.Write(ctx, w)
		cancel()
		if err == nil {
			err = out.Err
		}
		var fe *store.FenceError
		if err == nil || errors.As(err, &fe) || errors.Is(err, store.ErrNotFound) || errors.Is(err, ErrClosed) {
			return err
		}
		d.relMu.Lock()
		closing := d.closing
		d.relMu.Unlock()
		if closing || try == releaseTries {
			break
		}
		time.Sleep(time.Duration(try*try) * 100 * time.Millisecond)
	}
	return err
}

func (d *Dispatcher) releaseJobs(jobs []store.ClaimedJob, reason string) {
	for _, c := range jobs {
		w := store.Writeback{Kind: store.EventRescheduled, JobID: c.Job.ID, Attempt: c.Job.Attempt,
			LeaseToken: c.LeaseToken, NextAction: c.Job.NextAction, Reason: reason}
		d.relMu.Lock()
		if d.closing {
			d.relMu.Unlock()
			d.log.Warn("abandoned claim not released, the coordinator is closing; its lease will expire",
				"operation_key", c.Job.OperationKey, "job_id", c.Job.ID, "attempt", c.Job.Attempt)
			continue
		}
		d.releasing.Add(1)
		d.relMu.Unlock()
		go func() {
			defer d.releasing.Done()
			err := d.release1(w)
			if err != nil {
				d.log.LogAttrs(context.Background(), slog.LevelWarn, "abandoned claim not released; its lease will expire",
					slog.String("operation_key", c.Job.OperationKey), slog.Int64("job_id", c.Job.ID),
					slog.Int64("attempt", c.Job.Attempt), slog.String("error", err.Error()))
			}
		}()
	}
}
