package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jobfence/jobfence/internal/mariadbpair"
)

// errCampaignFailed is run's error when an invariant failed or a process
// died on its own; the details are printed above the summary line.
var errCampaignFailed = errors.New("the campaign failed (details above the summary line)")

// run is the whole campaign: set up, fault window, heal and settle, checks.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if c.seed == 0 {
		c.seed = rand.Uint64()>>1 + 1
	}
	faults := plan(c.seed, planParams{Window: c.duration, Workers: c.workers + c.nodeWorkers + c.pythonWorkers,
		Replicas: c.replicas, Lease: c.lease, Kinds: c.faults, Rate: c.faultRate, Failover: c.failover, Webhooks: c.webhooks})
	tl := &timeline{start: time.Now(), w: stdout}
	mode, database := "", "--mysql-dsn DSN"
	if c.failover != "" {
		mode, database = " failover="+c.failover, "--failover "+c.failover
	}
	fmt.Fprintf(stdout, "jobfence-chaos: seed=%d duration=%s jobs=%d workers=%d node-workers=%d python-workers=%d "+
		"replicas=%d lease=%s provider-timeout=%s patient-provider-timeout=%s node-renews=%v webhooks=%v "+
		"retain-succeeded=%s%s; %d faults planned\n", c.seed, c.duration, c.jobs, c.workers, c.nodeWorkers, c.pythonWorkers,
		c.replicas, c.lease, c.providerTimeout, c.patientTimeout, c.nodeRenews, c.webhooks, c.retainSucceeded, mode,
		len(faults))
	fmt.Fprintf(stdout, "replay with: jobfence-chaos %s --seed %d --duration %s --jobs %d --workers %d "+
		"--node-workers %d --python-workers %d --replicas %d --concurrency %d --lease %s --provider-timeout %s "+
		"--patient-provider-timeout %s --node-renews=%v --faults %s --fault-rate %g --webhooks=%v --future-share %g "+
		"--forged-webhooks=%v --retain-succeeded %s --archive-interval %s --cancel-share %g --pauses=%v "+
		"--resolve-reviews=%v\n", database, c.seed, c.duration, c.jobs, c.workers, c.nodeWorkers, c.pythonWorkers,
		c.replicas, c.concurrency, c.lease, c.providerTimeout, c.patientTimeout, c.nodeRenews, c.faultsSpec, c.faultRate,
		c.webhooks, c.futureShare, c.forge, c.retainSucceeded, c.archiveInterval, c.cancelShare, c.pauses,
		c.resolveReviews)
	// Future-dated refunds (R28, invariant 11), drawn from the seed like
	// the fault plan.
	specs := refundSpecs(c.seed, c.jobs)
	soon, beyond := dateSomeInTheFuture(c.seed, specs, c.futureShare, c.duration*8/10, c.duration)
	forge := c.webhooks && c.forge
	lo, hi := soonDelays(c.duration)
	fmt.Fprintf(stdout, "future-dated refunds: %d due %s-%s after their enqueue, within the fault window, %d a year "+
		"later, beyond the campaign; forged webhooks: %v\n", soon, round(lo), round(hi), beyond, forge)

	if c.dryRun {
		for _, f := range faults {
			fmt.Fprintf(stdout, "[%7.3fs] fault #%d %s\n", f.At.Seconds(), f.N, f)
		}
		return nil
	}

	// Logs (and built binaries) go to one folder, kept when something failed.
	dir, temp := c.logDir, c.logDir == ""
	if temp {
		var err error
		if dir, err = os.MkdirTemp("", "jobfence-chaos-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	keepLogs := c.keep
	defer func() {
		if keepLogs || !temp {
			fmt.Fprintf(stdout, "process logs: %s\n", dir)
			return
		}
		os.RemoveAll(dir)
	}()

	bins, err := findBinaries(ctx, c, dir, tl)
	if err != nil {
		return err
	}

	// With --failover, the campaign's own primary and replica: the database
	// is created on the primary and replicates.
	var pair *mariadbpair.Pair
	var pairDir string
	if c.failover != "" {
		if c.mysqlDSN != "" {
			tl.printf("--mysql-dsn ignored: --failover runs its own MariaDB primary and replica")
		}
		if pair, pairDir, err = startPair(ctx, &c, dir, tl); err != nil {
			keepLogs = true
			return fmt.Errorf("--failover: %w", err)
		}
		defer pair.Close()
		tl.printf("database pair (%s): primary %s, replica %s; datadirs and error logs in %s", c.failover,
			pair.PrimaryAddr(), pair.ReplicaAddr(), pairDir)
	}

	dbName, checkDB, dropDB, err := createDatabase(ctx, c)
	if err != nil {
		return err
	}
	defer func() {
		switch {
		case c.keep && pair != nil:
			fmt.Fprintf(stdout, "database kept: %s, in the promoted replica's datadir in %s (the servers are stopped)\n",
				dbName, pairDir)
		case c.keep:
			fmt.Fprintf(stdout, "database kept: %s\n", dbName)
		case pair != nil:
			// The pair goes with its datadirs; the old primary is dead.
		default:
			if err := dropDB(); err != nil {
				fmt.Fprintf(stderr, "jobfence-chaos: drop database %s: %v\n", dbName, err)
			}
		}
	}()
	tl.printf("database %s created", dbName)

	s := &system{cfg: c, bins: bins, dir: dir, tl: tl, pair: pair, checkDB: checkDB}
	if pair != nil {
		s.redrive = make(chan struct{})
	}
	defer func() {
		if db := s.db(); db != nil {
			db.Close()
		}
	}()
	defer s.close()
	if err := s.start(ctx, dbName); err != nil {
		keepLogs = true
		return err
	}

	// The fault window, with the producer enqueueing through it and the
	// forger sending its events.
	windowStart := time.Now()
	window, endWindow := context.WithTimeout(ctx, c.duration)
	defer endWindow()
	prodCtx, stopProducer := context.WithTimeout(ctx, c.duration+c.settleTimeout)
	defer stopProducer()
	// The canceller and the pauser, operators at work while the faults run
	// (R32, R33): the canceller hears of each acknowledged enqueue and of
	// each cut of a replica's worker front.
	var canc *canceller
	cancDone, pauseDone := make(chan struct{}), make(chan struct{})
	if c.cancelShare > 0 {
		if canc, err = s.newCanceller(prodCtx, c.seed, specs, c.cancelShare); err != nil {
			return fmt.Errorf("canceller: %w", err)
		}
		defer canc.op.close()
		s.cancelFeed, s.cutCues = make(chan ackedJob, len(specs)), make(chan string, 16)
		go func() { defer close(cancDone); canc.run(window, s.cancelFeed, s.cutCues) }()
	} else {
		close(cancDone)
	}
	var pz *pauser
	if c.pauses {
		if pz, err = s.newPauser(c.seed); err != nil {
			return fmt.Errorf("pauser: %w", err)
		}
		go func() { defer close(pauseDone); pz.run(window) }()
	} else {
		close(pauseDone)
	}
	produced := make(chan *production, 1)
	go func() { produced <- s.produce(prodCtx, specs, c.duration*8/10, windowStart.Add(c.duration*9/10)) }()
	forgedCh := make(chan []forgedEvent, 1)
	if forge {
		go func() { forgedCh <- s.forge(window, c.seed, specs) }()
	} else {
		forgedCh <- nil
	}
	// The late re-enqueues of keys whose jobs were archived, or are due
	// to be, through the window and the settle (R30, invariant 12).
	var late *lateEnqueuer
	lateCtx, stopLate := context.WithCancel(ctx)
	defer stopLate()
	lateDone := make(chan struct{})
	if c.retainSucceeded > 0 {
		if late, err = s.newLateEnqueuer(c.seed, specs); err != nil {
			return fmt.Errorf("late re-enqueues: %w", err)
		}
		defer late.close()
		go func() { defer close(lateDone); late.run(lateCtx) }()
	} else {
		close(lateDone)
	}
	tl.printf("fault window: %s", c.duration)
	results := s.runFaults(window, windowStart, faults)
	s.endFailover() // a failover the window never reached
	<-window.Done() // the last faults may end before it: the producer and the forger go on
	endWindow()
	forged := <-forgedCh
	<-pauseDone // the last pause resumed
	<-cancDone  // the cancels under way answered
	if ctx.Err() != nil {
		return ctx.Err()
	}
	applied := 0
	for _, r := range results {
		if r.Skipped == "" && r.Err == nil {
			applied++
		}
	}
	tl.printf("fault window over: %d of %d faults applied; healing everything", applied, len(results))

	healCtx, endHeal := context.WithTimeout(ctx, time.Minute)
	err = s.heal(healCtx)
	endHeal()
	if err != nil {
		keepLogs = true
		return fmt.Errorf("heal: %w", err)
	}
	prod, settled := s.settle(ctx, produced, stopProducer, specs)
	stopLate()
	<-lateDone
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if late != nil {
		// However the window went, archived keys re-enqueued once more, while
		// the workers still run: a second job would be worked and show.
		n := late.sweep(ctx, lateSweep)
		tl.printf("late re-enqueues: %d more of keys in the archive (%d jobs there)", n, s.archivedCount(ctx))
	}

	var resolutions []resolution
	if canc != nil && c.resolveReviews {
		// A person decides what the cancels left in review (R29, R32).
		resolutions = canc.resolveReviews(ctx)
	}

	tl.printf("stopping workers (they drain)")
	s.stopWorkers()
	// What the workers could not file and left in their slots' spools
	// (R28), read once they released them.
	var spoolsLeft []spoolLeft
	var spoolProblems []string
	for i := range s.workers {
		left, err := readSpool(filepath.Join(dir, spoolName(i)))
		if err != nil {
			spoolProblems = append(spoolProblems, fmt.Sprintf("receipt spool of worker slot %d: %v", i+1, err))
		}
		spoolsLeft = append(spoolsLeft, left...)
	}
	if len(spoolsLeft) > 0 {
		tl.printf("%d receipts left in the workers' receipt spools", len(spoolsLeft))
	}
	if s.front != nil {
		// The coordinators still serve: what the provider owes (held,
		// retried, duplicated events) reaches them before the checks.
		s.drainWebhooks(ctx)
	}
	octx, endOracle := context.WithTimeout(ctx, 10*time.Second)
	oracle, err := s.pay.Oracle(octx)
	endOracle()
	if err != nil {
		keepLogs = true
		return fmt.Errorf("provider oracle: %w", err)
	}
	tl.printf("stopping coordinators")
	s.stopReplicas()
	state, err := readDB(ctx, s.db())
	if err != nil {
		keepLogs = true
		return fmt.Errorf("read the database: %w", err)
	}

	in := checkInput{Specs: specs, Acked: prod.acked, DB: state, Oracle: oracle, Webhooks: c.webhooks,
		SpoolsLeft: spoolsLeft, NotBefore: prod.notBefore, Forged: forged, Forger: forge,
		Enqueues: prod.answers.all(), Retention: c.retainSucceeded}
	if late != nil {
		in.Enqueues = append(in.Enqueues, late.answers.all()...)
		slices.SortStableFunc(in.Enqueues, func(a, b enqueueAnswer) int { return a.At.Compare(b.At) })
	}
	in.Control = &controlInput{Canceller: canc != nil, Pauser: pz != nil, ClaimPoll: claimPollInterval, Lease: c.lease}
	if canc != nil {
		in.Control.Cancels = canc.all()
	}
	if pz != nil {
		in.Control.Pauses = pz.all()
	}
	in.Takeovers = &takeoverInput{Lease: c.lease, Start: tl.start, Workers: map[string]workerFacts{}, Outages: s.allOutages()}
	frozen := map[string][]span{}
	for _, w := range s.workers {
		for _, wp := range w.procs {
			in.addWorkerLog(workerLog{Worker: wp.id, Kind: wp.kind, Killed: killedBySIGKILL(wp.p),
				Lines: parseWorkerLines(wp.p.allRecords())})
			frozen[wp.id] = wp.p.frozenSpans()
			in.Takeovers.Workers[wp.id] = workerFacts{Kind: wp.kind, Renews: w.renews, Patient: w.patient,
				Replica: w.replica.name, Frozen: frozen[wp.id], Ended: wp.p.endedAt()}
		}
	}
	problems := spoolProblems
	if pair != nil {
		s.fo.mu.Lock()
		foApplied, foErr := s.fo.Applied, s.fo.Err
		in.Failover = &failoverInput{Mode: c.failover, Killed: s.fo.KilledAt, Repointed: s.fo.RepointedAt, Frozen: frozen}
		problems = append(problems, s.fo.Problems...)
		s.fo.mu.Unlock()
		in.EnqueuesLost = prod.lostInFailover
		if !foApplied {
			problems = append(problems, fmt.Sprintf("the db-failover did not happen (%v): nothing about R26 was shown", foErr))
			in.Failover = nil
		}
	}
	v := check(in)
	if in.Failover != nil && c.failover == failoverAsync && v.GrantsLost == 0 {
		problems = append(problems, "the async failover lost no grant the workers had logged: the fault did not bite "+
			"(no write of a lost grant was put to the test)")
	}
	switch {
	case c.retainSucceeded == 0:
	case v.Archived == 0:
		problems = append(problems, fmt.Sprintf("no job was archived (--retain-succeeded %s): R30 and R31 were not put "+
			"to the test", c.retainSucceeded))
	case !slices.ContainsFunc(in.Enqueues, func(a enqueueAnswer) bool {
		return a.Why == answerLate && a.WasArchived && a.Err == ""
	}):
		problems = append(problems, "no re-enqueue of a key in the archive was answered: R30 was not put to the test")
	}

	fmt.Fprintln(stdout)
	printFaultSummary(stdout, results)
	cc := s.coordinatorCounts()
	fmt.Fprintf(stdout, "seen by the coordinators: %d takeovers, %d fenced write-backs rejected, %d claims answered "+
		"CLAIM_OUTCOME_UNKNOWN (R7), %d writes answered WRITE_OUTCOME_UNKNOWN (R20), %d observations filed; "+
		"COMMITs cut: %d after reaching the server, %d before\n", cc["job taken over; next action reconcile"],
		cc["fenced write rejected"], cc["claim outcome unknown; nothing granted"], cc["write outcome unknown"],
		cc["observation filed"], s.cutsDelivered.Load(), s.cutsDropped.Load())
	if line := s.cuts.summary(); line != "" {
		fmt.Fprintln(stdout, line)
	}
	if s.front != nil {
		refused, notStored := s.webhookRefusals()
		fmt.Fprintf(stdout, "webhooks: deliveries answered through the front: %s; refused by the coordinators: %s; "+
			"%d events not stored (answered 503, delivered again)\n", s.front.summary(), formatCounts(refused), notStored)
	}
	fmt.Fprintf(stdout, "producer: %d of %d refunds acknowledged, %d enqueue retries; %d future-dated (%d due within the "+
		"window, %d beyond the campaign)\n", len(prod.acked), len(specs), prod.retries, len(prod.notBefore),
		len(prod.notBefore)-countBeyond(specs, prod.notBefore), countBeyond(specs, prod.notBefore))
	if forge {
		fmt.Fprintln(stdout, forgerySummary(forged))
	}
	if canc != nil {
		fmt.Fprintln(stdout, cancelSummary(in.Control.Cancels))
		if c.resolveReviews {
			fmt.Fprintln(stdout, resolutionSummary(resolutions))
		}
	}
	if pz != nil {
		fmt.Fprintln(stdout, pauseSummary(in.Control.Pauses))
	}
	if c.retainSucceeded > 0 {
		fmt.Fprintln(stdout, s.archiveSummary(ctx, v.Archived, v.ArchivedEvents, v.ArchivedReceipts))
		fmt.Fprintln(stdout, lateSummary(in.Enqueues))
	}
	if pair != nil {
		s.fo.mu.Lock()
		fmt.Fprintf(stdout, "failover (%s): old primary's gtid_binlog_pos %q at the kill, the promoted replica's "+
			"gtid_current_pos %q; the producer re-drove %d acknowledged enqueues, %d of them lost\n", c.failover,
			s.fo.PrimaryGTID, s.fo.ReplicaGTID, prod.redriven, len(prod.lostInFailover))
		for _, n := range s.fo.Reconnected {
			fmt.Fprintf(stdout, "  %s\n", n)
		}
		s.fo.mu.Unlock()
	}
	for _, k := range sortedKeys(prod.failed) {
		fmt.Fprintf(stdout, "  never acknowledged: %s: %v\n", k, prod.failed[k])
	}
	if !settled {
		fmt.Fprintf(stdout, "settle: not every job was final after %s\n", c.settleTimeout)
	}
	problems = append(s.unexpectedExits(), problems...)
	for _, p := range problems {
		fmt.Fprintf(stdout, "PROBLEM: %s\n", p)
	}
	v.print(stdout)
	fmt.Fprintln(stdout, v.summaryLine(c.seed, len(prod.acked), applied, c.failover, len(prod.lostInFailover)))
	if v.Failed() || len(problems) > 0 {
		keepLogs = true
		return errCampaignFailed
	}
	return nil
}

// findBinaries takes the commands from --bin-dir or builds them into dir,
// and finds the Node.js and the Python worker when they are wanted.
func findBinaries(ctx context.Context, c config, dir string, tl *timeline) (binaries, error) {
	var root string
	var err error
	if c.binDir == "" || (c.nodeWorkers > 0 && c.nodeScript == "") || (c.pythonWorkers > 0 && c.pythonScript == "") {
		if root, err = moduleRoot(ctx); err != nil {
			return binaries{}, err
		}
	}
	var bins binaries
	if c.binDir != "" {
		bins, err = binariesIn(c.binDir)
	} else {
		tl.printf("building coordinator, fakeprovider and refundworker")
		bins, err = buildBinaries(ctx, root, filepath.Join(dir, "bin"))
	}
	if err != nil {
		return bins, err
	}
	if c.nodeWorkers > 0 {
		if err := findNodeWorker(c, root, &bins); err != nil {
			return bins, err
		}
	}
	if c.pythonWorkers > 0 {
		if err := findPythonWorker(ctx, c, root, &bins); err != nil {
			return bins, err
		}
	}
	return bins, nil
}

// findNodeWorker finds node and the compiled Node.js example worker.
func findNodeWorker(c config, root string, bins *binaries) error {
	var err error
	bins.nodeScript = c.nodeScript
	if bins.nodeScript == "" {
		bins.nodeScript = filepath.Join(root, "clients", "node", "dist", "examples", "refund-worker.js")
	}
	if _, err := os.Stat(bins.nodeScript); err != nil {
		return fmt.Errorf("--node-workers: no Node.js worker at %s (build it: npm ci && npm run build in clients/node): %w",
			bins.nodeScript, err)
	}
	if bins.node, err = exec.LookPath(c.node); err != nil {
		return fmt.Errorf("--node-workers: %w", err)
	}
	return nil
}

// findPythonWorker finds the interpreter and the Python example worker,
// and asks the worker for its --help once: it imports the SDK, grpc and
// protobuf first, so an interpreter that lacks them fails here, with its
// own words, instead of every worker start failing in the fault window.
func findPythonWorker(ctx context.Context, c config, root string, bins *binaries) error {
	var err error
	bins.pythonScript = c.pythonScript
	if bins.pythonScript == "" {
		bins.pythonScript = filepath.Join(root, "clients", "python", "examples", "refund_worker.py")
	}
	if _, err := os.Stat(bins.pythonScript); err != nil {
		return fmt.Errorf("--python-workers: no Python worker at %s: %w", bins.pythonScript, err)
	}
	if bins.python, err = exec.LookPath(c.python); err != nil {
		return fmt.Errorf("--python-workers: %w", err)
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(hctx, bins.python, bins.pythonScript, "--help")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("--python-workers: %s %s --help: %w (does --python import grpc and google.protobuf? "+
			"Debian: apt-get install python3-grpcio python3-protobuf, for /usr/bin/python3)\n%s", bins.python,
			bins.pythonScript, err, out)
	}
	return nil
}

// createDatabase creates the campaign's fresh database on the server of
// c.dsn and opens a direct handle on it for the checks. drop removes it.
func createDatabase(ctx context.Context, c config) (name string, db *sql.DB, drop func() error, err error) {
	name = fmt.Sprintf("jobfence_chaos_%d_%d", c.seed, time.Now().Unix())
	admin := c.dsn.Clone()
	admin.DBName = ""
	adb, err := sql.Open("mysql", admin.FormatDSN())
	if err != nil {
		return "", nil, nil, err
	}
	if _, err := adb.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		adb.Close()
		return "", nil, nil, fmt.Errorf("create database %s: %w", name, err)
	}
	drop = func() error {
		defer adb.Close()
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := adb.ExecContext(dctx, "DROP DATABASE `"+name+"`")
		return err
	}
	direct := c.dsn.Clone()
	direct.DBName, direct.ParseTime, direct.Loc = name, true, time.UTC
	if db, err = sql.Open("mysql", direct.FormatDSN()); err != nil {
		_ = drop()
		return "", nil, nil, err
	}
	return name, db, drop, nil
}

// replicaDSN is the DSN replica r's coordinator uses: the campaign's
// database, reached through r's proxy.
func (s *system) replicaDSN(r *replica) string {
	d := s.cfg.dsn.Clone()
	d.Addr, d.DBName = r.proxy.Addr(), s.dbName
	return d.FormatDSN()
}

// start brings the deployment up: the provider (and, with webhooks, the
// front it delivers them to), a database proxy, a coordinator and a worker
// front per replica, the workers spread over the replicas.
func (s *system) start(ctx context.Context, dbName string) error {
	s.dbName = dbName
	for i := range s.cfg.replicas {
		name := replicaName(i)
		px, err := newTCPProxy(name, s.cfg.dsn.Addr)
		if err != nil {
			return err
		}
		r := &replica{idx: i, name: name, proxy: px}
		s.replicas = append(s.replicas, r)
		if r.listen, err = freeLoopbackPort(); err != nil {
			return err
		}
		if r.workerFront, err = newTCPProxy(name+workersTargetSuffix, r.listen); err != nil {
			return err
		}
		if s.cfg.webhooks {
			if r.webhookListen, err = freeLoopbackPort(); err != nil {
				return err
			}
		}
	}
	if s.cfg.webhooks {
		var err error
		if s.keys, err = writeWebhookSecrets(s.dir); err != nil {
			return fmt.Errorf("webhook secrets: %w", err)
		}
		if s.front, err = startWebhookFront(s.replicas); err != nil {
			return fmt.Errorf("webhook front: %w", err)
		}
	}
	if err := s.startProvider(); err != nil {
		return err
	}
	for _, r := range s.replicas {
		if err := s.startReplica(r); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		webhooks := ""
		if r.webhookListen != "" {
			webhooks = ", webhooks on " + r.webhookListen
		}
		s.tl.printf("%s serving on %s (its workers through %s)%s, database through %s", r.name, r.listen,
			r.workerFront.Addr(), webhooks, r.proxy.Addr())
	}
	if s.front != nil {
		s.tl.printf("provider's webhooks: to %s, spread over the replicas' webhook listeners (at most %d attempts each)",
			s.front.url(), webhookMaxAttempts)
	}
	renewing := map[workerKind]int{} // renewing workers so far, by kind
	var renewers, patient []string
	for i := range s.cfg.workers + s.cfg.nodeWorkers + s.cfg.pythonWorkers {
		// The Go workers first, then the Node.js ones, then the Python ones.
		kind := goWorker
		switch {
		case i >= s.cfg.workers+s.cfg.nodeWorkers:
			kind = pythonWorker
		case i >= s.cfg.workers:
			kind = nodeWorker
		}
		w := &workerSlot{idx: i, replica: s.replicas[i%len(s.replicas)], kind: kind}
		// The 1st, 3rd, … renewing worker of each kind is patient: the
		// provider-slow calls meet both a worker that waits them out under
		// a renewed lease (R27) and one that gives up at its deadline (R14).
		w.renews = w.kind != nodeWorker || s.cfg.nodeRenews
		if w.renews {
			w.patient = renewing[w.kind]%2 == 0
			renewing[w.kind]++
		}
		s.workers = append(s.workers, w)
		if err := s.startWorker(w); err != nil {
			return fmt.Errorf("worker %d: %w", i+1, err)
		}
		if id := w.procs[0].id; w.patient {
			patient = append(patient, id)
		} else if w.renews {
			renewers = append(renewers, id)
		}
	}
	s.tl.printf("provider on %s; %d workers (%d Go, %d Node.js, %d Python; concurrency %d) spread over %d replicas",
		s.providerURL, len(s.workers), s.cfg.workers, s.cfg.nodeWorkers, s.cfg.pythonWorkers, s.cfg.concurrency,
		len(s.replicas))
	s.tl.printf("renewing their leases (R27): %s patient, with a provider-call deadline of %s; %s with %s",
		orNone(patient), s.cfg.patientTimeout, orNone(renewers), s.cfg.providerTimeout)
	return ctx.Err()
}

// db is the campaign's own handle on its database (after a failover, on the
// promoted replica).
func (s *system) db() *sql.DB {
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	return s.checkDB
}

// settle waits for the producer and then until every job is final or the
// settle timeout passes, but for the refunds of specs dated beyond the
// campaign still ready: they are not due. It reports whether every job
// became final.
func (s *system) settle(ctx context.Context, produced <-chan *production, stopProducer func(),
	specs []refundSpec) (*production, bool) {
	dated := map[string]refundSpec{}
	for _, sp := range specs {
		if sp.NotBeforeIn > 0 {
			dated[sp.Key] = sp
		}
	}
	deadline := time.Now().Add(s.cfg.settleTimeout)
	start := time.Now()
	var prod *production
	lastReport := time.Now()
	for {
		if prod == nil {
			select {
			case prod = <-produced:
			default:
			}
		}
		total, unfinished, soon, notDue, err := s.unfinished(ctx, dated)
		if err == nil && prod != nil && unfinished == 0 {
			s.tl.printf("settled after %s: %d jobs (%d of them archived), all final but %d dated beyond the campaign",
				time.Since(start).Round(100*time.Millisecond), total, s.archivedCount(ctx), notDue)
			return prod, true
		}
		if time.Since(lastReport) >= 5*time.Second {
			lastReport = time.Now()
			s.tl.printf("settling: %d jobs, %d not final yet, %d of them future-dated (err=%v)", total, unfinished, soon, err)
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 250*time.Millisecond) {
			stopProducer()
			if prod == nil {
				prod = <-produced
			}
			s.tl.printf("settle timeout: %d of %d jobs not final", unfinished, total)
			return prod, false
		}
	}
}

// unfinished counts the jobs (of the working tables, and of the archive,
// where every job is final) and those not final; of these, the ones of
// dated (the future-dated refunds) due within the campaign, and those
// dated beyond it still ready: not due, not counted as unfinished.
func (s *system) unfinished(ctx context.Context, dated map[string]refundSpec) (total, unfinished, soon, notDue int,
	err error) {
	if err := s.db().QueryRowContext(ctx, `SELECT COUNT(*) FROM refund_jobs`).Scan(&total); err != nil {
		return 0, 0, 0, 0, err
	}
	total += s.archivedCount(ctx)
	rows, err := s.db().QueryContext(ctx, `SELECT operation_key, state FROM refund_jobs
  WHERE state NOT IN ('succeeded', 'manual_review', 'cancelled')`)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var key, state string
		if err := rows.Scan(&key, &state); err != nil {
			return 0, 0, 0, 0, err
		}
		sp, isDated := dated[key]
		switch {
		case sp.Beyond && state == "ready":
			notDue++
		case isDated:
			unfinished++
			soon++
		default:
			unfinished++
		}
	}
	return total, unfinished, soon, notDue, rows.Err()
}

// archivedCount is how many jobs are in the archive now (R31); 0 when the
// campaign does not archive, or the database did not answer.
func (s *system) archivedCount(ctx context.Context) int {
	n := 0
	if s.cfg.retainSucceeded > 0 {
		_ = s.db().QueryRowContext(ctx, `SELECT COUNT(*) FROM refund_jobs_archive`).Scan(&n)
	}
	return n
}

// countBeyond counts the refunds of specs dated beyond the campaign among
// those enqueued (the keys of notBefore).
func countBeyond(specs []refundSpec, notBefore map[string]time.Time) int {
	n := 0
	for _, sp := range specs {
		if _, ok := notBefore[sp.Key]; ok && sp.Beyond {
			n++
		}
	}
	return n
}

// killedBySIGKILL reports whether p ended by SIGKILL.
func killedBySIGKILL(p *proc) bool {
	var ee *exec.ExitError
	if !errors.As(p.exitErr(), &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// printFaultSummary prints how many faults of each kind were applied.
func printFaultSummary(w io.Writer, results []faultResult) {
	applied, skipped := map[faultKind]int{}, map[faultKind]int{}
	for _, r := range results {
		if r.Skipped == "" && r.Err == nil {
			applied[r.Kind]++
		} else {
			skipped[r.Kind]++
		}
	}
	var parts []string
	for _, k := range append(allFaultKinds(), faultDBFailover) {
		if applied[k]+skipped[k] > 0 {
			p := fmt.Sprintf("%s=%d", k, applied[k])
			if skipped[k] > 0 {
				p += fmt.Sprintf("(+%d skipped)", skipped[k])
			}
			parts = append(parts, p)
		}
	}
	fmt.Fprintf(w, "faults applied: %s\n", strings.Join(parts, " "))
}

// orNone joins names with ", ", or says "none".
func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
