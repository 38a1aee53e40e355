package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
)

const (
	// workerRetryAttempts, with its backoff of 100 ms doubling to 1 s,
	// lets a worker's write-backs outlast a restart of some 30 s (R21):
	// SDK defaults would give up after about 5 s.
	workerRetryAttempts = 35
	// workerDrainTimeout bounds the workers' drain at the end.
	workerDrainTimeout = 10 * time.Second
)

// fleet is the soak's Go SDK workers, in this process, each on its own
// connection and worker stream (the SDK's default), completing every
// refund after --provider-time.
type fleet struct {
	s       *soak
	clients []*jobfence.Client
	cancel  context.CancelFunc
	running sync.WaitGroup
	stopped sync.Once

	claimed    atomic.Int64 // jobs granted
	takeovers  atomic.Int64 // of which taken over from an expired lease
	reconciles atomic.Int64 // reconcile handler calls
	streamEnds atomic.Int64 // worker streams that ended or failed to open (WorkerClaimFailed)
	renewFails atomic.Int64
	// staleAfterRestart counts write-backs refused as stale around a
	// restart: grants the stopping coordinator handed back because their
	// acknowledgement had not reached it when their stream ended
	// (docs/DESIGN.md, "The worker stream"), done again by a later attempt.
	staleAfterRestart atomic.Int64
}

// startFleet starts the workers; they run until stop.
func (s *soak) startFleet(ctx context.Context) (*fleet, error) {
	f := &fleet{s: s}
	runCtx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	provider := s.cfg.providerTime
	refund := func(ctx context.Context, job jobfence.ClaimedJob) jobfence.Result {
		if provider > 0 {
			t := time.NewTimer(provider)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return jobfence.Unknown(context.Cause(ctx))
			}
		}
		return jobfence.Succeeded(fmt.Sprintf("re_soak_%d", job.Job.ID))
	}
	// A reconcile follows a takeover (R14): the refund was sent, and the
	// provider has it.
	reconcile := func(ctx context.Context, job jobfence.ClaimedJob) jobfence.Result {
		f.reconciles.Add(1)
		return jobfence.Succeeded(fmt.Sprintf("re_soak_%d", job.Job.ID))
	}
	for w := range s.cfg.workers {
		c, err := jobfence.Dial(s.listen, jobfence.WithRetry(workerRetryAttempts, 100*time.Millisecond, time.Second))
		if err != nil {
			f.stop()
			return nil, err
		}
		f.clients = append(f.clients, c)
		wk, err := jobfence.NewWorker(c, jobfence.HandlerFuncs{RefundFunc: refund, ReconcileFunc: reconcile},
			jobfence.WorkerOptions{WorkerID: fmt.Sprintf("soak-%d", w), Concurrency: s.cfg.slots,
				DrainTimeout: workerDrainTimeout, ReceiptSpool: jobfence.ReceiptSpoolOff, OnEvent: f.event})
		if err != nil {
			f.stop()
			return nil, err
		}
		f.running.Go(func() {
			if err := wk.Run(runCtx); err != nil {
				s.fail("worker soak-%d: %v", w, err)
			}
		})
	}
	return f, nil
}

// stop drains the workers and closes their connections; once.
func (f *fleet) stop() {
	f.stopped.Do(func() {
		f.cancel()
		f.running.Wait()
		for _, c := range f.clients {
			c.Close()
		}
	})
}

// event takes every worker event. A stream ending, or a renewal failing,
// while the coordinator restarts is expected, and so is a write-back
// refused as stale (with the observation the worker files for it): a
// grant sent just before the stopping coordinator ended its stream, whose
// acknowledgement it had not read, is handed back, and its token writes
// nothing more (R25) while the job's next attempt completes it; the
// producer's check that every job completes exactly once still holds. Anything
// else that is not a completion is a functional failure.
func (f *fleet) event(e jobfence.WorkerEvent) {
	switch e.Kind {
	case jobfence.WorkerClaimed:
		f.claimed.Add(1)
		if e.Job.Takeover {
			f.takeovers.Add(1)
		}
	case jobfence.WorkerHandled:
	case jobfence.WorkerWritten:
		if e.Decision.Kind != jobfence.DecideComplete {
			f.s.fail("worker wrote %s for job %d (%s) attempt %d instead of completing it", e.Decision.Kind,
				e.Job.Job.ID, e.Job.Job.OperationKey, e.Job.Attempt)
			return
		}
		f.s.prod.complete(e.Job.Job.OperationKey, e.Job.Job.ID, e.Replayed, f.s.clock())
	case jobfence.WorkerClaimFailed, jobfence.WorkerRenewFailed:
		if e.Kind == jobfence.WorkerClaimFailed {
			f.streamEnds.Add(1)
		} else {
			f.renewFails.Add(1)
		}
		if !f.s.restarting() {
			f.s.fail("worker %s outside a restart: %v", e.Kind, e.Err)
		}
	case jobfence.WorkerStale, jobfence.WorkerObserved:
		if f.s.restarting() {
			if e.Kind == jobfence.WorkerStale {
				f.staleAfterRestart.Add(1)
			}
			return
		}
		f.s.fail("worker %s outside a restart: job %d (%s) attempt %d: %v", e.Kind, e.Job.Job.ID,
			e.Job.Job.OperationKey, e.Job.Attempt, e.Err)
	default:
		f.s.fail("worker %s: job %d (%s) attempt %d: %v", e.Kind, e.Job.Job.ID, e.Job.Job.OperationKey,
			e.Job.Attempt, e.Err)
	}
}
