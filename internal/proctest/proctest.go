// Package proctest builds the project's commands once per test binary and runs
// them as real processes: a coordinator on a free loopback port whose address
// is read from its JSON log line msg="coordinator serving", field "listen",
// and any other command whose logs and output a test inspects.
//
// Under go test -short (make test-fast) it builds nothing and Start skips
// every test that would run a command: those tests are left to the full run
// (make test, CI).
package proctest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Short reports whether the tests run under go test -short, which leaves
// out the tests that run the project's commands as processes. A TestMain may
// call it before m.Run (it parses the test flags then) to build nothing.
func Short() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	return testing.Short()
}

// Build compiles the main package pkg (an import path, or a directory
// relative to the caller's working directory) into dir/name and returns the
// binary's path. Under -short (Short) it only returns the path: no test will
// run the binary. Errors: the go build failure with its output.
func Build(dir, name, pkg string) (string, error) {
	out := filepath.Join(dir, name)
	if Short() {
		return out, nil
	}
	cmd := exec.Command("go", "build", "-o", out, pkg)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, buf.String())
	}
	return out, nil
}

// Process is a command started by Start. Its stderr is read as log lines
// (JSON records when the command logs JSON); its stdout is kept whole.
type Process struct {
	Cmd *exec.Cmd
	// Addr is the "listen" field of the ready record, when Start waited for
	// one that had it.
	Addr string

	mu      sync.Mutex
	logs    strings.Builder
	records []map[string]any
	stdout  bytes.Buffer
	changed chan struct{} // closed and replaced whenever a log line arrives

	done chan struct{}
	err  error // Wait's result, once done is closed
}

// Options say how to start a command.
type Options struct {
	Args []string
	Env  []string // added to the test's environment
	// Ready, when set, is the msg of the JSON log record Start waits for.
	Ready string
	// ReadyTimeout bounds that wait (default 30s).
	ReadyTimeout time.Duration
}

// Start runs bin and, when o.Ready is set, waits for its ready record. The
// process is killed (after a SIGCONT, in case a test froze it) when t ends.
// It fails t when the command cannot start, exits before it is ready or is
// not ready in time. Under go test -short it skips t instead (SkipShort).
func Start(t testing.TB, bin string, o Options) *Process {
	t.Helper()
	SkipShort(t, filepath.Base(bin))
	cmd := exec.Command(bin, o.Args...)
	cmd.Env = append(os.Environ(), o.Env...)
	p := &Process{Cmd: cmd, changed: make(chan struct{}), done: make(chan struct{})}
	cmd.Stdout = &lockedWriter{mu: &p.mu, w: &p.stdout}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			p.addLine(sc.Text())
		}
		io.Copy(io.Discard, stderr) //nolint:errcheck
		p.err = cmd.Wait()
		close(p.done)
		p.mu.Lock()
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}()
	t.Cleanup(func() {
		if !p.Exited() {
			cmd.Process.Signal(syscall.SIGCONT) //nolint:errcheck
			cmd.Process.Kill()                  //nolint:errcheck
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s logs:\n%s", filepath.Base(bin), p.Logs())
		}
	})
	if o.Ready != "" {
		d := o.ReadyTimeout
		if d == 0 {
			d = 30 * time.Second
		}
		rec, ok := p.WaitRecord(d, func(r map[string]any) bool { return r["msg"] == o.Ready })
		if !ok {
			t.Fatalf("%s: no %q log record within %s (exited: %v)\n%s", filepath.Base(bin), o.Ready, d, p.Exited(), p.Logs())
		}
		p.Addr, _ = rec["listen"].(string)
	}
	return p
}

// SkipShort skips t under go test -short: it runs the command what as a
// process. Start calls it; so does a test that runs a command another way.
func SkipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: runs %s as a process", what)
	}
}

// StartCoordinator runs the coordinator binary with args plus a free
// loopback listener and JSON logs, and waits until it serves.
func StartCoordinator(t testing.TB, bin string, args ...string) *Process {
	t.Helper()
	return Start(t, bin, Options{
		Args:  append([]string{"--listen", "127.0.0.1:0", "--log-format", "json"}, args...),
		Ready: "coordinator serving",
	})
}

func (p *Process) addLine(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.logs.WriteString(line + "\n")
	var rec map[string]any
	if json.Unmarshal([]byte(line), &rec) == nil {
		p.records = append(p.records, rec)
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// WaitRecord waits up to d for a JSON log record for which match is true and
// returns it.
func (p *Process) WaitRecord(d time.Duration, match func(map[string]any) bool) (map[string]any, bool) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	seen := 0
	for {
		p.mu.Lock()
		recs, changed := p.records[seen:], p.changed
		seen = len(p.records)
		p.mu.Unlock()
		for _, r := range recs {
			if match(r) {
				return r, true
			}
		}
		if p.Exited() {
			p.mu.Lock()
			more := len(p.records) > seen
			p.mu.Unlock()
			if !more {
				return nil, false
			}
			continue
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil, false
		}
	}
}

// Records returns the JSON log records so far.
func (p *Process) Records() []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.records...)
}

// Logs returns everything written to stderr so far.
func (p *Process) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// Stdout returns everything written to stdout so far.
func (p *Process) Stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String()
}

// Signal sends sig to the process. Errors: those of os.Process.Signal.
func (p *Process) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits up to d for the process to exit and returns its exit error
// (nil for status 0). It fails t if the process is still running after d.
func (p *Process) Wait(t testing.TB, d time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		t.Fatalf("%s still running after %s\n%s", filepath.Base(p.Cmd.Path), d, p.Logs())
		return nil
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// WaitFor polls cond every 20 ms until it holds, failing t after d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Buffer is a bytes.Buffer that goroutines may write concurrently: a log
// sink for a server, a worker or a command run in the test's process.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
