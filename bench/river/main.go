// Command river-bench measures River (github.com/riverqueue/river) on
// PostgreSQL with no-op jobs, for comparison with jobfence's own bench
// (cmd/jobfence-bench, scenarios C and E), and prints one key=value summary
// line per measurement:
//
//	burn    N jobs inserted before the client starts, then drained: jobs/s
//	        from the client's start to the last completion (River's own
//	        `river bench --num-total-jobs` mode)
//	steady  a producer inserting at a fixed rate while the client works:
//	        enqueue→completed latency percentiles per rate
//
// and for each, the CPU time per job of every PostgreSQL server process and
// of this process (the River client, its workers and the producer).
//
// Each run creates a fresh database on the server named by --pg-dsn, applies
// River's migrations and drops it at the end (unless --keep). While a phase
// runs, it vacuums and analyzes that database's tables by autovacuum's rules
// every --autovacuum-naptime (maintain.go says why). It exits
// non-zero when something fails functionally (a job not completed, an insert
// error), never because of a number. README.md beside this file says what is
// measured and how it compares with jobfence's scenarios.
//
// It is its own Go module so that River never becomes a dependency of
// jobfence.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// defaultDSN reaches a local PostgreSQL by its Unix socket as the current
// operating-system user, which works on a fresh Debian install once that
// user has a role (see README.md).
const defaultDSN = "host=/var/run/postgresql dbname=postgres"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "river-bench:", err)
		os.Exit(1)
	}
}

// config is the bench's flags.
type config struct {
	pgDSN      string
	keep       bool
	burn       bool
	steady     bool
	jobs       int           // burn: jobs inserted before the client starts
	insertSize int           // burn: jobs per InsertManyFast call
	rates      []int         // steady: producer rates, jobs/s
	duration   time.Duration // steady: producer run per rate
	producers  int           // steady: concurrent inserting goroutines
	warmup     time.Duration // steady: from the client's start to the producer's

	workers           int // River's MaxWorkers of the one queue
	fetchCooldown     time.Duration
	fetchPollInterval time.Duration
	maxConns          int // 0: pgxpool's default, as `river bench` runs
	producerConns     int // steady: the producer's own pool

	autovacuumNaptime time.Duration // the autovacuum stand-in's pass interval; 0: off

	stall time.Duration // no completion for this long is a functional failure
	quiet bool          // no progress lines
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var modes, rates string
	fs := flag.NewFlagSet("river-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.pgDSN, "pg-dsn", defaultDSN,
		"PostgreSQL server to benchmark on (pgx keyword/value or URL form); its role must be allowed to create databases. "+
			"Each run creates its own database jobfence_river_bench_<pid> there; the database part of the DSN is only used to connect for that")
	fs.BoolVar(&c.keep, "keep", false, "keep the benchmark database instead of dropping it at the end")
	fs.StringVar(&modes, "modes", "burn,steady", "what to measure, a list of burn and steady")
	fs.IntVar(&c.jobs, "jobs", 100000, "burn: jobs inserted before the client starts, then drained")
	fs.IntVar(&c.insertSize, "insert-batch", 5000, "burn: jobs per InsertManyFast call while filling the backlog")
	fs.StringVar(&rates, "rates", "100,1000", "steady: producer rates in jobs/s, a list; one measurement per rate")
	fs.DurationVar(&c.duration, "duration", 20*time.Second, "steady: producer run per rate")
	fs.IntVar(&c.producers, "producers", 64,
		"steady: goroutines inserting on the schedule (job i at start + i/rate), one Insert per job, as jobfence's scenario E")
	fs.DurationVar(&c.warmup, "warmup", time.Second, "steady: time between the client's start and the producer's, not measured")
	fs.IntVar(&c.workers, "workers", 1000, "River's MaxWorkers for the queue (jobs worked at once)")
	fs.DurationVar(&c.fetchCooldown, "fetch-cooldown", 2*time.Millisecond, "River's FetchCooldown")
	fs.DurationVar(&c.fetchPollInterval, "fetch-poll-interval", 20*time.Millisecond, "River's FetchPollInterval")
	fs.IntVar(&c.maxConns, "pg-max-conns", 0,
		"connection pool of the River client that works the jobs (and of the burn's inserts); 0: pgxpool's default, max(4, cores), as river bench runs")
	fs.IntVar(&c.producerConns, "producer-conns", 16,
		"steady: connection pool of the producer, an insert-only River client of its own, as an application inserting jobs would have")
	fs.DurationVar(&c.autovacuumNaptime, "autovacuum-naptime", time.Second,
		"while a phase runs, vacuum and analyze the bench's tables by autovacuum's rules (the server's thresholds, scale factors and cost delay) "+
			"every this long, standing in for autovacuum's 60 s naptime, so that a table emptied for the phase is kept as on a running server; 0: off "+
			"(then a server with autovacuum off, or one within its naptime, leaves River's fetch on a plan made for an empty table)")
	fs.DurationVar(&c.stall, "stall", 30*time.Second,
		"fail when no job completes for this long while jobs are outstanding (a functional failure, not a slow run)")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines on stderr")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: river-bench [--pg-dsn DSN] [flags]\n\n"+
			"Measures River %s on PostgreSQL with no-op jobs in a fresh database: how fast a backlog\n"+
			"drains (burn) and the enqueue→completed latency at steady rates (steady), with the CPU time\n"+
			"per job of PostgreSQL and of this process. Prints one key=value summary line per measurement.\n\n",
			moduleVersion("github.com/riverqueue/river"))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, m := range strings.Split(modes, ",") {
		switch strings.TrimSpace(m) {
		case "burn":
			c.burn = true
		case "steady":
			c.steady = true
		default:
			return c, fmt.Errorf("--modes: unknown mode %q (burn, steady)", m)
		}
	}
	var err error
	if c.rates, err = intList("rates", rates); err != nil {
		return c, err
	}
	switch {
	case c.jobs < 1, c.insertSize < 1, c.producers < 1, c.producerConns < 1, c.workers < 1, c.maxConns < 0:
		return c, errors.New("--jobs, --insert-batch, --producers, --producer-conns and --workers must be at least 1, --pg-max-conns at least 0")
	case c.workers > 10000:
		return c, errors.New("--workers must be at most 10000 (River's limit)")
	case slices.Contains(c.rates, 0):
		return c, errors.New("--rates must be positive")
	case c.duration <= 0, c.warmup < 0, c.stall <= 0, c.fetchCooldown <= 0, c.fetchPollInterval <= 0, c.autovacuumNaptime < 0:
		return c, errors.New("durations must be positive, --warmup and --autovacuum-naptime at least 0")
	}
	return c, nil
}

func intList(name, s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--%s: %q is not a list of non-negative integers", name, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	b, err := newBench(ctx, c, stdout, stderr)
	if err != nil {
		return err
	}
	err = b.run(ctx)
	if cerr := b.close(); err == nil {
		err = cerr
	}
	return err
}
