// Command jobfence-bench measures jobfence on MySQL with the articles' data
// shape (Q3, Q4) and prints one key=value summary line per scenario:
//
//	A  candidate query latency at 0 / 200k / 2M finished rows, and its plans (Q3, Q5)
//	B  Claim RPC latency at 1 / 16 / 64 concurrent claimers, through a coordinator process
//	C  end-to-end drain of a backlog through gRPC, against the same transactions
//	   issued in-process through the store (the direct baseline), and Q6's arithmetic
//	D  the coordinator's CPU per job and peak RSS under C's load
//	E  enqueue→completed latency at a steady 100 / 500 / 1,000 jobs/s with long-polling workers
//	F  the operator console's pages (the review queue first) at the full history, server time
//	G  lease renewal (R27): how soon a SIGKILLed worker's jobs are taken over with a short
//	   renewed lease and a long plain one, and what renewals cost the database and the
//	   coordinator, at a steady rate and alone; not in the default set
//	H  grant delivery at the full history: enqueue → the WorkGrant read by one of 16 busy worker streams
//	W  write-path costs: what the index entries and rows a job writes cost the database;
//	   not in the default set
//
// Every run creates a fresh database on the server named by --mysql-dsn and drops
// it at the end (unless --keep). It exits non-zero when a scenario fails
// functionally (a job not drained, an RPC error), never because of a number.
// docs/BENCHMARKS.md describes the scenarios and the results.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobfence/jobfence/internal/cli"
	"github.com/jobfence/jobfence/server"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == holderCommand {
		// Scenario G's worker process, the bench binary started again.
		cli.Main("jobfence-bench "+holderCommand, holderMain)
		return
	}
	cli.Main("jobfence-bench", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

// config is the bench's flags. Sizes marked "quick" have smaller defaults
// under --quick.
type config struct {
	mysqlDSN       string
	quick          bool
	keep           bool
	resultsDir     string
	coordinatorBin string
	coordFlags     []string
	scenarios      string
	cpuProfile     string
	maxConns       int

	historyStages  []int // finished rows at which scenario A measures (quick)
	candidateReps  int   // repetitions per candidate-query measurement (quick)
	candidateLimit int

	claimLevels   []int
	claimDuration time.Duration // per concurrency level (quick)

	backlog int // due jobs drained by scenario C, per run (quick)
	workers int
	batches []int // max_jobs of scenario C's workers, one drain pair each

	latencyRates    []int
	latencyDuration time.Duration // per rate (quick)
	latencyWorkers  int
	latencyAPIs     []string // unary, stream: the workers of each scenario E run
	latencySlots    int
	claimWait       time.Duration

	takeoverJobs      int           // jobs the killed worker holds (G)
	takeoverKillAfter time.Duration // from its last claim to the kill
	takeoverLease     time.Duration // the renewed lease
	plainLease        time.Duration // the lease without renewal, in both measurements of G
	renewRate         int
	renewDuration     time.Duration // producer run per cost run (quick)
	renewHold         time.Duration // each job's provider call in the cost runs
	renewLease        time.Duration // the renewed lease of the cost runs
	renewInterval     time.Duration // 0: a third of the lease, as the SDK's default
	renewWorkers      int
	renewPairs        int // cost runs without and with renewal, alternating (quick)

	grantWorkers  int           // worker streams of scenario H
	grantCredits  int           // credits of each
	grantHold     time.Duration // each job's provider call
	grantRate     int
	grantDuration time.Duration // producer run (quick)
	roundTripRate int           // scenario R: transactions per second
	roundTripTxs  int           // scenario R: transactions per way and round
}

func (c config) mode() string {
	if c.quick {
		return "quick"
	}
	return "full"
}

func (c config) runs(scenario byte) bool { return strings.IndexByte(c.scenarios, scenario) >= 0 }

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var stages, levels, rates, batches, coordFlags string
	fs := flag.NewFlagSet("jobfence-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.mysqlDSN, "mysql-dsn", "",
		"MySQL server to benchmark on (go-sql-driver format, e.g. root@tcp(127.0.0.1:3306)/); required. "+
			"Each run creates its own database jfbench_<time> there; the database part of the DSN is ignored")
	fs.BoolVar(&c.quick, "quick", false,
		"a reduced run for CI (under a minute): 200k rows, small backlogs, short latency runs")
	fs.BoolVar(&c.keep, "keep", false, "keep the benchmark database instead of dropping it at the end")
	fs.StringVar(&c.resultsDir, "results", "bench/results",
		"where to write the summary and the query plans (files named full-* or quick-*)")
	fs.StringVar(&c.coordinatorBin, "coordinator-bin", "",
		"coordinator binary to benchmark; when empty, ./cmd/coordinator is built (run from the module)")
	fs.StringVar(&coordFlags, "coordinator-flags", "",
		"extra flags for the coordinator process, space-separated, e.g. '--claim-poll-interval 50ms'")
	fs.StringVar(&c.scenarios, "scenarios", "abcefh",
		"which scenarios to run: letters of a (candidate query), b (Claim RPC), c (end-to-end; d comes with it), e (latency), "+
			"f (console pages), g (lease renewal: takeover after a killed worker, and renewals' cost; two to three minutes), "+
			"h (grant delivery to busy worker streams), "+
			"w (write-path costs: the backlog drained in shared transactions once per index variant, and history and "+
			"ledger rows alone; run it with --history 0), "+
			"r (round trips against statements: a lone enqueue-and-hand-off transaction statement by statement, "+
			"and in two multi-statement exchanges)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write the bench process's CPU profile to this file")
	fs.IntVar(&c.maxConns, "mysql-max-conns", 32,
		"connection pool of the coordinator (--mysql-max-conns) and of the in-process direct baseline")
	fs.StringVar(&stages, "history", "0,200000,1990000",
		"finished rows at which scenario A measures, ascending; the last is the history of B, C and E (quick: 0,20000,190000)")
	fs.IntVar(&c.candidateReps, "candidate-reps", 3000, "repetitions per candidate-query measurement (quick: 500)")
	fs.IntVar(&c.candidateLimit, "candidate-limit", 10, "LIMIT of the candidate query (a claim's max_jobs)")
	fs.StringVar(&levels, "claim-levels", "1,16,64", "concurrent claimers of scenario B")
	fs.DurationVar(&c.claimDuration, "claim-duration", 10*time.Second,
		"measured time per scenario B level, after a warm-up (quick: 1.5s)")
	fs.IntVar(&c.backlog, "backlog", 50000, "due jobs drained by scenario C, once through gRPC and once direct (quick: 5000)")
	fs.IntVar(&c.workers, "workers", 16, "concurrent workers of scenario C (gRPC and direct alike)")
	fs.StringVar(&batches, "batch", "10,100",
		"max_jobs per claim in scenario C, a list: one drain through gRPC and one direct per value "+
			"(100 is the batch of the direct-SQL reference loop in docs/BENCHMARKS.md)")
	fs.StringVar(&rates, "latency-rates", "100,500,1000", "producer rates (jobs/s) of scenario E")
	fs.DurationVar(&c.latencyDuration, "latency-duration", 20*time.Second, "producer run per rate in scenario E (quick: 2s)")
	fs.IntVar(&c.latencyWorkers, "latency-workers", 8, "long-polling workers of scenario E")
	latencyAPIs := fs.String("latency-api", "unary,stream",
		"scenario E's workers, one run per rate each: unary (long-polling Claim calls), stream (worker streams)")
	fs.IntVar(&c.latencySlots, "latency-slots", 4, "jobs each scenario E worker handles at once (its max_jobs when idle)")
	fs.DurationVar(&c.claimWait, "claim-wait", 5*time.Second, "Claim long-poll wait of scenario E and G workers")
	fs.IntVar(&c.takeoverJobs, "takeover-jobs", 20, "scenario G: jobs the worker process holds when it is killed (1..100)")
	fs.DurationVar(&c.takeoverKillAfter, "takeover-kill-after", 7*time.Second,
		"scenario G: how long after its last claim the worker process is killed (SIGKILL)")
	fs.DurationVar(&c.takeoverLease, "takeover-lease", 5*time.Second, "scenario G: the lease the killed worker renews")
	fs.DurationVar(&c.plainLease, "plain-lease", 30*time.Second,
		"scenario G: the lease without renewal, of the killed worker and of the cost runs without renewal")
	fs.IntVar(&c.renewRate, "renew-rate", 1000, "scenario G: producer rate (jobs/s) of the cost runs")
	fs.DurationVar(&c.renewDuration, "renew-duration", 10*time.Second, "scenario G: producer run per cost run (quick: 2s)")
	fs.DurationVar(&c.renewHold, "renew-hold", 1500*time.Millisecond, "scenario G: each job's provider call in the cost runs")
	fs.DurationVar(&c.renewLease, "renew-lease", 3*time.Second, "scenario G: the renewed lease of the cost runs")
	fs.DurationVar(&c.renewInterval, "renew-interval", 0,
		"scenario G: renewal interval of the renewing workers; 0: a third of the lease (the Go SDK's default)")
	fs.IntVar(&c.renewWorkers, "renew-workers", 20, "scenario G: Go SDK workers of the cost runs, 100 slots each")
	fs.IntVar(&c.renewPairs, "renew-pairs", 2, "scenario G: cost runs without and with renewal, alternating (quick: 1)")
	fs.IntVar(&c.roundTripRate, "roundtrip-rate", 100, "scenario R: transactions per second, each alone")
	fs.IntVar(&c.roundTripTxs, "roundtrip-txs", 1000, "scenario R: transactions per way and round (quick: 200)")
	fs.IntVar(&c.grantWorkers, "grant-workers", 16, "scenario H: worker streams, each on its own connection")
	fs.IntVar(&c.grantCredits, "grant-credits", 4, "scenario H: credits (free slots) each worker stream holds, 1..1000")
	fs.DurationVar(&c.grantHold, "grant-hold", 100*time.Millisecond,
		"scenario H: how long a worker holds each granted job (its provider call) before it completes it on the stream")
	fs.IntVar(&c.grantRate, "grant-rate", 200, "scenario H: producer rate (jobs/s)")
	fs.DurationVar(&c.grantDuration, "grant-duration", 20*time.Second, "scenario H: producer run (quick: 2s)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: jobfence-bench --mysql-dsn DSN [--quick] [flags]\n\n"+
			"Seeds the articles' data shape into a fresh database, runs scenarios A-H against a\n"+
			"coordinator process and prints one key=value summary line per scenario.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.mysqlDSN == "" {
		return c, errors.New("--mysql-dsn is required, e.g. --mysql-dsn 'root@tcp(127.0.0.1:3306)/'")
	}
	if c.quick {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		quick := map[string]string{
			"history": "0,20000,190000", "candidate-reps": "500", "claim-duration": "1.5s",
			"backlog": "5000", "latency-duration": "2s", "renew-duration": "2s", "renew-pairs": "1",
			"grant-duration": "2s", "roundtrip-txs": "200",
		}
		for name, v := range quick {
			if !given[name] {
				if err := fs.Set(name, v); err != nil {
					return c, err
				}
			}
		}
	}
	c.coordFlags = strings.Fields(coordFlags)
	var err error
	if c.historyStages, err = intList("history", stages); err != nil {
		return c, err
	}
	for i := 1; i < len(c.historyStages); i++ {
		if c.historyStages[i] < c.historyStages[i-1] {
			return c, fmt.Errorf("--history must be ascending, got %q", stages)
		}
	}
	if c.claimLevels, err = intList("claim-levels", levels); err != nil {
		return c, err
	}
	if c.latencyRates, err = intList("latency-rates", rates); err != nil {
		return c, err
	}
	if c.batches, err = intList("batch", batches); err != nil {
		return c, err
	}
	for i, n := range c.batches {
		if n < 1 || n > 100 {
			return c, fmt.Errorf("--batch: %d is not between 1 and 100 (Claim's max_jobs)", n)
		}
		if slices.Contains(c.batches[:i], n) {
			return c, fmt.Errorf("--batch: %d is listed twice", n)
		}
	}
	for _, api := range strings.Split(*latencyAPIs, ",") {
		if api != "unary" && api != "stream" || slices.Contains(c.latencyAPIs, api) {
			return c, fmt.Errorf("--latency-api: want unary and/or stream, each once, got %q", *latencyAPIs)
		}
		c.latencyAPIs = append(c.latencyAPIs, api)
	}
	for _, s := range c.scenarios {
		if !strings.ContainsRune("abcdefghrw", s) {
			return c, fmt.Errorf("--scenarios: unknown scenario %q (letters of abcefghrw)", s)
		}
	}
	switch {
	case c.roundTripRate < 1 || c.roundTripRate > 1000, c.roundTripTxs < 1:
		return c, errors.New("--roundtrip-rate must be between 1 and 1000 and --roundtrip-txs at least 1")
	case c.candidateReps < 1, c.candidateLimit < 1, c.backlog < 1, c.workers < 1, c.latencyWorkers < 1:
		return c, errors.New("counts must be at least 1")
	case c.latencySlots < 1 || c.latencySlots > 100:
		return c, errors.New("--latency-slots must be between 1 and 100 (Claim's max_jobs)")
	case c.claimDuration <= 0, c.latencyDuration <= 0, c.claimWait < 0 || c.claimWait > time.Minute:
		return c, errors.New("durations must be positive (--claim-wait at most 1m)")
	case c.takeoverJobs < 1 || c.takeoverJobs > 100:
		return c, errors.New("--takeover-jobs must be between 1 and 100 (one worker's concurrency)")
	case c.takeoverLease < time.Second, c.plainLease < time.Second, c.renewLease < time.Second,
		c.plainLease > 15*time.Minute, c.takeoverLease > 15*time.Minute, c.renewLease > 15*time.Minute:
		return c, errors.New("--takeover-lease, --plain-lease and --renew-lease must be between 1s and 15m")
	case c.takeoverKillAfter <= 0 || c.takeoverKillAfter >= c.plainLease:
		return c, errors.New("--takeover-kill-after must be positive and shorter than --plain-lease")
	case c.renewHold <= 0 || c.renewHold >= c.plainLease:
		return c, errors.New("--renew-hold must be positive and shorter than --plain-lease (nothing is taken over without renewal)")
	case c.renewInterval < 0 || c.renewInterval >= min(c.renewLease, c.takeoverLease):
		return c, errors.New("--renew-interval must be 0 (a third of the lease) or shorter than --renew-lease and --takeover-lease")
	case c.renewRate < 1, c.renewDuration <= 0, c.renewWorkers < 1, c.renewPairs < 1:
		return c, errors.New("--renew-rate, --renew-duration, --renew-workers and --renew-pairs must be positive")
	case c.grantWorkers < 1, c.grantRate < 1, c.grantDuration <= 0:
		return c, errors.New("--grant-workers, --grant-rate and --grant-duration must be positive")
	case c.grantCredits < 1 || c.grantCredits > server.MaxStreamCredits:
		return c, fmt.Errorf("--grant-credits must be between 1 and %d (a stream's credits)", server.MaxStreamCredits)
	case c.grantHold <= 0 || c.grantHold >= 30*time.Second:
		return c, errors.New("--grant-hold must be positive and under 30s (the streams' lease is a minute)")
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
	if len(out) == 0 {
		return nil, fmt.Errorf("--%s is empty", name)
	}
	return out, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
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
