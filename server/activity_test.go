package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
)

// TestGetActivityOverGRPC_M1: readers and operators see the last minutes'
// activity, one entry a minute ending in the database's now: a completion,
// a review opened, a takeover and a receipt in the minutes they happened.
// The answer is kept per window (a second call of the same window answers
// the first), workers and producers are refused, and a window outside
// 1..360 minutes names the field.
func TestGetActivityOverGRPC_M1(t *testing.T) {
	for _, b := range testdb.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := start(t, b, func(o *server.Options) { o.Auth = operatorTokens(t) })
			ctx := ctxFor(t)
			activity := func(token string, minutes int32) *pb.GetActivityResponse {
				t.Helper()
				resp, err := c.client.GetActivity(as(ctx, token), &pb.GetActivityRequest{Minutes: minutes})
				if err != nil {
					t.Fatalf("GetActivity(%d) as %s: %v", minutes, token, err)
				}
				return resp
			}
			empty := activity("tok-rita", 0)
			if len(empty.Minutes) != store.DefaultActivityMinutes || empty.Truncated ||
				!empty.Minutes[len(empty.Minutes)-1].Start.AsTime().Equal(empty.Now.AsTime().Truncate(time.Minute)) ||
				!empty.CountedSince.AsTime().Equal(empty.Minutes[0].Start.AsTime()) {
				t.Fatalf("activity of an empty store: %d minutes, truncated %v, now %v, last minute %v, counted since %v",
					len(empty.Minutes), empty.Truncated, empty.Now, empty.Minutes[len(empty.Minutes)-1].Start,
					empty.CountedSince)
			}

			enqueue := func() *pb.Job {
				t.Helper()
				resp, err := c.client.EnqueueRefund(as(ctx, "tok-shop"), refundReq())
				if err != nil {
					t.Fatal(err)
				}
				return resp.Job
			}
			claimAs := func(token string, id int64) *pb.ClaimedJob {
				t.Helper()
				resp, err := c.client.Claim(as(ctx, token), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1})
				if err != nil || len(resp.Jobs) != 1 || resp.Jobs[0].Job.Id != id {
					t.Fatalf("Claim as %s = %v, %v; want job %d", token, resp, err, id)
				}
				return resp.Jobs[0]
			}
			job := enqueue()
			first := claimAs("tok-worker-a", job.Id)
			c.expire(t, job.Id)
			second := claimAs("tok-worker-b", job.Id)
			if _, err := c.client.ReportObservation(as(ctx, "tok-worker-a"), &pb.ReportObservationRequest{
				Job: &pb.ReportObservationRequest_JobId{JobId: job.Id}, Attempt: first.Attempt, Source: "worker-a",
				Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED, ProviderRefundId: "re_1"}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.client.Complete(as(ctx, "tok-worker-b"), &pb.CompleteRequest{JobId: job.Id,
				Attempt: second.Attempt, LeaseToken: second.LeaseToken, ProviderRefundId: "re_1"}); err != nil {
				t.Fatal(err)
			}
			review := enqueue()
			r := claimAs("tok-worker-a", review.Id)
			if _, err := c.client.Escalate(as(ctx, "tok-worker-a"), &pb.EscalateRequest{JobId: review.Id,
				Attempt: r.Attempt, LeaseToken: r.LeaseToken, Reason: "no record outside window"}); err != nil {
				t.Fatal(err)
			}

			got := activity("tok-alice", 5) // another window: not the cached answer
			var total pb.ActivityMinute
			for _, m := range got.Minutes {
				total.Succeeded += m.Succeeded
				total.ManualReview += m.ManualReview
				total.Takeovers += m.Takeovers
				total.Receipts += m.Receipts
				total.Cancelled += m.Cancelled
				total.ReviewsResolved += m.ReviewsResolved
			}
			if len(got.Minutes) != 5 || total.Succeeded != 1 || total.ManualReview != 1 || total.Takeovers != 1 ||
				total.Receipts != 1 || total.Cancelled != 0 || total.ReviewsResolved != 0 {
				t.Fatalf("activity of the last 5 minutes (%d listed) adds up to %v; want a completion, a review, a "+
					"takeover and a receipt", len(got.Minutes), &total)
			}
			if again := activity("tok-alice", 0); !again.Now.AsTime().Equal(empty.Now.AsTime()) {
				t.Fatalf("a second activity of the default window read at %v, want the first's answer (%v) from the "+
					"cache", again.Now.AsTime(), empty.Now.AsTime())
			}

			for _, token := range []string{"tok-worker-a", "tok-shop"} {
				_, err := c.client.GetActivity(as(ctx, token), &pb.GetActivityRequest{})
				errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
			}
			for _, minutes := range []int32{-1, store.MaxActivityMinutes + 1} {
				_, err := c.client.GetActivity(as(ctx, "tok-rita"), &pb.GetActivityRequest{Minutes: minutes})
				fieldViolation(t, err, "minutes")
			}
		})
	}
}

// GetActivity is an expensive read: with the credential's two reads in
// flight it is refused (TOO_MANY_CALLS, scope credential) and reads
// nothing; once they end it is answered.
func TestGetActivityIsAnExpensiveRead(t *testing.T) {
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) {
		o.Auth = operatorTokens(t)
		o.MaxReads, o.MaxReadsPerCredential = 4, 2
	})
	ctx := ctxFor(t)
	gate := make(chan struct{})
	c.watched.listGate.Store(&gate)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.client.ListJobs(as(ctx, "tok-rita"), &pb.ListJobsRequest{
				State: pb.JobState_JOB_STATE_MANUAL_REVIEW, ReasonPrefix: "no reason starts so"}); err != nil {
				t.Errorf("a held read: %v", err)
			}
		}()
	}
	proctest.WaitFor(t, 10*time.Second, "two reads held", func() bool { return c.watched.listing.Load() == 2 })
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.client.GetActivity(as(short, "tok-rita"), &pb.GetActivityRequest{})
	tooMany(t, err, "credential")
	close(gate)
	wg.Wait()
	if _, err := c.client.GetActivity(as(ctx, "tok-rita"), &pb.GetActivityRequest{}); err != nil {
		t.Fatalf("GetActivity after the reads ended: %v", err)
	}
}
