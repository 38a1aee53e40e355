package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// An expedite (R28) moves a ready job to reconcile now and nothing else; one
// that took a running job anywhere is a write the fence should have kept out.
func TestWalkHistoryJudgesExpedites_R28(t *testing.T) {
	expedite := func(id, attempt int64, from, to string) eventRow {
		e := ev(id, attempt, "expedited", from, to)
		e.NextAction = "reconcile"
		return e
	}
	rescheduled := ev(3, 1, "rescheduled", "running", "ready")
	rescheduled.NextAction = "reconcile"
	reclaimed := ev(5, 2, "claimed", "ready", "running")
	reclaimed.NextAction = "reconcile"
	done := ev(6, 2, "completed", "running", "succeeded")
	done.NextAction = "reconcile"
	clean := []eventRow{ev(1, 0, "enqueued", "", "ready"), ev(2, 1, "claimed", "ready", "running"), rescheduled,
		expedite(4, 1, "ready", "ready"), reclaimed, done}
	h := walkHistory(jobRow{ID: 1, State: "succeeded", Attempt: 2, NextAction: "reconcile"}, clean)
	if len(h.attemptProblems)+len(h.staleWrites)+len(h.grantProblems) > 0 {
		t.Fatalf("a fenced expedite judged %+v", h)
	}
	if h.expedites != 1 || h.webhookExpedites != 0 {
		t.Errorf("expedites counted %d (%d by webhooks), want 1 (0)", h.expedites, h.webhookExpedites)
	}
	bad := slices.Clone(clean[:5])
	bad = append(bad, expedite(6, 2, "running", "ready"))
	h = walkHistory(jobRow{ID: 1, State: "ready", Attempt: 2, NextAction: "reconcile"}, bad)
	if len(h.evidenceProblems) != 1 || !strings.Contains(h.evidenceProblems[0], "expedited event 6") ||
		!strings.Contains(h.evidenceProblems[0], "from running to ready") {
		t.Fatalf("an expedite of a running job passed: %+v", h)
	}

	// A webhook's expedite that claimed the job, one under an attempt the
	// job never had, and one carrying a grant: each a receipt that changed
	// the job, not evidence.
	for name, e := range map[string]eventRow{
		"to running": expedite(4, 1, "ready", "running"),
		"attempt":    expedite(4, 2, "ready", "ready"),
		"grant":      func() eventRow { e := expedite(4, 1, "ready", "ready"); e.Grant = "aaaa00000001"; return e }(),
	} {
		e.WorkerID = "webhook:acme"
		evs := slices.Clone(clean[:3])
		evs = append(evs, e)
		h := walkHistory(jobRow{ID: 1, State: e.ToState, Attempt: e.Attempt, NextAction: "reconcile"}, evs)
		if len(h.evidenceProblems) != 1 || !strings.Contains(h.evidenceProblems[0], "expedited event 4 by webhook:acme") ||
			h.webhookExpedites != 1 {
			t.Errorf("%s: expedite judged %+v", name, h)
		}
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

// logOf types a worker's JSON log records as the campaign does.
func logOf(worker string, kind workerKind, killed bool, recs []map[string]any) workerLog {
	return workerLog{Worker: worker, Kind: kind, Killed: killed, Lines: parseWorkerLines(recs)}
}

// A write the fence should have refused leaves a history entry under the
// row's attempt, not the writer's; the writer's own log gives it away.
func TestCheckFindsAStaleWriteBehindACleanHistory_T1(t *testing.T) {
	in := campaign()
	in.Acks = acksOf(logOf("w1", goWorker, false, []map[string]any{
		{"msg": "job written", "job_id": 1.0, "attempt": 1.0, "decision": "complete", "replayed": false},
		{"msg": "job completed", "job_id": "2", "attempt": "1", "replayed": true},
	}))
	if v := check(in); v.Failed() || len(in.Acks) != 2 {
		t.Fatalf("acknowledged writes that are in the history: failed %v, acks %+v", failedInvariants(v), in.Acks)
	}
	in.Acks = append(in.Acks, acksOf(logOf("zombie", goWorker, false, []map[string]any{
		{"msg": "job written", "job_id": 2.0, "attempt": 0.0, "decision": "reschedule", "replayed": false},
	}))...)
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
	in.Receipts, in.StaleRejections = receiptsOf(logOf("w1", goWorker, false, goWorkerLog(true)))
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
	in.Receipts, _ = receiptsOf(logOf("w1", goWorker, true, goWorkerLog(false)))
	if v := check(in); v.UnobservedLateSuccess != 0 || len(in.Receipts) != 1 || !in.Receipts[0].Killed {
		t.Fatalf("receipt of a killed worker: %+v, unobserved=%d", in.Receipts, v.UnobservedLateSuccess)
	}
}

func TestReceiptsOfANodeWorkerHaveUnknownOutcome(t *testing.T) {
	recs := []map[string]any{
		{"msg": "write-back rejected by the fence; filing the answer as an observation", "job_id": "2", "attempt": "1"},
		{"msg": "observation filed", "job_id": "2", "attempt": "1", "duplicate": false},
	}
	rs, stale := receiptsOf(logOf("n1", nodeWorker, false, recs))
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
	in.Receipts, _ = receiptsOf(logOf("n1", nodeWorker, false, recs[:1]))
	if v := check(in); v.Failed() {
		t.Fatalf("a stale write-back without a provider answer: failed %v", failedInvariants(v))
	}
}

// grantedCampaign is campaign() with lease token fingerprints: job 1 was
// granted "aaaa00000001" and job 2 "aaaa00000002", each completing under
// its grant; the workers logged both grants and both write-backs.
func grantedCampaign() checkInput {
	in := campaign()
	for i := range in.DB.Events {
		e := &in.DB.Events[i]
		if e.Kind != "enqueued" {
			e.Grant = fmt.Sprintf("aaaa0000000%d", e.JobID)
		}
	}
	for _, j := range in.DB.Jobs {
		g := fmt.Sprintf("aaaa0000000%d", j.ID)
		in.Grants = append(in.Grants, grantLog{Worker: "w1", Key: j.Key, JobID: j.ID, Attempt: 1, Grant: g})
		in.Acks = append(in.Acks, ack{Worker: "w1", Key: j.Key, JobID: j.ID, Attempt: 1, Kind: "completed", Grant: g})
	}
	return in
}

// asyncFailover is an async failover: the old primary killed at +10s, the
// proxies repointed at +11s.
func asyncFailover(base time.Time) *failoverInput {
	return &failoverInput{Mode: failoverAsync, Killed: base.Add(10 * time.Second), Repointed: base.Add(11 * time.Second),
		Frozen: map[string][]span{}}
}

func verdictText(v verdict) string {
	var b strings.Builder
	v.print(&b)
	return b.String()
}

func TestCheckGrantsPassWhenEveryGrantAndWriteIsInTheHistory_R25(t *testing.T) {
	v := check(grantedCampaign())
	if v.Failed() || v.StaleWritesAccepted != 0 {
		t.Fatalf("clean campaign with grants judged:\n%s", verdictText(v))
	}
	if !strings.Contains(v.Invariants[6].Summary, "2 write-backs accepted, 2 of them matched to the history by grant") {
		t.Errorf("summary: %s", v.Invariants[6].Summary)
	}
}

// R26's ABA: the old primary granted job 1 attempt 1 to A (grant aaaa…1),
// the promoted replica never saw it and granted attempt 1 again to B
// (bbbb…). A's write-back under attempt 1 is accepted as if it were B's:
// the history records A's grant on the write, and A's log shows it.
func TestCheckFindsTheABAWriteOfALostGrant_R26(t *testing.T) {
	in := grantedCampaign()
	base := time.Now()
	in.Failover = asyncFailover(base)
	in.DB.Events[1].Grant = "bbbb00000001" // the survivor's grant of attempt 1: B's
	in.Grants[0].Seen = base.Add(9 * time.Second)
	in.Grants = append(in.Grants, grantLog{Worker: "B", Key: in.Specs[0].Key, JobID: 1, Attempt: 1, Grant: "bbbb00000001",
		Seen: base.Add(12 * time.Second)})
	in.Acks[0].Seen = base.Add(13 * time.Second) // A, after the repoint
	v := check(in)
	if !v.Invariants[6].Failed || v.StaleWritesAccepted < 2 {
		t.Fatalf("ABA write passed: stale_writes_accepted=%d\n%s", v.StaleWritesAccepted, verdictText(v))
	}
	got := verdictText(v)
	for _, want := range []string{"ABA: w1's completed write-back of job 1", "carried grant aaaa00000001, but the attempt's grant is bbbb00000001"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if v.GrantsLost != 1 {
		t.Errorf("A's grant is the one the failover lost: grants_lost=%d", v.GrantsLost)
	}

	// Without a failover the same write is just as wrong: a writer that
	// knew the attempt without holding the grant (R25).
	in.Failover = nil
	in.Grants = in.Grants[1:]
	if v := check(in); !v.Invariants[6].Failed {
		t.Fatalf("ABA without failover passed:\n%s", verdictText(v))
	}
}

// The ABA as the workers' logs alone show it: the history has B's write
// under B's grant, and A was told its own write (under A's grant) succeeded
// after the failover.
func TestCheckFindsAnAcceptedWriteOfALostGrantMissingFromTheHistory_R26(t *testing.T) {
	in := grantedCampaign()
	base := time.Now()
	in.Failover = asyncFailover(base)
	for i := range in.DB.Events[:3] {
		if in.DB.Events[i].Kind != "enqueued" {
			in.DB.Events[i].Grant = "bbbb00000001"
		}
	}
	in.Grants[0].Seen = base.Add(9 * time.Second) // A's grant, before the kill: lost
	in.Grants = append(in.Grants, grantLog{Worker: "B", Key: in.Specs[0].Key, JobID: 1, Attempt: 1, Grant: "bbbb00000001",
		Seen: base.Add(12 * time.Second)})
	in.Acks = append(in.Acks, ack{Worker: "B", Key: in.Specs[0].Key, JobID: 1, Attempt: 1, Kind: "completed",
		Grant: "bbbb00000001", Seen: base.Add(14 * time.Second)})
	in.Grants[1].Seen, in.Acks[1].Seen = base.Add(20*time.Second), base.Add(20*time.Second)

	in.Acks[0].Seen = base.Add(9500 * time.Millisecond) // A's write, accepted by the old primary before the kill
	v := check(in)
	if v.Failed() || v.WritesLost != 1 || v.GrantsLost != 1 || v.lostCompletions != 1 {
		t.Fatalf("a write lost with the old primary: writes_lost=%d grants_lost=%d\n%s", v.WritesLost, v.GrantsLost,
			verdictText(v))
	}

	in.Acks[0].Seen = base.Add(12 * time.Second) // A's write, accepted after the repoint
	v = check(in)
	if !v.Invariants[6].Failed || v.StaleWritesAccepted != 1 || v.WritesLost != 0 {
		t.Fatalf("a write of a lost grant accepted after the failover passed: stale=%d\n%s", v.StaleWritesAccepted,
			verdictText(v))
	}
	if !strings.Contains(verdictText(v), "was accepted after the failover, but the new primary's history has no such write") {
		t.Errorf("detail missing:\n%s", verdictText(v))
	}

	// A worker frozen across the kill prints, right after SIGCONT, what it
	// was told before the kill: lost, not accepted by the survivor.
	in.Failover.Frozen["w1"] = []span{{From: base.Add(9800 * time.Millisecond), To: base.Add(12*time.Second - 100*time.Millisecond)}}
	if v := check(in); v.Failed() || v.WritesLost != 1 {
		t.Fatalf("a reply held across the kill by a freeze: writes_lost=%d\n%s", v.WritesLost, verdictText(v))
	}
	// … but not a line long after the freeze ended.
	in.Failover.Frozen["w1"] = []span{{From: base.Add(9800 * time.Millisecond), To: base.Add(11 * time.Second)}}
	if v := check(in); !v.Invariants[6].Failed {
		t.Fatalf("a write logged a second after the freeze ended passed:\n%s", verdictText(v))
	}
}

func TestCheckCountsGrantsLostInAFailover_R26(t *testing.T) {
	in := grantedCampaign()
	base := time.Now()
	in.Failover = asyncFailover(base)
	// A grant of job 2 attempt 2 the old primary made before the kill; the
	// survivor's history ends at attempt 1.
	lost := grantLog{Worker: "w2", Key: in.Specs[1].Key, JobID: 2, Attempt: 2, Grant: "cccc00000002", Seen: base.Add(9 * time.Second)}
	in.Grants = append(in.Grants, lost)
	v := check(in)
	if v.Failed() || v.GrantsLost != 1 {
		t.Fatalf("async: a lost grant is counted, not failed: grants_lost=%d\n%s", v.GrantsLost, verdictText(v))
	}
	if !strings.Contains(verdictText(v), "grant lost in the failover: w2's grant cccc00000002 of job 2") {
		t.Errorf("lost grant not listed:\n%s", verdictText(v))
	}

	in.Failover.Mode = failoverSemiSync
	if v := check(in); !v.Invariants[6].Failed || v.GrantsLost != 1 {
		t.Fatalf("semi-sync: a lossless topology lost a committed grant, yet:\n%s", verdictText(v))
	}

	// A grant logged after the repoint came from the survivor: it must be
	// in its history, whatever the mode.
	in.Failover.Mode = failoverAsync
	in.Grants[len(in.Grants)-1].Seen = base.Add(15 * time.Second)
	if v := check(in); !v.Invariants[6].Failed || v.GrantsLost != 0 {
		t.Fatalf("a grant of the survivor missing from its history passed:\n%s", verdictText(v))
	}
	// Without a failover every logged grant must be in the history.
	in.Failover = nil
	if v := check(in); !v.Invariants[6].Failed {
		t.Fatalf("a logged grant missing from the history passed:\n%s", verdictText(v))
	}
}

// A Node.js worker whose lines carry no grant is checked by attempt alone.
func TestCheckGrantsWithoutFingerprintAreCheckedByAttempt(t *testing.T) {
	in := grantedCampaign()
	in.Grants[0].Grant, in.Acks[0].Grant = "", ""
	v := check(in)
	if v.Failed() || !strings.Contains(v.Invariants[6].Summary, "1 grants and 1 write-backs by attempt alone") {
		t.Fatalf("weak check: %s\n%s", v.Invariants[6].Summary, verdictText(v))
	}
	in.Grants[0].Attempt, in.Acks[0].Attempt = 5, 5
	if v := check(in); !v.Invariants[6].Failed || !v.Invariants[3].Failed {
		t.Fatalf("a grant and a write under an attempt the history never had passed:\n%s", verdictText(v))
	}
}

func TestCheckEnqueuesAndObservationsLostInAFailover(t *testing.T) {
	in := grantedCampaign()
	base := time.Now()
	in.Failover = asyncFailover(base)
	in.EnqueuesLost = []string{in.Specs[1].Key}
	in.Receipts = []receipt{{Worker: "w1", Key: in.Specs[0].Key, JobID: 1, Attempt: 1, Why: "stale", RefundID: "re_1",
		Filed: "filed", FiledAt: base.Add(5 * time.Second)}}
	v := check(in)
	if v.Failed() || v.EnqueuesLost != 1 || v.ObservationsLost != 1 {
		t.Fatalf("async losses are counted, not failed: enqueues=%d observations=%d\n%s", v.EnqueuesLost,
			v.ObservationsLost, verdictText(v))
	}
	in.Receipts[0].FiledAt = base.Add(20 * time.Second) // filed on the survivor: must be on file
	if v := check(in); v.UnobservedLateSuccess != 1 {
		t.Fatalf("an observation filed after the failover and missing passed:\n%s", verdictText(v))
	}
	in.Receipts[0].FiledAt = base.Add(5 * time.Second)
	in.Failover.Mode = failoverSemiSync
	v = check(in)
	if !v.Invariants[1].Failed || !v.Invariants[4].Failed {
		t.Fatalf("semi-sync lost an acknowledged enqueue and a filed observation, yet:\n%s", verdictText(v))
	}
}

// After a failover that lost a job's enqueue, the re-drive makes it again
// under another id, and a receipt its worker files after the repoint (by
// the key the line names) lands on the new job (R15, R26).
func TestCheckFindsAReceiptFiledOnTheReDrivenJob_R26(t *testing.T) {
	in := grantedCampaign()
	base := time.Now()
	in.Failover = asyncFailover(base)
	k2 := in.Specs[1].Key
	in.EnqueuesLost = []string{k2}
	in.Receipts = []receipt{{Worker: "w1", Key: k2, JobID: 9, Attempt: 1, Why: "write_failed", RefundID: "re_2",
		Filed: "filed", FiledAt: base.Add(20 * time.Second)}}
	in.DB.Observations = []observationRow{{ID: 1, JobID: 2, Key: k2, ReportedAttempt: 1, Source: "worker:w1",
		Outcome: "succeeded", ProviderRefundID: "re_2"}}
	if v := check(in); v.Failed() || v.UnobservedLateSuccess != 0 ||
		!strings.Contains(v.Invariants[4].Summary, "1 on file under the id the new primary gave") {
		t.Fatalf("a receipt on file under the re-driven job's id judged:\n%s", verdictText(v))
	}
	in.DB.Observations[0].ReportedAttempt = 2
	if v := check(in); v.UnobservedLateSuccess != 1 {
		t.Fatalf("a receipt of another attempt taken for it:\n%s", verdictText(v))
	}
}

func TestGrantsAndAcksOfWorkerLogs(t *testing.T) {
	seen := time.Now()
	recs := []map[string]any{
		{"msg": "job claimed", "job_id": 7.0, "operation_key": "k7", "attempt": 2.0, "grant": "0123456789ab", seenKey: seen},
		{"msg": "job taken over", "job_id": "8", "operation_key": "k8", "attempt": "3"},
		{"msg": "job written", "job_id": 7.0, "operation_key": "k7", "attempt": 2.0, "grant": "0123456789ab",
			"decision": "reschedule", "replayed": true, seenKey: seen},
	}
	gs := grantsOf(logOf("w", goWorker, false, recs))
	if len(gs) != 2 || gs[0] != (grantLog{Worker: "w", Key: "k7", JobID: 7, Attempt: 2, Grant: "0123456789ab", Seen: seen}) ||
		gs[1].JobID != 8 || gs[1].Attempt != 3 || gs[1].Grant != "" {
		t.Fatalf("grants %+v", gs)
	}
	as := acksOf(logOf("w", goWorker, false, recs))
	if len(as) != 1 || as[0] != (ack{Worker: "w", Key: "k7", JobID: 7, Attempt: 2, Kind: "rescheduled", Replayed: true,
		Grant: "0123456789ab", Seen: seen}) {
		t.Fatalf("acks %+v", as)
	}
}

// Both workers' lines are typed alike: the Go worker's (numbers, "job
// written" with its decision) and the Node.js worker's (int64s as strings,
// a message per kind of write).
func TestParseWorkerLinesOfBothWorkers(t *testing.T) {
	seen := time.Now()
	goRecs := []map[string]any{
		{"msg": "refundworker started"},
		{"msg": "job claimed", "job_id": 7.0, "operation_key": "k7", "attempt": 2.0, "grant": "0123456789ab", seenKey: seen},
		{"msg": "calling the provider", "job_id": 7.0, "operation_key": "k7", "attempt": 2.0},
		{"msg": "job written", "job_id": 7.0, "operation_key": "k7", "attempt": 2.0, "grant": "0123456789ab",
			"decision": "escalate", "replayed": false, seenKey: seen},
		{"msg": "job written", "job_id": 7.0, "attempt": 2.0, "decision": "DecisionKind(9)"},
		{"msg": "write-back rejected by the fence; filing the answer as an observation", "job_id": 7.0, "attempt": 2.0,
			"decision": "complete"},
		{"msg": "write-back failed; the lease will expire and a takeover reconciles", "job_id": 7.0, "attempt": 2.0,
			"decision": "reschedule"},
		{"msg": "handler outlived the provider-call deadline; outcome unknown", "job_id": 7.0, "attempt": 2.0},
		{"msg": "observation not filed: the provider's answer is only in this log", "job_id": 7.0, "attempt": 2.0,
			"outcome": "succeeded", "provider_refund_id": "re_7", "error": "unavailable", seenKey: seen},
		{"msg": "grant lost; cancelling the handler before it sends anything new (R27)", "job_id": 7.0, "attempt": 2.0,
			seenKey: seen},
		{"msg": "lease renewal failed; trying again soon", "jobs": 1.0, seenKey: seen},
		{"msg": "jobfence: repeating call", "method": "RenewLeases", "try": 2.0, seenKey: seen},
		{"msg": "jobfence: repeating call", "method": "Complete", "try": 2.0, seenKey: seen},
		{"msg": "jobfence: repeating call", "method": "Claim", "try": 2.0, seenKey: seen},
	}
	ref := jobRef{Key: "k7", JobID: 7, Attempt: 2}
	want := []workerLine{
		grantLine{jobRef: ref, Grant: "0123456789ab", Seen: seen},
		keyLine{ref},
		writtenLine{jobRef: ref, Kind: "escalated", Grant: "0123456789ab", Seen: seen},
		rejectedLine{jobRef: jobRef{JobID: 7, Attempt: 2}, Decision: "complete"},
		writeFailedLine{jobRef: jobRef{JobID: 7, Attempt: 2}, Decision: "reschedule"},
		lateLine{jobRef: jobRef{JobID: 7, Attempt: 2}},
		observationLine{jobRef: jobRef{JobID: 7, Attempt: 2}, Outcome: "succeeded", RefundID: "re_7", Error: "unavailable",
			Seen: seen},
		grantLostLine{jobRef: jobRef{JobID: 7, Attempt: 2}, Seen: seen},
		callFailedLine{Seen: seen},
		callFailedLine{Seen: seen},
		callFailedLine{Seen: seen},
	}
	if got := parseWorkerLines(goRecs); !slices.Equal(got, want) {
		t.Errorf("Go worker's lines:\n got %+v\nwant %+v", got, want)
	}
	nodeRecs := []map[string]any{
		{"msg": "job taken over", "job_id": "8", "operation_key": "k8", "attempt": "3", "grant": "ba9876543210"},
		{"msg": "job completed", "job_id": "8", "operation_key": "k8", "attempt": "3", "grant": "ba9876543210", "replayed": true},
		{"msg": "job rescheduled", "job_id": "8", "operation_key": "k8", "attempt": "3"},
		{"msg": "write-back failed; the lease will lapse and a takeover reconciles", "job_id": "8", "attempt": "3"},
		{"msg": "provider call outlived its deadline; outcome unknown", "job_id": "8", "attempt": "3"},
		{"msg": "filing an observation failed", "job_id": "8", "attempt": "3", "error": "deadline"},
		{"msg": "observation filed", "job_id": "8", "attempt": "3", "duplicate": false},
		{"msg": "grant lost: the provider call is cancelled and nothing new is sent (R27)", "job_id": "8", "attempt": "3"},
		{"msg": "lease renewal failed; tried again sooner, nothing aborted (R27)", "jobs": 2.0},
	}
	ref = jobRef{Key: "k8", JobID: 8, Attempt: 3}
	bare := jobRef{JobID: 8, Attempt: 3}
	want = []workerLine{
		grantLine{jobRef: ref, Grant: "ba9876543210"},
		writtenLine{jobRef: ref, Kind: "completed", Replayed: true, Grant: "ba9876543210"},
		writtenLine{jobRef: ref, Kind: "rescheduled"},
		writeFailedLine{jobRef: bare},
		lateLine{jobRef: bare},
		observationLine{jobRef: bare, Error: "deadline"},
		observationLine{jobRef: bare, Filed: true},
		grantLostLine{jobRef: bare},
		callFailedLine{},
	}
	if got := parseWorkerLines(nodeRecs); !slices.Equal(got, want) {
		t.Errorf("Node.js worker's lines:\n got %+v\nwant %+v", got, want)
	}
}

// pyRecs decodes log lines as the Python example worker writes them (its
// JSONFormatter: the logging module's records, their extra fields
// included) and as the campaign reads a worker's stderr, each seen at seen.
func pyRecs(t *testing.T, seen time.Time, lines ...string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range lines {
		var r map[string]any
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		r[seenKey] = seen
		out = append(out, r)
	}
	return out
}

// pyJob is what every Python worker line about a job carries (the SDK's
// _job_fields): job 9, attempt 2, its key and grant.
const pyJob = `"worker_id": "chaos-py-w3", "job_id": 9, "operation_key": "k9", "attempt": 2, "grant": "b944de599aa0"`

// The Python worker's lines are typed by the messages its SDK shares with
// the Go one, but for a takeover, which it logs as the Node.js worker does.
// Each line is one the example emits (examples/refund_worker.py, the SDK's
// job.py, receipts.py, worker.py and client.py), with the fields it logs.
func TestParseWorkerLinesOfThePythonWorker(t *testing.T) {
	seen := time.Now()
	recs := pyRecs(t, seen,
		`{"level": "info", "msg": "refund-worker started", "worker_id": "chaos-py-w3", "coordinator": "127.0.0.1:36689", "pid": 4242}`,
		`{"level": "debug", "msg": "job claimed", `+pyJob+`, "next_action": "refund", "takeover": false}`,
		`{"level": "info", "msg": "job taken over", `+pyJob+`, "next_action": "reconcile", "takeover": true}`,
		`{"level": "info", "msg": "job written", `+pyJob+`, "decision": "complete", "next_action": "refund", "delay": 0.0, "reason": "", "provider_refund_id": "re_9", "replayed": false}`,
		`{"level": "info", "msg": "job written", `+pyJob+`, "decision": "reschedule", "next_action": "reconcile", "delay": 1.0, "reason": "pending", "provider_refund_id": "", "replayed": true}`,
		`{"level": "info", "msg": "job written", `+pyJob+`, "decision": "escalate", "next_action": "reconcile", "delay": 0.0, "reason": "two live refunds", "provider_refund_id": "", "replayed": false}`,
		`{"level": "info", "msg": "write-back rejected by the fence; filing the answer as an observation", `+pyJob+`, "decision": "complete", "reason": "STALE_ATTEMPT", "current_attempt": 3}`,
		`{"level": "info", "msg": "observation filed", `+pyJob+`, "outcome": "succeeded", "provider_refund_id": "re_9", "provider_event_id": "", "observation_id": 259, "duplicate": false}`,
		`{"level": "warn", "msg": "write-back failed; the lease will expire and a takeover reconciles", `+pyJob+`, "decision": "reschedule", "error": "jobfence: UNAVAILABLE: connection refused"}`,
		`{"level": "warn", "msg": "observation not filed yet; retrying", `+pyJob+`, "outcome": "succeeded", "provider_refund_id": "re_9", "provider_event_id": "", "error": "jobfence: UNAVAILABLE", "in": 0.1}`,
		`{"level": "error", "msg": "observation not filed: the provider's answer is only in this log", `+pyJob+`, "outcome": "succeeded", "provider_refund_id": "re_9", "provider_event_id": "", "error": "jobfence: UNAVAILABLE"}`,
		`{"level": "warn", "msg": "handler outlived the provider-call deadline; outcome unknown", `+pyJob+`, "deadline": 14.0}`,
		`{"level": "info", "msg": "provider call failed; outcome unknown", `+pyJob+`, "error": "ValueError()"}`,
		`{"level": "warn", "msg": "grant lost; cancelling the handler before it sends anything new (R27)", `+pyJob+`, "error": "jobfence: STALE_ATTEMPT"}`,
		`{"level": "warn", "msg": "lease renewal failed; trying again soon", "worker_id": "chaos-py-w3", "jobs": 2, "error": "jobfence: UNAVAILABLE"}`,
		`{"level": "warn", "msg": "jobfence: repeating call", "worker_id": "chaos-py-w3", "method": "RenewLeases", "try": 2, "after": 0.059, "error": "jobfence: UNAVAILABLE"}`,
		`{"level": "warn", "msg": "jobfence: repeating call", "worker_id": "chaos-py-w3", "method": "Escalate", "try": 2, "after": 0.1, "error": "jobfence: UNAVAILABLE"}`,
		`{"level": "warn", "msg": "jobfence: repeating call", "worker_id": "chaos-py-w3", "method": "ReportObservation", "try": 2, "after": 0.1, "error": "jobfence: UNAVAILABLE"}`,
		`{"level": "warn", "msg": "claim failed; nothing acted on (R7)", "worker_id": "chaos-py-w3", "error": "jobfence: UNAVAILABLE", "backoff": 0.2}`,
		`{"level": "info", "msg": "refund-worker stopped", "worker_id": "chaos-py-w3", "drained": true, "stats": {"claimed": 1}}`,
	)
	ref := jobRef{Key: "k9", JobID: 9, Attempt: 2}
	want := []workerLine{
		grantLine{jobRef: ref, Grant: "b944de599aa0", Seen: seen},
		grantLine{jobRef: ref, Grant: "b944de599aa0", Seen: seen},
		writtenLine{jobRef: ref, Kind: "completed", Grant: "b944de599aa0", Seen: seen},
		writtenLine{jobRef: ref, Kind: "rescheduled", Replayed: true, Grant: "b944de599aa0", Seen: seen},
		writtenLine{jobRef: ref, Kind: "escalated", Grant: "b944de599aa0", Seen: seen},
		rejectedLine{jobRef: ref, Decision: "complete", Seen: seen},
		observationLine{jobRef: ref, Filed: true, Outcome: "succeeded", RefundID: "re_9", Seen: seen},
		writeFailedLine{jobRef: ref, Decision: "reschedule", Seen: seen},
		keyLine{ref},
		observationLine{jobRef: ref, Outcome: "succeeded", RefundID: "re_9", Error: "jobfence: UNAVAILABLE", Seen: seen},
		lateLine{jobRef: ref, Seen: seen},
		keyLine{ref},
		grantLostLine{jobRef: ref, Seen: seen},
		callFailedLine{Seen: seen},
		callFailedLine{Seen: seen},
		callFailedLine{Seen: seen},
	}
	if got := parseWorkerLines(recs); !slices.Equal(got, want) {
		t.Errorf("Python worker's lines:\n got %+v\nwant %+v", got, want)
	}
}

// The Python worker's log says what a rejected write-back carried and what
// it filed, as refundworker's does: its receipts are judged as strictly
// (R15). A success it saw and did not get on file fails invariant 5, where
// the Node.js worker's rejection with no filing line is read as one with no
// answer to keep.
func TestReceiptsOfAPythonWorkerAreJudgedAsStrictlyAsGos_R15(t *testing.T) {
	seen := time.Now()
	k1, k2 := refundSpecs(5, 2)[0].Key, refundSpecs(5, 2)[1].Key
	job := func(id int, key string) string {
		return fmt.Sprintf(`"worker_id": "chaos-py-w3", "job_id": %d, "operation_key": %q, "attempt": 1, "grant": "b944de599aa%d"`,
			id, key, id)
	}
	rejected := func(id int, key, decision string) string {
		return `{"msg": "write-back rejected by the fence; filing the answer as an observation", ` + job(id, key) +
			`, "decision": "` + decision + `", "reason": "STALE_ATTEMPT", "current_attempt": 2}`
	}
	filed := `{"msg": "observation filed", ` + job(2, k2) +
		`, "outcome": "succeeded", "provider_refund_id": "re_2", "provider_event_id": "", "observation_id": 7, "duplicate": false}`
	onFile := []observationRow{{ID: 7, JobID: 2, Key: k2, ReportedAttempt: 1, JobAttempt: 2, Outcome: "succeeded",
		Source: "worker:chaos-py-w3"}}

	rs, stale := receiptsOf(logOf("chaos-py-w3", pythonWorker, false, pyRecs(t, seen,
		rejected(2, k2, "complete"), filed, rejected(1, k1, "reschedule"))))
	if stale != 2 || len(rs) != 1 || rs[0].Why != "stale" || rs[0].JobID != 2 || rs[0].RefundID != "re_2" ||
		rs[0].Filed != "filed" {
		t.Fatalf("Python receipts %+v, stale %d; want one stale receipt of re_2, filed, of 2 rejections", rs, stale)
	}
	in := campaign()
	in.Receipts = rs
	if v := check(in); v.UnobservedLateSuccess != 1 || !v.Invariants[4].Failed {
		t.Fatalf("the worker logged the success filed but none is on file: unobserved=%d\n%s", v.UnobservedLateSuccess,
			verdictText(v))
	}
	in.DB.Observations = onFile
	if v := check(in); v.Failed() {
		t.Fatalf("the success on file: failed %v\n%s", failedInvariants(v), verdictText(v))
	}
	// An observation of another outcome is not the success the worker saw.
	in.DB.Observations = []observationRow{{ID: 7, JobID: 2, Key: k2, ReportedAttempt: 1, JobAttempt: 2, Outcome: "not_found"}}
	if v := check(in); v.UnobservedLateSuccess != 1 {
		t.Fatalf("a not_found on file passed for a success seen: unobserved=%d", v.UnobservedLateSuccess)
	}

	// A rejected completion and no filing line: the Python worker files
	// every answer it has, so the success it carried is missing. The same
	// lines from the Node.js worker are read as no answer to keep.
	lines := pyRecs(t, seen, rejected(2, k2, "complete"))
	for _, c := range []struct {
		kind             workerKind
		killed           bool
		unobserved       int
		why              string
		failedInvariant5 bool
	}{
		{pythonWorker, false, 1, "stale", true},
		{pythonWorker, true, 0, "stale", false}, // died with its worker: listed
		{nodeWorker, false, 0, "stale_node", false},
	} {
		in := campaign()
		in.Receipts, _ = receiptsOf(logOf("w", c.kind, c.killed, lines))
		v := check(in)
		if len(in.Receipts) != 1 || in.Receipts[0].Why != c.why || v.UnobservedLateSuccess != c.unobserved ||
			v.Invariants[4].Failed != c.failedInvariant5 {
			t.Errorf("%s worker (killed %v), a rejected completion with no filing line: receipts %+v, unobserved=%d, "+
				"want %d (%s)\n%s", c.kind, c.killed, in.Receipts, v.UnobservedLateSuccess, c.unobserved, c.why, verdictText(v))
		}
	}

	// An answer after the provider-call deadline, filed as a success: a
	// late receipt, on file or not.
	in = campaign()
	in.Receipts, _ = receiptsOf(logOf("chaos-py-w3", pythonWorker, false, pyRecs(t, seen,
		`{"msg": "handler outlived the provider-call deadline; outcome unknown", `+job(2, k2)+`, "deadline": 1.5}`,
		`{"msg": "job written", `+job(2, k2)+`, "decision": "reschedule", "replayed": false}`, filed)))
	if len(in.Receipts) != 1 || in.Receipts[0].Why != "late" || in.Receipts[0].Filed != "filed" {
		t.Fatalf("late Python receipts %+v", in.Receipts)
	}
	if v := check(in); v.UnobservedLateSuccess != 1 {
		t.Fatalf("a late success filed and not on file passed: unobserved=%d", v.UnobservedLateSuccess)
	}
}

// A receipt the coordinator could not take goes to the slot's receipt
// spool and is filed from it later, by the same process or the one that
// replaced it (R28). The Python and Go workers log it alike, but for a
// receipt dropped from the spool, which the Python one logs as a failed
// filing marked dropped_from_spool.
func TestReceiptsKeptInTheSpool_R28(t *testing.T) {
	seen := time.Now()
	k2 := refundSpecs(5, 2)[1].Key
	job := `"worker_id": "chaos-py-w3", "job_id": 2, "operation_key": "` + k2 + `", "attempt": 1, "grant": "b944de599aa2"`
	receipt := `"outcome": "succeeded", "provider_refund_id": "re_2", "provider_event_id": "", "source": "worker:chaos-py-w3"`
	rejected := `{"msg": "write-back rejected by the fence; filing the answer as an observation", ` + job +
		`, "decision": "complete", "reason": "STALE_ATTEMPT", "current_attempt": 2}`
	spooled := `{"msg": "observation not filed; spooled, to be filed when the coordinator takes it (R28)", ` + job + `, ` +
		receipt + `, "error": "jobfence: UNAVAILABLE", "spool": "/tmp/slot-3.receipts.jsonl"}`
	refiled := `{"msg": "spooled receipt filed", ` + job + `, ` + receipt +
		`, "spooled_at": "2026-12-01T17:19:13.1Z", "observation_id": 7, "duplicate": false, "attempt_verified": true}`
	dropped := `{"msg": "observation not filed: the provider's answer is only in this log", ` + job + `, ` + receipt +
		`, "spooled_at": "2026-12-01T17:19:13.1Z", "error": "jobfence: INVALID_ARGUMENT", "spool": "/tmp/s", "dropped_from_spool": true}`
	droppedGo := map[string]any{"msg": "spooled receipt refused for good, dropped from the spool: the provider's answer is only in this log",
		"job_id": 2.0, "operation_key": k2, "attempt": 1.0, "outcome": "succeeded", "provider_refund_id": "re_2", "error": "no"}
	// A failed write-back under attempt 1 would have landed after all (job 2
	// completed under it): under attempt 3, it did not.
	job3 := strings.Replace(job, `"attempt": 1`, `"attempt": 3`, 1)
	failed := `{"msg": "write-back failed; the lease will expire and a takeover reconciles", ` + job3 +
		`, "decision": "complete", "error": "jobfence: UNAVAILABLE"}`
	spooled3 := strings.Replace(spooled, job, job3, 1)
	notFiled3 := `{"msg": "observation not filed: the provider's answer is only in this log", ` + job3 + `, ` + receipt +
		`, "error": "x"}`
	ref := jobRef{Key: k2, JobID: 2, Attempt: 1}
	if got, want := parseWorkerLines(append(pyRecs(t, seen, spooled, refiled, dropped), droppedGo)), []workerLine{
		observationLine{jobRef: ref, Spooled: true, Outcome: "succeeded", RefundID: "re_2", Error: "jobfence: UNAVAILABLE", Seen: seen},
		observationLine{jobRef: ref, Filed: true, Refiled: true, Outcome: "succeeded", RefundID: "re_2", Seen: seen},
		observationLine{jobRef: ref, Dropped: true, Outcome: "succeeded", RefundID: "re_2", Error: "jobfence: INVALID_ARGUMENT", Seen: seen},
		observationLine{jobRef: ref, Dropped: true, Outcome: "succeeded", RefundID: "re_2", Error: "no"},
	}; !slices.Equal(got, want) {
		t.Fatalf("spool lines:\n got %+v\nwant %+v", got, want)
	}

	for _, c := range []struct {
		name       string
		lines      []string
		killed     bool
		filed      string
		unobserved int // with nothing on file; 0 with the receipt on file
		left       bool
	}{
		{"rejected, spooled, filed from the spool", []string{rejected, spooled, refiled}, false, receiptRefiled, 1, false},
		{"rejected, spooled, never filed", []string{rejected, spooled}, false, "spooled: jobfence: UNAVAILABLE", 1, false},
		// Durable in the slot's spool when the workers stopped: its next
		// worker files it (R28).
		{"rejected, spooled, left in the spool", []string{rejected, spooled}, false, "spooled: jobfence: UNAVAILABLE", 0, true},
		{"write-back failed, spooled, left in the spool", []string{failed, spooled3}, false, "spooled: jobfence: UNAVAILABLE",
			0, true},
		// The slot's next process files it from the spool: no excuse.
		{"rejected, spooled, then killed", []string{rejected, spooled}, true, "spooled: jobfence: UNAVAILABLE", 1, false},
		{"rejected, spooled, dropped", []string{rejected, spooled, dropped}, false,
			"dropped from the spool: jobfence: INVALID_ARGUMENT", 1, false},
		// Not a stale worker's, but owed to the observation log all the same.
		{"write-back failed, spooled", []string{failed, spooled3}, false, "spooled: jobfence: UNAVAILABLE", 1, false},
		// For contrast: a failed write-back whose filing failed with no
		// spool is kept in the worker's log only, listed.
		{"write-back failed, not filed", []string{failed, notFiled3}, false, "not filed: x", 0, false},
	} {
		in := campaign()
		in.Receipts, _ = receiptsOf(logOf("chaos-py-w3", pythonWorker, c.killed, pyRecs(t, seen, c.lines...)))
		if len(in.Receipts) != 1 || in.Receipts[0].Filed != c.filed || in.Receipts[0].Killed {
			t.Errorf("%s: receipts %+v, want one %q", c.name, in.Receipts, c.filed)
			continue
		}
		if c.left {
			in.SpoolsLeft = []spoolLeft{{Spool: "slot-3.receipts.jsonl", Key: k2, JobID: 2, Attempt: in.Receipts[0].Attempt,
				Outcome: "succeeded", RefundID: "re_2"}}
		}
		if v := check(in); v.UnobservedLateSuccess != c.unobserved {
			t.Errorf("%s, not on file: unobserved=%d, want %d\n%s", c.name, v.UnobservedLateSuccess, c.unobserved, verdictText(v))
		}
		in.DB.Observations = []observationRow{{ID: 7, JobID: 2, Key: k2, ReportedAttempt: in.Receipts[0].Attempt,
			JobAttempt: 2, Outcome: "succeeded"}}
		if v := check(in); v.Failed() {
			t.Errorf("%s, on file: failed %v\n%s", c.name, failedInvariants(v), verdictText(v))
		}
	}
}

// Invariant 7's summary counts what each kind of worker logged: a campaign
// whose Python worker did nothing shows it.
func TestCheckCountsGrantsAndWritesByKindOfWorker(t *testing.T) {
	in := campaign()
	k1, k2 := in.Specs[0].Key, in.Specs[1].Key
	in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
		{"msg": "job claimed", "job_id": 1.0, "operation_key": k1, "attempt": 1.0},
		{"msg": "job written", "job_id": 1.0, "operation_key": k1, "attempt": 1.0, "decision": "complete"},
	}))
	in.addWorkerLog(logOf("chaos-py-w2", pythonWorker, false, pyRecs(t, time.Now(),
		`{"msg": "job claimed", "job_id": 2, "operation_key": "`+k2+`", "attempt": 1}`)))
	in.addWorkerLog(logOf("chaos-node-w3", nodeWorker, false, nil))
	v := check(in)
	const want = "logged by kind of worker (grants, write-backs accepted): Go 1, 1; Node.js 0, 0; Python 1, 0"
	if !strings.HasSuffix(v.Invariants[6].Summary, want) {
		t.Fatalf("invariant 7's summary %q, want it to end in %q", v.Invariants[6].Summary, want)
	}
}

func TestMayPredateKill(t *testing.T) {
	base := time.Now()
	fo := asyncFailover(base)
	fo.Frozen["z"] = []span{{From: base.Add(5 * time.Second), To: base.Add(20 * time.Second)}}
	fo.Frozen["late"] = []span{{From: base.Add(12 * time.Second), To: base.Add(20 * time.Second)}}
	fo.Frozen["open"] = []span{{From: base.Add(9 * time.Second)}}
	for _, c := range []struct {
		worker string
		at     time.Duration
		want   bool
	}{
		{"x", 9 * time.Second, true},           // before the kill
		{"x", 10500 * time.Millisecond, true},  // between kill and repoint: nothing reached the survivor
		{"x", 11500 * time.Millisecond, false}, // after the repoint, never frozen
		{"z", 20100 * time.Millisecond, true},  // right after a freeze across the kill
		{"z", 21 * time.Second, false},         // long after it
		{"late", 20100 * time.Millisecond, false},
		{"open", 30 * time.Second, true},
	} {
		if got := fo.mayPredateKill(c.worker, base.Add(c.at)); got != c.want {
			t.Errorf("%s at +%s: %v, want %v", c.worker, c.at, got, c.want)
		}
	}
}

// webhookCampaign is campaign() with the provider's webhooks: each refund
// has its refund.created and charge.refunded, delivered (refund 1's
// created first refused, signed with a wrong secret) and on file once each
// as a receipt of webhook:acme; job 2's history has the expedite a webhook's
// receipt made while it waited to reconcile.
func webhookCampaign() checkInput {
	in := campaign()
	in.Webhooks = true
	in.DB.Tokens = true
	for i := range in.DB.Events {
		if e := &in.DB.Events[i]; e.Kind != "enqueued" {
			e.Grant = fmt.Sprintf("aaaa0000000%d", e.JobID)
		}
	}
	at := time.Now()
	ok := fakeprovider.WebhookAttempt{At: at, Status: 200}
	in.Oracle.Webhooks.Enabled = true
	for n, j := range in.DB.Jobs {
		refund := j.ProviderRefundID
		created := fakeprovider.WebhookEvent{ID: fmt.Sprintf("evt_%d1", j.ID), Type: fakeprovider.EventRefundCreated,
			RefundID: refund, OperationKey: j.Key, IdempotencyKey: j.Key, Status: fakeprovider.StatusSucceeded,
			Attempts: []fakeprovider.WebhookAttempt{ok}, Deliveries: 1, Delivered: true}
		if n == 0 {
			created.Faults = "webhook_bad_signature"
			created.Attempts = []fakeprovider.WebhookAttempt{{At: at, Status: 400, Fault: "webhook_bad_signature"}, ok}
		}
		charge := created
		charge.ID, charge.Type, charge.Faults = fmt.Sprintf("evt_%d2", j.ID), fakeprovider.EventChargeRefunded, ""
		charge.Attempts = []fakeprovider.WebhookAttempt{ok}
		in.Oracle.Webhooks.Events = append(in.Oracle.Webhooks.Events, created, charge)
		for _, id := range []string{created.ID, charge.ID + ":" + refund} {
			in.DB.Observations = append(in.DB.Observations, observationRow{ID: int64(len(in.DB.Observations) + 1),
				JobID: j.ID, Key: j.Key, Source: "webhook:acme", Outcome: "succeeded", ProviderRefundID: refund,
				ProviderEventID: id})
		}
	}
	// Job 2: the worker's call timed out, it rescheduled to reconcile, the
	// webhook made it due now, the reconcile completed it (R28).
	evs := in.DB.Events[3:]
	resched := eventRow{ID: 22, JobID: 2, Attempt: 1, Kind: "rescheduled", FromState: "running", ToState: "ready",
		NextAction: "reconcile", Grant: "aaaa00000002"}
	expedite := eventRow{ID: 23, JobID: 2, Attempt: 1, Kind: "expedited", WorkerID: "webhook:acme", FromState: "ready",
		ToState: "ready", NextAction: "reconcile"}
	reclaim := eventRow{ID: 24, JobID: 2, Attempt: 2, Kind: "claimed", FromState: "ready", ToState: "running",
		NextAction: "reconcile", Grant: "bbbb00000002"}
	done := eventRow{ID: 25, JobID: 2, Attempt: 2, Kind: "completed", FromState: "running", ToState: "succeeded",
		NextAction: "reconcile", ProviderRefundID: "re_2", Grant: "bbbb00000002"}
	in.DB.Events = append(in.DB.Events[:3:3], evs[0], evs[1], resched, expedite, reclaim, done)
	in.DB.Jobs[1].Attempt, in.DB.Jobs[1].NextAction = 2, "reconcile"
	in.DB.Ledger[1].Attempt = 2
	return in
}

func TestCheckPassesACampaignWithWebhooks_R28(t *testing.T) {
	v := check(webhookCampaign())
	if v.Failed() || v.WebhooksDelivered != 4 || v.WebhookObservations != 4 || v.Expedited != 1 || v.ReceiptsLost != 0 {
		t.Fatalf("clean campaign with webhooks: delivered=%d observations=%d expedited=%d lost=%d\n%s", v.WebhooksDelivered,
			v.WebhookObservations, v.Expedited, v.ReceiptsLost, verdictText(v))
	}
	line := v.summaryLine(1, 2, 0, "", 0)
	if !strings.Contains(line, "webhooks_delivered=4 webhook_observations=4 expedited=1 webhook_receipts_lost=0 duplicate_receipts=0") {
		t.Errorf("summary line: %s", line)
	}
	if !strings.Contains(v.Invariants[7].Summary, "1 expedites (1 by webhooks' receipts, 0 by workers')") {
		t.Errorf("invariant 8: %s", v.Invariants[7].Summary)
	}
}

// A receipt that changed a job: the expedite took job 2 from ready to
// running (a claim with nobody holding it).
func TestCheckFindsAReceiptThatChangedAJob_R28(t *testing.T) {
	in := webhookCampaign()
	in.DB.Events[6].ToState = "running"
	in.DB.Events[7].FromState = "running"
	v := check(in)
	if !v.Invariants[7].Failed {
		t.Fatalf("an expedite that moved the job's state passed:\n%s", verdictText(v))
	}
	if got := verdictText(v); !strings.Contains(got, "job 2 (") ||
		!strings.Contains(got, "expedited event 23 by webhook:acme under attempt 1") {
		t.Errorf("the failure does not name the job and the event:\n%s", got)
	}
}

// R25: where the history keeps grants, a claim without one is a job
// running without a lease token.
func TestCheckFindsAClaimThatMintedNoGrant_R25(t *testing.T) {
	in := webhookCampaign()
	in.DB.Events[7].Grant, in.DB.Events[8].Grant = "", ""
	v := check(in)
	if !v.Invariants[7].Failed || !strings.Contains(verdictText(v), "claimed event 24 under attempt 2 by  minted no grant") {
		t.Fatalf("a claim without a grant passed:\n%s", verdictText(v))
	}
	in.DB.Tokens = false // a database from before R25: grants without fingerprints
	if v := check(in); v.Invariants[7].Failed {
		t.Fatalf("without lease_token_hash a claim has no grant to show:\n%s", verdictText(v))
	}
}

func TestCheckFindsALostWebhookReceipt_R28(t *testing.T) {
	in := webhookCampaign()
	in.DB.Observations = in.DB.Observations[:2] // job 2's receipts are gone
	v := check(in)
	if !v.Invariants[8].Failed || v.ReceiptsLost != 2 {
		t.Fatalf("lost receipts passed: lost=%d\n%s", v.ReceiptsLost, verdictText(v))
	}
	got := verdictText(v)
	for _, want := range []string{"NO RECEIPT: refund re_2 (succeeded, key " + in.Specs[1].Key + ", job 2)",
		"RECEIPT LOST: event evt_21 (refund.created of refund re_2", "no observation has provider event id evt_22:re_2"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}

	// Never delivered: the provider gave up.
	in = webhookCampaign()
	in.DB.Observations = in.DB.Observations[:3]
	e := &in.Oracle.Webhooks.Events[3]
	e.Attempts = []fakeprovider.WebhookAttempt{{Status: 503}, {Status: 0, Error: "connection refused"}}
	e.Deliveries, e.Delivered, e.GaveUp = 0, false, true
	if v := check(in); !v.Invariants[8].Failed || !strings.Contains(verdictText(v), "was never delivered: 2 attempts (gave up: true)") {
		t.Fatalf("an event given up passed:\n%s", verdictText(v))
	}

	// Kept in the unmatched log although its job exists.
	in = webhookCampaign()
	in.DB.Observations = in.DB.Observations[:3]
	in.DB.Unmatched = []unmatchedRow{{ID: 1, Provider: "acme", ProviderEventID: "evt_22:re_2", EventType: "charge.refunded",
		ProviderRefundID: "re_2", Key: in.Specs[1].Key, Outcome: "succeeded"}}
	if v := check(in); !v.Invariants[8].Failed || !strings.Contains(verdictText(v), "is in the unmatched log (1") {
		t.Fatalf("an unmatched receipt of an existing job passed:\n%s", verdictText(v))
	}

	// Filed with another outcome than the provider's event.
	in = webhookCampaign()
	in.DB.Observations[0].Outcome = "failed"
	if v := check(in); !v.Invariants[8].Failed || !strings.Contains(verdictText(v), "MISFILED: event evt_11") {
		t.Fatalf("a misfiled receipt passed:\n%s", verdictText(v))
	}
}

func TestCheckFindsADuplicateWebhookReceipt_R28(t *testing.T) {
	in := webhookCampaign()
	dup := in.DB.Observations[1]
	dup.ID = 99
	in.DB.Observations = append(in.DB.Observations, dup)
	v := check(in)
	if !v.Invariants[8].Failed || v.DuplicateReceipts != 1 ||
		!strings.Contains(verdictText(v), "DUPLICATE RECEIPT: provider event evt_12:re_1 is on file 2 times") {
		t.Fatalf("a duplicate receipt passed: duplicates=%d\n%s", v.DuplicateReceipts, verdictText(v))
	}
	// The same event filed on two jobs is as much a duplicate.
	in.DB.Observations[len(in.DB.Observations)-1].JobID = 2
	if v := check(in); v.DuplicateReceipts != 1 {
		t.Fatalf("an event filed on two jobs: duplicates=%d", v.DuplicateReceipts)
	}
	// Even with webhooks off nothing may be on file twice.
	in.Webhooks = false
	if v := check(in); !v.Invariants[8].Failed {
		t.Fatalf("webhooks off, duplicate passed:\n%s", verdictText(v))
	}
}

func TestCheckFindsASpoiledDeliveryTaken_R28(t *testing.T) {
	in := webhookCampaign()
	in.Oracle.Webhooks.Events[0].Attempts[0].Status = 200
	v := check(in)
	if !v.Invariants[8].Failed || !strings.Contains(verdictText(v), "SPOILED DELIVERY TAKEN: event evt_11") {
		t.Fatalf("a delivery with a wrong signature answered 2xx passed:\n%s", verdictText(v))
	}
}

// webhook-drop: a refund whose every event was dropped owes no receipt; one
// with an event delivered still does.
func TestCheckLeavesOutRefundsWhoseEveryEventWasDropped(t *testing.T) {
	in := webhookCampaign()
	in.DB.Observations = in.DB.Observations[:2]
	for i := 2; i < 4; i++ {
		e := &in.Oracle.Webhooks.Events[i]
		e.Dropped, e.Delivered, e.Deliveries, e.Attempts = true, false, 0, nil
	}
	v := check(in)
	if v.Failed() || !strings.Contains(v.Invariants[8].Summary, "(1 left out: every event dropped); 4 events (2 dropped)") {
		t.Fatalf("dropped events judged:\n%s", verdictText(v))
	}
	in.Oracle.Webhooks.Events[3].Dropped = false
	in.Oracle.Webhooks.Events[3].Attempts = []fakeprovider.WebhookAttempt{{At: time.Now(), Status: 200}}
	in.Oracle.Webhooks.Events[3].Delivered, in.Oracle.Webhooks.Events[3].Deliveries = true, 1
	if v := check(in); !v.Invariants[8].Failed || !strings.Contains(verdictText(v), "NO RECEIPT: refund re_2") {
		t.Fatalf("a refund with a delivered event and no receipt passed:\n%s", verdictText(v))
	}
}

// After an async failover a receipt the old primary stored is lost with it;
// one delivered after the repoint must be on the new primary; semi-sync
// loses none.
func TestCheckWebhookReceiptsLostInAFailover_R26(t *testing.T) {
	in := webhookCampaign()
	base := time.Now()
	in.Failover = asyncFailover(base)
	in.DB.Observations = in.DB.Observations[:3]
	in.Oracle.Webhooks.Events[3].Attempts[0].At = base.Add(9 * time.Second)
	v := check(in)
	if v.Failed() || v.ReceiptsLostInFailover != 1 || v.ReceiptsLost != 0 {
		t.Fatalf("async: a receipt stored by the old primary: lost_in_failover=%d lost=%d\n%s", v.ReceiptsLostInFailover,
			v.ReceiptsLost, verdictText(v))
	}
	in.Oracle.Webhooks.Events[3].Attempts[0].At = base.Add(12 * time.Second)
	if v := check(in); !v.Invariants[8].Failed || v.ReceiptsLost != 1 {
		t.Fatalf("async: a receipt delivered after the repoint and missing passed:\n%s", verdictText(v))
	}
	in.Oracle.Webhooks.Events[3].Attempts[0].At = base.Add(9 * time.Second)
	in.Failover.Mode = failoverSemiSync
	if v := check(in); !v.Invariants[8].Failed {
		t.Fatalf("semi-sync lost a stored receipt, yet:\n%s", verdictText(v))
	}

	// An enqueue the async failover lost: the event reached the new primary
	// before the re-drive and is kept unmatched.
	in.Failover.Mode = failoverAsync
	in.Oracle.Webhooks.Events[3].Attempts[0].At = base.Add(12 * time.Second)
	in.DB.Unmatched = []unmatchedRow{{ID: 1, Provider: "acme", ProviderEventID: "evt_22:re_2", EventType: "charge.refunded",
		ProviderRefundID: "re_2", Key: in.Specs[1].Key, Outcome: "succeeded"}}
	in.EnqueuesLost = []string{in.Specs[1].Key}
	if v := check(in); v.Invariants[8].Failed || v.ReceiptsLostInFailover != 1 {
		t.Fatalf("an unmatched receipt of an enqueue lost in the failover:\n%s", verdictText(v))
	}
}

// takeoverCampaign is campaign() with job 1 taken over: chaos-w1 (Go,
// renewing, on replica-a) claims it at base, chaos-w2 takes it over at
// base+10s and completes it. No fault is known: as it stands, a false
// takeover.
func takeoverCampaign(base time.Time) checkInput {
	in := campaign()
	k1 := in.Specs[0].Key
	in.DB.Now, in.DB.ReadAt = base.Add(time.Minute), base.Add(time.Minute)
	in.DB.Jobs[0].Attempt, in.DB.Jobs[0].NextAction = 2, "reconcile"
	in.DB.Ledger[0].Attempt = 2
	in.DB.Events = append([]eventRow{
		{ID: 10, JobID: 1, Kind: "enqueued", ToState: "ready", NextAction: "refund", At: base.Add(-time.Second)},
		{ID: 11, JobID: 1, Attempt: 1, Kind: "claimed", WorkerID: "chaos-w1", FromState: "ready", ToState: "running",
			NextAction: "refund", At: base},
		{ID: 12, JobID: 1, Attempt: 2, Kind: "taken_over", WorkerID: "chaos-w2", FromState: "running", ToState: "running",
			NextAction: "reconcile", At: base.Add(10 * time.Second)},
		{ID: 13, JobID: 1, Attempt: 2, Kind: "completed", WorkerID: "chaos-w2", FromState: "running", ToState: "succeeded",
			NextAction: "reconcile", ProviderRefundID: "re_1", At: base.Add(11 * time.Second)},
	}, in.DB.Events[3:]...)
	in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
		{"msg": "job claimed", "job_id": 1.0, "operation_key": k1, "attempt": 1.0, seenKey: base},
	}))
	in.Takeovers = &takeoverInput{Lease: 4 * time.Second, Start: base.Add(-20 * time.Second), Workers: map[string]workerFacts{
		"chaos-w1": {Renews: true, Patient: true, Replica: "replica-a"},
		"chaos-w2": {Renews: true, Replica: "replica-b"},
	}}
	return in
}

func TestCheckFindsAFalseTakeoverOfALiveRenewingWorker_R27(t *testing.T) {
	base := time.Now()
	v := check(takeoverCampaign(base))
	if !slices.Equal(failedInvariants(v), []int{10}) || v.Takeovers != 1 || v.FalseTakeovers != 1 {
		t.Fatalf("a live renewing worker taken over: failed %v, takeovers=%d false=%d\n%s", failedInvariants(v),
			v.Takeovers, v.FalseTakeovers, verdictText(v))
	}
	text := verdictText(v)
	for _, want := range []string{"FALSE TAKEOVER: job 1", "chaos-w2 took attempt 2 over at +30.000s from chaos-w1 (Go, patient",
		"event 12: taken_over", "takeovers=1 false_takeovers=1"} {
		if !strings.Contains(text+v.summaryLine(1, 2, 0, "", 0), want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}

	// The Python worker renews as refundworker does (R27): its takeovers
	// are judged alike, only the Node.js worker's may be left out
	// (--node-renews=false).
	in := takeoverCampaign(base)
	in.Takeovers.Workers["chaos-w1"] = workerFacts{Kind: pythonWorker, Renews: true, Patient: true, Replica: "replica-a"}
	if v := check(in); v.FalseTakeovers != 1 || !strings.Contains(verdictText(v), "from chaos-w1 (Python, patient, renewing") {
		t.Fatalf("a live renewing Python worker taken over: false=%d\n%s", v.FalseTakeovers, verdictText(v))
	}

	// Its write-back rejected after the takeover: it was live all along,
	// and the details say so.
	in = takeoverCampaign(base)
	in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
		{"msg": "write-back rejected by the fence; filing the answer as an observation", "job_id": 1.0,
			"operation_key": in.Specs[0].Key, "attempt": 1.0, "decision": "complete", seenKey: base.Add(12 * time.Second)},
	}))
	in.StaleRejections = 0
	v = check(in)
	if v.FalseTakeovers != 1 || !strings.Contains(verdictText(v), "at +32.000s its write-back was rejected by the fence") {
		t.Fatalf("a write-back rejected after the takeover excused it: false=%d\n%s", v.FalseTakeovers, verdictText(v))
	}
}

// A takeover of a renewing worker is no violation when something held the
// holder from renewing long enough to cost its lease: from a third of a
// lease before the takeover or earlier, until a lease before it or later;
// a coordinator down or a database refusing only when the holder's log
// shows renewals failing. Nor is one after the holder let the grant go, or
// of a grant it never learnt of (R7).
func TestCheckExcusesTakeoversWhileAFaultHeldTheHolder_R27(t *testing.T) {
	base := time.Now()
	s := func(d float64) time.Time { return base.Add(time.Duration(d * float64(time.Second))) }
	w1 := func(in *checkInput, edit func(w *workerFacts)) {
		w := in.Takeovers.Workers["chaos-w1"]
		edit(&w)
		in.Takeovers.Workers["chaos-w1"] = w
	}
	failing := func(in *checkInput, at ...float64) {
		for _, a := range at {
			in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
				{"msg": "jobfence: repeating call", "method": "RenewLeases", "try": 2.0, seenKey: s(a)},
			}))
		}
	}
	// The takeover is at 10 s, the lease 4 s.
	for _, c := range []struct {
		name  string
		edit  func(in *checkInput)
		false int
	}{
		{"frozen across the lease", func(in *checkInput) { w1(in, func(w *workerFacts) { w.Frozen = []span{{From: s(5), To: s(11)}} }) }, 0},
		{"frozen, then continued more than a lease before", func(in *checkInput) {
			w1(in, func(w *workerFacts) { w.Frozen = []span{{From: s(1), To: s(5)}} })
		}, 1},
		{"frozen less than a third of a lease before", func(in *checkInput) {
			w1(in, func(w *workerFacts) { w.Frozen = []span{{From: s(9), To: s(12)}} })
		}, 1},
		{"still frozen", func(in *checkInput) { w1(in, func(w *workerFacts) { w.Frozen = []span{{From: s(5)}} }) }, 0},
		{"killed", func(in *checkInput) { w1(in, func(w *workerFacts) { w.Ended = s(6) }) }, 0},
		{"killed a moment before", func(in *checkInput) { w1(in, func(w *workerFacts) { w.Ended = s(9.5) }) }, 1},
		{"its coordinator down, its renewals failing", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "coordinator down", Replica: "replica-a", From: s(4), To: s(7)}}
			failing(in, 4.5, 6)
		}, 0},
		{"its coordinator down, its write-back repeated", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "coordinator down", Replica: "replica-a", From: s(4), To: s(7)}}
			in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
				{"msg": "jobfence: repeating call", "method": "Reschedule", "try": 3.0, seenKey: s(8)},
			}))
		}, 0},
		{"its coordinator down, only its claims failing", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "coordinator down", Replica: "replica-a", From: s(4), To: s(7)}}
			in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
				{"msg": "jobfence: repeating call", "method": "Claim", "try": 3.0, seenKey: s(5)},
			}))
		}, 1},
		{"its coordinator down, no renewal failing", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "coordinator down", Replica: "replica-a", From: s(4), To: s(7)}}
		}, 1},
		{"the other coordinator down", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "coordinator down", Replica: "replica-b", From: s(4), To: s(7)}}
			failing(in, 4.5, 6)
		}, 1},
		{"its database refusing, its renewals failing", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-down", N: 4, Replica: "replica-a", From: s(6), To: s(8)}}
			failing(in, 7)
		}, 0},
		{"its database refusing, no renewal failing", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-reset", N: 4, Replica: "replica-a", From: s(6), To: s(8)}}
		}, 1},
		{"its database stalled until 3s before", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-blackhole", N: 3, Replica: "replica-a", From: s(5), To: s(7)}}
		}, 0},
		{"its database stalled until 5s before", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-latency", N: 3, Replica: "replica-a", From: s(2), To: s(5)}}
		}, 1},
		{"its database stalled until 5s before, its renewals failing until 2s before", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-latency", N: 3, Replica: "replica-a", From: s(2), To: s(5)}}
			failing(in, 6, 3, 8)
		}, 0},
		{"a commit-cut", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-commit-cut", N: 3, Replica: "replica-a", From: s(5), To: s(9)}}
			failing(in, 7)
		}, 1},
		{"renewal failures alone", func(in *checkInput) { failing(in, 6, 8, 9) }, 1},
		{"a failover", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-failover", N: 9, From: s(3), To: s(8)}}
		}, 0},
		{"a fault that began after the takeover", func(in *checkInput) {
			in.Takeovers.Outages = []outage{{What: "db-blackhole", N: 3, Replica: "replica-a", From: s(11), To: s(12)}}
		}, 1},
		{"its write-back had failed", func(in *checkInput) {
			in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
				{"msg": "write-back failed; the lease will expire and a takeover reconciles", "job_id": 1.0,
					"operation_key": in.Specs[0].Key, "attempt": 1.0, "decision": "reschedule", seenKey: s(3)},
			}))
		}, 0},
		{"a grant it never learnt of", func(in *checkInput) { in.Grants = nil }, 0},
		{"a worker that does not renew", func(in *checkInput) {
			in.Takeovers.Workers["chaos-w1"] = workerFacts{Kind: nodeWorker, Replica: "replica-a"}
		}, 0},
	} {
		in := takeoverCampaign(base)
		c.edit(&in)
		v := check(in)
		if v.FalseTakeovers != c.false || v.Takeovers != 1 || (c.false > 0) != v.Invariants[9].Failed {
			t.Errorf("%s: false_takeovers=%d, want %d; failed %v\n%s", c.name, v.FalseTakeovers, c.false, failedInvariants(v),
				verdictText(v))
		}
	}
}

// Grants held past their lease and written back, with no takeover: what
// renewal kept (R27), counted in the summary.
func TestCheckCountsGrantsKeptPastTheirLeaseByRenewal_R27(t *testing.T) {
	base := time.Now()
	in := campaign()
	in.Takeovers = &takeoverInput{Lease: 4 * time.Second, Workers: map[string]workerFacts{"chaos-w1": {Renews: true}}}
	in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
		{"msg": "job claimed", "job_id": 1.0, "operation_key": "k1", "attempt": 1.0, seenKey: base},
		{"msg": "job claimed", "job_id": 2.0, "operation_key": "k2", "attempt": 1.0, seenKey: base},
		{"msg": "job written", "job_id": 1.0, "operation_key": "k1", "attempt": 1.0, "decision": "complete",
			seenKey: base.Add(9 * time.Second)},
		{"msg": "job written", "job_id": 2.0, "operation_key": "k2", "attempt": 1.0, "decision": "complete",
			seenKey: base.Add(time.Second)},
	}))
	n, longest := heldPastLease(in, in.Takeovers)
	if n != 1 || longest != 9*time.Second {
		t.Fatalf("held past the lease: %d, longest %s; want 1, 9s", n, longest)
	}
}

// The spool's lines are the SDKs' (job_id and attempt as strings); what is
// left in them is read without the lease token.
func TestReadSpool(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, spoolName(4))
	if left, err := readSpool(path); err != nil || left != nil {
		t.Fatalf("no spool file: %v, %v", left, err)
	}
	lines := `{"v":1,"job_id":"236","operation_key":"k236","attempt":"1","lease_token":"secret","source":"worker:chaos-py-w5-3",` +
		`"outcome":"succeeded","provider_refund_id":"re_000234","provider_event_id":"","detail":"d","spooled_at":"2026-12-01T17:24:38.855495Z"}` +
		"\n\n" + `{"v":1,"job_id":"235","operation_key":"k235","attempt":"2","lease_token":"secret","outcome":"pending",` +
		`"provider_refund_id":"re_000233"}` + "\n"
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	left, err := readSpool(path)
	want := []spoolLeft{{Spool: path, Key: "k236", JobID: 236, Attempt: 1, Outcome: "succeeded", RefundID: "re_000234"},
		{Spool: path, Key: "k235", JobID: 235, Attempt: 2, Outcome: "pending", RefundID: "re_000233"}}
	if err != nil || !slices.Equal(left, want) {
		t.Fatalf("spool read as %+v, %v; want %+v", left, err, want)
	}
	// A crash in the middle of an append leaves an unfinished last line,
	// which holds nothing; a line the campaign cannot read anywhere else is
	// an error.
	if err := os.WriteFile(path, []byte(lines+`{"v":1,"job_id":"2`), 0o600); err != nil {
		t.Fatal(err)
	}
	if left, err := readSpool(path); err != nil || !slices.Equal(left, want) {
		t.Fatalf("an unfinished last line: %+v, %v", left, err)
	}
	if err := os.WriteFile(path, []byte(lines+"{not json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readSpool(path); err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("a line the campaign cannot read: %v", err)
	}
}
