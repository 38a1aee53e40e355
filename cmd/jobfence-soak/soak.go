package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
)

const (
	// restartGrace is how long after a restarted coordinator serves the
	// workers' streams may still fail to open: the SDK reopens a stream
	// after a backoff of up to 5 s, and gRPC redials a refused connection
	// after a backoff of its own.
	restartGrace = 15 * time.Second
	// reconnectAllowance is the part of a restart's excluded span after the
	// new coordinator serves that covers the reconnection (restartGrace's
	// first backoff), beside the archive's catching up.
	reconnectAllowance = 5 * time.Second
	// settleProgress is how often the settle says how far it got.
	settleProgress = 5 * time.Second
)

// soak is one run: its database, its coordinator processes, its producer and
// workers, and what the windows recorded.
type soak struct {
	cfg    config
	stdout io.Writer
	stderr io.Writer
	// origin is the zero of the soak clock (clock): every time of the run is
	// a monotonic duration since it.
	origin time.Time

	admin   *sql.DB // the server: CREATE and DROP DATABASE, and server-wide reads
	db      *sql.DB // the soak database: counts and the final checks
	dbName  string
	dsn     string
	version string

	binDir   string
	coordBin string
	coordLog *os.File // --coordinator-log, when set
	listen   string   // every coordinator's gRPC address

	mu       sync.Mutex
	coord    *coordinator   // the one serving; nil while it restarts
	procs    []*coordinator // every one started
	restarts []restartSpan
	// restartingNow is set from a restart's SIGTERM until its coordinator
	// serves; graceUntil (soak clock) is restartGrace after that.
	restartingNow atomic.Bool
	graceUntil    atomic.Int64

	failMu   sync.Mutex
	failures []string // the first functional failures
	failed   int

	prod     *producer
	fleet    *fleet
	win      accumulator
	windows  []window
	coordCPU cpuMeter // the serving coordinator's, between windows
	// settleTail holds the jobs completed after the last window, while the
	// run settled: in the summary's latencies, in no window.
	settleTail window
	// produceStart is the soak clock when the producer's schedule, and the
	// first window, start.
	produceStart time.Duration
}

// restartSpan is one coordinator restart, on the soak clock.
type restartSpan struct {
	Stop    time.Duration // SIGTERM sent
	Exited  time.Duration // the old process gone
	Serving time.Duration // the new one serving gRPC and metrics
}

func newSoak(ctx context.Context, c config, stdout, stderr io.Writer) (*soak, error) {
	s := &soak{cfg: c, stdout: stdout, stderr: stderr, origin: time.Now()}
	cfg, err := gomysql.ParseDSN(c.mysqlDSN)
	if err != nil {
		return nil, fmt.Errorf("--mysql-dsn: %w", err)
	}
	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	admin.SetMaxOpenConns(2)
	if err := admin.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&s.version); err != nil {
		admin.Close()
		return nil, fmt.Errorf("connect to %s: %w", cfg.Addr, err)
	}
	s.admin = admin
	// Two runs of one process (the tests) may start within a second.
	s.dbName = fmt.Sprintf("jfsoak_%s_%d_%04x", time.Now().UTC().Format("20060102_150405"), os.Getpid()%100000,
		rand.IntN(1<<16))
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+s.dbName+"`"); err != nil {
		admin.Close()
		return nil, fmt.Errorf("create database %s: %w", s.dbName, err)
	}
	s.logf("database %s on %s (%s)", s.dbName, cfg.Addr, s.version)
	cfg.DBName = s.dbName
	s.dsn = cfg.FormatDSN()
	cfg.ParseTime = true
	if s.db, err = sql.Open("mysql", cfg.FormatDSN()); err != nil {
		s.close()
		return nil, err
	}
	s.db.SetMaxOpenConns(4)
	if c.coordinatorLog != "" {
		if s.coordLog, err = os.OpenFile(c.coordinatorLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			s.close()
			return nil, fmt.Errorf("--coordinator-log: %w", err)
		}
	}
	return s, nil
}

// close stops what the run started and drops its database unless --keep.
func (s *soak) close() error {
	var errs []error
	if s.fleet != nil {
		s.fleet.stop()
	}
	if s.prod != nil {
		s.prod.close()
		s.prod = nil
	}
	s.mu.Lock()
	c := s.coord
	s.coord = nil
	s.mu.Unlock()
	if c != nil {
		errs = append(errs, c.stop())
	}
	if s.db != nil {
		s.db.Close()
	}
	if s.admin != nil {
		if s.cfg.keep {
			s.logf("kept database %s (--keep)", s.dbName)
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if _, err := s.admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+s.dbName+"`"); err != nil {
				errs = append(errs, fmt.Errorf("drop database %s: %w", s.dbName, err))
			}
			cancel()
		}
		s.admin.Close()
	}
	if s.coordLog != nil {
		s.coordLog.Close()
	}
	if s.binDir != "" {
		os.RemoveAll(s.binDir)
	}
	return errors.Join(errs...)
}

// clock is the soak clock: time since the run began, monotonic.
func (s *soak) clock() time.Duration { return time.Since(s.origin) }

// sleepUntil waits until the soak clock reads at; false when ctx ended.
func (s *soak) sleepUntil(ctx context.Context, at time.Duration) bool {
	return s.sleepFor(ctx, at-s.clock())
}

// sleepFor waits d; false when ctx ended first.
func (s *soak) sleepFor(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// logf reports progress on stderr, stamped with the soak clock.
func (s *soak) logf(format string, args ...any) {
	fmt.Fprintf(s.stderr, "[%7.1fs] %s\n", s.clock().Seconds(), fmt.Sprintf(format, args...))
}

// fail records a functional failure; the first few are also logged at once.
func (s *soak) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.failMu.Lock()
	s.failed++
	n := s.failed
	if n <= 20 {
		s.failures = append(s.failures, msg)
	}
	s.failMu.Unlock()
	if n <= 5 {
		s.logf("FAILURE: %s", msg)
	}
}

// functionalFailures is how many failures were recorded, and the first.
func (s *soak) functionalFailures() (int, []string) {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	return s.failed, append([]string(nil), s.failures...)
}

// restarting reports whether the coordinator is restarting, or restarted
// less than restartGrace ago.
func (s *soak) restarting() bool {
	return s.restartingNow.Load() || s.clock() < time.Duration(s.graceUntil.Load())
}

// current is the coordinator serving now; nil while it restarts.
func (s *soak) current() *coordinator {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.coord
}

// watch cancels the run when c exits without being stopped: a crash.
func (s *soak) watch(c *coordinator, abort context.CancelCauseFunc) {
	go func() {
		<-c.done
		if !c.stopping.Load() {
			abort(fmt.Errorf("coordinator pid %d exited unexpectedly: %v\n%s", c.pid(), c.err, c.logs()))
		}
	}()
}

func (s *soak) run(ctx context.Context) error {
	s.logf("machine: %d cores, %s, %s, load average %s", runtime.NumCPU(), cpuModel(), runtime.Version(), loadAvg())
	if err := s.resolveCoordinator(ctx); err != nil {
		return err
	}
	var err error
	if s.listen, err = freeLoopbackPort(); err != nil {
		return err
	}
	runCtx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	c, err := s.startCoordinator(runCtx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.coord, s.procs = c, append(s.procs, c)
	s.mu.Unlock()
	s.watch(c, abort)
	s.logf("coordinator pid %d serving on %s, metrics on %s; retain-succeeded %s, archive-interval %s",
		c.pid(), s.listen, c.metrics(), s.cfg.retain, s.cfg.archiveInterval)

	prefix := fmt.Sprintf("soak-%d-", time.Now().UnixNano()%1e9)
	if s.prod, err = newProducer(s, prefix, s.cfg.jobs()); err != nil {
		return err
	}
	if s.fleet, err = s.startFleet(runCtx); err != nil {
		return err
	}
	s.logf("%d workers × %d slots on worker streams, provider time %s; producer: %d jobs/s for %s (%d jobs), "+
		"a window every %s, %d restart(s)", s.cfg.workers, s.cfg.slots, s.cfg.providerTime, s.cfg.rate, s.cfg.duration,
		s.prod.n, s.cfg.sample, s.cfg.restarts)

	s.produceStart = s.clock() + 100*time.Millisecond
	var bg sync.WaitGroup
	bg.Go(func() { s.prod.run(runCtx, s.produceStart) })
	bg.Go(func() {
		for k := 1; k <= s.cfg.restarts; k++ {
			if !s.sleepUntil(runCtx, s.produceStart+s.cfg.restartAt(k)) {
				return
			}
			if err := s.restart(runCtx, k, abort); err != nil {
				abort(fmt.Errorf("restart %d: %w", k, err))
				return
			}
		}
	})
	for k := 1; k <= s.cfg.windows(); k++ {
		end := s.produceStart + time.Duration(k)*s.cfg.sample
		if !s.sleepUntil(runCtx, end) {
			break
		}
		w := s.win.take(k, end-s.cfg.sample-s.produceStart, end-s.produceStart)
		s.measure(runCtx, &w)
		s.windows = append(s.windows, w)
		s.logf("%s", w.progress(s.cfg.windows()))
	}
	bg.Wait()
	if err := context.Cause(runCtx); err != nil {
		return err
	}
	lastSent := time.Duration(s.prod.lastSent.Load()) - s.produceStart
	s.logf("producer done: %d enqueued (%d answered, %d failed, %d calls repeated), last job sent at %.1fs",
		s.prod.n, s.prod.acked.Load(), s.prod.failed.Load(), s.prod.retries.Load(), lastSent.Seconds())

	st := s.settle(runCtx)
	s.settleTail = s.win.take(0, 0, 0)
	s.fleet.stop()
	s.mu.Lock()
	c, s.coord = s.coord, nil
	s.mu.Unlock()
	if err := c.stop(); err != nil {
		s.fail("the last coordinator's stop: %v", err)
	}
	if err := context.Cause(runCtx); err != nil {
		return err
	}
	final, err := s.check(ctx)
	if err != nil {
		return err
	}
	return s.report(st, final)
}

// restart stops the serving coordinator with SIGTERM and starts another on
// the same database and address.
func (s *soak) restart(ctx context.Context, k int, abort context.CancelCauseFunc) error {
	s.restartingNow.Store(true)
	defer s.restartingNow.Store(false)
	s.mu.Lock()
	old := s.coord
	s.coord = nil
	s.mu.Unlock()
	r := restartSpan{Stop: s.clock()}
	s.logf("restart %d: SIGTERM to coordinator pid %d", k, old.pid())
	if err := old.stop(); err != nil {
		return err
	}
	r.Exited = s.clock()
	c, err := s.startCoordinator(ctx)
	if err != nil {
		return err
	}
	r.Serving = s.clock()
	s.graceUntil.Store(int64(r.Serving + restartGrace))
	s.mu.Lock()
	s.coord, s.procs = c, append(s.procs, c)
	s.restarts = append(s.restarts, r)
	s.mu.Unlock()
	s.watch(c, abort)
	s.logf("restart %d: pid %d exited %.2fs after SIGTERM; pid %d serving %.2fs after it, metrics on %s", k,
		old.pid(), (r.Exited - r.Stop).Seconds(), c.pid(), (r.Serving - r.Stop).Seconds(), c.metrics())
	return nil
}

// settled is what the settle after the producer saw.
type settled struct {
	completedAfter time.Duration // from the last job's first enqueue call to every job completed
	// drainedAfter is from then to the working tables' emptying (-1: they
	// did not empty, or the archive is off).
	drainedAfter time.Duration
}

// settle waits until every job enqueued completed and, with a retention,
// until the archive emptied refund_jobs, each within --settle-timeout; what
// is left after it is counted by the final checks.
func (s *soak) settle(ctx context.Context) settled {
	st := settled{drainedAfter: -1}
	lastSent := time.Duration(s.prod.lastSent.Load())
	began, said := s.clock(), s.clock()
	for s.prod.completed.Load() < s.prod.acked.Load() {
		if s.clock()-began > s.cfg.settleTimeout {
			s.logf("settle: %d of %d jobs completed after %s; the rest count as lost", s.prod.completed.Load(),
				s.prod.acked.Load(), s.cfg.settleTimeout)
			return st
		}
		if s.clock()-said >= settleProgress {
			said = s.clock()
			s.logf("settle: %d of %d jobs completed", s.prod.completed.Load(), s.prod.acked.Load())
		}
		if !s.sleepFor(ctx, 20*time.Millisecond) {
			return st
		}
	}
	st.completedAfter = s.clock() - lastSent
	s.logf("settle: every job completed, %.2fs after the last was sent", st.completedAfter.Seconds())
	if s.cfg.retain == 0 {
		return st
	}
	began, said = s.clock(), s.clock()
	for {
		var n int64
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM refund_jobs`).Scan(&n); err != nil {
			s.fail("settle: count refund_jobs: %v", err)
			return st
		}
		if n == 0 {
			st.drainedAfter = s.clock() - lastSent
			s.logf("settle: the archive emptied refund_jobs %.2fs after the last job was sent", st.drainedAfter.Seconds())
			return st
		}
		if s.clock()-began > s.cfg.settleTimeout {
			s.fail("the archive left %d jobs in refund_jobs %s after every job completed (retain-succeeded %s, "+
				"archive-interval %s)", n, s.cfg.settleTimeout, s.cfg.retain, s.cfg.archiveInterval)
			return st
		}
		if s.clock()-said >= settleProgress {
			said = s.clock()
			s.logf("settle: %d jobs still in refund_jobs", n)
		}
		if !s.sleepFor(ctx, 250*time.Millisecond) {
			return st
		}
	}
}

// loadAvg is the 1-minute load average, or "n/a".
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "n/a"
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown cpu"
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown cpu"
}
