package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// progressEvery is how often a long phase reports on stderr.
const progressEvery = 2 * time.Second

// noopArgs is the benchmark's job: it does nothing. Num numbers the jobs of
// a steady run, so that a completion finds its enqueue time.
type noopArgs struct {
	Num int `json:"num"`
}

// Kind is the job kind River stores.
func (noopArgs) Kind() string { return "bench_noop" }

type bench struct {
	cfg            config
	stdout, stderr io.Writer
	started        time.Time

	admin   *pgx.Conn     // to the DSN's own database: creates and drops the bench's
	dbName  string        // the bench's database, "" until created
	pool    *pgxpool.Pool // to the bench's database: the River client that works the jobs
	driver  *riverpgxv5.Driver
	inserts *pgxpool.Pool // to the bench's database: the steady producer's own
	server  serverMeter
	version string // the server's

	maintConn  *pgx.Conn   // to the bench's database: the autovacuum stand-in's
	maint      *maintainer // nil: the stand-in is off
	autovacuum string      // the server's autovacuum setting
}

func newBench(ctx context.Context, c config, stdout, stderr io.Writer) (*bench, error) {
	b := &bench{cfg: c, stdout: stdout, stderr: stderr, started: time.Now()}
	var err error
	if b.admin, err = pgx.Connect(ctx, c.pgDSN); err != nil {
		return nil, fmt.Errorf("connect to %q: %w (bench/river/README.md says how to set up a role)", c.pgDSN, err)
	}
	name := fmt.Sprintf("jobfence_river_bench_%d", os.Getpid())
	if _, err := b.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		b.close()
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	b.dbName = name
	if err := b.open(ctx); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// open connects the pool to the bench's database, applies River's
// migrations and finds the server's processes.
func (b *bench) open(ctx context.Context) error {
	var err error
	if b.pool, err = b.connect(ctx, "river-bench", b.cfg.maxConns); err != nil {
		return err
	}
	if b.inserts, err = b.connect(ctx, "river-bench producer", b.cfg.producerConns); err != nil {
		return err
	}
	b.driver = riverpgxv5.New(b.pool)
	migrator, err := rivermigrate.New(b.driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	if err := b.pool.QueryRow(ctx, "SHOW server_version").Scan(&b.version); err != nil {
		return err
	}
	if err := b.pool.QueryRow(ctx, "SHOW autovacuum").Scan(&b.autovacuum); err != nil {
		return err
	}
	if b.cfg.autovacuumNaptime > 0 {
		cc, err := pgx.ParseConfig(b.cfg.pgDSN)
		if err != nil {
			return err
		}
		cc.Database = b.dbName
		cc.RuntimeParams["application_name"] = "river-bench autovacuum stand-in"
		if b.maintConn, err = pgx.ConnectConfig(ctx, cc); err != nil {
			return fmt.Errorf("connect to database %s: %w", b.dbName, err)
		}
		if b.maint, err = newMaintainer(ctx, b.maintConn, b.cfg.autovacuumNaptime); err != nil {
			return err
		}
	}
	b.server = findServer(ctx, b.pool)
	if !b.server.ok {
		b.logf("PostgreSQL's processes are not on this machine or not readable: its CPU is reported as n/a")
	}
	return nil
}

// connect opens a pool of maxConns connections (0: pgxpool's default) to
// the bench's database.
func (b *bench) connect(ctx context.Context, application string, maxConns int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(b.cfg.pgDSN)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.Database = b.dbName
	pc.ConnConfig.RuntimeParams["application_name"] = application
	if maxConns > 0 {
		pc.MaxConns = int32(maxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to database %s: %w", b.dbName, err)
	}
	return pool, nil
}

// close drops the bench's database (unless --keep) with a context of its
// own, so that an interrupted run still cleans up.
func (b *bench) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range []*pgxpool.Pool{b.pool, b.inserts} {
		if p != nil {
			p.Close()
		}
	}
	if b.maintConn != nil {
		b.maintConn.Close(ctx)
	}
	var err error
	if b.admin != nil {
		switch {
		case b.dbName == "":
		case b.cfg.keep:
			b.logf("kept database %s (--keep)", b.dbName)
		default:
			if _, derr := b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{b.dbName}.Sanitize()+" WITH (FORCE)"); derr != nil {
				err = fmt.Errorf("drop database %s: %w", b.dbName, derr)
			}
		}
		b.admin.Close(ctx)
	}
	return err
}

func (b *bench) logf(format string, args ...any) {
	if b.cfg.quiet {
		return
	}
	fmt.Fprintf(b.stderr, "[%6.1fs] %s\n", time.Since(b.started).Seconds(), fmt.Sprintf(format, args...))
}

// summary prints one key=value line on stdout.
func (b *bench) summary(name string, kv ...any) { fmt.Fprintln(b.stdout, formatLine(name, kv...)) }

func (b *bench) run(ctx context.Context) error {
	poolSize := b.pool.Config().MaxConns
	b.summary("river machine", "nproc", runtime.NumCPU(), "cpu", quote(cpuModel()), "server", quote("PostgreSQL "+b.version),
		"river", moduleVersion("github.com/riverqueue/river"), "pgx", moduleVersion("github.com/jackc/pgx/v5"),
		"go", runtime.Version(), "loadavg", loadAvg(), "pg_cpu_from", b.server.how)
	b.summary("river config", "workers", b.cfg.workers, "fetch_cooldown_ms", num(ms64(b.cfg.fetchCooldown), 1),
		"fetch_poll_interval_ms", num(ms64(b.cfg.fetchPollInterval), 1), "pool_max_conns", poolSize,
		"producers", b.cfg.producers, "producer_conns", b.inserts.Config().MaxConns,
		"server_autovacuum", b.autovacuum, "autovacuum_standin_naptime_ms", num(ms64(b.cfg.autovacuumNaptime), 0))
	if b.cfg.burn {
		if err := b.burnRun(ctx); err != nil {
			return err
		}
	}
	if b.cfg.steady {
		for _, rate := range b.cfg.rates {
			if err := b.steadyRun(ctx, rate); err != nil {
				return err
			}
		}
	}
	b.summary("river run", "seconds", num(time.Since(b.started).Seconds(), 1), "loadavg", loadAvg())
	return nil
}

func ms64(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// newClient is a River client with the settings of `river bench` (the flags'
// defaults): one queue of cfg.workers workers, a 2 ms fetch cooldown and a
// 20 ms poll interval.
func (b *bench) newClient() (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[noopArgs]) error { return nil }))
	return river.NewClient(b.driver, &river.Config{
		FetchCooldown:     b.cfg.fetchCooldown,
		FetchPollInterval: b.cfg.fetchPollInterval,
		Logger:            slog.New(slog.NewTextHandler(b.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: b.cfg.workers}},
		Workers:           workers,
	})
}

// reset empties the job table between measurements, as `river bench` does,
// and asks for a checkpoint so that one measurement does not pay for writing
// back what the previous one (or the burn's inserts) left in shared buffers.
func (b *bench) reset(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, "VACUUM FULL river_job"); err != nil {
		return err
	}
	return b.checkpoint(ctx)
}

func (b *bench) checkpoint(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		// Needs superuser or pg_checkpoint; without it only a number moves.
		b.logf("CHECKPOINT refused (%v): measuring without it", err)
	}
	return ctx.Err()
}

// stopClient stops c, giving its completer time to finish.
func stopClient(c *river.Client[pgx.Tx]) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Stop(ctx)
}

// burnRun inserts cfg.jobs jobs, then starts a client and measures how fast
// it drains them: River's own burn-down benchmark.
func (b *bench) burnRun(ctx context.Context) error {
	n := b.cfg.jobs
	if err := b.reset(ctx); err != nil {
		return err
	}
	client, err := b.newClient()
	if err != nil {
		return err
	}
	b.logf("burn: inserting %d jobs", n)
	insertStart := time.Now()
	params := make([]river.InsertManyParams, 0, b.cfg.insertSize)
	for i := 0; i < n; {
		params = params[:0]
		for ; i < n && len(params) < b.cfg.insertSize; i++ {
			params = append(params, river.InsertManyParams{Args: noopArgs{Num: i}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("burn: insert: %w", err)
		}
	}
	insertTime := time.Since(insertStart)
	// The backlog starts as autovacuum would leave it once it noticed the
	// inserts (vacuumed and analyzed), and written out.
	if err := b.maint.pass(ctx); err != nil {
		return fmt.Errorf("burn: autovacuum stand-in: %w", err)
	}
	if err := b.checkpoint(ctx); err != nil {
		return err
	}

	b.logf("burn: draining %d jobs with %d workers", n, b.cfg.workers)
	before := b.server.sample()
	b.maint.start(ctx)
	t := newTracker(client, n, false) // the clock starts here, just before the client
	if err := client.Start(ctx); err != nil {
		t.stop()
		b.maint.finish()
		return fmt.Errorf("burn: start client: %w", err)
	}
	startTime := time.Since(t.base)
	werr := b.wait(ctx, t, n, "burn", func() string { return "" })
	after := b.server.sample()
	vacuums, analyzes, merr := b.maint.finish()
	serr := stopClient(client)
	t.stop()
	if err := errors.Join(werr, merr, serr); err != nil {
		return fmt.Errorf("burn: %w", err)
	}
	if err := b.checkCompleted(ctx, n); err != nil {
		return fmt.Errorf("burn: %w", err)
	}
	last, first := time.Duration(t.last.Load()), time.Duration(t.first.Load())
	pg, cl, total := cpuPerJob(before, after, n)
	b.summary("river burn", "jobs", n, "insert_s", num(insertTime.Seconds(), 2),
		"seconds", num(last.Seconds(), 3), "jobs_per_s", num(ratio(float64(n), last.Seconds()), 0),
		"start_ms", ms(startTime), "first_completion_ms", ms(first),
		"cpu_us_per_job_pg", num(pg, 1), "cpu_us_per_job_client", num(cl, 1), "cpu_us_per_job_total", num(total, 1),
		"standin_vacuums", vacuums, "standin_analyzes", analyzes)
	return nil
}

// steadyRun inserts jobs one at a time on a fixed schedule, job i at
// start + i/rate, while a started client works them, and measures each job
// from just before its Insert to River's completed event for it.
func (b *bench) steadyRun(ctx context.Context, rate int) error {
	n := max(1, int(float64(rate)*b.cfg.duration.Seconds()))
	if err := b.reset(ctx); err != nil {
		return err
	}
	client, err := b.newClient()
	if err != nil {
		return err
	}
	// Jobs are inserted as an application would insert them: by an
	// insert-only client on a pool of its own, not the working client's.
	producer, err := river.NewClient(riverpgxv5.New(b.inserts), &river.Config{})
	if err != nil {
		return err
	}
	b.maint.start(ctx) // the warmup included, as autovacuum runs whenever the client does
	t := newTracker(client, n, true)
	if err := client.Start(ctx); err != nil {
		t.stop()
		b.maint.finish()
		return fmt.Errorf("steady %d/s: start client: %w", rate, err)
	}
	select {
	case <-time.After(b.cfg.warmup):
	case <-ctx.Done():
	}
	b.logf("steady %d/s: producing %d jobs over %s", rate, n, b.cfg.duration)
	var sent atomic.Int64
	before := b.server.sample()
	runCtx, cancel := context.WithCancelCause(ctx)
	var p producerResult
	var produced sync.WaitGroup
	produced.Go(func() {
		p = b.produce(runCtx, producer, t, rate, n, &sent)
		if p.err != nil {
			cancel(p.err)
		}
	})
	werr := b.wait(runCtx, t, n, fmt.Sprintf("steady %d/s", rate),
		func() string { return fmt.Sprintf(", %d sent", sent.Load()) })
	cancel(nil)
	produced.Wait()
	after := b.server.sample()
	vacuums, analyzes, merr := b.maint.finish()
	serr := stopClient(client)
	t.stop()
	if p.err != nil {
		werr = nil // the wait ended because the producer failed
	}
	if err := errors.Join(p.err, werr, merr, serr); err != nil {
		return fmt.Errorf("steady %d/s: %w", rate, err)
	}
	if err := b.checkCompleted(ctx, n); err != nil {
		return fmt.Errorf("steady %d/s: %w", rate, err)
	}
	e2e := t.e2e
	if t.matched != n {
		return fmt.Errorf("steady %d/s: %d of %d completions matched to their enqueue", rate, t.matched, n)
	}
	firstHalf, secondHalf := e2e.halves()
	pg, cl, total := cpuPerJob(before, after, n)
	b.summary("river steady", "rate", rate, "jobs", n, "achieved_per_s", num(p.achieved, 0),
		"p50_ms", ms(e2e.percentile(0.50)), "p95_ms", ms(e2e.percentile(0.95)),
		"p99_ms", ms(e2e.percentile(0.99)), "max_ms", ms(e2e.percentile(1)),
		"p99_first_half_ms", ms(firstHalf.percentile(0.99)), "p99_second_half_ms", ms(secondHalf.percentile(0.99)),
		"insert_p50_ms", ms(p.inserts.percentile(0.50)), "insert_p99_ms", ms(p.inserts.percentile(0.99)),
		"producer_lag_p99_ms", ms(p.lags.percentile(0.99)),
		"cpu_us_per_job_pg", num(pg, 1), "cpu_us_per_job_client", num(cl, 1), "cpu_us_per_job_total", num(total, 1),
		"standin_vacuums", vacuums, "standin_analyzes", analyzes)
	return nil
}

// producerResult is what a steady run's producer measured.
type producerResult struct {
	achieved float64   // jobs/s from the first insert's start to the last's
	inserts  latencies // Insert round trips
	lags     latencies // how late each insert started against the schedule
	err      error
}

// produce inserts n jobs with cfg.producers goroutines on the schedule job i
// at start + i/rate, noting in t when each insert began.
func (b *bench) produce(ctx context.Context, client *river.Client[pgx.Tx], t *tracker, rate, n int, sent *atomic.Int64) producerResult {
	var r producerResult
	interval := time.Second / time.Duration(rate)
	var next atomic.Int64
	var firstAt, lastAt atomic.Int64 // ns after start
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errOnce sync.Once
	start := time.Now().Add(100 * time.Millisecond)
	for range b.cfg.producers {
		wg.Go(func() {
			var ins, lag latencies
			defer func() {
				mu.Lock()
				r.inserts, r.lags = append(r.inserts, ins...), append(r.lags, lag...)
				mu.Unlock()
			}()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				at := start.Add(time.Duration(i) * interval)
				select {
				case <-time.After(time.Until(at)):
				case <-ctx.Done():
					return
				}
				t0 := time.Now()
				lag = append(lag, t0.Sub(at))
				t.enqueued[i].Store(int64(t0.Sub(t.base)) + 1)
				if _, err := client.Insert(ctx, noopArgs{Num: i}, nil); err != nil {
					errOnce.Do(func() { r.err = fmt.Errorf("insert job %d: %w", i, err) })
					return
				}
				ins = append(ins, time.Since(t0))
				sent.Add(1)
				if i == 0 {
					firstAt.Store(int64(t0.Sub(start)))
				}
				if i == n-1 {
					lastAt.Store(int64(t0.Sub(start)))
				}
			}
		})
	}
	wg.Wait()
	if span := time.Duration(lastAt.Load() - firstAt.Load()); n > 1 && span > 0 {
		r.achieved = float64(n-1) / span.Seconds()
	} else {
		r.achieved = float64(rate)
	}
	return r
}

// wait returns once n jobs have completed, reporting progress every
// progressEvery; it fails when a job fails or is cancelled, or when no job
// completes for cfg.stall while some are outstanding.
func (b *bench) wait(ctx context.Context, t *tracker, n int, what string, extra func() string) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	seen, progress, reported := int64(0), time.Now(), time.Now()
	lastSeen := int64(0)
	for {
		done := t.completed.Load()
		if msg := t.failure(); msg != "" {
			return errors.New(msg)
		}
		if done >= int64(n) {
			return nil
		}
		now := time.Now()
		if done != seen {
			seen, progress = done, now
		} else if now.Sub(progress) > b.cfg.stall {
			return fmt.Errorf("stalled at %d of %d jobs completed, none for %s", done, n, b.cfg.stall)
		}
		if now.Sub(reported) >= progressEvery {
			b.logf("%s: %d/%d completed%s, %.0f jobs/s over the last %s", what, done, n, extra(),
				float64(done-lastSeen)/now.Sub(reported).Seconds(), progressEvery)
			reported, lastSeen = now, done
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				return cause
			}
			return ctx.Err()
		}
	}
}

// checkCompleted confirms in the database that exactly n jobs exist and all
// are completed, so that a summary never counts events for jobs River did not
// finish.
func (b *bench) checkCompleted(ctx context.Context, n int) error {
	var all, completed int
	if err := b.pool.QueryRow(ctx,
		"SELECT count(*), count(*) FILTER (WHERE state = 'completed') FROM river_job").Scan(&all, &completed); err != nil {
		return err
	}
	if all != n || completed != n {
		return fmt.Errorf("%d jobs in river_job, %d completed; want %d and %d", all, completed, n, n)
	}
	return nil
}

// tracker follows a client's completion events. River completes jobs in
// batches after Work returns and sends the events once the batch's UPDATE has
// returned, so an event's arrival is when the job's completion is durable.
type tracker struct {
	base     time.Time
	enqueued []atomic.Int64 // steady: ns after base, +1, when job i's insert began; 0 until then
	e2e      latencies      // steady: job i's enqueue → completed, written by consume only; read after stop
	matched  int            // steady: jobs of e2e set, likewise

	completed   atomic.Int64
	first, last atomic.Int64 // ns after base of the first and the latest completion
	failed      atomic.Pointer[string]

	cancel func()
	done   chan struct{}
}

// newTracker subscribes to client's job events with room for every event of
// n jobs, so that none is dropped (River drops events a full channel cannot
// take).
func newTracker(client *river.Client[pgx.Tx], n int, latency bool) *tracker {
	t := &tracker{base: time.Now(), done: make(chan struct{})}
	if latency {
		t.enqueued = make([]atomic.Int64, n)
		t.e2e = make(latencies, n)
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: n + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	t.cancel = cancel
	go t.consume(events)
	return t
}

func (t *tracker) consume(events <-chan *river.Event) {
	defer close(t.done)
	for ev := range events {
		now := int64(time.Since(t.base))
		if ev.Kind != river.EventKindJobCompleted {
			msg := fmt.Sprintf("job %d: unexpected %s event (errors %v)", ev.Job.ID, ev.Kind, ev.Job.Errors)
			t.failed.CompareAndSwap(nil, &msg)
			continue
		}
		if t.enqueued != nil {
			var a noopArgs
			if err := json.Unmarshal(ev.Job.EncodedArgs, &a); err != nil || a.Num < 0 || a.Num >= len(t.enqueued) {
				msg := fmt.Sprintf("job %d: unexpected args %s", ev.Job.ID, ev.Job.EncodedArgs)
				t.failed.CompareAndSwap(nil, &msg)
				continue
			}
			if t.e2e[a.Num] != 0 {
				msg := fmt.Sprintf("job %d (number %d): a second completed event", ev.Job.ID, a.Num)
				t.failed.CompareAndSwap(nil, &msg)
				continue
			}
			if t0 := t.enqueued[a.Num].Load(); t0 > 0 {
				t.e2e[a.Num] = max(1, time.Duration(now-(t0-1))) // 0 stays "not seen"
				t.matched++
			}
		}
		t.first.CompareAndSwap(0, now)
		t.last.Store(now)
		t.completed.Add(1)
	}
}

func (t *tracker) failure() string {
	if p := t.failed.Load(); p != nil {
		return *p
	}
	return ""
}

// stop ends the subscription and waits for the last event to be counted.
func (t *tracker) stop() {
	t.cancel()
	<-t.done
}

// moduleVersion is the version of a module this binary was built with.
func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "unknown"
}

// cpuModel is the processor's model name from /proc/cpuinfo.
func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
