package jobfence

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
)

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
