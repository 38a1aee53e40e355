package server_test

import (
	"database/sql"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/server"
)

// ledgerRows counts the refunds recorded for a job (R10), straight from the
// database.
func (c *coordinator) ledgerRows(t *testing.T, jobID int64) int {
	t.Helper()
	db := c.store.(interface{ DB() *sql.DB }).DB()
	var n int
	if err := db.QueryRowContext(ctxFor(t), `SELECT COUNT(*) FROM refund_ledger WHERE job_id = ?`, jobID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// R25, the attack found from outside: a worker told STALE_ATTEMPT reads the
// current attempt from the error's metadata and writes again with it. It
// holds no grant, so nothing lands and no ledger row is written; the
// holder's write then does. The token appears in the claim's answer only:
// not in GetJob, not in any error.
func TestDisclosedAttemptWritesNothing_R25(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		a := c.claimOne(t, "worker-a", job.Id)
		c.expire(t, job.Id)
		b := c.claimOne(t, "worker-b", job.Id)
		if a.LeaseToken == "" || b.LeaseToken == "" || a.LeaseToken == b.LeaseToken {
			t.Fatalf("lease tokens %q and %q, want two distinct ones", a.LeaseToken, b.LeaseToken)
		}

		_, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken,
			ProviderRefundId: "re_A"})
		meta := errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)
		current, _ := strconv.ParseInt(meta["current_attempt"], 10, 64)
		if current != b.Attempt {
			t.Fatalf("metadata %v, want current_attempt %d", meta, b.Attempt)
		}
		var answers []string
		for _, token := range []string{a.LeaseToken, ""} {
			_, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: current, LeaseToken: token,
				ProviderRefundId: "re_forged"})
			errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)
			answers = append(answers, prototext.Format(status.Convert(err).Proto()))
		}
		if n := c.ledgerRows(t, job.Id); n != 0 {
			t.Fatalf("%d ledger rows after forged completes, want 0", n)
		}
		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: job.Id}})
		if err != nil || got.Job.State != pb.JobState_JOB_STATE_RUNNING || got.Job.ProviderRefundId != "" {
			t.Fatalf("GetJob = %v, %v; want B's grant untouched", got, err)
		}
		for _, shown := range append(answers, prototext.Format(got)) {
			if strings.Contains(shown, b.LeaseToken) || strings.Contains(shown, a.LeaseToken) {
				t.Fatalf("a lease token is shown outside its claim's answer:\n%s", shown)
			}
		}

		done, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: b.Attempt, LeaseToken: b.LeaseToken,
			ProviderRefundId: "re_B"})
		if err != nil || done.Job.State != pb.JobState_JOB_STATE_SUCCEEDED {
			t.Fatalf("the holder's Complete = %v, %v", done, err)
		}
		if n := c.ledgerRows(t, job.Id); n != 1 {
			t.Fatalf("%d ledger rows after the holder's complete, want 1", n)
		}
	})
}
