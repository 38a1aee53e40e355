package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/cli"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat; it
// is 100 on every Linux architecture Go supports.
const clockTicks = 100

// resolveCoordinator uses --coordinator-bin, or builds ./cmd/coordinator into
// a temporary folder.
func (b *bench) resolveCoordinator(ctx context.Context) error {
	if b.cfg.coordinatorBin != "" {
		b.coordBin = b.cfg.coordinatorBin
		return nil
	}
	start := time.Now()
	var err error
	if b.coordBin, b.binDir, err = cli.BuildCoordinator(ctx, "jobfence-bench-"); err != nil {
		return err
	}
	b.logf("built the coordinator in %s", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// coordinator is a coordinator process serving the bench database.
type coordinator struct {
	cmd  *exec.Cmd
	addr string
	done chan error

	mu   sync.Mutex
	tail []string // its last log lines, for error reports
	// metricsAddr is where it serves /metrics, once it says so (started
	// with --metrics-listen).
	metricsAddr string
}

// startCoordinator starts a coordinator process on the bench database, on a
// free loopback port, with extra flags after --coordinator-flags, and waits
// until it serves.
func (b *bench) startCoordinator(ctx context.Context, extra ...string) error {
	if err := b.stopCoordinator(); err != nil {
		return err
	}
	c, err := b.launchCoordinator(ctx, b.dsn, extra...)
	if err != nil {
		return err
	}
	b.coord = c
	return nil
}

// launchCoordinator starts a coordinator process on the database of dsn, on a
// free loopback port, with extra flags after --coordinator-flags, and waits
// until it serves (and serves its metrics, when extra names
// --metrics-listen).
func (b *bench) launchCoordinator(ctx context.Context, dsn string, extra ...string) (*coordinator, error) {
	// The seeded history is what scenario A measures the claim beside (Q3):
	// the archive stays off unless --coordinator-flags sets a retention.
	args := append([]string{"--mysql-dsn", dsn, "--listen", "127.0.0.1:0", "--log-format", "json",
		"--mysql-max-conns", strconv.Itoa(b.cfg.maxConns), "--retain-succeeded", "0"}, b.cfg.coordFlags...)
	args = append(args, extra...)
	cmd := exec.Command(b.coordBin, args...)
	cmd.Env = withoutJobfenceEnv(os.Environ())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the coordinator: %w", err)
	}
	c := &coordinator{cmd: cmd, done: make(chan error, 1)}
	ready, metrics := make(chan string, 1), make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			if c.tail = append(c.tail, line); len(c.tail) > 50 {
				c.tail = c.tail[1:]
			}
			c.mu.Unlock()
			var rec struct{ Msg, Listen string }
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			switch rec.Msg {
			case "coordinator serving":
				select {
				case ready <- rec.Listen:
				default:
				}
			case "metrics serving":
				c.mu.Lock()
				if c.metricsAddr == "" {
					c.metricsAddr = rec.Listen
					close(metrics)
				}
				c.mu.Unlock()
			}
		}
		c.done <- cmd.Wait()
	}()
	select {
	case c.addr = <-ready:
	case err := <-c.done:
		return nil, fmt.Errorf("the coordinator exited before serving: %v\n%s", err, c.logs())
	case <-time.After(60 * time.Second):
		cmd.Process.Kill() //nolint:errcheck
		<-c.done
		return nil, fmt.Errorf("the coordinator did not start serving\n%s", c.logs())
	case <-ctx.Done():
		cmd.Process.Kill() //nolint:errcheck
		<-c.done
		return nil, ctx.Err()
	}
	if slices.Contains(extra, "--metrics-listen") {
		select {
		case <-metrics:
		case <-time.After(10 * time.Second):
			c.stop() //nolint:errcheck
			return nil, fmt.Errorf("the coordinator serves no metrics 10s after it started serving\n%s", c.logs())
		}
	}
	b.logf("coordinator pid %d serving on %s", cmd.Process.Pid, c.addr)
	return c, nil
}

// stopCoordinator stops the running coordinators, if any.
func (b *bench) stopCoordinator() error {
	var errs []error
	for _, c := range []**coordinator{&b.coord, &b.refCoord} {
		if *c != nil {
			errs = append(errs, (*c).stop())
			*c = nil
		}
	}
	return errors.Join(errs...)
}

// withoutJobfenceEnv drops JOBFENCE_* variables: the coordinator's flags fall
// back to them, and the bench gives it every setting it needs explicitly.
func withoutJobfenceEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "JOBFENCE_") {
			out = append(out, kv)
		}
	}
	return out
}

func (c *coordinator) pid() int { return c.cmd.Process.Pid }

// metrics is the address of its /metrics, empty when it serves none.
func (c *coordinator) metrics() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.metricsAddr
}

func (c *coordinator) logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.tail, "\n")
}

// stop sends SIGTERM and waits for a clean exit, killing it after 30 s.
func (c *coordinator) stop() error {
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-c.done:
		if err != nil {
			return fmt.Errorf("coordinator exit: %v\n%s", err, c.logs())
		}
		return nil
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill() //nolint:errcheck
		<-c.done
		return fmt.Errorf("the coordinator did not stop within 30s of SIGTERM\n%s", c.logs())
	}
}

// clients dials n connections to the coordinator, one per simulated worker
// (workers are separate processes in a deployment), and returns a function
// that closes them.
func (c *coordinator) clients(n int) ([]pb.CoordinatorClient, func(), error) {
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, cc := range conns {
			cc.Close()
		}
	}
	out := make([]pb.CoordinatorClient, n)
	for i := range n {
		cc, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, cc)
		out[i] = pb.NewCoordinatorClient(cc)
	}
	return out, closeAll, nil
}

// procCPU is a process's user+system CPU time so far.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces; the fields start after its ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	// Fields 14 and 15 of stat (utime, stime) are 12 and 13 after the name.
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// procPeakRSS is a process's peak resident set (VmHWM) in bytes.
func procPeakRSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// selfCPU is this process's user+system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// findProcess returns the pid of the first live process whose command name
// is one of names, or 0. A server that was just restarted leaves its old
// process behind as a zombie until it is reaped; its CPU time no longer moves,
// so it is passed over.
func findProcess(names ...string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if liveProcess(pid, names...) { // one gone meanwhile is not
			return pid
		}
	}
	return 0
}

// serverPID is the pid of the database server the bench is connected to, on
// this machine: the one its pid file (@@pid_file) names, when that is a live
// mariadbd or mysqld; else the first live process of that name, which on a
// machine running several servers may be another one. 0 when none is found.
func (b *bench) serverPID(ctx context.Context) int {
	var pidFile, dataDir string
	if err := b.admin.QueryRowContext(ctx, `SELECT @@pid_file, @@datadir`).Scan(&pidFile, &dataDir); err == nil {
		if !filepath.IsAbs(pidFile) {
			pidFile = filepath.Join(dataDir, pidFile)
		}
		if data, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && liveProcess(pid, "mariadbd", "mysqld") {
				b.logf("database server pid %d (%s)", pid, pidFile)
				return pid
			}
		}
	}
	pid := findProcess("mariadbd", "mysqld")
	if pid != 0 {
		b.logf("database server pid %d, found by name (its pid file is not readable here)", pid)
	}
	return pid
}

// liveProcess reports whether pid is a live process whose command name is
// one of names.
func liveProcess(pid int, names ...string) bool {
	comm, state, ok := procNameState(pid)
	return ok && state != "Z" && state != "X" && slices.Contains(names, comm)
}

// procNameState is a process's command name and state from /proc/<pid>/stat.
func procNameState(pid int) (comm, state string, ok bool) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", "", false
	}
	// "pid (comm) state ...": the name may hold spaces and parentheses.
	open, end := strings.IndexByte(string(data), '('), strings.LastIndexByte(string(data), ')')
	if open < 0 || end < open {
		return "", "", false
	}
	rest := strings.Fields(string(data[end+1:]))
	if len(rest) == 0 {
		return "", "", false
	}
	return string(data[open+1 : end]), rest[0], true
}

// cpuMeter measures CPU time of the coordinator, the database server and the
// bench itself over an interval.
type cpuMeter struct {
	pids  []int // coordinator (0 when none), database server (0 when unknown)
	start []time.Duration
	self  time.Duration
}

func startCPU(pids ...int) *cpuMeter {
	m := &cpuMeter{pids: pids, start: make([]time.Duration, len(pids)), self: selfCPU()}
	for i, p := range pids {
		if p != 0 {
			m.start[i], _ = procCPU(p)
		}
	}
	return m
}

// perJob returns each process's CPU microseconds per job since start (NaN for
// a process that is not measured), then the bench's own.
func (m *cpuMeter) perJob(jobs int) ([]float64, float64) {
	out := make([]float64, len(m.pids))
	for i, p := range m.pids {
		out[i] = ratio(0, 0)
		if p == 0 {
			continue
		}
		if now, err := procCPU(p); err == nil {
			out[i] = ratio(float64((now - m.start[i]).Microseconds()), float64(jobs))
		}
	}
	return out, ratio(float64((selfCPU() - m.self).Microseconds()), float64(jobs))
}

// dbCounterNames are the server-wide status counters read around a run: the
// statements clients sent, their COMMITs, and InnoDB's fsyncs.
var dbCounterNames = []string{"Questions", "Com_commit", "Innodb_data_fsyncs"}

// dbCounters is a reading of dbCounterNames; a counter the server lacks is
// absent. They count the whole server: the bench assumes it has the server to
// itself while it runs.
type dbCounters map[string]int64

func (b *bench) readDBCounters(ctx context.Context) (dbCounters, error) {
	return b.readStatus(ctx, dbCounterNames...)
}

// readStatus reads the server's global status variables names (SHOW GLOBAL
// STATUS, on MySQL and MariaDB alike); a variable the server lacks is absent.
func (b *bench) readStatus(ctx context.Context, names ...string) (dbCounters, error) {
	rows, err := b.admin.QueryContext(ctx,
		`SHOW GLOBAL STATUS WHERE Variable_name IN ('`+strings.Join(names, "', '")+`')`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := dbCounters{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return nil, err
		}
		if n, err := strconv.ParseInt(value, 10, 64); err == nil {
			out[name] = n
		}
	}
	return out, rows.Err()
}

// perJob returns counter name's growth since before, per job (NaN when the
// server lacks the counter).
func (after dbCounters) perJob(before dbCounters, name string, jobs int) float64 {
	a, ok1 := after[name]
	b, ok2 := before[name]
	if !ok1 || !ok2 {
		return ratio(0, 0)
	}
	return ratio(float64(a-b), float64(jobs))
}
