package main_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// reconcileLater is when the worker asks to reconcile a refund whose reply
// was cut: the webhook must close the refund well before it.
const reconcileLater = time.Minute

// TestWebhookClosesACutReplyBeforeItsReconcile_T3_R28 is T3 with the
// provider's webhook: the refund is made but its reply is cut, so the worker
// reschedules a reconcile a minute later (R14); the provider's signed
// refund.created webhook reaches the coordinator binary's --webhook-listen
// and is filed as an observation (R28). Arriving after the reschedule, it
// makes the ready job due now (expedited by webhook:acme); arriving while the
// worker still runs the job, it moves nothing then, and the worker's
// reschedule comes due at once instead (expedited by the coordinator). Either
// way a worker reconciles and completes it through the fenced path, seconds
// after the cut instead of a minute. No webhook changes the job's state
// itself.
func TestWebhookClosesACutReplyBeforeItsReconcile_T3_R28(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// faults: the webhook a second after the cut reply, after the
		// worker's reschedule has committed; or at once, with the handler
		// holding its answer until the receipt is on file.
		faults      string
		waitForHook bool
		expediter   string
	}{
		{"after the reschedule", "cut_reply,webhook_delay=1", false, "webhook:acme"},
		{"while the job runs", "cut_reply", true, "jobfence"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			webhookClosesCutReply(t, tc.faults, tc.waitForHook, tc.expediter)
		})
	}
}

func webhookClosesCutReply(t *testing.T, faults string, waitForHook bool, expediter string) {
	const secret = "whsec_e2e_0123456789abcdef"
	secrets := filepath.Join(t.TempDir(), "webhook-secrets")
	if err := os.WriteFile(secrets, []byte("acme stripe "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	coord := proctest.StartCoordinator(t, bin.coordinator, "--mysql-dsn", testdb.MySQL(t), "--webhook-listen", "127.0.0.1:0",
		"--webhook-secrets-file", secrets, "--claim-poll-interval", "50ms")
	rec, ok := coord.WaitRecord(10*time.Second, func(r map[string]any) bool { return r["msg"] == "webhooks serving" })
	if !ok {
		t.Fatalf("no webhooks serving record:\n%s", coord.Logs())
	}
	provider := fakeprovider.New(fakeprovider.Config{WebhookURL: "http://" + rec["listen"].(string) + "/webhooks/acme",
		WebhookSecret: secret})
	web := httptest.NewServer(provider)
	t.Cleanup(func() { web.Close(); provider.Close() })
	pay := fakeprovider.NewClient(web.URL, nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := jobfence.Dial(coord.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	job, _, err := client.EnqueueRefund(ctx, jobfence.EnqueueRequest{OperationKey: "t3-webhook-1", OrderID: "order-t3",
		PaymentID: "pay-t3", AmountMinor: 1200, Currency: "EUR", Provider: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if err := pay.RegisterPayment(ctx, job.PaymentID, job.AmountMinor, job.Currency); err != nil {
		t.Fatal(err)
	}
	handler := fakeprovider.Handlers(pay, faults)
	if waitForHook {
		refund := handler.RefundFunc
		handler.RefundFunc = func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
			res := refund(ctx, j)
			proctest.WaitFor(t, 10*time.Second, "the webhook's receipt while the job runs", func() bool {
				d, err := client.GetJob(ctx, j.Job.ID)
				return err == nil && slices.ContainsFunc(d.Observations, func(o jobfence.Observation) bool {
					return o.Source == "webhook:acme"
				})
			})
			return res
		}
	}
	w, err := jobfence.NewWorker(client, handler, jobfence.WorkerOptions{WorkerID: "worker-t3", Concurrency: 2,
		Lease: 30 * time.Second, ProviderTimeout: 5 * time.Second, PollInterval: 50 * time.Millisecond,
		Policy: jobfence.ProviderPolicy{UnknownDelay: reconcileLater}, ReceiptSpool: "off"})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(runCtx) }()
	var d jobfence.JobDetail
	proctest.WaitFor(t, 30*time.Second, "the refund completed", func() bool {
		if d, err = client.GetJob(ctx, job.ID); err != nil {
			t.Fatal(err)
		}
		return d.Job.State == jobfence.StateSucceeded
	})
	elapsed := time.Since(start)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("cut reply to completion: %s (the reschedule asked for a reconcile in %s)", elapsed.Round(time.Millisecond), reconcileLater)
	if elapsed > reconcileLater/3 {
		t.Fatalf("completed after %s: the webhook did not bring the reconcile forward", elapsed)
	}
	var kinds []string
	for _, e := range d.Events {
		kinds = append(kinds, e.Kind)
		if e.Kind == jobfence.EventExpedited && e.WorkerID != expediter {
			t.Fatalf("expedited by %q, want %q", e.WorkerID, expediter)
		}
	}
	want := []string{jobfence.EventEnqueued, jobfence.EventClaimed, jobfence.EventRescheduled, jobfence.EventExpedited,
		jobfence.EventClaimed, jobfence.EventCompleted}
	if !slices.Equal(kinds, want) {
		t.Fatalf("history %v, want %v", kinds, want)
	}
	fromWebhook := slices.IndexFunc(d.Observations, func(o jobfence.Observation) bool {
		return o.Source == "webhook:acme" && o.ProviderRefundID == d.Job.ProviderRefundID
	})
	if fromWebhook < 0 {
		t.Fatalf("no receipt from the webhook: %+v", d.Observations)
	}
	oracle, err := pay.Oracle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if oracle.DoubleRefunds != 0 {
		t.Fatalf("double refunds: %d", oracle.DoubleRefunds)
	}
}
