package server_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testdb"
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
		// Receipts without a grant's token from many reporters fill their
		// share; the holder's own fill the rest (R28), and its lease ends.
		held := c.claimOne(t, "holder", flooded.Id)
		for i := 0; i < store.MaxObservationsPerJob; i++ {
			p := store.ObservationParams{Job: store.JobRef{ID: flooded.Id}, Source: "webhook",
				Reporter: fmt.Sprintf("webhook:p%d", i/store.MaxObservationsPerReporter), Outcome: store.OutcomePending,
				ProviderEventID: fmt.Sprintf("evt_%d", i), Detail: detail}
			if i >= store.MaxUnverifiedObservationsPerJob {
				p.Attempt, p.LeaseToken = held.Attempt, store.LeaseToken(held.LeaseToken)
			}
			if o, _, err := c.store.Observe(ctx, p); err != nil || o.KeptAside != nil {
				t.Fatalf("receipt %d = %+v, %v", i, o, err)
			}
		}
		c.expire(t, flooded.Id)
		// R28: one more is kept in the unmatched log, never refused.
		more, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
			Job: &pb.ReportObservationRequest_JobId{JobId: flooded.Id}, Source: "webhook",
			Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_PENDING, ProviderEventId: "evt_one_more", Detail: detail})
		if err != nil || more.KeptAside == nil || more.KeptAside.OperationKey != flooded.OperationKey ||
			more.Observation.GetId() != 0 || more.Duplicate {
			t.Fatalf("one receipt too many = %v, %v; want it kept aside", more, err)
		}

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

// R28 over gRPC: a receipt of success for a job that was sent and waits in
// ready says it expedited the job, which GetJob then shows due to
// reconcile, its history ending in an expedited event under the unchanged
// attempt; a redelivery and a pending receipt say nothing moved. A job never
// sent, scheduled for later, is not moved by the same receipt.
func TestReportObservationSaysExpedited_R28(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		st, err := c.store.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		req := refundReq()
		req.NotBefore = timestamppb.New(st.Now.Add(time.Hour)) // scheduled by its producer (R12: the database's clock)
		scheduled, err := c.client.EnqueueRefund(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		sent := c.claimOne(t, "sender", c.enqueue(t).Id)
		if _, err := c.client.Reschedule(ctx, &pb.RescheduleRequest{JobId: sent.Job.Id, Attempt: sent.Attempt,
			LeaseToken: sent.LeaseToken, NextAction: pb.NextAction_NEXT_ACTION_REFUND,
			When: &pb.RescheduleRequest_Delay{Delay: durationpb.New(time.Hour)}, Reason: "provider busy"}); err != nil {
			t.Fatal(err)
		}
		enq := &pb.EnqueueRefundResponse{Job: sent.Job}
		report := func(outcome pb.ObservationOutcome, eventID string) *pb.ReportObservationResponse {
			t.Helper()
			resp, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
				Job: &pb.ReportObservationRequest_JobId{JobId: enq.Job.Id}, Source: "webhook:stripe",
				Outcome: outcome, ProviderRefundId: "re_hook", ProviderEventId: eventID})
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		early, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
			Job: &pb.ReportObservationRequest_JobId{JobId: scheduled.Job.Id}, Source: "worker:w",
			Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED, ProviderRefundId: "re_made_up"})
		if err != nil || early.Expedited {
			t.Fatalf("a receipt of success for a job never sent = %v, %v; want filed, not expedited", early, err)
		}
		if got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: scheduled.Job.Id}}); err != nil ||
			got.Job.NextAction != pb.NextAction_NEXT_ACTION_REFUND || !got.Job.NextAttemptAt.AsTime().Equal(req.NotBefore.AsTime()) {
			t.Fatalf("the scheduled job after a receipt = %v, %v; want it as its producer scheduled it", got.GetJob(), err)
		}
		if resp := report(pb.ObservationOutcome_OBSERVATION_OUTCOME_PENDING, "evt_pending"); resp.Expedited || resp.Duplicate {
			t.Fatalf("a pending receipt = %v, want filed and not expedited", resp)
		}
		hook := report(pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED, "evt_succeeded")
		if !hook.Expedited || hook.Duplicate {
			t.Fatalf("a receipt of success for a waiting job = %v, want expedited", hook)
		}
		if again := report(pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED, "evt_succeeded"); again.Expedited ||
			!again.Duplicate {
			t.Fatalf("its redelivery = %v, want a duplicate that moved nothing", again)
		}

		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: enq.Job.Id}})
		if err != nil {
			t.Fatal(err)
		}
		j := got.Job
		if j.State != pb.JobState_JOB_STATE_READY || j.Attempt != 1 || j.NextAction != pb.NextAction_NEXT_ACTION_RECONCILE ||
			j.NextAttemptAt.AsTime().After(got.Now.AsTime()) || j.LeaseUntil != nil {
			t.Fatalf("job after the receipt = %v (now %v), want ready, attempt 1, due to reconcile", j, got.Now)
		}
		ev := got.Events[len(got.Events)-1]
		if len(got.Events) != 4 || ev.Kind != "expedited" || ev.Attempt != 1 || ev.WorkerId != "webhook:stripe" ||
			ev.FromState != pb.JobState_JOB_STATE_READY || ev.ToState != pb.JobState_JOB_STATE_READY ||
			ev.NextAction != pb.NextAction_NEXT_ACTION_RECONCILE ||
			ev.Reason != fmt.Sprintf("receipt %d from webhook:stripe: succeeded", hook.Observation.Id) {
			t.Fatalf("history = %v, want enqueued, claimed, rescheduled, then the receipt's expedited event", got.Events)
		}
		claimed := c.claimOne(t, "w", enq.Job.Id)
		if claimed.NextAction != pb.NextAction_NEXT_ACTION_RECONCILE || claimed.Takeover {
			t.Fatalf("claim after the receipt = %v, want a claim that reconciles (R14)", claimed)
		}
	})
}

// R28 over gRPC: GetOverview counts the unmatched log and lists its newest
// events, newest first, every field as kept; the limit bounds the list, not
// the count.
func TestGetOverviewShowsUnmatchedEvents_R28(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		empty, err := c.client.GetOverview(ctx, &pb.GetOverviewRequest{})
		if err != nil || empty.UnmatchedEvents != 0 || len(empty.RecentUnmatched) != 0 {
			t.Fatalf("overview of an empty log = %v, %v", empty, err)
		}
		var kept []store.UnmatchedEvent
		for i, outcome := range []store.Outcome{store.OutcomeSucceeded, store.OutcomeFailed, store.OutcomeNotFound} {
			e, dup, err := c.store.KeepUnmatched(ctx, store.UnmatchedEvent{Provider: "stripe",
				ProviderEventID: fmt.Sprintf("evt_%d", i), EventType: "refund.updated",
				ProviderRefundID: fmt.Sprintf("re_%d", i), OperationKey: fmt.Sprintf("op-gone-%d", i), Outcome: outcome,
				Detail: "status: " + string(outcome) + "\nno job"})
			if err != nil || dup {
				t.Fatalf("KeepUnmatched %d = dup %v, %v", i, dup, err)
			}
			kept = append(kept, e)
		}
		got, err := c.client.GetOverview(ctx, &pb.GetOverviewRequest{Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if got.UnmatchedEvents != 3 || len(got.RecentUnmatched) != 2 {
			t.Fatalf("unmatched = %d, %d listed; want 3, the newest 2", got.UnmatchedEvents, len(got.RecentUnmatched))
		}
		newest := kept[2]
		want := &pb.UnmatchedEvent{Id: newest.ID, Provider: "stripe", ProviderEventId: "evt_2", EventType: "refund.updated",
			ProviderRefundId: "re_2", OperationKey: "op-gone-2", Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_NOT_FOUND,
			Detail: "status: not_found\nno job", ReceivedAt: timestamppb.New(newest.ReceivedAt)}
		if !proto.Equal(got.RecentUnmatched[0], want) || got.RecentUnmatched[1].Id != kept[1].ID ||
			got.RecentUnmatched[1].Outcome != pb.ObservationOutcome_OBSERVATION_OUTCOME_FAILED {
			t.Fatalf("recent unmatched = %v, want %v first, then event %d", got.RecentUnmatched, want, kept[1].ID)
		}
		if r := got.RecentUnmatched[0].ReceivedAt.AsTime(); r.After(got.Now.AsTime()) || r.Before(got.Now.AsTime().Add(-time.Minute)) {
			t.Fatalf("received at %v, the database's now %v", r, got.Now.AsTime())
		}
	})
}

// R28 over gRPC: a receipt of success filed while the job runs moves
// nothing then; the holder learns of it in its renewal's answer, its
// reschedule to reconcile in an hour is due now instead (expedited), the
// next claim takes it at once, and its completion is measured from the
// receipt (jobfence_receipt_to_completion_seconds).
func TestReceiptDuringGrantComesDueOverGRPC_R28(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		a := c.claimOne(t, "worker-a", c.enqueue(t).Id)
		obs, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
			Job: &pb.ReportObservationRequest_JobId{JobId: a.Job.Id}, Source: "webhook:acme",
			Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED, ProviderRefundId: "re_hook",
			ProviderEventId: "evt_during"})
		if err != nil || obs.Expedited {
			t.Fatalf("ReportObservation = %v, %v; want filed, not expedited (the job runs)", obs, err)
		}
		grant := []*pb.GrantRef{{JobId: a.Job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken}}
		renewed, err := c.client.RenewLeases(ctx, &pb.RenewLeasesRequest{Grants: grant})
		if err != nil || !renewed.Renewals[0].ReceiptFiledAt.AsTime().Equal(obs.Observation.CreatedAt.AsTime()) {
			t.Fatalf("RenewLeases = %v, %v; want the receipt's time %v", renewed, err, obs.Observation.CreatedAt.AsTime())
		}
		res, err := c.client.Reschedule(ctx, &pb.RescheduleRequest{JobId: a.Job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken,
			When: &pb.RescheduleRequest_Delay{Delay: durationpb.New(time.Hour)}, Reason: "provider pending"})
		if err != nil || !res.Expedited || !res.Job.NextAttemptAt.AsTime().Equal(res.Job.UpdatedAt.AsTime()) {
			t.Fatalf("Reschedule = %v, %v; want expedited, due now", res, err)
		}
		b := c.claimOne(t, "worker-b", a.Job.Id)
		if _, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: b.Job.Id, Attempt: b.Attempt, LeaseToken: b.LeaseToken,
			ProviderRefundId: "re_hook"}); err != nil {
			t.Fatal(err)
		}
		if h := c.metric(t, "jobfence_receipt_to_completion_seconds").GetHistogram(); h.GetSampleCount() != 1 ||
			h.GetSampleSum() <= 0 || h.GetSampleSum() > 30 {
			t.Fatalf("receipt to completion = %d samples, sum %vs; want one, of seconds", h.GetSampleCount(), h.GetSampleSum())
		}
	})
}

// R28 over gRPC: a job's room is kept per credential, whatever source a
// caller names: one worker credential filing receipts under many sources
// fills its own share, its next receipt is kept in the unmatched log
// (kept_aside, not an error, so no SDK drops it), and another credential's
// receipt is still filed on the job, naming that credential as reporter.
func TestReceiptRoomIsPerCredential_R28(t *testing.T) {
	authn, err := server.LoadTokens(writeTokens(t,
		tokenLine("shop", "producer", "tok-shop"),
		tokenLine("careless", "worker", "tok-careless"),
		tokenLine("worker-b", "worker", "tok-b")))
	if err != nil {
		t.Fatal(err)
	}
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) { o.Auth = authn })
	ctx := ctxFor(t)
	enq, err := c.client.EnqueueRefund(as(ctx, "tok-shop"), refundReq())
	if err != nil {
		t.Fatal(err)
	}
	report := func(token, source string) *pb.ReportObservationResponse {
		t.Helper()
		resp, err := c.client.ReportObservation(as(ctx, token), &pb.ReportObservationRequest{
			Job: &pb.ReportObservationRequest_JobId{JobId: enq.Job.Id}, Source: source,
			Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_FAILED})
		if err != nil {
			t.Fatalf("ReportObservation(%s) = %v", source, err)
		}
		return resp
	}
	for i := range store.MaxObservationsPerReporter {
		if r := report("tok-careless", fmt.Sprintf("webhook:source-%d", i)); r.KeptAside != nil ||
			r.Observation.Reporter != "careless" {
			t.Fatalf("receipt %d = %v, want it filed under the credential", i, r)
		}
	}
	if r := report("tok-careless", "webhook:one-more"); r.KeptAside == nil || r.Observation.Id != 0 ||
		!strings.Contains(r.KeptAside.Detail, `reporter "careless"`) {
		t.Fatalf("the credential's receipt past its share = %v, want it kept aside", r)
	}
	if r := report("tok-b", "worker:b"); r.KeptAside != nil || r.Observation.Id == 0 || r.Observation.Reporter != "worker-b" {
		t.Fatalf("another credential's receipt = %v, want it filed on the job", r)
	}
}
