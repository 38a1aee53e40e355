// Command jobfence-soak runs a coordinator process under a steady load for
// minutes or hours and checks that retention (R31) keeps the working set
// bounded while latency, memory and goroutines stay flat, across a
// coordinator restart:
//
//   - it creates a fresh database on the server of --mysql-dsn (dropped at
//     the end unless --keep) and starts a coordinator binary on it (built
//     from ./cmd/coordinator, or --coordinator-bin) with
//     --retain-succeeded, --archive-interval and its metrics on loopback;
//   - --workers Go SDK workers in this process, each on its own connection
//     and worker stream with --slots slots, complete every refund after
//     --provider-time;
//   - a producer enqueues --rate jobs a second for --duration, job i at
//     start + i/rate by the clock, each on its own goroutine, retrying an
//     enqueue the coordinator could not answer (the operation key makes
//     the retry safe, R1);
//   - --restarts times, evenly spread (in the middle of a window), the
//     coordinator gets SIGTERM and is started again on the same database
//     and address; the workers and the producer reconnect by themselves;
//   - every --sample it records one window: rows in each working table
//     (exact COUNT(*)), in each archive table and refund_operation_keys
//     (InnoDB's estimates, checked against exact counts at the end), the
//     coordinator's RSS and goroutines (from /metrics), InnoDB's history
//     list length, and the p50 and p99 of enqueue→completed of the jobs
//     completed in the window, from just before the producer's first
//     EnqueueRefund call to the worker's Complete answer, on this
//     process's monotonic clock;
//   - at the end it waits for every job to complete and (with a retention)
//     to leave the working tables, prints the windows as a table and one
//     summary line, and exits 1 naming the reason when the working set, RSS
//     or goroutines grew, p99 grew, or anything failed functionally: a job
//     lost, a key with two jobs, a job completed twice, a worker's error.
//
// Growth compares the mean of the last third of the windows with the first
// third's (for p99, the median of the windows' p99s), leaving out the
// warm-up and the windows around each restart;
// docs/BENCHMARKS.md ("Run 16: the soak") says how and why, and lists every
// flag, as --help does. Progress goes to stderr, the table and the summary
// to stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jobfence/jobfence/internal/cli"
)

func main() {
	cli.Main("jobfence-soak", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

// config is the soak's flags.
type config struct {
	mysqlDSN        string
	coordinatorBin  string
	coordFlags      []string
	coordinatorLog  string
	keep            bool
	duration        time.Duration
	rate            int
	sample          time.Duration
	restarts        int
	retain          time.Duration
	archiveInterval time.Duration
	workers         int
	slots           int
	providerTime    time.Duration
	growthRatio     float64
	latencySlack    time.Duration
	settleTimeout   time.Duration
}

// windows is how many sample windows the producer's run has.
func (c config) windows() int { return int(c.duration / c.sample) }

// restartAt is when restart k (from 1) sends SIGTERM, from the producer's
// start: in the middle of the window that holds duration × k/(restarts+1),
// so that no window's end, when the coordinator is read, meets a SIGTERM.
func (c config) restartAt(k int) time.Duration {
	at := time.Duration(int64(c.duration) * int64(k) / int64(c.restarts+1))
	return at.Truncate(c.sample) + c.sample/2
}

// jobs is how many jobs the producer enqueues.
func (c config) jobs() int { return int(int64(c.rate) * int64(c.duration) / int64(time.Second)) }

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var coordFlags string
	fs := flag.NewFlagSet("jobfence-soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.mysqlDSN, "mysql-dsn", "",
		"MySQL server to soak on (go-sql-driver format, e.g. root@tcp(127.0.0.1:3306)/); required. Each run creates "+
			"its own database jfsoak_<time>_<pid>_<random> there and drops it at the end; the database part is ignored")
	fs.StringVar(&c.coordinatorBin, "coordinator-bin", "",
		"coordinator binary to soak; when empty, ./cmd/coordinator is built (run from the module)")
	fs.StringVar(&coordFlags, "coordinator-flags", "",
		"extra coordinator flags, space-separated, after the soak's own (so they win), e.g. '--archive-batch 200'")
	fs.StringVar(&c.coordinatorLog, "coordinator-log", "",
		"append the coordinator processes' logs (JSON lines) to this file; by default only their last lines are "+
			"kept, for error reports")
	fs.BoolVar(&c.keep, "keep", false, "keep the soak database instead of dropping it at the end")
	fs.DurationVar(&c.duration, "duration", 2*time.Minute, "how long the producer enqueues; a whole number of --sample windows")
	fs.IntVar(&c.rate, "rate", 200, "jobs the producer enqueues per second, paced by the clock (1..5000)")
	fs.DurationVar(&c.sample, "sample", 10*time.Second, "length of a window: one row of the table per window (at least 1s)")
	fs.IntVar(&c.restarts, "restarts", 1,
		"coordinator restarts (SIGTERM, then a new process on the same database and address), evenly spread over "+
			"--duration; 0: none")
	fs.DurationVar(&c.retain, "retain-succeeded", 5*time.Second,
		"the coordinator's --retain-succeeded: how long a succeeded job stays in the working tables; 0 turns the "+
			"archive off, and the working set then grows (the verdict must fail)")
	fs.DurationVar(&c.archiveInterval, "archive-interval", time.Second, "the coordinator's --archive-interval (1s..1h)")
	fs.IntVar(&c.workers, "workers", 4, "Go SDK workers, each on its own connection and worker stream (1..64)")
	fs.IntVar(&c.slots, "slots", 25, "jobs each worker runs at once (1..100)")
	fs.DurationVar(&c.providerTime, "provider-time", 20*time.Millisecond,
		"how long each refund's provider call takes in the workers' handler (0..10s)")
	fs.Float64Var(&c.growthRatio, "growth-ratio", 1.5,
		"a series grew when the mean of the last third of the windows is over this times the first third's (and "+
			"over it by more than the series' slack); for p99, the median of the windows' p99s in each third")
	fs.DurationVar(&c.latencySlack, "latency-slack", 25*time.Millisecond,
		"p99 grew only when the last third's is also this much over the first third's: the scheduling noise of a "+
			"shared machine")
	fs.DurationVar(&c.settleTimeout, "settle-timeout", 2*time.Minute,
		"after the producer's last enqueue, how long every job may take to complete and then to leave the working "+
			"tables; past it the jobs left count as lost")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: jobfence-soak --mysql-dsn DSN [flags]\n\n"+
			"Runs a coordinator under a steady load with retention on, restarts it midway, samples the working\n"+
			"tables, the archive, the coordinator's RSS and goroutines and the latency every --sample, and exits 1\n"+
			"when any of them grew or a job was lost.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c.coordFlags = strings.Fields(coordFlags)
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.mysqlDSN == "":
		return errors.New("--mysql-dsn is required, e.g. --mysql-dsn 'root@tcp(127.0.0.1:3306)/'")
	case c.sample < time.Second:
		return fmt.Errorf("--sample must be at least 1s, got %s", c.sample)
	case c.duration%c.sample != 0 || c.duration < 3*c.sample:
		return fmt.Errorf("--duration must be a whole number of --sample windows, at least three: %s is not, with "+
			"--sample %s", c.duration, c.sample)
	case c.rate < 1 || c.rate > 5000:
		return fmt.Errorf("--rate must be between 1 and 5000 jobs/s, got %d", c.rate)
	case c.restarts < 0 || c.restarts > c.windows()/3:
		return fmt.Errorf("--restarts must be between 0 and a third of the windows (%d), got %d", c.windows()/3, c.restarts)
	case c.retain < 0 || (c.retain > 0 && c.retain < time.Second):
		return fmt.Errorf("--retain-succeeded must be 0 (archive off) or at least 1s, got %s", c.retain)
	case c.archiveInterval < time.Second || c.archiveInterval > time.Hour:
		return fmt.Errorf("--archive-interval must be between 1s and 1h, got %s", c.archiveInterval)
	case c.workers < 1 || c.workers > 64:
		return fmt.Errorf("--workers must be between 1 and 64, got %d", c.workers)
	case c.slots < 1 || c.slots > 100:
		return fmt.Errorf("--slots must be between 1 and 100, got %d", c.slots)
	case c.providerTime < 0 || c.providerTime > 10*time.Second:
		return fmt.Errorf("--provider-time must be between 0 and 10s, got %s", c.providerTime)
	case c.growthRatio <= 1:
		return fmt.Errorf("--growth-ratio must be over 1, got %v", c.growthRatio)
	case c.latencySlack < 0:
		return fmt.Errorf("--latency-slack must not be negative, got %s", c.latencySlack)
	case c.settleTimeout < time.Second:
		return fmt.Errorf("--settle-timeout must be at least 1s, got %s", c.settleTimeout)
	}
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	s, err := newSoak(ctx, c, stdout, stderr)
	if err != nil {
		return err
	}
	err = s.run(ctx)
	if cerr := s.close(); err == nil {
		err = cerr
	}
	return err
}
