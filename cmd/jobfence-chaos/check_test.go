package main

import (
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// ev builds a history event of job 1.
func ev(id, attempt int64, kind, from, to string) eventRow {
	next := "refund"
	if kind == "taken_over" {
		next = "reconcile"
	}
	return eventRow{ID: id, JobID: 1, Attempt: attempt, Kind: kind, FromState: from, ToState: to, NextAction: next}
}

// zombieHistory is T1 as the database records it when the fence holds: A
// claims, B takes over and completes; A's late write left no trace.
func zombieHistory() []eventRow {
	return []eventRow{
		ev(1, 0, "enqueued", "", "ready"),
		ev(2, 1, "claimed", "ready", "running"),
		ev(3, 2, "taken_over", "running", "running"),
		ev(4, 2, "completed", "running", "succeeded"),
	}
}

func TestWalkHistoryAcceptsAFencedTakeover(t *testing.T) {
	h := walkHistory(jobRow{ID: 1, State: "succeeded", Attempt: 2, NextAction: "refund"}, zombieHistory())
	if len(h.attemptProblems)+len(h.staleWrites) > 0 || h.claims != 1 || h.takeovers != 1 || h.writes != 1 {
		t.Fatalf("clean history judged %+v", h)
	}
}

func TestWalkHistoryFindsAStaleWriteAccepted_T1(t *testing.T) {
	evs := zombieHistory()
	// A's reschedule under attempt 1 after B's takeover: the fence failed.
	evs = append(evs[:3:3], ev(9, 1, "rescheduled", "running", "ready"))
	h := walkHistory(jobRow{ID: 1, State: "ready", Attempt: 2}, evs)
	if len(h.staleWrites) != 1 || !strings.Contains(h.staleWrites[0], "under attempt 1 while the current attempt was 2") {
		t.Fatalf("stale write not found: %+v", h)
	}
	if len(h.attemptProblems) == 0 {
		t.Error("the attempt going down from 2 to 1 was not reported")
	}
}

func TestWalkHistoryFindsASecondCompletion(t *testing.T) {
	evs := append(zombieHistory(), ev(5, 2, "completed", "succeeded", "succeeded"))
	h := walkHistory(jobRow{ID: 1, State: "succeeded", Attempt: 2}, evs)
	if len(h.staleWrites) == 0 {
		t.Fatalf("a second completion passed: %+v", h)
	}
}

func TestWalkHistoryFindsAttemptJumpsAndDoubleGrants(t *testing.T) {
	evs := []eventRow{
		ev(1, 0, "enqueued", "", "ready"),
		ev(2, 2, "claimed", "ready", "running"),   // skipped attempt 1
		ev(3, 3, "claimed", "running", "running"), // a claim of a running job
	}
	h := walkHistory(jobRow{ID: 1, State: "running", Attempt: 5}, evs)
	got := strings.Join(h.attemptProblems, "\n")
	for _, w := range []string{"stepped the attempt from 0 to 2", "claimed event 3 while the job was running",
		"row attempt 5, history's highest 3"} {
		if !strings.Contains(got, w) {
			t.Errorf("missing %q in:\n%s", w, got)
		}
	}
}

// campaign builds a check input for two refunds, both done right.
func campaign() checkInput {
	specs := refundSpecs(5, 2)
	k1, k2 := specs[0].Key, specs[1].Key
	done := func(id int64, refund string) []eventRow {
		return []eventRow{
			{ID: id * 10, JobID: id, Kind: "enqueued", ToState: "ready", NextAction: "refund"},
			{ID: id*10 + 1, JobID: id, Attempt: 1, Kind: "claimed", FromState: "ready", ToState: "running", NextAction: "refund"},
			{ID: id*10 + 2, JobID: id, Attempt: 1, Kind: "completed", FromState: "running", ToState: "succeeded",
				NextAction: "refund", ProviderRefundID: refund},
		}
	}
	refund := func(id, key string) fakeprovider.Refund {
		return fakeprovider.Refund{ID: id, MerchantReference: key, Status: fakeprovider.StatusSucceeded}
	}
	return checkInput{
		Specs: specs,
		Acked: map[string]int64{k1: 1, k2: 2},
		DB: dbState{
			Now: time.Now(),
			Jobs: []jobRow{
				{ID: 1, Key: k1, State: "succeeded", Attempt: 1, NextAction: "refund", ProviderRefundID: "re_1"},
				{ID: 2, Key: k2, State: "succeeded", Attempt: 1, NextAction: "refund", ProviderRefundID: "re_2"},
			},
			Events: append(done(1, "re_1"), done(2, "re_2")...),
			Ledger: []ledgerRow{{JobID: 1, Key: k1, ProviderRefundID: "re_1", Attempt: 1}, {JobID: 2, Key: k2, ProviderRefundID: "re_2", Attempt: 1}},
		},
		Oracle: fakeprovider.OracleReport{
			Refunds: []fakeprovider.Refund{refund("re_1", k1), refund("re_2", k2)},
			Operations: []fakeprovider.OperationTruth{
				{MerchantReference: k1, MerchantReferences: []string{k1}, IdempotencyKeys: []string{k1}, RefundIDs: []string{"re_1"}, Refunds: 1},
				{MerchantReference: k2, MerchantReferences: []string{k2}, IdempotencyKeys: []string{k2}, RefundIDs: []string{"re_2"}, Refunds: 1},
			},
		},
	}
}

func failedInvariants(v verdict) []int {
	var out []int
	for _, i := range v.Invariants {
		if i.Failed {
			out = append(out, i.N)
		}
	}
	return out
}

func TestCheckPassesACleanCampaign(t *testing.T) {
	v := check(campaign())
	if v.Failed() || v.Succeeded != 2 || v.Lost+v.DoubleRefunds+v.StaleWritesAccepted+v.UnobservedLateSuccess != 0 {
		var b strings.Builder
		v.print(&b)
		t.Fatalf("clean campaign judged:\n%s", b.String())
	}
}

func TestCheckFindsADoubleRefund(t *testing.T) {
	in := campaign()
	k1 := in.Specs[0].Key
	in.Oracle.Refunds = append(in.Oracle.Refunds, fakeprovider.Refund{ID: "re_3", MerchantReference: k1, Status: fakeprovider.StatusSucceeded})
	in.Oracle.Operations[0].RefundIDs = append(in.Oracle.Operations[0].RefundIDs, "re_3")
	in.Oracle.Operations[0].Refunds = 2
	in.Oracle.Operations[0].Duplicate = true
	in.Oracle.DoubleRefunds = 1
	v := check(in)
	if v.DoubleRefunds != 1 || !v.Invariants[0].Failed || !v.Invariants[5].Failed {
		t.Fatalf("double refund: got %d, failed invariants %v", v.DoubleRefunds, failedInvariants(v))
	}
}

func TestCheckFindsALostAndAStuckJob(t *testing.T) {
	in := campaign()
	in.DB.Jobs = in.DB.Jobs[:1]
	in.DB.Events = in.DB.Events[:3]
	in.DB.Ledger = in.DB.Ledger[:1]
	in.Oracle.Refunds = in.Oracle.Refunds[:1]
	in.Oracle.Operations = in.Oracle.Operations[:1]
	if v := check(in); v.Lost != 1 || !v.Invariants[1].Failed {
		t.Fatalf("missing job: lost=%d, failed invariants %v", v.Lost, failedInvariants(v))
	}

	in = campaign()
	in.DB.Jobs[1].State, in.DB.Jobs[1].ProviderRefundID = "ready", ""
	in.DB.Jobs[1].NextAction = "reconcile"
	in.DB.Events[5] = eventRow{ID: 22, JobID: 2, Attempt: 1, Kind: "rescheduled", FromState: "running", ToState: "ready",
		NextAction: "reconcile"}
	in.DB.Ledger = in.DB.Ledger[:1]
	in.Oracle.Refunds[1].Status = fakeprovider.StatusPending
	v := check(in)
	if v.Lost != 0 || v.Pending != 1 || v.Failed() {
		t.Fatalf("a job waiting on a pending refund (R4) is legitimately unfinished: lost=%d pending=%d failed %v",
			v.Lost, v.Pending, failedInvariants(v))
	}
	in.Oracle.Refunds[1].Status = fakeprovider.StatusSucceeded
	if v := check(in); v.Lost != 1 || !v.Invariants[1].Failed {
		t.Fatalf("a job stuck although the provider refunded: lost=%d failed %v", v.Lost, failedInvariants(v))
	}
}

func TestCheckFindsARowChangedBehindTheHistory(t *testing.T) {
	in := campaign()
	in.DB.Jobs[0].ProviderRefundID = "re_9"
	in.DB.Ledger[0].ProviderRefundID = "re_9"
	if v := check(in); v.StaleWritesAccepted != 1 {
		t.Fatalf("a refund id changed without a history entry: failed %v", failedInvariants(v))
	}
}

// A write the fence should have refused leaves a history entry under the
// row's attempt, not the writer's; the writer's own log gives it away.
func TestCheckFindsAStaleWriteBehindACleanHistory_T1(t *testing.T) {
	in := campaign()
	in.Acks = acksOf("w1", []map[string]any{
		{"msg": "job written", "job_id": 1.0, "attempt": 1.0, "decision": "complete", "replayed": false},
		{"msg": "job completed", "job_id": "2", "attempt": "1", "replayed": true},
	})
	if v := check(in); v.Failed() || len(in.Acks) != 2 {
		t.Fatalf("acknowledged writes that are in the history: failed %v, acks %+v", failedInvariants(v), in.Acks)
	}
	in.Acks = append(in.Acks, acksOf("zombie", []map[string]any{
		{"msg": "job written", "job_id": 2.0, "attempt": 0.0, "decision": "reschedule", "replayed": false},
	})...)
	if v := check(in); v.StaleWritesAccepted != 1 || !v.Invariants[3].Failed {
		t.Fatalf("a zombie's accepted write: stale_writes_accepted=%d", v.StaleWritesAccepted)
	}
}

func TestCheckFindsALedgerMismatch(t *testing.T) {
	in := campaign()
	in.DB.Ledger[1].ProviderRefundID = "re_9"
	if v := check(in); !v.Invariants[5].Failed {
		t.Fatal("ledger row with another refund id passed")
	}
	in = campaign()
	in.DB.Ledger = in.DB.Ledger[:1]
	if v := check(in); !v.Invariants[5].Failed {
		t.Fatal("succeeded job without a ledger row passed")
	}
	in = campaign()
	in.Oracle.Refunds[0].Status = fakeprovider.StatusPending
	if v := check(in); !v.Invariants[5].Failed {
		t.Fatal("a job succeeded on a pending refund passed (R4)")
	}
}

// goWorkerLog is what refundworker logs (JSON) around a stale write-back
// that carried a provider success, and around one that carried nothing.
func goWorkerLog(filed bool) []map[string]any {
	recs := []map[string]any{
		{"msg": "job claimed", "job_id": 2.0, "attempt": 1.0},
		{"msg": "write-back rejected by the fence; filing the answer as an observation", "job_id": 2.0, "attempt": 1.0,
			"decision": "complete"},
		{"msg": "write-back rejected by the fence; filing the answer as an observation", "job_id": 1.0, "attempt": 1.0,
			"decision": "reschedule"},
	}
	if filed {
		recs = append(recs, map[string]any{"msg": "observation filed", "job_id": 2.0, "attempt": 1.0, "outcome": "succeeded",
			"provider_refund_id": "re_2"})
	}
	return recs
}

func TestCheckFindsAnUnobservedLateSuccess_R15(t *testing.T) {
	in := campaign()
	in.Receipts, in.StaleRejections = receiptsOf("w1", false, goWorkerLog(true), false)
	if in.StaleRejections != 2 || len(in.Receipts) != 1 || in.Receipts[0].Filed != "filed" {
		t.Fatalf("receipts %+v, stale %d", in.Receipts, in.StaleRejections)
	}
	if v := check(in); v.UnobservedLateSuccess != 1 {
		t.Fatalf("the filed receipt is not in refund_observations, yet unobserved=%d", v.UnobservedLateSuccess)
	}
	in.DB.Observations = []observationRow{{ID: 1, JobID: 2, ReportedAttempt: 1, JobAttempt: 2, Outcome: "succeeded"}}
	if v := check(in); v.UnobservedLateSuccess != 0 || v.Failed() {
		t.Fatalf("observed receipt: unobserved=%d failed %v", v.UnobservedLateSuccess, failedInvariants(v))
	}

	// Killed before it could file: noted, not held against the system.
	in = campaign()
	in.Receipts, _ = receiptsOf("w1", false, goWorkerLog(false), true)
	if v := check(in); v.UnobservedLateSuccess != 0 || len(in.Receipts) != 1 || !in.Receipts[0].Killed {
		t.Fatalf("receipt of a killed worker: %+v, unobserved=%d", in.Receipts, v.UnobservedLateSuccess)
	}
}

func TestReceiptsOfANodeWorkerHaveUnknownOutcome(t *testing.T) {
	recs := []map[string]any{
		{"msg": "write-back rejected by the fence; filing the answer as an observation", "job_id": "2", "attempt": "1"},
		{"msg": "observation filed", "job_id": "2", "attempt": "1", "duplicate": false},
	}
	rs, stale := receiptsOf("n1", true, recs, false)
	if stale != 1 || len(rs) != 1 || rs[0].Why != "stale_node" || rs[0].JobID != 2 || rs[0].Filed != "filed" {
		t.Fatalf("node receipts %+v, stale %d", rs, stale)
	}
	in := campaign()
	in.Receipts = rs
	if v := check(in); v.UnobservedLateSuccess != 1 {
		t.Fatalf("the worker logged the observation filed but none is on file: unobserved=%d", v.UnobservedLateSuccess)
	}
	in.DB.Observations = []observationRow{{ID: 1, JobID: 2, ReportedAttempt: 1, JobAttempt: 2, Outcome: "not_found"}}
	if v := check(in); v.Failed() {
		t.Fatalf("an observation on file: failed %v", failedInvariants(v))
	}
	// No filing line: the Node worker had no provider answer to keep.
	in = campaign()
	in.Receipts, _ = receiptsOf("n1", true, recs[:1], false)
	if v := check(in); v.Failed() {
		t.Fatalf("a stale write-back without a provider answer: failed %v", failedInvariants(v))
	}
}
