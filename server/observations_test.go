package server_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
)

// Issue: 1,100 receipts of 4 KiB on one job made Claim{max_jobs:4} answer
// RESOURCE_EXHAUSTED ("received message larger than max") while all four
// jobs stayed granted, every lease cycle. A claim now carries the newest few
// receipts and their count, the job keeps at most 1,000, and GetJob pages.
func TestFloodedJobStaysDeliverable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		flooded := c.enqueue(t)
		for i := 0; i < 3; i++ {
			c.enqueue(t)
		}
		detail := strings.Repeat("d", store.MaxDetailLen)
		for i := 0; i < store.MaxObservationsPerJob; i++ {
			if _, _, err := c.store.Observe(ctx, store.ObservationParams{Job: store.JobRef{ID: flooded.Id},
				Source: "webhook", Outcome: store.OutcomePending, ProviderEventID: fmt.Sprintf("evt_%d", i),
				Detail: detail}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
			Job: &pb.ReportObservationRequest_JobId{JobId: flooded.Id}, Source: "webhook",
			Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_PENDING, ProviderEventId: "evt_one_more", Detail: detail})
		errorInfo(t, err, codes.ResourceExhausted, server.ReasonObservationLimit)

		resp, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: "w", MaxJobs: 4})
		if err != nil || len(resp.Jobs) != 4 {
			t.Fatalf("Claim{max_jobs:4} = %v, %v", len(resp.GetJobs()), err)
		}
		if got := resp.Jobs[0]; got.Job.Id != flooded.Id || got.ObservationCount != store.MaxObservationsPerJob ||
			len(got.Observations) != store.MaxClaimObservations {
			t.Fatalf("flooded job claimed with %d receipts of %d, want the newest %d", len(got.Observations),
				got.ObservationCount, store.MaxClaimObservations)
		}
		t.Logf("claim answer: %d bytes", proto.Size(resp))

		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: flooded.Id}})
		if err != nil || len(got.Observations) != store.ObservationPageSize || got.NextObservationsPageToken == "" ||
			got.ObservationCount != store.MaxObservationsPerJob {
			t.Fatalf("GetJob = %d receipts of %d, next %q, %v", len(got.GetObservations()), got.GetObservationCount(),
				got.GetNextObservationsPageToken(), err)
		}
		next, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: flooded.Id},
			ObservationsPageSize: 500, ObservationsPageToken: got.NextObservationsPageToken})
		if err != nil || len(next.Observations) != 500 || next.Observations[0].Id <= got.Observations[99].Id {
			t.Fatalf("GetJob's second page = %d receipts, %v", len(next.GetObservations()), err)
		}
	})
}
