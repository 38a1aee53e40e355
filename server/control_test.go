package server_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/mysql"
)

// TestCancelOverGRPC_R32: a cancel of a running job fences its holder over
// the wire (its Complete is STALE_ATTEMPT and writes nothing); the next
// claim says a cancel was requested and carries RECONCILE; a reschedule
// asking for REFUND is CANCEL_REQUESTED; the provider having the refund
// completes the job onto the attention list, which a person acknowledges;
// bad input names its field.
func TestCancelOverGRPC_R32(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		g := c.claimOne(t, "A", job.Id)
		resp, err := c.client.CancelRefund(ctx, &pb.CancelRefundRequest{JobId: job.Id, Attempt: g.Attempt, Reason: "customer disputed"})
		if err != nil || resp.Cancelled || resp.Job.CancelRequestedAt == nil || resp.Job.Attempt != g.Attempt+1 {
			t.Fatalf("CancelRefund of a running job = %v, %v", resp, err)
		}
		_, err = c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: g.Attempt, LeaseToken: g.LeaseToken,
			ProviderRefundId: "re_zombie"})
		errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)
		// T1 with a cancel in the middle: the zombie files what the provider
		// told it (R15), and the next holder is handed it.
		if _, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{Job: &pb.ReportObservationRequest_JobId{JobId: job.Id},
			Attempt: g.Attempt, LeaseToken: g.LeaseToken, Source: "worker:A", ProviderRefundId: "re_had_it",
			Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED}); err != nil {
			t.Fatal(err)
		}

		g2 := c.claimOne(t, "B", job.Id)
		if !g2.CancelRequested || g2.NextAction != pb.NextAction_NEXT_ACTION_RECONCILE || len(g2.Observations) != 1 ||
			g2.Observations[0].ProviderRefundId != "re_had_it" {
			t.Fatalf("grant after the cancel = cancel_requested %v next_action %v receipts %v", g2.CancelRequested,
				g2.NextAction, g2.Observations)
		}
		_, err = c.client.Reschedule(ctx, &pb.RescheduleRequest{JobId: job.Id, Attempt: g2.Attempt, LeaseToken: g2.LeaseToken,
			NextAction: pb.NextAction_NEXT_ACTION_REFUND, When: &pb.RescheduleRequest_Delay{Delay: durationpb.New(time.Minute)}})
		errorInfo(t, err, codes.FailedPrecondition, server.ReasonCancelRequested)
		done, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: g2.Attempt, LeaseToken: g2.LeaseToken,
			ProviderRefundId: "re_had_it"})
		if err != nil || done.Job.State != pb.JobState_JOB_STATE_SUCCEEDED || done.Job.AttentionSince == nil {
			t.Fatalf("completion of the cancel-requested job = %v, %v", done, err)
		}
		if n := c.counter(t, "jobfence_cancels_too_late_total"); n != 1 {
			t.Fatalf("jobfence_cancels_too_late_total = %v, want 1", n)
		}
		ov, err := c.client.GetOverview(ctx, &pb.GetOverviewRequest{})
		if err != nil || ov.AttentionJobs != 1 || len(ov.Attention) != 1 || ov.Attention[0].Id != job.Id {
			t.Fatalf("overview's attention = %d %v, %v", ov.GetAttentionJobs(), ov.GetAttention(), err)
		}
		list, err := c.client.ListJobs(ctx, &pb.ListJobsRequest{Attention: true})
		if err != nil || len(list.Jobs) != 1 {
			t.Fatalf("ListJobs(attention) = %v, %v", list, err)
		}
		_, err = c.client.AcknowledgeAttention(ctx, &pb.AcknowledgeAttentionRequest{JobId: job.Id,
			AttentionSince: timestamppb.New(done.Job.AttentionSince.AsTime().Add(-time.Millisecond)), Note: "looked"})
		errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)
		ack, err := c.client.AcknowledgeAttention(ctx, &pb.AcknowledgeAttentionRequest{JobId: job.Id,
			AttentionSince: done.Job.AttentionSince, Note: "the customer keeps the refund"})
		if err != nil || ack.Job.AttentionSince != nil {
			t.Fatalf("AcknowledgeAttention = %v, %v", ack, err)
		}
		_, err = c.client.AcknowledgeAttention(ctx, &pb.AcknowledgeAttentionRequest{JobId: job.Id,
			AttentionSince: done.Job.AttentionSince, Note: "another note"})
		errorInfo(t, err, codes.FailedPrecondition, server.ReasonNotOnAttentionList)

		// A never-sent job is cancelled at once; a succeeded one cannot be.
		fresh := c.enqueue(t)
		cancelled, err := c.client.CancelRefund(ctx, &pb.CancelRefundRequest{JobId: fresh.Id, Reason: "order reinstated"})
		if err != nil || !cancelled.Cancelled || cancelled.Job.State != pb.JobState_JOB_STATE_CANCELLED {
			t.Fatalf("CancelRefund of a never-sent job = %v, %v", cancelled, err)
		}
		_, err = c.client.CancelRefund(ctx, &pb.CancelRefundRequest{JobId: job.Id, Attempt: done.Job.Attempt, Reason: "late"})
		errorInfo(t, err, codes.FailedPrecondition, server.ReasonJobNotCancellable)
		_, err = c.client.CancelRefund(ctx, &pb.CancelRefundRequest{JobId: fresh.Id + 1000, Reason: "who"})
		errorInfo(t, err, codes.NotFound, server.ReasonNotFound)
		_, err = c.client.CancelRefund(ctx, &pb.CancelRefundRequest{JobId: fresh.Id})
		fieldViolation(t, err, "reason")
		_, err = c.client.PauseProvider(ctx, &pb.PauseProviderRequest{Provider: "Bad Name", Reason: "x"})
		fieldViolation(t, err, "provider")
		_, err = c.client.AcknowledgeAttention(ctx, &pb.AcknowledgeAttentionRequest{JobId: job.Id, Note: "n"})
		fieldViolation(t, err, "attention_since")
	})
}

// TestControlRoles_R29_R32: readers and workers may not cancel, pause or
// acknowledge; a producer cancels only what it enqueued; the history names
// whoever acted.
func TestControlRoles_R29_R32(t *testing.T) {
	authn, err := server.LoadTokens(writeTokens(t,
		tokenLine("shop", "producer", "tok-shop"),
		tokenLine("other-shop", "producer", "tok-other"),
		tokenLine("ops", "operator", "tok-ops"),
		tokenLine("viewer", "reader", "tok-reader"),
		tokenLine("worker-a", "worker", "tok-worker")))
	if err != nil {
		t.Fatal(err)
	}
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) { o.Auth = authn })
	ctx := ctxFor(t)
	var ids []int64
	for range 2 {
		resp, err := c.client.EnqueueRefund(as(ctx, "tok-shop"), refundReq())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Job.Id)
	}
	for _, tok := range []string{"tok-reader", "tok-worker"} {
		_, err := c.client.CancelRefund(as(ctx, tok), &pb.CancelRefundRequest{JobId: ids[0], Reason: "r"})
		errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
		_, err = c.client.PauseProvider(as(ctx, tok), &pb.PauseProviderRequest{Provider: "acme", Reason: "r"})
		errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
		_, err = c.client.ResumeProvider(as(ctx, tok), &pb.ResumeProviderRequest{Provider: "acme", Reason: "r"})
		errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
		_, err = c.client.AcknowledgeAttention(as(ctx, tok), &pb.AcknowledgeAttentionRequest{JobId: ids[0],
			AttentionSince: timestamppb.Now(), Note: "n"})
		errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
	}
	_, err = c.client.PauseProvider(as(ctx, "tok-shop"), &pb.PauseProviderRequest{Provider: "acme", Reason: "r"})
	errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
	_, err = c.client.CancelRefund(as(ctx, "tok-other"), &pb.CancelRefundRequest{JobId: ids[0], Reason: "not mine"})
	errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
	if r, err := c.client.CancelRefund(as(ctx, "tok-shop"), &pb.CancelRefundRequest{JobId: ids[0], Reason: "order reinstated"}); err != nil || !r.Cancelled {
		t.Fatalf("the producer's cancel of its own refund = %v, %v", r, err)
	}
	if r, err := c.client.CancelRefund(as(ctx, "tok-ops"), &pb.CancelRefundRequest{JobId: ids[1], Reason: "entered twice"}); err != nil || !r.Cancelled {
		t.Fatalf("the operator's cancel = %v, %v", r, err)
	}
	for i, who := range []string{"shop", "ops"} {
		d, err := c.client.GetJob(as(ctx, "tok-ops"), &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: ids[i]}})
		if err != nil {
			t.Fatal(err)
		}
		if e := d.Events[len(d.Events)-1]; e.Kind != string(store.EventCancelled) || e.WorkerId != who {
			t.Fatalf("job %d's cancel entry = %v, want by %s", ids[i], e, who)
		}
		if d.Events[0].WorkerId != "shop" {
			t.Fatalf("job %d's enqueue entry names %q, want the producer", ids[i], d.Events[0].WorkerId)
		}
	}
}

// TestPauseStopsGrantsOnEveryReplica_R33: a provider paused through one
// coordinator gets no grant from another on the same database within its
// poll interval, long polls included; its running grant writes back; the
// resume through the other lets its jobs go.
func TestPauseStopsGrantsOnEveryReplica_R33(t *testing.T) {
	dsn := testdb.MySQL(t)
	shared := testdb.Backend{Name: "mysql", Open: func(t *testing.T) store.Store {
		s, err := mysql.Open(context.Background(), dsn, mysql.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}}
	const poll = 100 * time.Millisecond
	var logs [2]proctest.Buffer
	with := func(i int) func(o *server.Options) {
		return func(o *server.Options) {
			o.ClaimPollInterval = poll
			o.Logger = slog.New(slog.NewTextHandler(&logs[i], nil))
		}
	}
	a, b := start(t, shared, with(0)), start(t, shared, with(1))
	// Each replica says so when its claims' paused providers change: it
	// reads them every poll interval (chaos invariant 15 holds every grant
	// of a campaign to that bound).
	seen := func(providers string) {
		t.Helper()
		for i := range logs {
			proctest.WaitFor(t, 10*time.Second, "replica "+string(rune('a'+i))+" seeing paused providers "+providers,
				func() bool { return strings.Contains(logs[i].String(), `msg="paused providers" providers=`+providers) })
		}
	}
	ctx := ctxFor(t)
	held := a.enqueue(t)
	g := b.claimOne(t, "B", held.Id)

	pause, err := a.client.PauseProvider(ctx, &pb.PauseProviderRequest{Provider: "acme", Reason: "provider down"})
	if err != nil || !pause.Changed {
		t.Fatalf("PauseProvider = %v, %v", pause, err)
	}
	seen("[acme]")
	waiting := a.enqueue(t)
	for _, c := range []*coordinator{a, b} {
		resp, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: "W", MaxJobs: 10, Wait: durationpb.New(3 * poll)})
		if err != nil || len(resp.Jobs) != 0 {
			t.Fatalf("claim of a paused provider's job = %v, %v", resp, err)
		}
	}
	if _, err := b.client.Complete(ctx, &pb.CompleteRequest{JobId: held.Id, Attempt: g.Attempt, LeaseToken: g.LeaseToken,
		ProviderRefundId: "re_held"}); err != nil {
		t.Fatalf("a grant made before the pause writes back: %v", err)
	}
	ov, err := b.client.GetOverview(ctx, &pb.GetOverviewRequest{})
	if err != nil || len(ov.PausedProviders) != 1 || ov.PausedProviders[0].Reason != "provider down" ||
		len(ov.RecentPauseEvents) != 1 {
		t.Fatalf("overview's pauses = %v %v, %v", ov.GetPausedProviders(), ov.GetRecentPauseEvents(), err)
	}
	if r, err := b.client.ResumeProvider(ctx, &pb.ResumeProviderRequest{Provider: "acme", Reason: "back"}); err != nil || !r.Changed {
		t.Fatalf("ResumeProvider = %v, %v", r, err)
	}
	seen("[]")
	a.claimOne(t, "A", waiting.Id)
}
