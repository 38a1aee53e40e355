package jobfence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	jobfence "github.com/jobfence/jobfence/clients/go"
	"github.com/jobfence/jobfence/internal/testdb"
)

func TestDecisionTable_R14_R16(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	sent := jobfence.ClaimedJob{Attempt: 2, NextAction: jobfence.ActionReconcile, ResendDeadline: now.Add(time.Hour)}
	closing := sent
	closing.ResendDeadline = now.Add(time.Minute) // inside the default 5m margin
	past := sent
	past.ResendDeadline = now.Add(-time.Second)
	neverSent := jobfence.ClaimedJob{Attempt: 1, NextAction: jobfence.ActionReconcile}
	refund := jobfence.ClaimedJob{Attempt: 1, NextAction: jobfence.ActionRefund, ResendDeadline: now.Add(24 * time.Hour)}
	safe := jobfence.ProviderPolicy{SameKeyResendSafe: true}
	unsafe := jobfence.ProviderPolicy{}

	for _, tc := range []struct {
		name   string
		result jobfence.Result
		job    jobfence.ClaimedJob
		policy jobfence.ProviderPolicy
		want   jobfence.Decision
	}{
		{"refunded completes", jobfence.Succeeded("re_1"), sent, safe,
			jobfence.Decision{Kind: jobfence.DecideComplete, ProviderRefundID: "re_1"}},
		{"refunded without id escalates", jobfence.Succeeded(""), sent, safe,
			jobfence.Decision{Kind: jobfence.DecideEscalate}},
		{"pending reconciles later R4", jobfence.Pending("re_1", 0), sent, safe,
			jobfence.Decision{Kind: jobfence.DecideReschedule, NextAction: jobfence.ActionReconcile, Delay: jobfence.DefaultPendingDelay}},
		{"pending honours retry-after", jobfence.Pending("", 7*time.Second), sent, safe,
			jobfence.Decision{Kind: jobfence.DecideReschedule, NextAction: jobfence.ActionReconcile, Delay: 7 * time.Second}},
		{"no record inside the window resends", jobfence.NoRecord(), sent, safe,
			jobfence.Decision{Kind: jobfence.DecideReschedule, NextAction: jobfence.ActionRefund}},
		{"no record, window closing, escalates", jobfence.NoRecord(), closing, safe,
			jobfence.Decision{Kind: jobfence.DecideEscalate}},
		{"no record past the window escalates", jobfence.NoRecord(), past, safe,
			jobfence.Decision{Kind: jobfence.DecideEscalate}},
		{"no record without the guarantee escalates R16", jobfence.NoRecord(), sent, unsafe,
			jobfence.Decision{Kind: jobfence.DecideEscalate}},
		{"no record of a key never sent sends", jobfence.NoRecord(), neverSent, unsafe,
			jobfence.Decision{Kind: jobfence.DecideReschedule, NextAction: jobfence.ActionRefund}},
		{"rejected escalates", jobfence.Failed("re_1", "declined"), sent, safe,
			jobfence.Decision{Kind: jobfence.DecideEscalate}},
		{"not sent repeats a refund", jobfence.NotSent("rate limited", 0), refund, unsafe,
			jobfence.Decision{Kind: jobfence.DecideReschedule, NextAction: jobfence.ActionRefund, Delay: jobfence.DefaultNotSentDelay}},
		{"not sent repeats a reconcile", jobfence.NotSent("rate limited", time.Second), sent, unsafe,
			jobfence.Decision{Kind: jobfence.DecideReschedule, NextAction: jobfence.ActionReconcile, Delay: time.Second}},
		{"unknown reconciles R14", jobfence.Unknown(errors.New("cut")), refund, safe,
			jobfence.Decision{Kind: jobfence.DecideReschedule, NextAction: jobfence.ActionReconcile, Delay: jobfence.DefaultUnknownDelay}},
		{"the zero result is unknown", jobfence.Result{}, refund, safe,
			jobfence.Decision{Kind: jobfence.DecideReschedule, NextAction: jobfence.ActionReconcile, Delay: jobfence.DefaultUnknownDelay}},
		{"handler escalates", jobfence.Escalate("odd"), sent, safe,
			jobfence.Decision{Kind: jobfence.DecideEscalate, Reason: "odd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := jobfence.DecideAt(tc.result, tc.job, tc.policy, now)
			if tc.want.Reason == "" {
				if got.Reason == "" && got.Kind != jobfence.DecideComplete {
					t.Errorf("decision %+v has no reason", got)
				}
				got.Reason = ""
			}
			if got != tc.want {
				t.Errorf("DecideAt = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestResendAllowedNeedsMarginBeforeDeadline_R22(t *testing.T) {
	deadline := time.Date(2030, 1, 2, 0, 0, 0, 0, time.UTC)
	c := jobfence.ClaimedJob{ResendDeadline: deadline}
	p := jobfence.ProviderPolicy{SameKeyResendSafe: true, ResendMargin: time.Minute}
	for _, tc := range []struct {
		now  time.Time
		want bool
	}{
		{deadline.Add(-time.Hour), true},
		{deadline.Add(-time.Minute - time.Nanosecond), true},
		{deadline.Add(-time.Minute), false},
		{deadline.Add(time.Hour), false},
	} {
		ok, why := p.ResendAllowed(c, tc.now)
		if ok != tc.want || why == "" {
			t.Errorf("ResendAllowed at deadline%+v = %v (%s), want %v", tc.now.Sub(deadline), ok, why, tc.want)
		}
	}
	if ok, why := (jobfence.ProviderPolicy{}).ResendAllowed(c, deadline.Add(-time.Hour)); ok || !strings.Contains(why, "guarantee") {
		t.Errorf("without the guarantee: %v %s", ok, why)
	}
}

// TestCoordinatorNowFollowsTheClaimNotTheWallClock_R12: the estimate starts
// at the database time of the claim and advances with the monotonic clock.
func TestCoordinatorNowFollowsTheClaimNotTheWallClock_R12(t *testing.T) {
	c := startCoordinatorOn(t, testdb.SQLiteBackend(), nil)
	job := c.enqueue(t, "acme")
	claimed := c.claimOne(t, "w", job)
	if claimed.ClaimedAt.IsZero() || !claimed.Job.FirstSentAt.Equal(claimed.ClaimedAt) || claimed.SendsAgain() {
		t.Fatalf("first claim: claimed at %v, first sent %v, SendsAgain %v", claimed.ClaimedAt, claimed.Job.FirstSentAt, claimed.SendsAgain())
	}
	time.Sleep(50 * time.Millisecond)
	got := claimed.CoordinatorNow().Sub(claimed.ClaimedAt)
	if got < 50*time.Millisecond || got > 5*time.Second {
		t.Fatalf("CoordinatorNow is %s after the claim's database time, want about 50ms", got)
	}
}
