package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
)

// holderCommand, as the first argument, makes the bench binary the worker
// process of scenario G: a Go SDK worker that claims jobs and holds each in
// a provider call that does not return, renewing their leases (or not),
// until the bench kills it with SIGKILL. It prints "claimed <job id>
// <attempt>" on stdout for every job granted, and exits when its stdin
// closes (the bench is gone) or after --hold.
const holderCommand = "hold-jobs"

// holderConfig is the holder's flags.
type holderConfig struct {
	coordinator   string
	workerID      string
	provider      string
	jobs          int
	lease         time.Duration
	renewInterval time.Duration
	noRenewal     bool
	hold          time.Duration
}

// args renders c as the holder's command line.
func (c holderConfig) args() []string {
	args := []string{holderCommand, "--coordinator", c.coordinator, "--worker-id", c.workerID, "--provider", c.provider,
		"--jobs", fmt.Sprint(c.jobs), "--lease", c.lease.String(), "--renew-interval", c.renewInterval.String(),
		"--hold", c.hold.String()}
	if c.noRenewal {
		args = append(args, "--no-lease-renewal")
	}
	return args
}

func parseHolderFlags(args []string, stderr io.Writer) (holderConfig, error) {
	var c holderConfig
	fs := flag.NewFlagSet(holderCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.coordinator, "coordinator", "", "coordinator gRPC address")
	fs.StringVar(&c.workerID, "worker-id", "bench-holder", "worker id in the job history")
	fs.StringVar(&c.provider, "provider", "", "claim only this provider's jobs")
	fs.IntVar(&c.jobs, "jobs", 20, "jobs held at once (the worker's concurrency, 1..100)")
	fs.DurationVar(&c.lease, "lease", 5*time.Second, "lease asked for")
	fs.DurationVar(&c.renewInterval, "renew-interval", 0, "renewal interval; 0: a third of the lease")
	fs.BoolVar(&c.noRenewal, "no-lease-renewal", false, "never renew a lease")
	fs.DurationVar(&c.hold, "hold", 5*time.Minute, "how long each provider call takes, and the longest the process lives")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.coordinator == "":
		return c, errors.New("--coordinator is required")
	case c.jobs < 1 || c.jobs > 100:
		return c, fmt.Errorf("--jobs must be 1..100, got %d", c.jobs)
	case c.lease < time.Second, c.hold <= 0, c.renewInterval < 0:
		return c, errors.New("--lease must be at least 1s, --hold positive, --renew-interval not negative")
	}
	return c, nil
}

// runHolder is the holder process.
func runHolder(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c, err := parseHolderFlags(args, stderr)
	if err != nil {
		return err
	}
	client, err := jobfence.Dial(c.coordinator)
	if err != nil {
		return err
	}
	defer client.Close()
	var mu sync.Mutex
	hold := func(ctx context.Context, job jobfence.ClaimedJob) jobfence.Result {
		select {
		case <-ctx.Done():
			return jobfence.Unknown(context.Cause(ctx))
		case <-time.After(c.hold):
			return jobfence.Unknown(errors.New("held to the end"))
		}
	}
	w, err := jobfence.NewWorker(client, jobfence.HandlerFuncs{RefundFunc: hold, ReconcileFunc: hold}, jobfence.WorkerOptions{
		WorkerID: c.workerID, Concurrency: c.jobs, Provider: c.provider, Lease: c.lease,
		RenewInterval: c.renewInterval, NoLeaseRenewal: c.noRenewal, ProviderTimeout: c.hold + time.Minute,
		ClaimWait: time.Second, DrainTimeout: time.Second, ReceiptSpool: jobfence.ReceiptSpoolOff,
		OnEvent: func(e jobfence.WorkerEvent) {
			if e.Kind == jobfence.WorkerClaimed {
				mu.Lock()
				fmt.Fprintf(stdout, "claimed %d %d\n", e.Job.Job.ID, e.Job.Attempt)
				mu.Unlock()
			}
		},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.hold)
	defer cancel()
	go func() {
		// The bench holds the other end of stdin: when it is gone, so is
		// the reason to hold anything.
		io.Copy(io.Discard, stdin) //nolint:errcheck
		cancel()
	}()
	err = w.Run(ctx)
	if errors.Is(err, jobfence.ErrDrainTimeout) {
		err = nil // the held calls never return: expected
	}
	return err
}

// holderMain runs the holder when the bench binary is started as one.
func holderMain(ctx context.Context) error {
	return runHolder(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr)
}

// holder is a running holder process, seen from the bench: the jobs it
// reports granted, the tail of its log, and SIGKILL.
type holder struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	claims  chan [2]int64 // job id, attempt
	done    chan struct{}
	mu      sync.Mutex
	tail    []string
	stopped sync.Once
}

// startHolder runs self, the bench binary, as the holder process with c.
func startHolder(self string, c holderConfig) (*holder, error) {
	cmd := exec.Command(self, c.args()...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the worker process: %w", err)
	}
	h := &holder{cmd: cmd, stdin: stdin, claims: make(chan [2]int64, 2*c.jobs), done: make(chan struct{})}
	var pipes sync.WaitGroup
	pipes.Go(func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var id, attempt int64
			if _, err := fmt.Sscanf(sc.Text(), "claimed %d %d", &id, &attempt); err == nil {
				select {
				case h.claims <- [2]int64{id, attempt}:
				default:
				}
			}
		}
	})
	pipes.Go(func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			h.mu.Lock()
			if h.tail = append(h.tail, sc.Text()); len(h.tail) > 30 {
				h.tail = h.tail[1:]
			}
			h.mu.Unlock()
		}
	})
	go func() {
		pipes.Wait()
		cmd.Wait() //nolint:errcheck // killed on purpose
		close(h.done)
	}()
	return h, nil
}

// waitClaimed waits until the holder reports a first grant of every job of
// ids, and returns when the last came.
func (h *holder) waitClaimed(ctx context.Context, ids []int64, timeout time.Duration) (time.Time, error) {
	want := map[int64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for len(want) > 0 {
		select {
		case c := <-h.claims:
			if !want[c[0]] || c[1] != 1 {
				return time.Time{}, fmt.Errorf("the worker process was granted job %d attempt %d, want one of its jobs, attempt 1",
					c[0], c[1])
			}
			delete(want, c[0])
		case <-h.done:
			return time.Time{}, fmt.Errorf("the worker process exited holding %d of %d jobs\n%s", len(ids)-len(want), len(ids), h.logs())
		case <-timer.C:
			return time.Time{}, fmt.Errorf("the worker process held %d of %d jobs after %s\n%s",
				len(ids)-len(want), len(ids), timeout, h.logs())
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
	return time.Now(), nil
}

func (h *holder) exited() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (h *holder) kill() {
	h.stopped.Do(func() {
		h.cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck
		<-h.done
		h.stdin.Close()
	})
}

func (h *holder) logs() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.tail, "\n")
}
