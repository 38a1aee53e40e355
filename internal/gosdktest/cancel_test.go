package jobfence_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// R32 end to end, against a real coordinator: two refunds in flight when an
// operator cancels them lose their grants (each handler's context ends with
// ErrGrantLost), and their next grants, cancel requested, go to Reconcile
// only. The provider without a record: escalated for a person, never resent,
// though the policy trusts same-key resends and the window is open. The
// provider that has the refund: completed, and the cancel that came too late
// is on the attention list. The refund handler ran once per job, before the
// cancel, and never after.
func TestWorkerNeverSendsACancelledRefundAgain_R32(t *testing.T) {
	c := startCoordinator(t)
	noRecord := c.enqueue(t, "acme")
	hadIt := c.enqueue(t, "acme")

	var mu sync.Mutex
	sending := map[int64]bool{}
	bothSending := make(chan struct{})
	lost := make(chan error, 2)
	h := &recorder{
		refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
			mu.Lock()
			if !sending[j.Job.ID] && len(sending) == 1 {
				close(bothSending)
			}
			sending[j.Job.ID] = true
			mu.Unlock()
			<-ctx.Done() // the provider call hangs until the grant is lost
			lost <- context.Cause(ctx)
			return jobfence.Unknown(context.Cause(ctx))
		},
		reconcile: func(_ context.Context, j jobfence.ClaimedJob) jobfence.Result {
			switch {
			case !j.CancelRequested:
				return jobfence.Escalate("test: reconciled without seeing the cancel request")
			case j.Job.ID == hadIt.ID:
				return jobfence.Succeeded("re_had_it")
			}
			return jobfence.NoRecord()
		},
	}
	w := newWorker(t, c, h, jobfence.WorkerOptions{WorkerID: "A", Concurrency: 2, Lease: 3 * time.Second,
		ProviderTimeout: time.Minute, Policy: jobfence.ProviderPolicy{SameKeyResendSafe: true}})
	runWorker(t, w)
	select {
	case <-bothSending:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not start sending both refunds")
	}

	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	operator := pb.NewCoordinatorClient(conn)
	for _, j := range []jobfence.Job{noRecord, hadIt} {
		resp, err := operator.CancelRefund(ctxFor(t), &pb.CancelRefundRequest{JobId: j.ID, Attempt: 1,
			Reason: "the customer withdrew the request"})
		if err != nil || resp.GetCancelled() || resp.GetJob().GetCancelRequestedAt() == nil {
			t.Fatalf("CancelRefund(%d) = %v, %v; want a cancel request", j.ID, resp, err)
		}
	}
	for range 2 {
		select {
		case cause := <-lost:
			if !errors.Is(cause, jobfence.ErrGrantLost) {
				t.Fatalf("a sending handler's context ended with %v, want ErrGrantLost", cause)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a sending handler was not cancelled after the cancel request took its job over")
		}
	}

	escalated := waitState(t, c, noRecord.ID, jobfence.StateManualReview)
	if r := escalated.Job.LastReason; !strings.Contains(r, "cancel requested") || !strings.Contains(r, "no record") {
		t.Errorf("the escalation's reason %q does not name the cancel request and the missing record", r)
	}
	if escalated.Job.CancelRequestedAt.IsZero() {
		t.Errorf("GetJob's job carries no CancelRequestedAt: %+v", escalated.Job)
	}
	done := waitState(t, c, hadIt.ID, jobfence.StateSucceeded)
	if done.Job.ProviderRefundID != "re_had_it" {
		t.Errorf("completed with %q, want re_had_it", done.Job.ProviderRefundID)
	}
	if got, err := operator.GetJob(ctxFor(t), &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: hadIt.ID}}); err != nil ||
		got.GetJob().GetAttentionSince() == nil {
		t.Errorf("the cancel that came too late is not on the attention list: %v, %v", got.GetJob(), err)
	}

	refunds := map[int64]int{}
	reconciles := map[int64]int{}
	for _, cl := range h.log() {
		switch cl.method {
		case "refund":
			refunds[cl.jobID]++
			if cl.attempt != 1 {
				t.Errorf("the refund handler ran for job %d under attempt %d, after the cancel request", cl.jobID, cl.attempt)
			}
		case "reconcile":
			reconciles[cl.jobID]++
		}
	}
	for _, j := range []jobfence.Job{noRecord, hadIt} {
		if refunds[j.ID] != 1 || reconciles[j.ID] != 1 {
			t.Errorf("job %d: %d refund and %d reconcile calls, want 1 and 1 (%+v)", j.ID, refunds[j.ID],
				reconciles[j.ID], h.log())
		}
	}
}
