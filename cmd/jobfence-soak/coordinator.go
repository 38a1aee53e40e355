package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jobfence/jobfence/internal/cli"
)

const (
	// coordinatorStartTimeout bounds how long a coordinator may take to
	// serve its gRPC and metrics listeners.
	coordinatorStartTimeout = time.Minute
	// coordinatorStopTimeout bounds its exit after SIGTERM: its own
	// --shutdown-timeout (15 s by default) and the archiver's release of
	// its lease (10 s at most) fit in it.
	coordinatorStopTimeout = time.Minute
)

// resolveCoordinator uses --coordinator-bin, or builds ./cmd/coordinator
// into a temporary folder.
func (s *soak) resolveCoordinator(ctx context.Context) error {
	if s.cfg.coordinatorBin != "" {
		s.coordBin = s.cfg.coordinatorBin
		return nil
	}
	began := time.Now()
	var err error
	if s.coordBin, s.binDir, err = cli.BuildCoordinator(ctx, "jobfence-soak-"); err != nil {
		return err
	}
	s.logf("built the coordinator in %s", time.Since(began).Round(100*time.Millisecond))
	return nil
}

// coordinator is one coordinator process of the soak.
type coordinator struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it exited
	err  error         // its exit, once done is closed
	// stopping is set before the soak sends SIGTERM: an exit without it is
	// a crash.
	stopping atomic.Bool

	mu          sync.Mutex
	tail        []string // its last log lines, for error reports
	metricsAddr string
	// warnings counts WARN and ERROR records by message, but for those a
	// healthy run logs too (see expectedWarning).
	warnings map[string]int
}

// expectedWarning says whether a WARN record is one every run logs: the
// start-up notice that loopback serves without authentication, and the
// gRPC log of calls that ended with an error code (the worker streams a
// SIGTERM ends, enqueues answered UNAVAILABLE while stopping).
func expectedWarning(msg string) bool {
	return msg == "finished call" || strings.HasPrefix(msg, "NO AUTHENTICATION")
}

// coordinatorArgs are the flags of every coordinator process of the run:
// the soak's own, then --coordinator-flags, which win.
func (s *soak) coordinatorArgs() []string {
	args := []string{"--mysql-dsn", s.dsn, "--listen", s.listen, "--metrics-listen", "127.0.0.1:0",
		"--log-format", "json", "--retain-succeeded", s.cfg.retain.String(),
		"--archive-interval", s.cfg.archiveInterval.String()}
	return append(args, s.cfg.coordFlags...)
}

// startCoordinator starts a coordinator process and waits until it serves
// gRPC on s.listen and its metrics.
func (s *soak) startCoordinator(ctx context.Context) (*coordinator, error) {
	cmd := exec.Command(s.coordBin, s.coordinatorArgs()...)
	cmd.Env = withoutJobfenceEnv(os.Environ())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the coordinator: %w", err)
	}
	c := &coordinator{cmd: cmd, done: make(chan struct{})}
	serving, metrics := make(chan struct{}), make(chan struct{})
	go func() {
		c.read(stderr, s.coordLog, serving, metrics)
		c.err = cmd.Wait()
		close(c.done)
	}()
	timeout := time.NewTimer(coordinatorStartTimeout)
	defer timeout.Stop()
	for _, ready := range []chan struct{}{serving, metrics} {
		select {
		case <-ready:
		case <-c.done:
			return nil, fmt.Errorf("the coordinator exited before serving: %v\n%s", c.err, c.logs())
		case <-timeout.C:
			c.kill()
			return nil, fmt.Errorf("the coordinator did not serve within %s\n%s", coordinatorStartTimeout, c.logs())
		case <-ctx.Done():
			c.kill()
			return nil, ctx.Err()
		}
	}
	return c, nil
}

// read follows the coordinator's JSON log: it keeps the tail, copies every
// line to log (when set), counts ERROR records and signals serving and
// metrics once.
func (c *coordinator) read(r io.Reader, log io.Writer, serving, metrics chan struct{}) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var servingOnce, metricsOnce sync.Once
	for sc.Scan() {
		line := sc.Text()
		if log != nil {
			fmt.Fprintln(log, line)
		}
		var rec struct{ Msg, Level, Listen string }
		parsed := json.Unmarshal([]byte(line), &rec) == nil
		c.mu.Lock()
		if c.tail = append(c.tail, line); len(c.tail) > 50 {
			c.tail = c.tail[1:]
		}
		if parsed && (rec.Level == "WARN" || rec.Level == "ERROR") && !expectedWarning(rec.Msg) {
			if c.warnings == nil {
				c.warnings = map[string]int{}
			}
			c.warnings[rec.Level+" "+rec.Msg]++
		}
		if parsed && rec.Msg == "metrics serving" && c.metricsAddr == "" {
			c.metricsAddr = rec.Listen
		}
		c.mu.Unlock()
		switch {
		case !parsed:
		case rec.Msg == "coordinator serving":
			servingOnce.Do(func() { close(serving) })
		case rec.Msg == "metrics serving":
			metricsOnce.Do(func() { close(metrics) })
		}
	}
	io.Copy(io.Discard, r) //nolint:errcheck // a line over 1 MiB: keep the pipe drained
}

func (c *coordinator) pid() int { return c.cmd.Process.Pid }

// metrics is the address of its /metrics.
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

// warningCounts is its WARN and ERROR records by level and message, but
// the expected ones.
func (c *coordinator) warningCounts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.warnings)
}

// stop sends SIGTERM and waits for a clean exit, killing it after
// coordinatorStopTimeout. Errors: it exited non-zero, or had to be killed.
func (c *coordinator) stop() error {
	c.stopping.Store(true)
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		select {
		case <-c.done: // it had exited already
			return fmt.Errorf("the coordinator had exited: %v\n%s", c.err, c.logs())
		default:
			return err
		}
	}
	select {
	case <-c.done:
		if c.err != nil {
			return fmt.Errorf("coordinator exit after SIGTERM: %v\n%s", c.err, c.logs())
		}
		return nil
	case <-time.After(coordinatorStopTimeout):
		c.kill()
		return fmt.Errorf("the coordinator did not stop within %s of SIGTERM\n%s", coordinatorStopTimeout, c.logs())
	}
}

// kill ends it at once and waits for its exit.
func (c *coordinator) kill() {
	c.stopping.Store(true)
	c.cmd.Process.Kill() //nolint:errcheck // it may have exited
	<-c.done
}

// withoutJobfenceEnv drops JOBFENCE_* variables: the coordinator's flags
// fall back to them, and the soak gives it every setting explicitly.
func withoutJobfenceEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "JOBFENCE_") {
			out = append(out, kv)
		}
	}
	return out
}

// freeLoopbackPort returns a loopback address whose port is free now, for
// every coordinator of the run to bind: the workers and the producer find
// the restarted one where the first was. The port lies below the kernel's
// ephemeral range, so that no outgoing connection or port-0 listener takes
// it between the SIGTERM and the restart.
func freeLoopbackPort() (string, error) {
	low := firstEphemeralPort()
	from := max(1024, low-10000)
	for range 200 {
		port := from + rand.IntN(low-from)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken
		}
		addr := l.Addr().String()
		l.Close()
		return addr, nil
	}
	return "", fmt.Errorf("no free loopback port in %d..%d", from, low-1)
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
