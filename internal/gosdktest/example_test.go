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
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
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
func Example_staleAttemptError() {
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

// A whole worker process: refundHandler asks the provider under each job's
// operation key and says what it answered, and runRefundWorker is the command's
// body, run until its context ends as SIGTERM ends it (the README's "A whole
// worker" is the same program as a main package). Here the producer enqueues
// three refunds, the worker makes them, and the SIGTERM comes once they are
// done: the worker drains and stops.
func Example_worker() {
	addr, stopCoordinator := exampleCoordinator()
	defer stopCoordinator()
	provider := httptest.NewServer(fakeprovider.New(fakeprovider.Config{}))
	defer provider.Close()
	stateDir, err := os.MkdirTemp("", "jobfence-worker-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(stateDir)

	// The producer: three refunds.
	ctx := context.Background()
	producer, err := jobfence.Dial(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	var ids []int64
	for _, n := range []string{"3001", "3002", "3003"} {
		job, _, err := producer.EnqueueRefund(ctx, jobfence.EnqueueRequest{OperationKey: "refund-" + n,
			OrderID: "order-" + n, PaymentID: "pay-" + n, AmountMinor: 1250, Currency: "EUR", Provider: "acme"})
		if err != nil {
			log.Fatal(err)
		}
		ids = append(ids, job.ID)
	}

	// The worker process, until "SIGTERM".
	runCtx, sigterm := context.WithCancel(ctx) // in main: signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	type result struct {
		stats jobfence.WorkerStats
		err   error
	}
	ran := make(chan result, 1)
	go func() {
		stats, err := runRefundWorker(runCtx, workerConfig{Coordinator: addr, Provider: provider.URL,
			WorkerID: "refunds-1", StateDir: stateDir})
		ran <- result{stats, err}
	}()
	for _, id := range ids {
		for {
			d, err := producer.GetJob(ctx, id)
			if err != nil {
				log.Fatal(err)
			}
			if d.Job.State.Final() {
				fmt.Println(d.Job.OperationKey, d.Job.State, "under attempt", d.Job.Attempt)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	sigterm()
	r := <-ran
	if r.err != nil {
		log.Fatal(r.err)
	}
	fmt.Println("completed:", r.stats.Completed, "stale:", r.stats.StaleRejected)
	// Output:
	// refund-3001 succeeded under attempt 1
	// refund-3002 succeeded under attempt 1
	// refund-3003 succeeded under attempt 1
	// completed: 3 stale: 0
}

// workerConfig is what the worker command reads from its flags.
type workerConfig struct {
	Coordinator string // host:port of the coordinator
	Provider    string // base URL of the payment provider
	WorkerID    string // stable across restarts: the receipt spool is named after it
	StateDir    string // where the receipt spool lives
	TokenFile   string // bearer token, when the coordinator has a tokens file
}

// runRefundWorker works refunds until ctx ends, then drains: the jobs in flight
// finish their provider call and write back (DrainTimeout bounds it).
func runRefundWorker(ctx context.Context, cfg workerConfig) (jobfence.WorkerStats, error) {
	var opts []jobfence.Option
	if cfg.TokenFile != "" {
		opts = append(opts, jobfence.WithBearerToken(func(context.Context) (string, error) {
			b, err := os.ReadFile(cfg.TokenFile) // read per call: a rotated token is picked up
			return strings.TrimSpace(string(b)), err
		})) // and jobfence.WithTLS(…): a token is sent only over TLS, or to loopback with WithPlaintextTokens
	}
	client, err := jobfence.Dial(cfg.Coordinator, opts...)
	if err != nil {
		return jobfence.WorkerStats{}, err
	}
	defer client.Close()
	w, err := jobfence.NewWorker(client, refundHandler{pay: fakeprovider.NewClient(cfg.Provider, nil)},
		jobfence.WorkerOptions{
			WorkerID:        cfg.WorkerID,
			Provider:        "acme",           // only this provider's jobs
			Concurrency:     8,                // jobs in flight; granted only for free slots (R18)
			Lease:           10 * time.Second, // renewed while a handler runs (R27)
			ProviderTimeout: 5 * time.Second,
			// acme replays a same-key, same-body request inside its key
			// retention window, which the coordinator knows (R14, R22).
			Policy:       jobfence.ProviderPolicy{SameKeyResendSafe: true},
			ReceiptSpool: filepath.Join(cfg.StateDir, cfg.WorkerID+".receipts.jsonl"),
		})
	if err != nil {
		return jobfence.WorkerStats{}, err
	}
	err = w.Run(ctx)
	return w.Stats(), err
}

// refundHandler is the worker's jobfence.Handler. It sends only the job's
// operation key to the provider, as the Idempotency-Key, never the attempt
// (R1, R2), and reports the answer; the Worker turns it into the fenced
// write-back.
type refundHandler struct {
	pay *fakeprovider.Client
}

// Refund sends the refund, unless the grant was lost before it could (R27).
func (h refundHandler) Refund(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
	if err := ctx.Err(); err != nil {
		return jobfence.Unknown(context.Cause(ctx)) // nothing sent
	}
	// SendContext: a request on the wire runs to its answer even if the
	// grant is lost meanwhile; the Worker files that answer (R15).
	r, err := h.pay.CreateRefund(jobfence.SendContext(ctx), j.Job.OperationKey, fakeprovider.RefundParams{
		PaymentID: j.Job.PaymentID, AmountMinor: j.Job.AmountMinor, Currency: j.Job.Currency,
		MerchantReference: j.Job.OperationKey,
	})
	var refused *fakeprovider.StatusError
	switch {
	case err == nil:
		return resultOf(r)
	case errors.As(err, &refused) && refused.StatusCode >= 400 && refused.StatusCode < 500:
		return jobfence.Failed("", refused.Code+": "+refused.Message) // refused; no refund was made
	default:
		return jobfence.Unknown(err) // no answer: the refund may exist; reconcile next (R14)
	}
}

// Reconcile asks the provider what happened under the operation key (R14).
func (h refundHandler) Reconcile(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
	found, err := h.pay.FindByReference(ctx, j.Job.OperationKey)
	switch {
	case err != nil:
		return jobfence.Unknown(err)
	case len(found) == 0:
		return jobfence.NoRecord() // a same-key resend if the policy and the window allow, else a person (R14, R16)
	case len(found) > 1:
		return jobfence.Escalate("the provider shows more than one refund under this operation key")
	}
	return resultOf(found[0])
}

// resultOf reads a provider refund: the id first, then what else it says.
func resultOf(r fakeprovider.Refund) jobfence.Result {
	switch r.Status {
	case fakeprovider.StatusSucceeded:
		return jobfence.Succeeded(r.ID)
	case fakeprovider.StatusPending:
		return jobfence.Pending(r.ID, 0) // R4: not a success; reconcile after the policy's delay
	case fakeprovider.StatusFailed:
		return jobfence.Failed(r.ID, r.FailureReason)
	}
	return jobfence.Unknown(fmt.Errorf("refund %s in an unknown status %q", r.ID, r.Status))
}

// TestReadmeWorkerBuilds: the whole worker of README.md builds and vets as it
// stands, as a main package in a module requiring this one.
func TestReadmeWorkerBuilds(t *testing.T) {
	readme, err := os.ReadFile("../../clients/go/README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "<!-- whole worker:")
	if !ok {
		t.Fatal("README.md has no whole worker marker")
	}
	_, rest, _ = strings.Cut(rest, "```go\n")
	program, _, _ := strings.Cut(rest, "```")
	main := filepath.Join(t.TempDir(), "main.go")
	if err := os.WriteFile(main, []byte(program), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"vet", main}, {"build", "-o", os.DevNull, main}} {
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", args[0], err, out)
		}
	}
}
