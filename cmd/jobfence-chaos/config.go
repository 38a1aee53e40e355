package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/internal/flagenv"
)

// config is the campaign's configuration, from flags and JOBFENCE_CHAOS_*.
type config struct {
	mysqlDSN        string
	dsn             *mysql.Config
	duration        time.Duration
	seed            uint64
	jobs            int
	workers         int
	replicas        int
	concurrency     int
	lease           time.Duration
	providerTimeout time.Duration
	settleTimeout   time.Duration
	faultsSpec      string
	faultRate       float64
	faults          map[faultKind]bool
	binDir          string
	nodeWorkers     int
	node            string
	nodeScript      string
	pythonWorkers   int
	python          string
	pythonScript    string
	logDir          string
	keep            bool
	dryRun          bool
	// webhooks: the provider sends its signed webhooks, through a front
	// spread over the replicas' --webhook-listen, and the webhook lane of
	// faults runs (R28).
	webhooks bool
	// failover is "" (none), failoverAsync or failoverSemiSync: the campaign
	// runs its own MariaDB primary and replica and fails over once.
	failover string
	// patientTimeout is the provider-call deadline of the patient workers
	// (every other renewing worker of each kind, from the first): longer
	// than the provider-slow calls, which they wait out renewing their
	// leases (R27). 0 in the flag: 3.5 leases.
	patientTimeout time.Duration
	// nodeRenews: the Node.js example worker renews its leases (R27), so
	// invariant 10 covers it and it may be patient.
	nodeRenews bool
	// futureShare is the share of the refunds enqueued with a not_before
	// in the future: half of them due within the fault window, half a year
	// later, beyond the campaign (R28, invariant 11).
	futureShare float64
	// forge: with webhooks, a forger sends correctly signed webhook events
	// that must move nothing: another provider's, and the job's own
	// provider's for another amount or currency (R28, invariant 11).
	forge bool
	// retainSucceeded is the coordinators' --retain-succeeded: succeeded
	// jobs leave for the archive this long after their completion, while
	// the faults run (R31); 0 leaves the coordinators' default (a week:
	// nothing is archived during a campaign). archiveInterval is their
	// --archive-interval.
	retainSucceeded time.Duration
	archiveInterval time.Duration
	// cancelShare is the share of the refunds an operator cancels at
	// moments that matter (R32, invariants 13 and 14); pauses: an operator
	// pauses and resumes the provider now and then (R33, invariant 15).
	cancelShare float64
	pauses      bool
	// resolveReviews: after the settle, a person resolves the
	// cancel-requested jobs left in review, after a look at the provider
	// (R29, R32).
	resolveReviews bool
}

// The modes of --failover.
const (
	failoverAsync    = "async"     // lossy: the promoted replica lacks what the primary committed last
	failoverSemiSync = "semi-sync" // lossless: semi-sync AFTER_SYNC that never falls back to async
)

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("jobfence-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.mysqlDSN, "mysql-dsn", "",
		"MariaDB/MySQL server to run on, go-sql-driver format over TCP, e.g. root@tcp(127.0.0.1:3306)/ (required "+
			"unless --failover is set); a fresh database is created on it and dropped at the end")
	fs.DurationVar(&c.duration, "duration", time.Minute, "how long faults are injected (the fault window)")
	fs.Uint64Var(&c.seed, "seed", 0, "seed of the fault plan; 0 picks one (printed, to replay the campaign)")
	fs.IntVar(&c.jobs, "jobs", 300, "refunds to enqueue, spread over the first 80% of the fault window")
	fs.IntVar(&c.workers, "workers", 4, "refundworker processes, spread over the replicas (1..16)")
	fs.IntVar(&c.replicas, "replicas", 2, "coordinator replicas on the one database (1..4)")
	fs.IntVar(&c.concurrency, "concurrency", 2, "jobs each worker works at once")
	fs.DurationVar(&c.lease, "lease", 4*time.Second, "lease the workers ask for (and the coordinators' default)")
	fs.DurationVar(&c.providerTimeout, "provider-timeout", 1500*time.Millisecond,
		"the provider-call deadline of the workers that are not patient, which give up on slow calls; keep it well "+
			"under --lease (R17)")
	fs.DurationVar(&c.patientTimeout, "patient-provider-timeout", 0,
		"the provider-call deadline of the patient workers (the 1st, 3rd, … renewing worker of each kind), which wait "+
			"out provider-slow calls (up to 3 leases) renewing their leases (R27); must exceed 3 leases; 0: 3.5 leases")
	fs.BoolVar(&c.nodeRenews, "node-renews", true,
		"the Node.js example worker renews its leases (R27): invariant 10 then covers its takeovers, and the first "+
			"Node.js worker is patient (it must then accept a --provider-timeout longer than its --lease)")
	fs.DurationVar(&c.settleTimeout, "settle-timeout", 90*time.Second,
		"after the fault window, how long every job has to become final")
	fs.StringVar(&c.faultsSpec, "faults", "all",
		"fault kinds to draw from: all, or a comma-separated list of groups (worker, coordinator, db, provider, webhook) "+
			"and kinds ("+
			kindList()+")")
	fs.IntVar(&c.nodeWorkers, "node-workers", 0,
		"Node.js example workers (clients/node examples/refund-worker) to run besides the Go ones (0..8)")
	fs.StringVar(&c.node, "node", "node", "the Node.js binary, for --node-workers")
	fs.StringVar(&c.nodeScript, "node-worker-script", "",
		"the compiled Node.js example worker (default clients/node/dist/examples/refund-worker.js in the module; "+
			"build it with npm run build in clients/node)")
	fs.IntVar(&c.pythonWorkers, "python-workers", 0,
		"Python example workers (clients/python examples/refund_worker.py) to run besides the Go and Node.js ones (0..8)")
	fs.StringVar(&c.python, "python", defaultPython(),
		"the Python interpreter, for --python-workers: one that imports grpc and google.protobuf (Debian's "+
			"python3-grpcio and python3-protobuf are installed for /usr/bin/python3 only)")
	fs.StringVar(&c.pythonScript, "python-worker-script", "",
		"the Python example worker (default clients/python/examples/refund_worker.py in the module)")
	fs.Float64Var(&c.faultRate, "fault-rate", 1,
		"how often faults come: the pauses between two faults on one target are divided by this (0.1..10)")
	fs.StringVar(&c.binDir, "bin-dir", "",
		"take coordinator, fakeprovider and refundworker from this folder instead of building them with go build")
	fs.StringVar(&c.logDir, "log-dir", "",
		"write the processes' logs here (default: a temporary folder, removed after a passing campaign)")
	fs.BoolVar(&c.keep, "keep", false, "keep the database and the logs after the campaign")
	fs.StringVar(&c.failover, "failover", "",
		"run a real database failover once in the fault window: async (lossy replication) or semi-sync (lossless, "+
			"AFTER_SYNC); the campaign then starts its own MariaDB primary and replica (mariadbd must be installed) "+
			"and --mysql-dsn is not needed (ignored)")
	fs.BoolVar(&c.webhooks, "webhooks", true,
		"the provider sends Stripe-signed webhooks to the coordinators' --webhook-listen (through a front spread over "+
			"the replicas), webhook faults are drawn (delays, duplicates, reordering, bad signatures, old timestamps) "+
			"and every refund's receipts are checked in the observation log; --webhooks=false runs without")
	fs.Float64Var(&c.futureShare, "future-share", 0.1,
		"the share of the refunds enqueued with a not_before in the future (0..0.5, drawn from the seed): half of them "+
			"due 10-30s after their enqueue (less in a short window), within the fault window, the others a year later, "+
			"never to be sent during the campaign; no refund may be created before its not_before")
	fs.BoolVar(&c.forge, "forged-webhooks", true,
		"with --webhooks, a forger sends correctly signed webhook events naming the campaign's jobs, future-dated ones "+
			"above all, that must move nothing: signed by a second provider ("+otherProviderName+", in the coordinators' "+
			"secrets file), or by "+providerName+" for another amount or currency; none may be filed on a job")
	fs.DurationVar(&c.retainSucceeded, "retain-succeeded", 3*time.Second,
		"the coordinators' --retain-succeeded: succeeded jobs are archived this long after their completion, while the "+
			"faults run, and the producer re-enqueues a sample of their keys once archived (R30, R31, invariant 12); at "+
			"least 1s, or 0 to leave the coordinators' default of a week (nothing archived)")
	fs.DurationVar(&c.archiveInterval, "archive-interval", time.Second,
		"the coordinators' --archive-interval, how often the archive looks for jobs past their retention (1s..1h)")
	fs.Float64Var(&c.cancelShare, "cancel-share", 0.1,
		"the share of the refunds an operator cancels (0..0.5, drawn from the seed), with the attempt GetJob shows: "+
			"just after the enqueue, while a worker calls the provider, as the provider makes the refund, and right "+
			"after a cut reply or a cut of the workers' streams; none may be sent after its cancel took effect (R32)")
	fs.BoolVar(&c.resolveReviews, "resolve-reviews", true,
		"with the canceller, after the settle a person resolves each cancel-requested job left in manual_review after a "+
			"look at the provider: refunded with its refund's id when the provider made it, cancelled when it has none")
	fs.BoolVar(&c.pauses, "pauses", true,
		"an operator pauses the provider for 1-4s every 10-20s of the fault window (divided by --fault-rate) and "+
			"resumes it; no replica may grant its jobs while it stands, a claim poll interval after the pause (R33)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "print the fault plan of these flags and seed, and exit without running anything")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: jobfence-chaos --mysql-dsn DSN [--duration D] [--seed S] [flags]\n"+
			"       jobfence-chaos --failover async|semi-sync [--duration D] [--seed S] [flags]\n\n"+
			"Runs the fake provider, coordinator replicas (each behind its own fault-injecting database proxy, its\n"+
			"workers reaching it through another) and refundworker processes on loopback, injects faults drawn from\n"+
			"the seed for --duration, heals, settles and checks that no refund was lost or made twice. Ends with one\n"+
			"line:\n"+
			"  seed=S jobs=N faults=F double_refunds=0 lost=0 stale_writes_accepted=0 unobserved_late_success=0 "+
			"takeovers=T false_takeovers=0 handed_back=H webhooks_delivered=D webhook_observations=O expedited=E "+
			"webhook_receipts_lost=0 "+
			"duplicate_receipts=0 future_dated=F early_refunds=0 forged_webhooks=W forged_filed=0 archived=A "+
			"archived_reenqueues=R second_jobs=0 keys_unrecorded=0 cancels=C cancels_too_late=L refunds_after_cancel=0 "+
			"cancels_unended=0 pauses=P grants_while_paused=0\n"+
			"(with --failover followed by failover=MODE grants_lost_in_failover=N writes_lost_in_failover=W "+
			"enqueues_lost_in_failover=E)\n"+
			"and exits 1 when an invariant failed. docs/CHAOS.md explains the invariants.\n\n"+
			"Every flag falls back to the environment variable JOBFENCE_CHAOS_<FLAG> (upper case, '-' as '_'),\n"+
			"e.g. JOBFENCE_CHAOS_MYSQL_DSN.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if err := flagenv.Apply(fs, "JOBFENCE_CHAOS"); err != nil {
		return c, err
	}
	var err error
	if c.patientTimeout == 0 {
		c.patientTimeout = c.lease * 7 / 2
	}
	if c.faults, err = parseFaultKinds(c.faultsSpec); err != nil {
		return c, fmt.Errorf("--faults: %w", err)
	}
	switch c.failover {
	case "", failoverAsync, failoverSemiSync:
	default:
		return c, fmt.Errorf("--failover must be %q or %q (or empty for no failover), got %q", failoverAsync,
			failoverSemiSync, c.failover)
	}
	switch {
	case c.mysqlDSN == "" && !c.dryRun && c.failover == "":
		return c, errors.New("--mysql-dsn is required (or JOBFENCE_CHAOS_MYSQL_DSN)")
	case c.duration < 5*time.Second || c.duration > 24*time.Hour:
		return c, fmt.Errorf("--duration must be between 5s and 24h, got %s", c.duration)
	case c.jobs < 1 || c.jobs > 100000:
		return c, fmt.Errorf("--jobs must be 1..100000, got %d", c.jobs)
	case c.workers < 1 || c.workers > 16:
		return c, fmt.Errorf("--workers must be 1..16, got %d", c.workers)
	case c.nodeWorkers < 0 || c.nodeWorkers > 8:
		return c, fmt.Errorf("--node-workers must be 0..8, got %d", c.nodeWorkers)
	case c.pythonWorkers < 0 || c.pythonWorkers > 8:
		return c, fmt.Errorf("--python-workers must be 0..8, got %d", c.pythonWorkers)
	case c.replicas < 1 || c.replicas > 4:
		return c, fmt.Errorf("--replicas must be 1..4, got %d", c.replicas)
	case c.concurrency < 1 || c.concurrency > 100:
		return c, fmt.Errorf("--concurrency must be 1..100, got %d", c.concurrency)
	case c.lease < time.Second || c.lease > time.Minute:
		return c, fmt.Errorf("--lease must be between 1s and 1m, got %s", c.lease)
	case c.providerTimeout <= 0 || c.providerTimeout >= c.lease:
		return c, fmt.Errorf("--provider-timeout must be positive and under --lease, got %s", c.providerTimeout)
	case c.patientTimeout < 0 || (c.patientTimeout > 0 && c.patientTimeout <= slowCallMax*c.lease):
		return c, fmt.Errorf("--patient-provider-timeout must be 0 (3.5 leases) or longer than %d leases (%s), the longest "+
			"provider-slow call, got %s", slowCallMax, slowCallMax*c.lease, c.patientTimeout)
	case c.faultRate < 0.1 || c.faultRate > 10:
		return c, fmt.Errorf("--fault-rate must be 0.1..10, got %g", c.faultRate)
	case c.futureShare < 0 || c.futureShare > 0.5:
		return c, fmt.Errorf("--future-share must be 0..0.5, got %g", c.futureShare)
	case c.cancelShare < 0 || c.cancelShare > 0.5:
		return c, fmt.Errorf("--cancel-share must be 0..0.5, got %g", c.cancelShare)
	case c.settleTimeout < time.Second:
		return c, fmt.Errorf("--settle-timeout must be at least 1s, got %s", c.settleTimeout)
	case c.retainSucceeded < 0 || (c.retainSucceeded > 0 && c.retainSucceeded < time.Second):
		return c, fmt.Errorf("--retain-succeeded must be at least 1s, or 0 for the coordinators' default, got %s",
			c.retainSucceeded)
	case c.archiveInterval < time.Second || c.archiveInterval > time.Hour:
		return c, fmt.Errorf("--archive-interval must be between 1s and 1h, got %s", c.archiveInterval)
	}
	if c.dryRun || c.failover != "" {
		// With --failover, the DSN is the campaign's own primary's (run).
		return c, nil
	}
	if c.dsn, err = mysql.ParseDSN(c.mysqlDSN); err != nil {
		return c, fmt.Errorf("--mysql-dsn: %w", err)
	}
	if c.dsn.Net != "tcp" {
		return c, fmt.Errorf("--mysql-dsn must reach the server over tcp (the proxies forward TCP), got %q", c.dsn.Net)
	}
	return c, nil
}

// defaultPython is --python's default: Debian's interpreter when it is
// there, the one apt installs python3-grpcio and python3-protobuf for (a
// python3 earlier on PATH does not see them), else python3 on PATH.
func defaultPython() string {
	const debian = "/usr/bin/python3"
	if st, err := os.Stat(debian); err == nil && !st.IsDir() {
		return debian
	}
	return "python3"
}

func kindList() string {
	var names []string
	for _, k := range allFaultKinds() {
		names = append(names, string(k))
	}
	return strings.Join(names, ", ")
}
