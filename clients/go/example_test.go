package jobfence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	jobfence "github.com/jobfence/jobfence/clients/go"
	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store/sqlite"
)

// A worker that refunds through a payment provider: the handler sends the
// refund under the job's operation key and reports what the provider said;
// the Worker makes the fenced write-back.
func Example() {
	ctx := context.Background()
	addr, stop := exampleCoordinator()
	defer stop()
	provider := httptest.NewServer(fakeprovider.New(fakeprovider.Config{}))
	defer provider.Close()
	pay := fakeprovider.NewClient(provider.URL, nil)

	client, err := jobfence.Dial(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	job, _, err := client.EnqueueRefund(ctx, jobfence.EnqueueRequest{
		OperationKey: "refund-1001", OrderID: "order-77", PaymentID: "pay-42",
		AmountMinor: 1999, Currency: "EUR", Provider: "acme",
	})
	if err != nil {
		log.Fatal(err)
	}

	handler := jobfence.HandlerFuncs{
		// The operation key is the Idempotency-Key, whoever holds the job (R1).
		RefundFunc: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
			r, err := pay.CreateRefund(ctx, j.Job.OperationKey, fakeprovider.RefundParams{
				PaymentID: j.Job.PaymentID, AmountMinor: j.Job.AmountMinor, Currency: j.Job.Currency,
			})
			if err != nil {
				return jobfence.Unknown(err) // the refund may exist: reconcile next (R14)
			}
			return exampleResult(r)
		},
		// Ask the provider what happened under the key (R14).
		ReconcileFunc: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
			found, err := pay.FindByReference(ctx, j.Job.OperationKey)
			if err != nil {
				return jobfence.Unknown(err)
			}
			if len(found) == 0 {
				return jobfence.NoRecord()
			}
			return exampleResult(found[0])
		},
	}
	worker, err := jobfence.NewWorker(client, handler, jobfence.WorkerOptions{
		WorkerID:        "worker-1",
		Concurrency:     4,
		Lease:           30 * time.Second,
		ProviderTimeout: 3 * time.Second,
		PollInterval:    50 * time.Millisecond,
		// This provider replays a same-key, same-body request inside its
		// retention window (which the coordinator knows, R22).
		Policy: jobfence.ProviderPolicy{SameKeyResendSafe: true},
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, shutdown := context.WithCancel(ctx) // in a command: signal.NotifyContext
	done := make(chan error, 1)
	go func() { done <- worker.Run(runCtx) }()

	for {
		d, err := client.GetJob(ctx, job.ID)
		if err != nil {
			log.Fatal(err)
		}
		if d.Job.State.Final() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	shutdown() // stop claiming, drain what is in flight
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	d, err := client.GetJob(ctx, job.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Job.OperationKey, d.Job.State, d.Job.ProviderRefundID)
	for _, e := range d.Events {
		fmt.Printf("%s under attempt %d by %q\n", e.Kind, e.Attempt, e.WorkerID)
	}
	// Output:
	// refund-1001 succeeded re_000001
	// enqueued under attempt 0 by ""
	// claimed under attempt 1 by "worker-1"
	// completed under attempt 1 by "worker-1"
}

// A write-back carrying an attempt that was taken over is rejected: branch on
// the typed error, never on the message, and file what the provider said
// instead of retrying (R9, R15).
func ExampleStaleAttemptError() {
	ctx := context.Background()
	addr, stop := exampleCoordinator()
	defer stop()
	client, err := jobfence.Dial(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	job, _, err := client.EnqueueRefund(ctx, jobfence.EnqueueRequest{
		OperationKey: "refund-2002", OrderID: "order-78", PaymentID: "pay-43",
		AmountMinor: 500, Currency: "EUR", Provider: "acme",
	})
	if err != nil {
		log.Fatal(err)
	}
	claim := func(worker string) jobfence.ClaimedJob {
		jobs, err := client.Claim(ctx, jobfence.ClaimRequest{WorkerID: worker, MaxJobs: 1, Lease: time.Second})
		if err != nil || len(jobs) != 1 {
			log.Fatal(jobs, err)
		}
		return jobs[0]
	}
	a := claim("worker-a")
	time.Sleep(1100 * time.Millisecond) // A hangs past its lease
	b := claim("worker-b")              // B takes over and must reconcile first
	fmt.Println("B: attempt", b.Attempt, "takeover", b.Takeover, "next", b.NextAction)
	if _, err := client.Complete(ctx, jobfence.CompleteRequest{JobID: job.ID, Attempt: b.Attempt, LeaseToken: b.LeaseToken, ProviderRefundID: "re_77"}); err != nil {
		log.Fatal(err)
	}

	_, err = client.Complete(ctx, jobfence.CompleteRequest{JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken, ProviderRefundID: "re_77"})
	var stale *jobfence.StaleAttemptError
	if errors.As(err, &stale) {
		fmt.Println("A: stale; the job is", stale.CurrentState, "under attempt", stale.CurrentAttempt)
		_, _, err := client.ReportObservation(ctx, jobfence.ObservationRequest{
			JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Source: "worker:worker-a",
			Outcome: jobfence.OutcomeSucceeded, ProviderRefundID: "re_77",
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	d, err := client.GetJob(ctx, job.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Job.State, "with", len(d.Observations), "observation from", d.Observations[0].Source)
	// Output:
	// B: attempt 2 takeover true next reconcile
	// A: stale; the job is succeeded under attempt 2
	// succeeded with 1 observation from worker:worker-a
}

// exampleResult maps a provider refund to a Result.
func exampleResult(r fakeprovider.Refund) jobfence.Result {
	switch r.Status {
	case fakeprovider.StatusSucceeded:
		return jobfence.Succeeded(r.ID)
	case fakeprovider.StatusPending:
		return jobfence.Pending(r.ID, 0)
	default:
		return jobfence.Failed(r.ID, r.FailureReason)
	}
}

// exampleCoordinator serves a coordinator on the embedded store over a
// loopback socket, as `go run ./cmd/coordinator` would.
func exampleCoordinator() (addr string, stop func()) {
	dir, err := os.MkdirTemp("", "jobfence-example-")
	if err != nil {
		log.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "jobfence.db"), sqlite.Options{})
	if err != nil {
		log.Fatal(err)
	}
	gs, _ := server.New(st, server.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).NewGRPCServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go gs.Serve(lis) //nolint:errcheck
	return lis.Addr().String(), func() {
		gs.Stop()
		st.Close()
		os.RemoveAll(dir)
	}
}
