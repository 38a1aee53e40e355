package server_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
)

// R1 for producers: an enqueue with another producer's values answers with
// the existing job as a producer needs it — its id, values, state — and
// never who handled it, why, its lease or the provider's refund id; a
// conflict names the key, not the job. A credential that may read jobs is
// told everything, as GetJob would tell it.
func TestEnqueueTellsProducersWhatTheyNeed_R1(t *testing.T) {
	authn, err := server.LoadTokens(writeTokens(t,
		tokenLine("shop", "producer", "tok-shop"),
		tokenLine("other-shop", "producer", "tok-other"),
		tokenLine("back-office", "producer,reader", "tok-office"),
		tokenLine("worker-a", "worker", "tok-worker")))
	if err != nil {
		t.Fatal(err)
	}
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) { o.Auth = authn })
	ctx := ctxFor(t)
	req := refundReq()
	if _, err := c.client.EnqueueRefund(as(ctx, "tok-shop"), req); err != nil {
		t.Fatal(err)
	}
	claimed, err := c.client.Claim(as(ctx, "tok-worker"), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1})
	if err != nil || len(claimed.Jobs) != 1 {
		t.Fatalf("Claim = %v, %v", claimed, err)
	}
	g := claimed.Jobs[0]
	if _, err := c.client.Reschedule(as(ctx, "tok-worker"), &pb.RescheduleRequest{JobId: g.Job.Id, Attempt: g.Attempt,
		LeaseToken: g.LeaseToken, NextAction: pb.NextAction_NEXT_ACTION_RECONCILE, Reason: "provider timeout, acquirer X"}); err != nil {
		t.Fatal(err)
	}
	g = c.claimOneAs(t, "tok-worker", g.Job.Id)
	if _, err := c.client.Complete(as(ctx, "tok-worker"), &pb.CompleteRequest{JobId: g.Job.Id, Attempt: g.Attempt,
		LeaseToken: g.LeaseToken, ProviderRefundId: "re_secret"}); err != nil {
		t.Fatal(err)
	}

	same, err := c.client.EnqueueRefund(as(ctx, "tok-other"), req)
	if err != nil || same.Created {
		t.Fatalf("the same values from another producer = %v, %v", same, err)
	}
	j := same.Job
	if j.Id != g.Job.Id || j.OperationKey != req.OperationKey || j.AmountMinor != req.AmountMinor ||
		j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("the producer's answer = %v, want the job's id, values and state", j)
	}
	if j.WorkerId != "" || j.ProviderRefundId != "" || j.LastReason != "" || j.LeaseUntil != nil {
		t.Fatalf("a producer was told %q, %q, %q, %v: who handled the refund, the provider's id or why", j.WorkerId,
			j.ProviderRefundId, j.LastReason, j.LeaseUntil)
	}
	office, err := c.client.EnqueueRefund(as(ctx, "tok-office"), req)
	if err != nil || office.Job.WorkerId != "worker-a" || office.Job.ProviderRefundId != "re_secret" {
		t.Fatalf("a producer that may read = %v, %v; want the whole job", office, err)
	}

	conflict := refundReq()
	conflict.OperationKey, conflict.AmountMinor = req.OperationKey, req.AmountMinor+1
	_, err = c.client.EnqueueRefund(as(ctx, "tok-other"), conflict)
	meta := errorInfo(t, err, codes.AlreadyExists, server.ReasonKeyConflict)
	if meta["operation_key"] != req.OperationKey || meta["job_id"] != "" {
		t.Fatalf("conflict metadata %v, want the key and no job id", meta)
	}
	_, err = c.client.EnqueueRefund(as(ctx, "tok-office"), conflict)
	if meta := errorInfo(t, err, codes.AlreadyExists, server.ReasonKeyConflict); meta["job_id"] == "" {
		t.Fatalf("conflict metadata for a reader %v, want the job id", meta)
	}
}

// claimOneAs claims, as token's credential, exactly job id.
func (c *coordinator) claimOneAs(t *testing.T, token string, id int64) *pb.ClaimedJob {
	t.Helper()
	resp, err := c.client.Claim(as(ctxFor(t), token), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1})
	if err != nil || len(resp.Jobs) != 1 || resp.Jobs[0].Job.Id != id {
		t.Fatalf("Claim = %v, %v; want job %d", resp, err, id)
	}
	return resp.Jobs[0]
}
