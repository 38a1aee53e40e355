package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// proc is one child process of the campaign. Its stderr and stdout go to a
// log file; JSON log lines are also parsed and kept in memory, for ready
// records and for the workers' receipts (invariant 5).
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File

	mu      sync.Mutex
	records []map[string]any
	changed chan struct{} // closed and replaced when a record arrives or the process exits

	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done

	// meant is set before the campaign signals the process to end, so that
	// its exit counts as intended.
	meant atomic.Bool
	// stopped is set while the process is frozen by SIGSTOP.
	stopped atomic.Bool
	// frozen are the spans the process spent frozen (the last one open,
	// with a zero To, while it is frozen): a log line read after a freeze
	// may tell of something that happened before it.
	frozen []span
	// ended is when the process stopped working: the campaign sent it
	// SIGKILL or SIGTERM, or it exited, whichever came first.
	ended time.Time
	// ready is when the campaign read its ready line (zero until then).
	ready time.Time
}

// span is a stretch of the campaign's time; a zero To is still open.
type span struct{ From, To time.Time }

// seenKey is the key under which every parsed JSON record carries the time
// the campaign read it (time.Time): one clock for every process's lines and
// for the campaign's own steps, such as a database failover.
const seenKey = "jobfence_chaos_seen"

// startProc runs bin with args and env (added to the campaign's own
// environment), writing its output to logPath. The child is killed if the
// campaign dies (Pdeathsig). Errors: the log file or the process could not
// be created.
func startProc(name, bin string, args, env []string, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = f
	// Children die with the campaign, even when it is killed itself; in
	// their own process group, a Ctrl-C reaches only the campaign, which
	// then ends them itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: f, changed: make(chan struct{}), done: make(chan struct{})}
	go p.read(stderr)
	return p, nil
}

func (p *proc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		p.mu.Lock()
		p.log.Write(line)         //nolint:errcheck // best effort
		p.log.Write([]byte{'\n'}) //nolint:errcheck
		var rec map[string]any
		if json.Unmarshal(line, &rec) == nil {
			rec[seenKey] = time.Now()
			p.records = append(p.records, rec)
			close(p.changed)
			p.changed = make(chan struct{})
		}
		p.mu.Unlock()
	}
	io.Copy(io.Discard, r) //nolint:errcheck
	err := p.cmd.Wait()
	p.mu.Lock()
	if p.ended.IsZero() {
		p.ended = time.Now()
	}
	p.err = err
	p.log.Close()
	close(p.done)
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitErr is the process's exit status once it has ended.
func (p *proc) exitErr() error {
	<-p.done
	return p.err
}

// pid is the process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// signal sends sig. Errors: the process is gone.
func (p *proc) signal(sig syscall.Signal) error {
	if p.exited() {
		return errors.New(p.name + " has exited")
	}
	switch sig {
	case syscall.SIGSTOP:
		p.stopped.Store(true)
		p.mu.Lock()
		if n := len(p.frozen); n == 0 || !p.frozen[n-1].To.IsZero() {
			p.frozen = append(p.frozen, span{From: time.Now()})
		}
		p.mu.Unlock()
	case syscall.SIGCONT:
		p.stopped.Store(false)
		p.mu.Lock()
		if n := len(p.frozen); n > 0 && p.frozen[n-1].To.IsZero() {
			p.frozen[n-1].To = time.Now()
		}
		p.mu.Unlock()
	case syscall.SIGKILL, syscall.SIGTERM:
		p.meant.Store(true)
		p.mu.Lock()
		if p.ended.IsZero() {
			p.ended = time.Now()
		}
		p.mu.Unlock()
	}
	return p.cmd.Process.Signal(sig)
}

// kill ends the process with SIGKILL (after a SIGCONT, in case it is frozen)
// and waits for it.
func (p *proc) kill() {
	if p.exited() {
		return
	}
	_ = p.signal(syscall.SIGCONT)
	_ = p.signal(syscall.SIGKILL)
	<-p.done
}

// terminate sends SIGTERM and waits up to grace for the process to end,
// then kills it. It reports whether the process ended on its own.
func (p *proc) terminate(grace time.Duration) bool {
	if p.exited() {
		return true
	}
	_ = p.signal(syscall.SIGCONT)
	_ = p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return true
	case <-time.After(grace):
		p.kill()
		return false
	}
}

// waitRecord waits up to d for a JSON log record for which match is true,
// looking at records from index from on. It fails when the process exits
// first or d passes.
func (p *proc) waitRecord(d time.Duration, from int, match func(map[string]any) bool) (map[string]any, error) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	seen := from
	for {
		p.mu.Lock()
		var recs []map[string]any
		if seen < len(p.records) {
			recs = p.records[seen:]
		}
		seen = max(seen, len(p.records))
		changed := p.changed
		p.mu.Unlock()
		for _, r := range recs {
			if match(r) {
				return r, nil
			}
		}
		if p.exited() && len(recs) == 0 {
			return nil, fmt.Errorf("%s exited (%v)", p.name, p.err)
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil, fmt.Errorf("%s: no matching log record within %s", p.name, d)
		}
	}
}

// waitAny waits up to d for a record for which match is true in any of ps,
// looking at each from the record count it has when called. It returns the
// first such record and its process.
func waitAny(ps []*proc, d time.Duration, match func(map[string]any) bool) (*proc, map[string]any, error) {
	from := make([]int, len(ps))
	for i, p := range ps {
		from[i] = p.recordCount()
	}
	return waitAnyFrom(ps, from, d, match)
}

// waitAnyFrom is waitAny looking at each ps[i]'s records from index from[i] on.
func waitAnyFrom(ps []*proc, from []int, d time.Duration, match func(map[string]any) bool) (*proc, map[string]any, error) {
	type hit struct {
		p   *proc
		rec map[string]any
	}
	found := make(chan hit, len(ps))
	done := make(chan struct{})
	defer close(done)
	for i, p := range ps {
		go func() {
			// The losers give up at their next record once done is closed,
			// or after d.
			rec, err := p.waitRecord(d, from[i], func(r map[string]any) bool {
				select {
				case <-done:
					return true
				default:
					return match(r)
				}
			})
			if err == nil {
				found <- hit{p, rec}
			}
		}()
	}
	select {
	case h := <-found:
		return h.p, h.rec, nil
	case <-time.After(d):
		return nil, nil, fmt.Errorf("no matching log record within %s", d)
	}
}

// recordCount is how many JSON records arrived so far.
func (p *proc) recordCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.records)
}

// allRecords returns the JSON log records so far.
func (p *proc) allRecords() []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.records...)
}

// frozenSpans returns the spans the process spent frozen so far.
func (p *proc) frozenSpans() []span {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]span(nil), p.frozen...)
}

// endedAt is when the process stopped working (zero while it runs).
func (p *proc) endedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended
}

// readyAt is when the campaign read the process's ready line.
func (p *proc) readyAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

// markReady notes rec, the process's ready line.
func (p *proc) markReady(rec map[string]any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready = seenAt(rec)
}

// seenAt is when the campaign read record r (zero for a record it did not
// read itself, such as a test's).
func seenAt(r map[string]any) time.Time {
	t, _ := r[seenKey].(time.Time)
	return t
}

// msgIs matches a record by its msg.
func msgIs(msg string) func(map[string]any) bool {
	return func(r map[string]any) bool { return r["msg"] == msg }
}
