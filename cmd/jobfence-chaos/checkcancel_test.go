package main

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// cancelBase is the hand-made campaigns' time zero, on both clocks (the
// database's and the campaign's agree: offset 0).
var cancelBase = time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return cancelBase.Add(time.Duration(sec * float64(time.Second))) }

// tev builds a timed history event of job id.
func tev(id, job, attempt int64, kind, from, to, next, worker string, sec float64) eventRow {
	return eventRow{ID: id, JobID: job, Attempt: attempt, Kind: kind, FromState: from, ToState: to, NextAction: next,
		WorkerID: worker, At: at(sec)}
}

// cancelCampaign is one job (id 1) whose history and refunds the tests
// shape; the provider's refund re_1 of it is added by withRefund.
func cancelCampaign(job jobRow, evs ...eventRow) checkInput {
	specs := refundSpecs(7, 1)
	job.ID, job.Key = 1, specs[0].Key
	for i := range evs {
		evs[i].JobID = 1
	}
	return checkInput{
		Specs:    specs,
		Webhooks: true,
		DB:       dbState{Now: at(60), ReadAt: at(60), Jobs: []jobRow{job}, Events: evs, Control: true},
		Control:  &controlInput{Canceller: true, Pauser: true, ClaimPoll: 200 * time.Millisecond, Lease: 4 * time.Second},
		Takeovers: &takeoverInput{Lease: 4 * time.Second, Start: cancelBase, Workers: map[string]workerFacts{
			"w1": {Replica: "replica-a", Renews: true}, "w2": {Replica: "replica-b", Renews: true}}},
	}
}

// withRefund adds the provider's refund of the job, its request received
// at received and made at created.
func withRefund(in checkInput, status fakeprovider.RefundStatus, received, created float64) checkInput {
	key := in.Specs[0].Key
	in.Oracle.Refunds = append(in.Oracle.Refunds, fakeprovider.Refund{ID: "re_1", MerchantReference: key, Status: status,
		Received: at(received), Created: at(created)})
	live := 1
	if status == fakeprovider.StatusFailed {
		live = 0
	}
	in.Oracle.Operations = append(in.Oracle.Operations, fakeprovider.OperationTruth{MerchantReference: key,
		MerchantReferences: []string{key}, IdempotencyKeys: []string{key}, RefundIDs: []string{"re_1"}, Refunds: live})
	return in
}

// tooLateHistory: claimed to refund by w1 at 1s, the cancel request at 2s
// takes it over (attempt 2), w2 reconciles at 2.3s and finds the refund:
// succeeded, the cancel too late.
func tooLateHistory() (jobRow, []eventRow) {
	evs := []eventRow{
		tev(1, 1, 0, "enqueued", "", "ready", "refund", "", 0),
		tev(2, 1, 1, "claimed", "ready", "running", "refund", "w1", 1),
		tev(3, 1, 2, "cancel_requested", "running", "ready", "reconcile", "operator", 2),
		tev(4, 1, 3, "claimed", "ready", "running", "reconcile", "w2", 2.3),
		tev(5, 1, 3, "completed", "running", "succeeded", "reconcile", "w2", 2.4),
		tev(6, 1, 3, "attention", "succeeded", "succeeded", "reconcile", "w2", 2.4),
	}
	evs[4].ProviderRefundID, evs[5].ProviderRefundID = "re_1", "re_1"
	evs[5].Reason = "cancel_too_late: the provider had the refund when the cancel was requested"
	job := jobRow{State: "succeeded", Attempt: 3, NextAction: "reconcile", ProviderRefundID: "re_1",
		FirstSentAt: sql.NullTime{Time: at(1), Valid: true}, CancelRequestedAt: sql.NullTime{Time: at(2), Valid: true},
		AttentionSince: sql.NullTime{Time: at(2.4), Valid: true}, AttentionReason: evs[5].Reason}
	return job, evs
}

// cancelledHistory: enqueued and cancelled at once at 0.5s, never sent.
func cancelledHistory() (jobRow, []eventRow) {
	return jobRow{State: "cancelled", NextAction: "refund"}, []eventRow{
		tev(1, 1, 0, "enqueued", "", "ready", "refund", "", 0),
		tev(2, 1, 0, "cancelled", "ready", "cancelled", "refund", "operator", 0.5),
	}
}

func judge13(t *testing.T, in checkInput) (*invariant, cancelTally) {
	t.Helper()
	return checkNoRefundAfterCancel(in, newCheckFacts(in.Specs, in.DB))
}

func judge14(t *testing.T, in checkInput) (*invariant, cancelTally) {
	t.Helper()
	return checkCancelsEnd(in, newCheckFacts(in.Specs, in.DB))
}

func wantVerdict(t *testing.T, i *invariant, fail bool, words string) {
	t.Helper()
	text := i.Summary + "\n" + strings.Join(i.Details, "\n")
	if i.Failed != fail {
		t.Fatalf("invariant %d failed=%v, want %v:\n%s", i.N, i.Failed, fail, text)
	}
	if words != "" && !strings.Contains(text, words) {
		t.Fatalf("invariant %d does not say %q:\n%s", i.N, words, text)
	}
}

func TestWalkHistoryKnowsCancelsAndTheAttentionList_R32(t *testing.T) {
	job, evs := tooLateHistory()
	if h := walkHistory(job, evs); len(h.attemptProblems)+len(h.staleWrites)+len(h.evidenceProblems) > 0 ||
		h.cancelRequests != 1 || h.attentions != 1 || h.claims != 2 {
		t.Fatalf("a cancel too late judged %+v", h)
	}
	job, evs = cancelledHistory()
	if h := walkHistory(job, evs); len(h.attemptProblems)+len(h.staleWrites)+len(h.evidenceProblems) > 0 || h.cancels != 1 {
		t.Fatalf("a cancel at once judged %+v", h)
	}
	// A cancel request of a running job that did not take it over: the
	// holder could still write.
	job, evs = tooLateHistory()
	evs[2].Attempt, evs[3].Attempt, evs[4].Attempt, evs[5].Attempt = 1, 2, 2, 2
	job.Attempt = 2
	if h := walkHistory(job, evs); len(h.evidenceProblems) != 1 || !strings.Contains(h.evidenceProblems[0], "takes a running job over") {
		t.Fatalf("a cancel request that took nothing over judged %+v", h)
	}
	// Anything but the attention list after a cancel is a write after the end.
	job, evs = cancelledHistory()
	evs = append(evs, tev(3, 1, 1, "claimed", "cancelled", "running", "refund", "w1", 1))
	job.State, job.Attempt = "running", 1
	if h := walkHistory(job, evs); len(h.staleWrites) == 0 || !strings.Contains(h.staleWrites[0], "after the job was final (cancelled)") {
		t.Fatalf("a claim after the cancel judged %+v", h)
	}
}

func TestCheckNoRefundAfterCancel_R32(t *testing.T) {
	t.Run("a cancel too late: the refund requested before the cancel", func(t *testing.T) {
		job, evs := tooLateHistory()
		i, tally := judge13(t, withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 1.01, 1.02))
		wantVerdict(t, i, false, "1 requested before the cancel took effect")
		if tally.Requested != 1 || tally.RefundsAfterCancel != 0 {
			t.Fatalf("tally %+v", tally)
		}
	})
	t.Run("a refund requested before the cancel, made after it (a hang)", func(t *testing.T) {
		job, evs := tooLateHistory()
		wantVerdict(t, judgeOnly13(t, withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 1.5, 6)), false,
			"1 requested before the cancel took effect")
	})
	t.Run("a call on its way: requested just after the cancel, within a lease of its grant", func(t *testing.T) {
		job, evs := tooLateHistory()
		wantVerdict(t, judgeOnly13(t, withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 2.2, 2.2)), false,
			"1 after it by the holder of an earlier grant")
	})
	t.Run("requested long after the cancel by a holder that was not frozen", func(t *testing.T) {
		job, evs := tooLateHistory()
		i, tally := judge13(t, withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 7, 7))
		wantVerdict(t, i, true, "REFUND AFTER CANCEL: job 1")
		if tally.RefundsAfterCancel != 1 {
			t.Fatalf("tally %+v", tally)
		}
	})
	t.Run("requested long after the cancel by a holder frozen across it", func(t *testing.T) {
		job, evs := tooLateHistory()
		in := withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 7, 7)
		in.Takeovers.Workers["w1"] = workerFacts{Replica: "replica-a", Renews: true,
			Frozen: []span{{From: at(1.001), To: at(6.9)}}}
		wantVerdict(t, judgeOnly13(t, in), false, "5.899s of it frozen")
	})
	t.Run("a grant to refund after the cancel request", func(t *testing.T) {
		job, evs := tooLateHistory()
		evs[3].NextAction = "refund" // the grant forgot the cancel
		i, _ := judge13(t, withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 2.31, 2.32))
		wantVerdict(t, i, true, "GRANT TO REFUND AFTER A CANCEL: job 1")
		wantVerdict(t, i, true, "the latest grant to refund before it, event 4 by w2")
	})
	t.Run("a reschedule to refund accepted after the cancel request", func(t *testing.T) {
		job, evs := tooLateHistory()
		evs = append(evs[:4:4], tev(5, 1, 3, "rescheduled", "running", "ready", "refund", "w2", 2.4))
		job = jobRow{State: "ready", Attempt: 3, NextAction: "refund", FirstSentAt: job.FirstSentAt,
			CancelRequestedAt: job.CancelRequestedAt}
		wantVerdict(t, judgeOnly13(t, cancelCampaign(job, evs...)), true, "RESCHEDULE TO REFUND ACCEPTED AFTER A CANCEL")
	})
	t.Run("a job cancelled as never sent, with a refund at the provider", func(t *testing.T) {
		job, evs := cancelledHistory()
		wantVerdict(t, judgeOnly13(t, withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 0.4, 0.4)), true,
			"REFUND OF A JOB CANCELLED AS NEVER SENT")
	})
	t.Run("a job cancelled as never sent, and nothing at the provider", func(t *testing.T) {
		job, evs := cancelledHistory()
		wantVerdict(t, judgeOnly13(t, cancelCampaign(job, evs...)), false, "1 cancelled as never sent")
	})
}

func judgeOnly13(t *testing.T, in checkInput) *invariant {
	t.Helper()
	i, _ := judge13(t, in)
	return i
}

func TestCheckCancelsEnd_R32_R34(t *testing.T) {
	t.Run("succeeded too late, on the attention list", func(t *testing.T) {
		job, evs := tooLateHistory()
		i, tally := judge14(t, withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 1.01, 1.02))
		wantVerdict(t, i, false, "1 succeeded too late")
		if tally.TooLate != 1 || tally.Unended != 0 {
			t.Fatalf("tally %+v", tally)
		}
	})
	t.Run("succeeded after its cancel request, not on the attention list", func(t *testing.T) {
		job, evs := tooLateHistory()
		evs = evs[:5]
		job.AttentionSince, job.AttentionReason = sql.NullTime{}, ""
		wantVerdict(t, judgeOnly14(t, cancelCampaign(job, evs...)), true, "CANCEL TOO LATE, NOT ON THE ATTENTION LIST")
	})
	t.Run("taken off the list with no acknowledgement", func(t *testing.T) {
		job, evs := tooLateHistory()
		job.AttentionSince = sql.NullTime{}
		wantVerdict(t, judgeOnly14(t, cancelCampaign(job, evs...)), true, "OFF THE ATTENTION LIST UNACKNOWLEDGED")
	})
	t.Run("with a person", func(t *testing.T) {
		job, evs := tooLateHistory()
		evs = append(evs[:4:4], tev(5, 1, 3, "escalated", "running", "manual_review", "reconcile", "w2", 2.4))
		job = jobRow{State: "manual_review", Attempt: 3, NextAction: "reconcile", FirstSentAt: job.FirstSentAt,
			CancelRequestedAt: job.CancelRequestedAt}
		wantVerdict(t, judgeOnly14(t, cancelCampaign(job, evs...)), false, "1 with a person")
	})
	t.Run("a cancel request never ended", func(t *testing.T) {
		job, evs := tooLateHistory()
		evs = evs[:3]
		job = jobRow{State: "ready", Attempt: 2, NextAction: "reconcile", FirstSentAt: job.FirstSentAt,
			CancelRequestedAt: job.CancelRequestedAt}
		wantVerdict(t, judgeOnly14(t, cancelCampaign(job, evs...)), true, "CANCEL REQUEST NOT ENDED: job 1")
	})
	t.Run("a maybe-sent refund cancelled without a person", func(t *testing.T) {
		job, evs := tooLateHistory()
		evs = append(evs[:4:4], tev(5, 1, 3, "cancelled", "running", "cancelled", "reconcile", "w2", 2.4))
		job = jobRow{State: "cancelled", Attempt: 3, NextAction: "reconcile", FirstSentAt: job.FirstSentAt,
			CancelRequestedAt: job.CancelRequestedAt}
		wantVerdict(t, judgeOnly14(t, cancelCampaign(job, evs...)), true, "CANCELLED WITHOUT A PERSON")
		// A person's resolution may close it so.
		evs = append(evs[:4:4], tev(5, 1, 3, "escalated", "running", "manual_review", "reconcile", "w2", 2.4),
			tev(6, 1, 3, "resolved", "manual_review", "cancelled", "reconcile", "operator", 9))
		wantVerdict(t, judgeOnly14(t, cancelCampaign(job, evs...)), false, "1 resolved by a person as cancelled")
		// Or as refunded, the provider having made it: no attention entry
		// is owed then, a person having looked.
		evs[5].ToState, evs[5].ProviderRefundID = "succeeded", "re_1"
		job.State, job.ProviderRefundID = "succeeded", "re_1"
		wantVerdict(t, judgeOnly14(t, cancelCampaign(job, evs...)), false, "0 resolved by a person as cancelled and 1 as refunded")
	})
	t.Run("cancelled as never sent, yet sent", func(t *testing.T) {
		job, evs := cancelledHistory()
		job.FirstSentAt = sql.NullTime{Time: at(0.2), Valid: true}
		wantVerdict(t, judgeOnly14(t, cancelCampaign(job, evs...)), true, "CANCELLED AS NEVER SENT, BUT")
	})
	t.Run("refunded and cancelled, not on the attention list", func(t *testing.T) {
		job, evs := cancelledHistory()
		in := withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 0.4, 0.4)
		wantVerdict(t, judgeOnly14(t, in), true, "REFUNDED, CANCELLED AND NOT ON THE ATTENTION LIST")
		a := tev(3, 1, 0, "attention", "cancelled", "cancelled", "refund", "", 3)
		a.Reason = "receipt_after_cancel: webhook:acme reported the refund succeeded (re_1) after it was cancelled"
		in.DB.Events = append(in.DB.Events, a)
		wantVerdict(t, judgeOnly14(t, in), false, "1 of them on the attention list")
	})
	t.Run("a cancel request of a job archived", func(t *testing.T) {
		job, evs := tooLateHistory()
		job.ArchivedAt = sql.NullTime{Time: at(9), Valid: true}
		wantVerdict(t, judgeOnly14(t, cancelCampaign(job, evs...)), true, "ARCHIVED WITH A CANCEL REQUEST")
	})
	t.Run("the canceller's answers, against the history", func(t *testing.T) {
		job, evs := tooLateHistory()
		in := cancelCampaign(job, evs...)
		in.Control.Cancels = []cancelAnswer{
			{Key: in.Specs[0].Key, JobID: 1, Moment: cancelInCall, Outcome: "requested", CoordAt: at(2), At: at(2.01)},
			{Key: in.Specs[0].Key, JobID: 1, Moment: cancelInCall, Outcome: "JOB_NOT_CANCELLABLE", CoordAt: at(3), At: at(3)},
		}
		wantVerdict(t, judgeOnly14(t, in), false, "2 of them matched")
		in.Control.Cancels[0].CoordAt = at(2.5) // no entry then
		wantVerdict(t, judgeOnly14(t, in), true, "CANCEL ANSWERED, NOT IN THE HISTORY")
		in.Control.Cancels[0].CoordAt = at(2)
		in.Control.Cancels[1].CoordAt = at(1.5) // nothing had ended it by then
		wantVerdict(t, judgeOnly14(t, in), true, "NOT CANCELLABLE, YET NOTHING ENDED IT")
	})
}

func judgeOnly14(t *testing.T, in checkInput) *invariant {
	t.Helper()
	i, _ := judge14(t, in)
	return i
}

// pausedCampaign: the provider paused at 10s (answered at 10.01s) and
// resumed at 13s; job 1 granted to w1 (replica-a) at grantAt.
func pausedCampaign(grantAt float64) checkInput {
	in := cancelCampaign(jobRow{State: "running", Attempt: 1, NextAction: "refund"},
		tev(1, 1, 0, "enqueued", "", "ready", "refund", "", 9),
		tev(2, 1, 1, "claimed", "ready", "running", "refund", "w1", grantAt))
	in.DB.PauseEvents = []pauseEventRow{
		{ID: 1, Provider: providerName, Action: "paused", Actor: "operator", Reason: "chaos: pause #1", At: at(10)},
		{ID: 2, Provider: providerName, Action: "resumed", Actor: "operator", Reason: "chaos: end of pause #1", At: at(13)},
	}
	in.Control.Pauses = []pauseAnswer{{N: 1, Action: "paused", Changed: true, PausedAt: at(10), At: at(10.01)},
		{N: 1, Action: "resumed", Changed: true, At: at(13.01)}}
	return in
}

func judge15(t *testing.T, in checkInput) (*invariant, pauseTally) {
	t.Helper()
	return checkNoGrantWhilePaused(in, newCheckFacts(in.Specs, in.DB))
}

func TestCheckNoGrantWhilePaused_R33(t *testing.T) {
	for _, c := range []struct {
		name    string
		grantAt float64
		shape   func(*checkInput)
		fail    bool
		words   string
	}{
		{"a grant before the pause", 9.5, nil, false, "0 before every replica"},
		{"a grant before every replica saw the pause", 10.2, nil, false, "1 before every replica must have seen the pause"},
		{"a grant while the pause stood", 11, nil, true, "GRANT WHILE PAUSED: job 1"},
		{"a takeover while the pause stood", 11, func(in *checkInput) {
			in.DB.Events[1].Kind, in.DB.Events[1].FromState, in.DB.Events[1].NextAction = "taken_over", "running", "reconcile"
		}, true, "GRANT WHILE PAUSED"},
		{"a grant after the resume", 13.5, nil, false, "0 otherwise"},
		{"a pause whose answer came late: judged from the answer", 11, func(in *checkInput) {
			in.Control.Pauses[0].At = at(10.9)
		}, false, "1 before every replica must have seen the pause"},
		{"a grant by a replica whose database was cut off meanwhile", 11, func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-down", N: 4, Replica: "replica-a", From: at(9.8), To: at(10.8)}}
		}, false, "1 later by a replica whose database was faulted"},
		{"another replica's database faults explain nothing", 11, func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-down", N: 4, Replica: "replica-b", From: at(9.8), To: at(10.8)}}
		}, true, "GRANT WHILE PAUSED"},
		{"a pause never resumed", 9.5, func(in *checkInput) { in.DB.PauseEvents = in.DB.PauseEvents[:1] }, true,
			"PAUSE NEVER RESUMED"},
		{"a pause answered and not on file", 9.5, func(in *checkInput) { in.DB.PauseEvents = nil }, true,
			"PAUSE ANSWERED, NOT ON FILE"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := pausedCampaign(c.grantAt)
			if c.shape != nil {
				c.shape(&in)
			}
			i, tally := judge15(t, in)
			wantVerdict(t, i, c.fail, c.words)
			if c.fail != (tally.GrantsWhilePaused > 0) && !strings.Contains(c.name, "never resumed") &&
				!strings.Contains(c.name, "not on file") {
				t.Fatalf("tally %+v", tally)
			}
		})
	}
}

// The whole check, on a clean campaign with a cancel too late: no
// invariant fails, and the summary line counts the cancel.
func TestCheckPassesACampaignWithACancelTooLate(t *testing.T) {
	job, evs := tooLateHistory()
	in := withRefund(cancelCampaign(job, evs...), fakeprovider.StatusSucceeded, 1.01, 1.02)
	in.Acked = map[string]int64{in.Specs[0].Key: 1}
	in.Webhooks = false
	in.DB.Ledger = []ledgerRow{{JobID: 1, Key: in.Specs[0].Key, ProviderRefundID: "re_1", Attempt: 3}}
	in.Takeovers = nil
	v := check(in)
	if v.Failed() || v.Cancels != 1 || v.TooLate != 1 {
		var b strings.Builder
		v.print(&b)
		t.Fatalf("failed %v, cancels %d, too late %d:\n%s", failedInvariants(v), v.Cancels, v.TooLate, b.String())
	}
	if line := v.summaryLine(7, 1, 0, "", 0); !strings.Contains(line, "cancels=1 cancels_too_late=1 refunds_after_cancel=0 "+
		"cancels_unended=0 pauses=0 grants_while_paused=0") {
		t.Fatalf("summary line: %s", line)
	}
}
