// Package archiver moves finished jobs out of the working tables (R31): one
// coordinator at a time, elected through a fenced lease row in the
// database, in short batches paced so that claims and write-backs do not
// notice, backing off while the database's purge falls behind or its locks
// time out. The store does each batch in one transaction (store.Archive);
// this package decides when, how big, and who.
package archiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobfence/jobfence/store"
)

// Store is what the archiver needs of the store.
type Store interface {
	TakeLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error)
	RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error)
	ReleaseLease(ctx context.Context, l store.Lease) error
	Archive(ctx context.Context, p store.ArchiveParams) (store.ArchiveResult, error)
	PurgeBacklog(ctx context.Context) (int64, error)
	ArchiveAllowed(ctx context.Context) (bool, error)
}

// Options configure an Archiver; zero fields take Defaults.
type Options struct {
	// RetainSucceeded is how long a succeeded job stays in the working
	// tables after its completion (at least store.MinRetention).
	RetainSucceeded time.Duration
	// RetainCancelled is how long a cancelled job stays after it was
	// cancelled (R32); 0 keeps cancelled jobs in the working tables.
	RetainCancelled time.Duration
	// Batch is the most jobs one transaction moves; Pause the wait between
	// two batches of one run; Interval the wait between runs.
	Batch    int
	Pause    time.Duration
	Interval time.Duration
	// MaxPurgeBacklog is the purge backlog (InnoDB's history list length)
	// above which the archiver waits before its next batch.
	MaxPurgeBacklog int64
	// LeaseTTL is how long the archiver's lease lasts unless renewed; it
	// is renewed at each batch once a third of it has passed.
	LeaseTTL time.Duration
	// Holder names this archiver in the lease row; host and pid when
	// empty. A name that outlives the process (the coordinator gives its
	// host and listen address) lets a restarted archiver take its lease
	// again at once instead of waiting out LeaseTTL.
	Holder string
	// Metrics record the archive; kept on a private registry when nil.
	Metrics *Metrics
	// Logger gets a progress line per run; slog.Default() when nil.
	Logger *slog.Logger
}

// Defaults are the options a zero field takes, and the defaults of the
// coordinator's flags.
var Defaults = Options{
	RetainSucceeded: 7 * 24 * time.Hour,
	RetainCancelled: 7 * 24 * time.Hour,
	Batch:           500,
	Pause:           100 * time.Millisecond,
	Interval:        time.Minute,
	MaxPurgeBacklog: 1_000_000,
	LeaseTTL:        30 * time.Second,
}

// Bounds the archiver keeps whatever it is told.
const (
	minBatch   = 10
	maxBackoff = time.Minute
)

// Metrics are the archive's counters and gauges.
type Metrics struct {
	jobs, batches prometheus.Counter
	backoffs      *prometheus.CounterVec
	lastRun       prometheus.Gauge
	behind        prometheus.Gauge
	purgeBacklog  prometheus.Gauge
}

// NewMetrics registers the archive's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		jobs: prometheus.NewCounter(prometheus.CounterOpts{Name: "jobfence_archived_jobs_total",
			Help: "Jobs this coordinator moved from the working tables to the archive (R31)."}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Name: "jobfence_archive_batches_total",
			Help: "Archive transactions this coordinator committed."}),
		backoffs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jobfence_archive_backoffs_total",
			Help: "Times the archiver waited instead of archiving, by reason: purge (the database's purge fell behind) or error (a batch failed: lock-wait timeout, database away)."},
			[]string{"reason"}),
		lastRun: prometheus.NewGauge(prometheus.GaugeOpts{Name: "jobfence_archive_last_run_timestamp_seconds",
			Help: "When this coordinator's archiver last finished a run with nothing left due (Unix seconds)."}),
		behind: prometheus.NewGauge(prometheus.GaugeOpts{Name: "jobfence_archive_behind_seconds",
			Help: "How far past its retention the oldest succeeded job still in the working tables is, as the last batch saw it."}),
		purgeBacklog: prometheus.NewGauge(prometheus.GaugeOpts{Name: "jobfence_db_purge_backlog",
			Help: "The database's purge backlog (InnoDB's history list length) as the archiver last read it; 0 where there is none."}),
	}
	for _, r := range []string{"purge", "error"} {
		m.backoffs.WithLabelValues(r)
	}
	reg.MustRegister(m.jobs, m.batches, m.backoffs, m.lastRun, m.behind, m.purgeBacklog)
	return m
}

// ErrWaitsForContract is Once's error while the contract migration that
// completes the key table is pending (ArchiveAllowed): nothing may leave
// the working tables yet (R30).
var ErrWaitsForContract = errors.New("archive waits for the contract migration that completes the key table")

// Archiver runs the archive. Its methods are not safe for concurrent use.
type Archiver struct {
	st    Store
	opts  Options
	log   *slog.Logger
	m     *Metrics
	lease store.Lease // held when Generation > 0
	batch int         // the batch size now: halved after a failure, grown back after successes
	// waitedForContract: the log said once that archiving waits for it.
	waitedForContract bool
}

// Totals counts what a run moved.
type Totals struct {
	Jobs, Events, Observations, Batches int
	// Behind is how far behind the last batch saw the archive.
	Behind time.Duration
}

// New returns an archiver of st. Errors: options out of bounds, naming the
// option.
func New(st Store, opts Options) (*Archiver, error) {
	setDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	setDur(&opts.RetainSucceeded, Defaults.RetainSucceeded)
	setDur(&opts.Pause, Defaults.Pause)
	setDur(&opts.Interval, Defaults.Interval)
	setDur(&opts.LeaseTTL, Defaults.LeaseTTL)
	if opts.Batch == 0 {
		opts.Batch = Defaults.Batch
	}
	if opts.MaxPurgeBacklog == 0 {
		opts.MaxPurgeBacklog = Defaults.MaxPurgeBacklog
	}
	switch {
	case opts.RetainSucceeded < store.MinRetention:
		return nil, fmt.Errorf("retain succeeded: must be at least %s, got %s", store.MinRetention, opts.RetainSucceeded)
	case opts.RetainCancelled != 0 && opts.RetainCancelled < store.MinRetention:
		return nil, fmt.Errorf("retain cancelled: must be 0 (never) or at least %s, got %s", store.MinRetention,
			opts.RetainCancelled)
	case opts.Batch < 1 || opts.Batch > store.MaxArchiveBatch:
		return nil, fmt.Errorf("archive batch: must be 1..%d, got %d", store.MaxArchiveBatch, opts.Batch)
	case opts.Pause < 0 || opts.Interval < 0 || opts.LeaseTTL < 3*time.Second:
		return nil, fmt.Errorf("archive pause and interval must not be negative, the lease at least 3s")
	case opts.MaxPurgeBacklog < 0:
		return nil, fmt.Errorf("archive max purge backlog: must not be negative, got %d", opts.MaxPurgeBacklog)
	}
	if opts.Holder == "" {
		host, _ := os.Hostname()
		opts.Holder = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	return &Archiver{st: st, opts: opts, log: opts.Logger, m: opts.Metrics, batch: opts.Batch}, nil
}

// Run archives until ctx ends: a run whenever this archiver holds the
// lease, every Interval. It returns nil when ctx ends, having released its
// lease for another coordinator to take at once.
func (a *Archiver) Run(ctx context.Context) error {
	defer a.Release()
	for {
		if _, err := a.Once(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, store.ErrLeaseHeld) &&
			!errors.Is(err, ErrWaitsForContract) { // said once, by Once
			a.log.Warn("archive run stopped; the next one starts in "+a.opts.Interval.String(), "error", err.Error())
		}
		if !sleep(ctx, a.opts.Interval) {
			return nil
		}
	}
}

// Once archives everything due now, batch after batch, and returns what
// it moved: the coordinator's --archive-once, and each of Run's runs.
// Errors: store.ErrLeaseHeld (another coordinator archives), the contract
// migration missing, the lease lost, ctx's end.
func (a *Archiver) Once(ctx context.Context) (Totals, error) {
	var t Totals
	allowed, err := a.st.ArchiveAllowed(ctx)
	if err != nil {
		return t, err
	}
	if !allowed {
		if !a.waitedForContract {
			a.waitedForContract = true
			a.log.Warn("archive waits for the contract migration that completes the key table (coordinator " +
				"--migrate-only --migrate-contract, once every coordinator runs this release): until then a " +
				"coordinator of an earlier release could enqueue an archived key again")
		}
		return t, ErrWaitsForContract
	}
	began := time.Now()
	backoff := a.opts.Pause
	for {
		if err := a.hold(ctx); err != nil {
			return t, err
		}
		if n, err := a.st.PurgeBacklog(ctx); err == nil {
			a.m.purgeBacklog.Set(float64(n))
			if n > a.opts.MaxPurgeBacklog {
				backoff = min(max(2*backoff, time.Second), maxBackoff)
				a.m.backoffs.WithLabelValues("purge").Inc()
				a.log.Info("archive waits for the database's purge", "purge_backlog", n,
					"max", a.opts.MaxPurgeBacklog, "wait", backoff.String())
				if !sleep(ctx, backoff) {
					return t, ctx.Err()
				}
				continue
			}
		}
		res, err := a.st.Archive(ctx, store.ArchiveParams{Lease: a.lease, RetainSucceeded: a.opts.RetainSucceeded,
			RetainCancelled: a.opts.RetainCancelled, Limit: a.batch})
		switch {
		case errors.Is(err, store.ErrLeaseLost):
			a.lease = store.Lease{}
			return t, err
		case err != nil:
			if ctx.Err() != nil {
				return t, ctx.Err()
			}
			// A lock-wait timeout or a database away: nothing moved. Try
			// again smaller and later (R20).
			a.batch = max(a.batch/2, minBatch)
			backoff = min(max(2*backoff, time.Second), maxBackoff)
			a.m.backoffs.WithLabelValues("error").Inc()
			what := "archive batch failed; nothing moved"
			if errors.Is(err, store.ErrWriteOutcomeUnknown) {
				what = "archive batch's commit cut off: it moved whole or not at all, the next batch sees which"
			}
			a.log.Warn(what, "error", err.Error(), "batch", a.batch, "wait", backoff.String())
			if !sleep(ctx, backoff) {
				return t, ctx.Err()
			}
			continue
		}
		backoff = a.opts.Pause
		a.batch = min(a.batch*2, a.opts.Batch)
		t.Jobs += res.Jobs
		t.Events += res.Events
		t.Observations += res.Observations
		t.Behind = res.Behind
		if res.Jobs > 0 {
			t.Batches++
			a.m.batches.Inc()
			a.m.jobs.Add(float64(res.Jobs))
		}
		a.m.behind.Set(res.Behind.Seconds())
		if !res.More {
			break
		}
		if !sleep(ctx, a.opts.Pause) {
			return t, ctx.Err()
		}
	}
	a.m.lastRun.SetToCurrentTime()
	if t.Jobs > 0 {
		a.log.Info("archive run", "jobs", t.Jobs, "events", t.Events, "receipts", t.Observations, "batches", t.Batches,
			"took", time.Since(began).Round(time.Millisecond).String(), "behind", t.Behind.Round(time.Second).String())
	}
	return t, nil
}

// Release gives the lease up, if this archiver holds it: another
// coordinator's archiver takes it at its next run instead of after the
// lease's time. Call it when the archiver stops for good.
func (a *Archiver) Release() {
	if a.lease.Generation == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.st.ReleaseLease(ctx, a.lease); err != nil {
		a.log.Warn("archiver lease not released; another coordinator takes it once it runs out", "error", err.Error())
	}
	a.lease = store.Lease{}
}

// hold takes the lease, or renews it once a third of it has passed.
// Errors: store.ErrLeaseHeld, the store's.
func (a *Archiver) hold(ctx context.Context) error {
	if a.lease.Generation > 0 && time.Until(a.lease.Until) > 2*a.opts.LeaseTTL/3 {
		return nil
	}
	if a.lease.Generation > 0 {
		l, err := a.st.RenewLease(ctx, a.lease, a.opts.LeaseTTL)
		if err == nil {
			a.lease = localUntil(l, a.opts.LeaseTTL)
			return nil
		}
		a.lease = store.Lease{}
		if !errors.Is(err, store.ErrLeaseLost) {
			return err
		}
	}
	l, err := a.st.TakeLease(ctx, store.ArchiverLease, a.opts.Holder, a.opts.LeaseTTL)
	if err != nil {
		return err
	}
	a.log.Debug("archiver lease taken", "holder", l.Holder, "generation", l.Generation)
	a.lease = localUntil(l, a.opts.LeaseTTL)
	return nil
}

// localUntil keeps l with Until on this process's clock, when to renew it:
// only the database's clock decides whether it holds (R12).
func localUntil(l store.Lease, ttl time.Duration) store.Lease {
	l.Until = time.Now().Add(ttl)
	return l
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
