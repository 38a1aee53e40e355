package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/mariadbpair"
)

// providerName is the provider of every job of the campaign.
const providerName = "acme"

// claimPollInterval is the coordinators' --claim-poll-interval: how often
// each reads the paused providers (R33) and its waiting claims look again.
const claimPollInterval = 200 * time.Millisecond

// binaries are the commands the campaign runs; node and nodeScript only
// with Node.js workers, python and pythonScript only with Python workers.
type binaries struct {
	coordinator, provider, worker string
	node, nodeScript              string
	python, pythonScript          string
}

// moduleRoot is the folder of the jobfence module that holds the working
// directory. Errors: not inside a module.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the jobfence module: run from it, or give --bin-dir (and --node-worker-script)")
	}
	return filepath.Dir(gomod), nil
}

// buildBinaries compiles the three commands into dir with go build, in the
// module root. Errors: the build's own.
func buildBinaries(ctx context.Context, root, dir string) (binaries, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator),
		"github.com/jobfence/jobfence/cmd/coordinator",
		"github.com/jobfence/jobfence/cmd/fakeprovider",
		"github.com/jobfence/jobfence/cmd/refundworker")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return binaries{}, fmt.Errorf("go build: %w\n%s", err, out)
	}
	return binariesIn(dir)
}

// binariesIn finds the three commands in dir. Errors: one is missing.
func binariesIn(dir string) (binaries, error) {
	b := binaries{
		coordinator: filepath.Join(dir, "coordinator"),
		provider:    filepath.Join(dir, "fakeprovider"),
		worker:      filepath.Join(dir, "refundworker"),
	}
	for _, p := range []string{b.coordinator, b.provider, b.worker} {
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			return b, fmt.Errorf("no %s in %s", filepath.Base(p), dir)
		}
	}
	return b, nil
}

// timeline prints what happens, each line with the time since the
// campaign's start.
type timeline struct {
	start time.Time
	mu    sync.Mutex
	w     io.Writer
}

func (t *timeline) printf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "[%7.3fs] %s\n", time.Since(t.start).Seconds(), fmt.Sprintf(format, args...))
}

// replica is one coordinator process, its own proxy to MariaDB and its
// workers' front.
type replica struct {
	idx    int
	name   string
	listen string // fixed, so that the front, the producer and restarts find it
	proxy  *tcpProxy
	// workerFront is the one way its workers reach it (their
	// --coordinator): a proxy in front of listen, whose connections a
	// coordinator-stream-cut cuts. The producer, the failover's probes and
	// the webhook front go to the coordinator directly.
	workerFront *tcpProxy
	// webhookListen is its --webhook-listen, fixed like listen, so that
	// the webhook front finds a restarted coordinator; "" without webhooks.
	webhookListen string

	mu     sync.Mutex
	proc   *proc
	starts int
	procs  []*proc
}

func (r *replica) current() *proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc
}

// workerKind is which worker a slot runs: refundworker or one of the SDKs'
// example workers. Their flags are alike; their logs differ in a few
// messages (workerlog.go) and in what the checks may read from them.
type workerKind int

const (
	goWorker     workerKind = iota // cmd/refundworker
	nodeWorker                     // clients/node examples/refund-worker, compiled
	pythonWorker                   // clients/python/examples/refund_worker.py
)

// String names the kind in the timeline and the checks' details.
func (k workerKind) String() string {
	switch k {
	case nodeWorker:
		return "Node.js"
	case pythonWorker:
		return "Python"
	}
	return "Go"
}

// workerSlot is one worker position; a killed worker is replaced by a new
// process (and worker id) in the same slot, talking to the same replica.
type workerSlot struct {
	idx     int
	replica *replica
	kind    workerKind
	// renews: its worker renews its leases while a job's provider calls
	// run (R27): refundworker and the Python example worker always (the
	// campaign never passes --no-lease-renewal), the Node.js worker with
	// --node-renews. Invariant 10 holds its takeovers to the faults that
	// hit it.
	renews bool
	// patient: a renewing worker whose provider-call deadline
	// (--patient-provider-timeout) outlasts the provider-slow calls, which
	// it waits out renewing; the others give up at --provider-timeout.
	patient bool

	mu    sync.Mutex
	proc  *proc
	gen   int
	procs []*workerProc

	// busy is held by the slot's lane during each of its faults, and by a
	// db-failover while it keeps the slot's worker frozen: each skips the
	// slot when the other holds it, so that no fault's SIGCONT ends another's
	// freeze.
	busy sync.Mutex
}

// workerProc is one worker process and the worker id it ran under.
type workerProc struct {
	id   string
	p    *proc
	kind workerKind
}

func (w *workerSlot) current() *proc {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.proc
}

// system is everything the campaign runs: the provider, the replicas, the
// workers.
type system struct {
	cfg    config
	bins   binaries
	dir    string // process logs
	tl     *timeline
	dbName string // the campaign's database; see replicaDSN

	provider    *proc
	providerURL string
	pay         *fakeprovider.Client

	// With --webhooks: the signing secrets and their files, and the front
	// the provider delivers to.
	keys  webhookKeys
	front *webhookFront
	// The provider's global faults: the provider lane's part, the
	// provider-slow lane's and the webhook lane's (setAPIFaults,
	// setSlowFaults, setWebhookModes).
	provMu                            sync.Mutex
	apiFaults, slowFaults, hookFaults fakeprovider.Faults

	replicas []*replica
	workers  []*workerSlot

	// COMMITs cut by db-commit-cut faults, after and before reaching the server.
	cutsDelivered, cutsDropped atomic.Int64
	// What the coordinator-stream-cut faults did, and the producer's
	// enqueues they may wait for.
	cuts        streamCutTally
	enqueueCues enqueueCues

	// checkDB is the campaign's own handle on its database, for the settle
	// loop and the checks; a failover moves it to the promoted replica.
	dbMu    sync.Mutex
	checkDB *sql.DB

	// With --failover: the MariaDB pair, the producer (whose acknowledged
	// enqueues the failover re-drives), whether a failover is under way
	// (coordinator-kill faults wait it out, so that the coordinators that
	// live through it prove they reconnect without a restart), what it did,
	// and redrive, closed once the proxies point at the new primary.
	pair        *mariadbpair.Pair
	prod        atomic.Pointer[production]
	failingOver atomic.Bool
	fo          failoverFacts
	redrive     chan struct{}
	redriveOnce sync.Once

	// archive: what the campaign's kills did to the archive (R31).
	archive archiveFacts

	// With a canceller (R32): the enqueues the producer had acknowledged,
	// and the replicas whose worker fronts were just cut; nil without.
	cancelFeed chan ackedJob
	cutCues    chan string

	// unexpected lists processes that ended without the campaign asking.
	mu         sync.Mutex
	unexpected []string

	// outages are the faults that may keep workers' renewals from the
	// database (a replica's database faults, a failover), for invariant 10;
	// a coordinator's own outages are read from its processes
	// (allOutages).
	outMu   sync.Mutex
	outages []outage
}

// noteOutage records an outage that has begun and returns its index for
// endOutage.
func (s *system) noteOutage(o outage) int {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	s.outages = append(s.outages, o)
	return len(s.outages) - 1
}

// endOutage notes that outage i has ended.
func (s *system) endOutage(i int) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	s.outages[i].To = time.Now()
}

// allOutages returns the database outages and each replica's coordinator
// outages: from a process's kill (or exit) to the next one's ready line,
// whoever restarted it (the fault, or the heal).
func (s *system) allOutages() []outage {
	s.outMu.Lock()
	out := append([]outage(nil), s.outages...)
	s.outMu.Unlock()
	for _, r := range s.replicas {
		r.mu.Lock()
		procs := append([]*proc(nil), r.procs...)
		r.mu.Unlock()
		for i, p := range procs {
			end := p.endedAt()
			if end.IsZero() {
				continue
			}
			o := outage{What: "coordinator down", Replica: r.name, From: end}
			if i+1 < len(procs) {
				o.To = procs[i+1].readyAt()
			}
			out = append(out, o)
		}
	}
	return out
}

// firstEphemeralPort is the lowest port the kernel gives outgoing
// connections and port-0 listeners.
func firstEphemeralPort() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 2048 {
				return n
			}
		}
	}
	return 32768 // Linux's default
}

// fixedPorts are the ports freeLoopbackPort handed out, none twice.
var fixedPorts = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// freeLoopbackPort returns an address on loopback with a port free now, for
// a coordinator to bind at every start of the campaign. The port lies below
// the kernel's ephemeral range: one from that range, free when it was
// picked, can be taken before the coordinator binds it, or between a kill
// and the restart, by any outgoing connection or listener on port 0 (the
// start then fails: address already in use).
func freeLoopbackPort() (string, error) {
	low := firstEphemeralPort()
	from := max(1024, low-10000)
	fixedPorts.Lock()
	defer fixedPorts.Unlock()
	for range 200 {
		port := from + rand.IntN(low-from)
		if fixedPorts.given[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken
		}
		l.Close()
		fixedPorts.given[port] = true
		return l.Addr().String(), nil
	}
	return "", fmt.Errorf("no free loopback port in %d..%d", from, low-1)
}

// startProvider runs the fake provider on a free port.
func (s *system) startProvider() error {
	args := []string{"--listen", "127.0.0.1:0", "--log-format", "json", "--shutdown-timeout", "1s"}
	if s.front != nil {
		args = append(args, "--webhook-url", s.front.url(), "--webhook-secret-file", s.keys.providerFile,
			"--webhook-max-attempts", strconv.Itoa(webhookMaxAttempts))
	}
	p, err := startProc("fakeprovider", s.bins.provider, args, nil, filepath.Join(s.dir, "fakeprovider.log"))
	if err != nil {
		return err
	}
	rec, err := p.waitRecord(20*time.Second, 0, msgIs("fakeprovider serving"))
	if err != nil {
		p.kill()
		return fmt.Errorf("fakeprovider: %w", err)
	}
	addr, _ := rec["listen"].(string)
	s.provider, s.providerURL = p, "http://"+addr
	s.pay = fakeprovider.NewClient(s.providerURL, nil)
	s.watch(p)
	return nil
}

// startReplica starts replica r's coordinator and waits until it serves.
// Errors: it exited or did not serve in time (e.g. its database proxy is
// down); the process is then gone.
func (s *system) startReplica(r *replica) error {
	r.mu.Lock()
	r.starts++
	n := r.starts
	r.mu.Unlock()
	args := []string{
		"--listen", r.listen,
		"--lease", s.cfg.lease.String(),
		"--claim-poll-interval", claimPollInterval.String(),
		"--mysql-max-conns", "8",
		"--shutdown-timeout", "3s",
		"--log-format", "json",
	}
	if r.webhookListen != "" {
		args = append(args, "--webhook-listen", r.webhookListen, "--webhook-secrets-file", s.keys.coordinatorFile)
	}
	if s.cfg.retainSucceeded > 0 {
		// R31: jobs leave for the archive while the faults run, whichever
		// replica holds the archive's lease, killed or cut off like any.
		args = append(args, "--retain-succeeded", s.cfg.retainSucceeded.String(),
			"--archive-interval", s.cfg.archiveInterval.String())
	}
	p, err := startProc(r.name, s.bins.coordinator, args, []string{"JOBFENCE_MYSQL_DSN=" + s.replicaDSN(r)},
		filepath.Join(s.dir, fmt.Sprintf("%s.%d.log", r.name, n)))
	if err != nil {
		return err
	}
	rec, err := p.waitRecord(20*time.Second, 0, msgIs("coordinator serving"))
	if err != nil {
		p.kill()
		return err
	}
	p.markReady(rec)
	r.mu.Lock()
	r.proc = p
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	s.watch(p)
	return nil
}

// restartReplica starts r again until it serves or ctx ends.
func (s *system) restartReplica(ctx context.Context, r *replica) error {
	for {
		err := s.startReplica(r)
		if err == nil {
			return nil
		}
		s.tl.printf("%s: restart failed, trying again: %v", r.name, err)
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// startWorker starts a new worker process in slot w.
func (s *system) startWorker(w *workerSlot) error {
	w.mu.Lock()
	w.gen++
	id := fmt.Sprintf("chaos-w%d", w.idx+1)
	switch w.kind {
	case nodeWorker:
		id = fmt.Sprintf("chaos-node-w%d", w.idx+1)
	case pythonWorker:
		id = fmt.Sprintf("chaos-py-w%d", w.idx+1)
	}
	if w.gen > 1 {
		id += "-" + strconv.Itoa(w.gen)
	}
	w.mu.Unlock()
	args := []string{
		"--coordinator", w.replica.workerFront.Addr(),
		"--provider", s.providerURL,
		"--provider-name", providerName,
		"--worker-id", id,
		"--concurrency", strconv.Itoa(s.cfg.concurrency),
		"--lease", s.cfg.lease.String(),
		"--provider-timeout", s.workerProviderTimeout(w).String(),
		"--pending-delay", "1s",
		"--unknown-delay", "1s",
		"--call-timeout", "3s",
		"--drain-timeout", "5s",
		// Debug: "job claimed" lets worker-stop-in-job freeze a worker mid-job.
		"--log-level", "debug",
		// One spool per slot, in the run's folder: a worker that replaces a
		// killed one files the receipts it left (R28), and nothing spooled
		// by another run reaches this one.
		"--receipt-spool", filepath.Join(s.dir, spoolName(w.idx)),
	}
	bin, ready := s.bins.worker, "refundworker started"
	var env []string
	switch w.kind {
	case nodeWorker:
		// The Node worker logs JSON always. Like every worker here it takes
		// its grants from the worker stream (its SDK's default; the
		// campaign never passes --no-stream); --claim-wait shapes its Claim
		// calls only where there is no stream (an older worker, a
		// coordinator without Work).
		args = append([]string{s.bins.nodeScript}, append(args, "--claim-wait", "1s")...)
		bin, ready = s.bins.node, "refund-worker started"
	case pythonWorker:
		// So does the Python one, alike. It puts its own ../src on sys.path (as
		// the SDK's tests run it), so no PYTHONPATH; no bytecode is written
		// into the checkout.
		args = append([]string{s.bins.pythonScript}, append(args, "--claim-wait", "1s")...)
		bin, ready = s.bins.python, "refund-worker started"
		env = []string{"PYTHONDONTWRITEBYTECODE=1"}
	default:
		args = append(args, "--poll-interval", "250ms", "--log-format", "json")
	}
	p, err := startProc(id, bin, args, env, filepath.Join(s.dir, id+".log"))
	if err != nil {
		return err
	}
	rec, err := p.waitRecord(20*time.Second, 0, msgIs(ready))
	if err != nil {
		p.kill()
		return err
	}
	p.markReady(rec)
	w.mu.Lock()
	w.proc = p
	w.procs = append(w.procs, &workerProc{id: id, p: p, kind: w.kind})
	w.mu.Unlock()
	s.watch(p)
	return nil
}

// workerProviderTimeout is slot w's provider-call deadline: a patient
// worker's outlasts the provider-slow calls.
func (s *system) workerProviderTimeout(w *workerSlot) time.Duration {
	if w.patient {
		return s.cfg.patientTimeout
	}
	return s.cfg.providerTimeout
}

// watch notes a process that ends without the campaign having asked.
func (s *system) watch(p *proc) {
	go func() {
		err := p.exitErr()
		if p.meant.Load() {
			return
		}
		s.mu.Lock()
		s.unexpected = append(s.unexpected, fmt.Sprintf("%s (pid %d) exited on its own: %v", p.name, p.pid(), err))
		s.mu.Unlock()
		s.tl.printf("UNEXPECTED: %s (pid %d) exited on its own: %v", p.name, p.pid(), err)
	}()
}

// heal ends every fault: provider faults cleared, proxies healed, frozen
// workers continued, dead coordinators and workers started again.
func (s *system) heal(ctx context.Context) error {
	var errs []error
	if err := s.clearProviderFaults(ctx); err != nil {
		errs = append(errs, fmt.Errorf("clear provider faults: %w", err))
	}
	for _, r := range s.replicas {
		if err := r.proxy.Heal(); err != nil {
			errs = append(errs, err)
		}
		if err := r.workerFront.Heal(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, w := range s.workers {
		if p := w.current(); p != nil && !p.exited() && p.stopped.Load() {
			_ = p.signal(syscall.SIGCONT)
		}
	}
	for _, r := range s.replicas {
		if p := r.current(); p == nil || p.exited() {
			s.tl.printf("heal: starting %s", r.name)
			if err := s.restartReplica(ctx, r); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", r.name, err))
			}
		}
	}
	for _, w := range s.workers {
		if p := w.current(); p == nil || p.exited() {
			s.tl.printf("heal: starting a worker in slot %d", w.idx+1)
			if err := s.startWorker(w); err != nil {
				errs = append(errs, fmt.Errorf("worker slot %d: %w", w.idx+1, err))
			}
		}
	}
	return errors.Join(errs...)
}

// stopWorkers sends every worker SIGTERM (they drain) and waits.
func (s *system) stopWorkers() {
	var wg sync.WaitGroup
	for _, w := range s.workers {
		if p := w.current(); p != nil {
			wg.Go(func() {
				if !p.terminate(10 * time.Second) {
					s.tl.printf("%s did not drain in time; killed", p.name)
				}
			})
		}
	}
	wg.Wait()
}

// stopReplicas sends every coordinator SIGTERM and waits.
func (s *system) stopReplicas() {
	var wg sync.WaitGroup
	for _, r := range s.replicas {
		if p := r.current(); p != nil {
			wg.Go(func() { p.terminate(6 * time.Second) })
		}
	}
	wg.Wait()
}

// close kills whatever still runs and closes the proxies.
func (s *system) close() {
	var all []*proc
	for _, w := range s.workers {
		w.mu.Lock()
		for _, wp := range w.procs {
			all = append(all, wp.p)
		}
		w.mu.Unlock()
	}
	for _, r := range s.replicas {
		r.mu.Lock()
		all = append(all, r.procs...)
		r.mu.Unlock()
	}
	if s.provider != nil {
		all = append(all, s.provider)
	}
	for _, p := range all {
		p.kill()
	}
	for _, r := range s.replicas {
		for _, px := range []*tcpProxy{r.proxy, r.workerFront} {
			if px != nil {
				px.Close()
			}
		}
	}
	s.front.close()
}

// coordinatorCounts counts, over every coordinator process, the log records
// that show a fault reaching the fencing logic.
func (s *system) coordinatorCounts() map[string]int {
	n := map[string]int{}
	s.eachCoordinatorRecord(func(rec map[string]any) {
		if msg, ok := rec["msg"].(string); ok {
			n[msg]++
		}
	})
	return n
}

// eachCoordinatorRecord calls fn with every log record of every coordinator
// process the campaign started, replica by replica.
func (s *system) eachCoordinatorRecord(fn func(rec map[string]any)) {
	for _, r := range s.replicas {
		r.mu.Lock()
		procs := append([]*proc(nil), r.procs...)
		r.mu.Unlock()
		for _, p := range procs {
			for _, rec := range p.allRecords() {
				fn(rec)
			}
		}
	}
}

// unexpectedExits returns the processes that ended on their own.
func (s *system) unexpectedExits() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.unexpected...)
}

// feedCanceller tells the canceller of an acknowledged enqueue, if it
// runs and has room.
func (s *system) feedCanceller(key string, job int64) {
	if s.cancelFeed == nil {
		return
	}
	select {
	case s.cancelFeed <- ackedJob{Key: key, JobID: job}:
	default:
	}
}

// cueCut tells the canceller that replica's worker front was just cut.
func (s *system) cueCut(replica string) {
	if s.cutCues == nil {
		return
	}
	select {
	case s.cutCues <- replica:
	default:
	}
}

// sleepCtx sleeps d or until ctx ends; it reports whether it slept in full.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
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
