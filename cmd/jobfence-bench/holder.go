package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	jobfence "github.com/jobfence/jobfence/clients/go"
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
