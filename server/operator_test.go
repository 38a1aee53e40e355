package server_test

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/server"
)

// fieldViolation requires INVALID_ARGUMENT with a BadRequest naming field.
func fieldViolation(t *testing.T, err error, field string) {
	t.Helper()
	errorInfo(t, err, codes.InvalidArgument, server.ReasonInvalidArgument)
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.FieldViolations {
				if v.Field == field {
					return
				}
			}
		}
	}
	t.Fatalf("%v has no field violation for %s", err, field)
}

func listIDs(jobs []*pb.Job) []int64 {
	out := make([]int64, len(jobs))
	for i, j := range jobs {
		out[i] = j.Id
	}
	return out
}

// TestListJobsLookupsOverGRPC: the console's lookups by payment and provider
// refund id, its reason and created filters and the receipts counted per
// job reach the store as the proto names them, violations included.
func TestListJobsLookupsOverGRPC(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		var jobs []*pb.Job
		for i := 0; i < 3; i++ {
			req := refundReq()
			req.PaymentId = "pay-shared"
			resp, err := c.client.EnqueueRefund(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, resp.Job)
		}
		done := c.claimOne(t, "A", jobs[0].Id)
		if _, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: done.Job.Id, Attempt: done.Attempt,
			LeaseToken: done.LeaseToken, ProviderRefundId: "re_done"}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if _, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
				Job: &pb.ReportObservationRequest_JobId{JobId: jobs[1].Id}, Source: "webhook",
				Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED, ProviderRefundId: "re_seen",
				ProviderEventId: "evt_" + string(rune('a'+i))}); err != nil {
				t.Fatal(err)
			}
		}
		pending := c.claimOne(t, "A", jobs[1].Id)
		if _, err := c.client.Reschedule(ctx, &pb.RescheduleRequest{JobId: pending.Job.Id, Attempt: pending.Attempt,
			LeaseToken: pending.LeaseToken, When: &pb.RescheduleRequest_Delay{Delay: durationpb.New(time.Hour)},
			Reason: "50% of the provider's answers pending"}); err != nil {
			t.Fatal(err)
		}

		byPayment, err := c.client.ListJobs(ctx, &pb.ListJobsRequest{PaymentId: "pay-shared"})
		if err != nil {
			t.Fatal(err)
		}
		if got := listIDs(byPayment.Jobs); len(got) != 3 || got[0] != jobs[2].Id || got[2] != jobs[0].Id {
			t.Fatalf("by payment = %v, want %d %d %d", got, jobs[2].Id, jobs[1].Id, jobs[0].Id)
		}
		if n := byPayment.ObservationCounts; len(n) != 1 || n[jobs[1].Id] != 2 {
			t.Fatalf("observation_counts = %v, want {%d: 2}", n, jobs[1].Id)
		}
		for refundID, want := range map[string]int64{"re_done": jobs[0].Id, "re_seen": jobs[1].Id} {
			got, err := c.client.ListJobs(ctx, &pb.ListJobsRequest{ProviderRefundId: refundID})
			if err != nil || len(got.Jobs) != 1 || got.Jobs[0].Id != want {
				t.Fatalf("by provider refund id %s = %v, %v; want job %d", refundID, got, err, want)
			}
		}
		byReason, err := c.client.ListJobs(ctx, &pb.ListJobsRequest{State: pb.JobState_JOB_STATE_READY, ReasonPrefix: "50%"})
		if err != nil || len(byReason.Jobs) != 1 || byReason.Jobs[0].Id != jobs[1].Id {
			t.Fatalf("by reason prefix = %v, %v; want job %d", byReason, err, jobs[1].Id)
		}
		created := jobs[1].CreatedAt.AsTime()
		byCreated, err := c.client.ListJobs(ctx, &pb.ListJobsRequest{PaymentId: "pay-shared",
			CreatedAfter: timestamppb.New(created), CreatedBefore: timestamppb.New(created.Add(time.Microsecond))})
		if err != nil || !slices.Contains(listIDs(byCreated.Jobs), jobs[1].Id) {
			t.Fatalf("created at %v = %v, %v; want job %d among them", created, byCreated, err, jobs[1].Id)
		}
		for _, j := range byCreated.Jobs {
			if !j.CreatedAt.AsTime().Equal(created) {
				t.Fatalf("created at %v lists job %d created at %v", created, j.Id, j.CreatedAt.AsTime())
			}
		}

		for field, req := range map[string]*pb.ListJobsRequest{
			"payment_id":         {OrderId: jobs[0].OrderId, PaymentId: "pay-shared"},
			"provider_refund_id": {PaymentId: "pay-shared", ProviderRefundId: "re_done"},
			"created_after":      {CreatedAfter: timestamppb.New(created), CreatedBefore: timestamppb.New(created)},
			"created_before":     {CreatedBefore: &timestamppb.Timestamp{Seconds: 1, Nanos: -1}},
			"reason_prefix":      {ReasonPrefix: "a\tb"},
		} {
			_, err := c.client.ListJobs(ctx, req)
			fieldViolation(t, err, field)
		}
	})
}

// TestGetJobLedgerClockAndResendDeadlineOverGRPC: GetJob answers the
// database's time, the resend deadline counted from the first send with the
// provider's key retention (R22), and the ledger row once the job succeeded
// (R10).
func TestGetJobLedgerClockAndResendDeadlineOverGRPC(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		getJob := func(id int64) *pb.GetJobResponse {
			t.Helper()
			resp, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: id}})
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		req := refundReq()
		req.Provider = "globex" // a key retention of its own: 7 days
		enq, err := c.client.EnqueueRefund(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		job := enq.Job
		if got := getJob(job.Id); got.ResendDeadline != nil || got.Ledger != nil || got.Now == nil ||
			got.Now.AsTime().Before(job.CreatedAt.AsTime()) {
			t.Fatalf("ready job: deadline %v ledger %v now %v", got.ResendDeadline, got.Ledger, got.Now)
		}
		a := c.claimOne(t, "A", job.Id)
		running := getJob(job.Id)
		want := a.Job.FirstSentAt.AsTime().Add(7 * 24 * time.Hour)
		if running.ResendDeadline == nil || !running.ResendDeadline.AsTime().Equal(want) ||
			!running.ResendDeadline.AsTime().Equal(a.ResendDeadline.AsTime()) || running.Ledger != nil {
			t.Fatalf("running job: deadline %v (claim's %v), ledger %v; want %v", running.ResendDeadline,
				a.ResendDeadline, running.Ledger, want)
		}
		done, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken,
			ProviderRefundId: "re_ledger"})
		if err != nil {
			t.Fatal(err)
		}
		got := getJob(job.Id)
		l := got.Ledger
		if l == nil || l.ProviderRefundId != "re_ledger" || l.AmountMinor != req.AmountMinor || l.Currency != req.Currency ||
			l.Attempt != a.Attempt || !l.RecordedAt.AsTime().Equal(done.Job.UpdatedAt.AsTime()) {
			t.Fatalf("ledger = %v, want re_ledger %d %s attempt %d at %v", l, req.AmountMinor, req.Currency, a.Attempt,
				done.Job.UpdatedAt.AsTime())
		}
		if got.Now.AsTime().Before(done.Job.UpdatedAt.AsTime()) || !got.ResendDeadline.AsTime().Equal(want) {
			t.Fatalf("succeeded job: now %v deadline %v", got.Now.AsTime(), got.ResendDeadline.AsTime())
		}
	})
}
