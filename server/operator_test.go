package server_test

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
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
		// Pending receipts: they leave jobs[1] where it is in the due order
		// (one of success would expedite it to due now, behind jobs[2], R28).
		for i := 0; i < 2; i++ {
			if _, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
				Job: &pb.ReportObservationRequest_JobId{JobId: jobs[1].Id}, Source: "webhook",
				Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_PENDING, ProviderRefundId: "re_seen",
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

// operatorTokens are one credential per role, and one with two.
func operatorTokens(t *testing.T) *server.Authenticator {
	t.Helper()
	authn, err := server.LoadTokens(writeTokens(t,
		tokenLine("shop", "producer", "tok-shop"),
		tokenLine("worker-a", "worker", "tok-worker-a"),
		tokenLine("worker-b", "worker", "tok-worker-b"),
		tokenLine("alice", "operator,reader", "tok-alice"),
		tokenLine("rita", "reader", "tok-rita"),
		tokenLine("bob", "reader", "tok-bob")))
	if err != nil {
		t.Fatal(err)
	}
	return authn
}

// TestWhoAmIPerRoleAndOpen_R29: every credential may ask who it is and gets
// its name and roles; without a credential it is refused; an open
// coordinator authenticates nobody. GetOverview is for readers and
// operators only.
func TestWhoAmIPerRoleAndOpen_R29(t *testing.T) {
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) { o.Auth = operatorTokens(t) })
	ctx := ctxFor(t)
	for token, want := range map[string]*pb.WhoAmIResponse{
		"tok-shop":     {Name: "shop", Roles: []pb.Role{pb.Role_ROLE_PRODUCER}, Authenticated: true},
		"tok-worker-a": {Name: "worker-a", Roles: []pb.Role{pb.Role_ROLE_WORKER}, Authenticated: true},
		"tok-alice":    {Name: "alice", Roles: []pb.Role{pb.Role_ROLE_OPERATOR, pb.Role_ROLE_READER}, Authenticated: true},
		"tok-rita":     {Name: "rita", Roles: []pb.Role{pb.Role_ROLE_READER}, Authenticated: true},
	} {
		got, err := c.client.WhoAmI(as(ctx, token), &pb.WhoAmIRequest{})
		if err != nil || !proto.Equal(got, want) {
			t.Fatalf("WhoAmI(%s) = %v, %v; want %v", token, got, err, want)
		}
	}
	_, err := c.client.WhoAmI(ctx, &pb.WhoAmIRequest{})
	errorInfo(t, err, codes.Unauthenticated, server.ReasonUnauthenticated)
	_, err = c.client.WhoAmI(as(ctx, "tok-guess"), &pb.WhoAmIRequest{})
	errorInfo(t, err, codes.Unauthenticated, server.ReasonUnauthenticated)

	for _, token := range []string{"tok-worker-a", "tok-shop"} {
		_, err := c.client.GetOverview(as(ctx, token), &pb.GetOverviewRequest{})
		errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
	}
	for _, token := range []string{"tok-alice", "tok-rita"} {
		if _, err := c.client.GetOverview(as(ctx, token), &pb.GetOverviewRequest{}); err != nil {
			t.Fatalf("GetOverview as %s: %v", token, err)
		}
	}

	open := start(t, testdb.SQLiteBackend())
	got, err := open.client.WhoAmI(ctx, &pb.WhoAmIRequest{})
	if err != nil || got.Authenticated || got.Name != "" || len(got.Roles) != 0 {
		t.Fatalf("WhoAmI on an open coordinator = %v, %v; want nobody", got, err)
	}
}

// TestGetOverviewOverGRPC_M1: an operator sees the queue's counts and its
// oldest unfinished job, the review waiting longest, a takeover, a stale
// write-back this coordinator refused (with who sent it) and each
// provider's budget; the limit bounds every list.
func TestGetOverviewOverGRPC_M1(t *testing.T) {
	for _, b := range testdb.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := start(t, b, func(o *server.Options) { o.Auth = operatorTokens(t) })
			ctx := ctxFor(t)
			if err := c.store.ConfigureBudgets(ctx, map[string]store.BudgetConfig{"acme": {Rate: 0.001, Burst: 50}}); err != nil {
				t.Fatal(err)
			}
			overview := func(limit int32) *pb.GetOverviewResponse {
				t.Helper()
				resp, err := c.client.GetOverview(as(ctx, "tok-rita"), &pb.GetOverviewRequest{Limit: limit})
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			before := time.Now()
			empty := overview(0)
			if empty.Now == nil || empty.ReadyJobs+empty.RunningJobs+empty.ManualReviewJobs != 0 ||
				empty.OldestUnfinishedCreatedAt != nil || len(empty.RecentStaleRejections) != 0 ||
				empty.StaleRejectionsSinceStart != 0 || empty.TakeoversWindow != store.TakeoverWindow ||
				empty.CoordinatorStartedAt == nil || empty.CoordinatorStartedAt.AsTime().After(before) {
				t.Fatalf("overview of an empty queue = %v", empty)
			}

			enq, err := c.client.EnqueueRefund(as(ctx, "tok-shop"), refundReq())
			if err != nil {
				t.Fatal(err)
			}
			job := enq.Job
			claimAs := func(token string) *pb.ClaimedJob {
				t.Helper()
				resp, err := c.client.Claim(as(ctx, token), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1})
				if err != nil || len(resp.Jobs) != 1 {
					t.Fatalf("Claim as %s = %v, %v", token, resp, err)
				}
				return resp.Jobs[0]
			}
			a := claimAs("tok-worker-a")
			c.expire(t, job.Id)
			b := claimAs("tok-worker-b")
			// worker-a's late write: refused, and remembered here only.
			_, err = c.client.Complete(as(ctx, "tok-worker-a"), &pb.CompleteRequest{JobId: job.Id, Attempt: a.Attempt,
				LeaseToken: a.LeaseToken, ProviderRefundId: "re_late"})
			errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)

			review, err := c.client.EnqueueRefund(as(ctx, "tok-shop"), refundReq())
			if err != nil {
				t.Fatal(err)
			}
			r := claimAs("tok-worker-a")
			if _, err := c.client.Escalate(as(ctx, "tok-worker-a"), &pb.EscalateRequest{JobId: review.Job.Id,
				Attempt: r.Attempt, LeaseToken: r.LeaseToken, Reason: "no record outside window"}); err != nil {
				t.Fatal(err)
			}

			// The overview of an empty queue is served for a moment longer
			// (a short cache): the next one is read after it.
			var got *pb.GetOverviewResponse
			proctest.WaitFor(t, 10*time.Second, "a fresh overview", func() bool {
				got = overview(0)
				return got.Now.AsTime().After(empty.Now.AsTime())
			})
			if got.ReadyJobs != 0 || got.RunningJobs != 1 || got.ManualReviewJobs != 1 ||
				!got.OldestUnfinishedCreatedAt.AsTime().Equal(job.CreatedAt.AsTime()) {
				t.Fatalf("counts ready %d running %d review %d, oldest %v; want 0, 1, 1 and %v", got.ReadyJobs,
					got.RunningJobs, got.ManualReviewJobs, got.OldestUnfinishedCreatedAt, job.CreatedAt)
			}
			if len(got.OldestReviews) != 1 || got.OldestReviews[0].Id != review.Job.Id {
				t.Fatalf("oldest reviews = %v, want job %d", got.OldestReviews, review.Job.Id)
			}
			if len(got.RecentTakeovers) != 1 || got.RecentTakeovers[0].JobId != job.Id ||
				got.RecentTakeovers[0].Kind != "taken_over" || got.RecentTakeovers[0].Attempt != b.Attempt ||
				got.RecentTakeovers[0].WorkerId != "worker-b" {
				t.Fatalf("recent takeovers = %v, want job %d's by worker-b under attempt %d", got.RecentTakeovers,
					job.Id, b.Attempt)
			}
			want := &pb.StaleRejection{JobId: job.Id, Attempt: a.Attempt, CurrentAttempt: b.Attempt, Rpc: "Complete",
				Caller: "worker-a"}
			if len(got.RecentStaleRejections) != 1 || got.StaleRejectionsSinceStart != 1 {
				t.Fatalf("stale rejections %v (%d since start), want one", got.RecentStaleRejections,
					got.StaleRejectionsSinceStart)
			}
			s := got.RecentStaleRejections[0]
			if at := s.At; at == nil || at.AsTime().Before(before) || at.AsTime().After(time.Now()) {
				t.Fatalf("stale rejection at %v", at)
			}
			s.At = nil
			if !proto.Equal(s, want) {
				t.Fatalf("stale rejection = %v, want %v", s, want)
			}
			if len(got.Budgets) != 1 || got.Budgets[0].Provider != "acme" || got.Budgets[0].RatePerSecond != 0.001 ||
				got.Budgets[0].Burst != 50 || got.Budgets[0].Available < 47 || got.Budgets[0].Available > 47.1 {
				t.Fatalf("budgets = %v, want acme at 0.001/s, burst 50, 47 available (3 grants)", got.Budgets)
			}

			// A second stale write, by the other RPC a worker sends: the
			// newest comes first and the limit bounds the list, not the count.
			_, err = c.client.Escalate(as(ctx, "tok-worker-a"), &pb.EscalateRequest{JobId: job.Id, Attempt: a.Attempt,
				LeaseToken: a.LeaseToken, Reason: "confused"})
			errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)
			one := overview(1)
			if len(one.RecentStaleRejections) != 1 || one.RecentStaleRejections[0].Rpc != "Escalate" ||
				one.StaleRejectionsSinceStart != 2 || len(one.RecentTakeovers) != 1 || len(one.OldestReviews) != 1 {
				t.Fatalf("overview(1) = %v", one)
			}
			for _, limit := range []int32{-1, store.MaxOverviewLimit + 1} {
				_, err := c.client.GetOverview(as(ctx, "tok-alice"), &pb.GetOverviewRequest{Limit: limit})
				fieldViolation(t, err, "limit")
			}
			if _, err := c.client.GetOverview(as(ctx, "tok-alice"), &pb.GetOverviewRequest{Limit: store.MaxOverviewLimit}); err != nil {
				t.Fatalf("GetOverview(limit %d): %v", store.MaxOverviewLimit, err)
			}
		})
	}
}
