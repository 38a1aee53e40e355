package main

import (
	"database/sql"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// failoverInput is what the checks need to know of a database failover.
type failoverInput struct {
	Mode string // async or semi-sync
	// Killed is when the old primary was killed, Repointed when every proxy
	// pointed at the promoted replica: nothing the workers logged before
	// Repointed was accepted by the survivor.
	Killed, Repointed time.Time
	// Frozen are the spans each worker (by id) spent frozen.
	Frozen map[string][]span
}

// Slack of mayPredateKill: how late after a kill a freeze may begin and
// still hold back a line of something done before the kill, and how soon
// after a freeze ends the worker prints what it held.
const (
	freezeStartSlack = 100 * time.Millisecond
	freezeEndSlack   = 250 * time.Millisecond
)

// mayPredateKill reports whether a line worker logged, read at seen, may
// tell of something the old primary did before it was killed: it was read
// before the proxies pointed at the new primary (nothing could reach the
// survivor before), or right after the end of a freeze that held the worker
// across the kill (the reply was in hand, the line not yet printed).
func (f *failoverInput) mayPredateKill(worker string, seen time.Time) bool {
	if seen.Before(f.Repointed) {
		return true
	}
	for _, sp := range f.Frozen[worker] {
		if sp.From.After(f.Killed.Add(freezeStartSlack)) || (!sp.To.IsZero() && sp.To.Before(f.Killed)) {
			continue
		}
		if sp.To.IsZero() || seen.Before(sp.To.Add(freezeEndSlack)) {
			return true
		}
	}
	return false
}

// lossless reports whether the failover was one that must lose nothing
// (semi-sync); false without a failover.
func (f *failoverInput) lossless() bool { return f != nil && f.Mode == failoverSemiSync }

// checkInput is everything the invariants are checked against.
type checkInput struct {
	Specs           []refundSpec
	Acked           map[string]int64
	DB              dbState
	Oracle          fakeprovider.OracleReport
	Receipts        []receipt
	StaleRejections int
	// Acks are the write-backs the workers were told succeeded.
	Acks []ack
	// Grants are the grants the workers logged.
	Grants []grantLog
	// Failover is set when the campaign failed the database over; then
	// EnqueuesLost are the acknowledged enqueues the new primary did not
	// have (re-driven, answered created: true).
	Failover     *failoverInput
	EnqueuesLost []string
}

// invariant is the verdict on one invariant.
type invariant struct {
	N       int
	Name    string
	Summary string
	Details []string
	Failed  bool
}

// verdict is the result of all checks, with the numbers of the summary line.
type verdict struct {
	Invariants            []*invariant
	DoubleRefunds         int
	Lost                  int
	StaleWritesAccepted   int
	UnobservedLateSuccess int
	Succeeded, Review     int
	Pending               int // unfinished, but legitimately (the provider still says pending, R4)
	// What a failover lost: grants and accepted write-backs the workers
	// logged that the survivor does not have, acknowledged enqueues it did
	// not have, observations filed before the kill that are not on file.
	GrantsLost, WritesLost, EnqueuesLost, ObservationsLost int
	lostCompletions                                        int // of WritesLost
}

// Failed reports whether any invariant failed.
func (v verdict) Failed() bool {
	return slices.ContainsFunc(v.Invariants, func(i *invariant) bool { return i.Failed })
}

// maxDetails bounds the lines printed per invariant.
const maxDetails = 25

func (i *invariant) fail(format string, args ...any) {
	i.Failed = true
	i.Details = append(i.Details, fmt.Sprintf(format, args...))
}

func (i *invariant) note(format string, args ...any) {
	i.Details = append(i.Details, fmt.Sprintf(format, args...))
}

// check evaluates the seven invariants (docs/CHAOS.md, "The invariants") in
// order, on what the input was indexed into once: the jobs and their
// histories (checkFacts) and where each acknowledged write-back is in the
// surviving history (placeAcks).
func check(in checkInput) verdict {
	x := newCheckFacts(in.Specs, in.DB)
	writes := placeAcks(in.Acks, in.Failover, x)
	writesLost, completionsLost := lostInFailover(writes)

	i1, doubleRefunds := checkOncePerKey(in.Oracle, x)
	i2, jobs := checkPresentAndFinal(in.Acked, in.DB, in.Oracle, in.Failover, in.EnqueuesLost, x)
	i3 := checkAttemptsIncreased(in.DB, x)
	i4, staleAttempts := checkNoStaleWrite(in.Acks, in.StaleRejections, in.Failover, x)
	i5, receipts := checkLateSuccessesObserved(in.Receipts, in.DB.Observations, in.Failover, x)
	i6 := checkLedger(in.DB, in.Oracle, in.Failover, completionsLost, x)
	i7, grants := checkGrants(in.Grants, writes, in.DB, in.Failover, x)

	return verdict{
		Invariants:            []*invariant{i1, i2, i3, i4, i5, i6, i7},
		DoubleRefunds:         doubleRefunds,
		Lost:                  jobs.Lost,
		StaleWritesAccepted:   staleAttempts + grants.StaleWrites,
		UnobservedLateSuccess: receipts.Unobserved,
		Succeeded:             jobs.Succeeded,
		Review:                jobs.Review,
		Pending:               jobs.Pending,
		GrantsLost:            grants.GrantsLost,
		WritesLost:            writesLost,
		EnqueuesLost:          jobs.EnqueuesLost,
		ObservationsLost:      receipts.Lost,
		lostCompletions:       completionsLost,
	}
}

// summaryLine is the campaign's last line: its size and the verdict's
// numbers, with the failover's losses when it ran one.
func (v verdict) summaryLine(seed uint64, jobs, faults int, failover string, enqueuesLost int) string {
	s := fmt.Sprintf("seed=%d jobs=%d faults=%d double_refunds=%d lost=%d stale_writes_accepted=%d unobserved_late_success=%d",
		seed, jobs, faults, v.DoubleRefunds, v.Lost, v.StaleWritesAccepted, v.UnobservedLateSuccess)
	if failover != "" {
		s += fmt.Sprintf(" failover=%s grants_lost_in_failover=%d writes_lost_in_failover=%d enqueues_lost_in_failover=%d",
			failover, v.GrantsLost, v.WritesLost, enqueuesLost)
	}
	return s
}

// checkFacts is what the invariants share, indexed once: the campaign's
// refunds by key, the jobs by key and by id, each job's history, and what
// walkHistory found in it.
type checkFacts struct {
	specByKey map[string]refundSpec
	jobByKey  map[string]jobRow
	jobByID   map[int64]jobRow
	events    map[int64][]eventRow // by job id, each in id order
	walked    []walkedJob          // every job of refund_jobs, in id order
}

// walkedJob is a job with what walkHistory found in its history.
type walkedJob struct {
	job jobRow
	h   history
}

func newCheckFacts(specs []refundSpec, db dbState) *checkFacts {
	x := &checkFacts{specByKey: map[string]refundSpec{}, jobByKey: map[string]jobRow{}, jobByID: map[int64]jobRow{},
		events: map[int64][]eventRow{}}
	for _, s := range specs {
		x.specByKey[s.Key] = s
	}
	for _, j := range db.Jobs {
		x.jobByKey[j.Key] = j
		x.jobByID[j.ID] = j
	}
	for _, e := range db.Events {
		x.events[e.JobID] = append(x.events[e.JobID], e)
	}
	for _, j := range db.Jobs {
		x.walked = append(x.walked, walkedJob{job: j, h: walkHistory(j, x.events[j.ID])})
	}
	return x
}

// jobOf is the job a worker's line is about: by its operation key when the
// line names it (after a failover the survivor may have given the job
// another id, and the id to another job), else by id. The zero jobRow when
// there is none.
func (x *checkFacts) jobOf(key string, id int64) jobRow {
	if key != "" {
		return x.jobByKey[key]
	}
	return x.jobByID[id]
}

// historyOf formats a job's row and history for a failure's details.
func (x *checkFacts) historyOf(j jobRow) string { return historyOf(j, x.events) }

// liveRefunds are the provider's refunds of an operation key that did not
// fail (pending or succeeded).
func liveRefunds(o fakeprovider.OracleReport, key string) []fakeprovider.Refund {
	op, _ := o.Operation(key)
	var out []fakeprovider.Refund
	for _, r := range o.Refunds {
		if slices.Contains(op.RefundIDs, r.ID) && r.Status != fakeprovider.StatusFailed {
			out = append(out, r)
		}
	}
	return out
}

// ackedWrite is a write-back a worker was told succeeded, placed in the
// surviving history.
type ackedWrite struct {
	ack
	job jobRow // the job its line names (jobOf); zero when the database has none
	// inHistory: the job's history has a write of that kind under that
	// attempt and, when the line carries one, that grant.
	inHistory bool
	// lost: not inHistory, after a failover, and the line may tell of a
	// write the old primary accepted before it was killed (mayPredateKill):
	// lost with it.
	lost bool
}

// placeAcks looks up each acknowledged write-back in the surviving history.
func placeAcks(acks []ack, fo *failoverInput, x *checkFacts) []ackedWrite {
	out := make([]ackedWrite, 0, len(acks))
	for _, a := range acks {
		w := ackedWrite{ack: a, job: x.jobOf(a.Key, a.JobID)}
		w.inHistory = slices.ContainsFunc(x.events[w.job.ID], func(e eventRow) bool {
			return e.Kind == a.Kind && e.Attempt == a.Attempt && (a.Grant == "" || e.Grant == a.Grant)
		})
		w.lost = !w.inHistory && fo != nil && fo.mayPredateKill(a.Worker, a.Seen)
		out = append(out, w)
	}
	return out
}

// lostInFailover counts the acknowledged write-backs lost with the old
// primary, and the completions among them.
func lostInFailover(writes []ackedWrite) (lost, completions int) {
	for _, w := range writes {
		if w.lost {
			lost++
			if w.Kind == "completed" {
				completions++
			}
		}
	}
	return lost, completions
}

// checkOncePerKey is invariant 1, the promise itself (R1, R14, R16, T3), on
// the provider's own records: no operation with more than one live refund,
// more than one reference or more than one key, no payment refunded beyond
// its amount, no refund for a key the campaign never enqueued, and the
// oracle's double_refunds 0. doubleRefunds is the larger of the oracle's
// count and the operations found doubled.
func checkOncePerKey(o fakeprovider.OracleReport, x *checkFacts) (i1 *invariant, doubleRefunds int) {
	i1 = &invariant{N: 1, Name: "every refund happened at most once per operation key (R1, R14, T3)"}
	dups := 0
	for _, op := range o.Operations {
		if _, ours := x.specByKey[op.MerchantReference]; !ours {
			i1.fail("operation %q at the provider is not one of the campaign's refunds", op.MerchantReference)
		}
		if op.Refunds > 1 || len(op.MerchantReferences) > 1 || len(op.IdempotencyKeys) > 1 {
			dups++
			i1.fail("operation %s: %d live refunds %v (references %v, keys %v)%s", op.MerchantReference, op.Refunds,
				op.RefundIDs, op.MerchantReferences, op.IdempotencyKeys, x.historyOf(x.jobByKey[op.MerchantReference]))
		}
	}
	for _, p := range o.Payments {
		if p.OverRefunded {
			i1.fail("payment %s over-refunded: %d of %d minor units in %v", p.PaymentID, p.RefundedMinor, p.AmountMinor, p.RefundIDs)
		}
	}
	if o.DoubleRefunds > 0 {
		i1.Failed = true
	}
	i1.Summary = fmt.Sprintf("%d refunds at the provider for %d operations; oracle double_refunds=%d",
		len(o.Refunds), len(o.Operations), o.DoubleRefunds)
	return i1, max(o.DoubleRefunds, dups)
}

// jobTally is how the jobs ended, for the verdict.
type jobTally struct {
	Succeeded, Review int
	Pending           int // unfinished, but the provider still says pending (R4)
	Lost              int // acknowledged and missing, or unfinished without a pending refund
	EnqueuesLost      int // acknowledged enqueues the failover lost (re-driven)
}

// checkPresentAndFinal is invariant 2, the other half of the promise:
// nothing dropped, nothing stuck. Every acknowledged enqueue has its row
// under its acknowledged id, every row is a refund the campaign enqueued,
// and every row is final (succeeded or manual_review) or legitimately
// pending: the provider still reports its refund pending (R4), counted and
// listed apart. After a failover the acknowledged enqueues it lost are
// counted (re-driven by the producer, so they are among the acknowledged
// above); a lossless (semi-sync) failover must lose none.
func checkPresentAndFinal(acked map[string]int64, db dbState, o fakeprovider.OracleReport, fo *failoverInput,
	enqueuesLost []string, x *checkFacts) (i2 *invariant, t jobTally) {
	i2 = &invariant{N: 2, Name: "every enqueued job is present and final (succeeded or manual_review)"}
	unacked := 0
	for _, j := range db.Jobs {
		if _, ours := x.specByKey[j.Key]; !ours {
			i2.fail("job %d has operation key %q, which the campaign never enqueued", j.ID, j.Key)
		}
		if _, ok := acked[j.Key]; !ok {
			unacked++
		}
	}
	missing := 0
	for key, id := range acked {
		j, ok := x.jobByKey[key]
		switch {
		case !ok:
			missing++
			i2.fail("LOST: job %d (%s) was enqueued and acknowledged but is not in refund_jobs", id, key)
		case j.ID != id:
			i2.fail("job for %s: acknowledged as %d, stored as %d", key, id, j.ID)
		}
	}
	unfinished := 0
	for _, j := range db.Jobs {
		switch j.State {
		case "succeeded":
			t.Succeeded++
			continue
		case "manual_review":
			t.Review++
			continue
		}
		unfinished++
		refunds := liveRefunds(o, j.Key)
		pendingAtProvider := slices.ContainsFunc(refunds, func(r fakeprovider.Refund) bool { return r.Status == fakeprovider.StatusPending })
		desc := fmt.Sprintf("job %d (%s) is %s, next_action %s at %s, lease_until %s, last reason %q; provider: %s%s",
			j.ID, j.Key, j.State, j.NextAction, j.NextAttemptAt.Format("15:04:05.000"), nullTime(j.LeaseUntil),
			j.LastReason, describeRefunds(refunds), x.historyOf(j))
		if pendingAtProvider {
			t.Pending++
			i2.note("pending (R4, the provider still says pending): %s", desc)
		} else {
			i2.fail("NOT FINAL: %s", desc)
		}
	}
	t.Lost = missing + unfinished - t.Pending
	i2.Summary = fmt.Sprintf("%d acknowledged, %d rows (%d enqueued without acknowledgement); %d succeeded, "+
		"%d manual_review, %d legitimately pending, %d missing, %d not final",
		len(acked), len(db.Jobs), unacked, t.Succeeded, t.Review, t.Pending, missing, unfinished-t.Pending)
	if fo != nil {
		// Acknowledged enqueues the old primary committed last are gone with
		// it; the producer enqueued every acknowledged one again (R1), so
		// they are above among the acknowledged, present and final.
		t.EnqueuesLost = len(enqueuesLost)
		i2.Summary += fmt.Sprintf("; %d acknowledged enqueues lost in the failover and re-driven", t.EnqueuesLost)
		for _, k := range enqueuesLost {
			if fo.lossless() {
				i2.fail("LOST IN A LOSSLESS FAILOVER: the acknowledged enqueue of %s was not on the new primary", k)
			} else {
				i2.note("enqueue of %s lost in the failover (acknowledged by the old primary), re-driven", k)
			}
		}
	}
	return i2, t
}

// checkAttemptsIncreased is invariant 3 (R2, R3, R5, R6), on each job's
// history as walkHistory replayed it: the attempt starts at 0, never goes
// down, and every claim or takeover steps it by exactly one from the state
// it claims from (a takeover with next action reconcile); the row agrees
// with where its history ends; and no history belongs to a job that is not
// in refund_jobs.
func checkAttemptsIncreased(db dbState, x *checkFacts) *invariant {
	i3 := &invariant{N: 3, Name: "attempts only increased, claims and takeovers by exactly one, the row agrees with its history (R2, R3, R5, R6)"}
	claims, takeovers := 0, 0
	for _, w := range x.walked {
		claims += w.h.claims
		takeovers += w.h.takeovers
		for _, p := range w.h.attemptProblems {
			i3.fail("job %d (%s): %s%s", w.job.ID, w.job.Key, p, x.historyOf(w.job))
		}
	}
	for id := range x.events {
		if _, ok := x.jobByID[id]; !ok {
			i3.fail("history of job %d, which is not in refund_jobs", id)
		}
	}
	i3.Summary = fmt.Sprintf("%d events: %d claims, %d takeovers", len(db.Events), claims, takeovers)
	return i3
}

// checkNoStaleWrite is invariant 4 (R8, R9, R10, R21, T1, T4). In each
// history (walkHistory) every write-back carries the attempt of the latest
// claim or takeover while the job was running, there is at most one
// completion and nothing after it, and the row's refund id is its
// completion's. A history entry records the row's attempt and holder, which
// the fence makes the writer's own; the workers' side shows a write that
// slipped through anyway: every write-back a worker was told succeeded
// (replayed or not) must be in the job's history as that kind of write
// under that attempt (R9; a "replayed" one with no first write, R21). After
// a failover such a write may have been lost with the old primary:
// checkGrants tells. stale counts the violations (stale_writes_accepted).
func checkNoStaleWrite(acks []ack, staleRejections int, fo *failoverInput, x *checkFacts) (i4 *invariant, stale int) {
	i4 = &invariant{N: 4, Name: "no write with a stale attempt changed a job (R8, R9, R10, R21, T1, T4)"}
	writes := 0
	for _, w := range x.walked {
		writes += w.h.writes
		for _, p := range w.h.staleWrites {
			stale++
			i4.fail("job %d (%s): %s%s", w.job.ID, w.job.Key, p, x.historyOf(w.job))
		}
	}
	replayed := 0
	for _, a := range acks {
		if a.Replayed {
			replayed++
		}
		j := x.jobOf(a.Key, a.JobID)
		if slices.ContainsFunc(x.events[j.ID], func(e eventRow) bool { return e.Kind == a.Kind && e.Attempt == a.Attempt }) {
			continue
		}
		if fo != nil {
			continue // lost in the failover, or not: invariant 7 tells
		}
		stale++
		i4.fail("job %d: %s was told its %s write-back under attempt %d succeeded (replayed=%v), but the history has no "+
			"such write under that attempt%s", a.JobID, a.Worker, a.Kind, a.Attempt, a.Replayed, x.historyOf(j))
	}
	i4.Summary = fmt.Sprintf("%d write-backs in the histories, each under the attempt current then; workers' logs: "+
		"%d write-backs accepted (%d of them replayed, R21) and checked against the history, %d rejected by the fence",
		writes, len(acks), replayed, staleRejections)
	return i4, stale
}

// receiptTally is what invariant 5 counts for the verdict.
type receiptTally struct {
	Unobserved int // receipts of a success with no observation on file (unobserved_late_success)
	Lost       int // observations filed on the old primary and lost in the failover
}

// checkLateSuccessesObserved is invariant 5 (R15): every provider success a
// worker saw but could not write back (a write-back rejected by the fence,
// failed, or answered after the provider-call deadline) has a
// refund_observations row with that job and reported_attempt. Listed, not
// counted: receipts that died with a SIGKILLed worker, receipts of a failed
// write-back whose filing failed too (closed by a takeover's reconcile), and
// after a failover observations filed on the old primary before the kill
// (counted as lost; a lossless failover must lose none). For the Node.js
// worker the check is weaker (its receipts' Why ends in "_node"): any
// observation on file for the attempt will do, a rejection with no filing
// line had no provider answer to keep, and one whose filing failed is an
// answer of unknown outcome; but every observation it says it filed must be
// on file.
func checkLateSuccessesObserved(receipts []receipt, observations []observationRow, fo *failoverInput,
	x *checkFacts) (i5 *invariant, t receiptTally) {
	i5 = &invariant{N: 5, Name: "every late success a stale worker saw is in the observation log (R15)"}
	observed := map[[2]int64]bool{}    // a success on file for (job, attempt)
	observedAny := map[[2]int64]bool{} // any outcome on file
	for _, o := range observations {
		k := [2]int64{o.JobID, o.ReportedAttempt}
		observedAny[k] = true
		if o.Outcome == "succeeded" {
			observed[k] = true
		}
	}
	obsKey := map[[2]int64]string{} // the operation key the observation of (job, attempt) was filed under
	for _, o := range observations {
		obsKey[[2]int64{o.JobID, o.ReportedAttempt}] = o.Key
	}
	counts := map[string]int{}
	died, unfiled, unverifiable, noAnswer, misfiled := 0, 0, 0, 0, 0
	for _, r := range receipts {
		counts[r.Why]++
		k := [2]int64{r.JobID, r.Attempt}
		node := strings.HasSuffix(r.Why, "_node")
		switch {
		case observed[k], node && observedAny[k]:
			if fo != nil && r.Key != "" && obsKey[k] != "" && obsKey[k] != r.Key {
				// The worker names the job by id; after a failover that lost
				// the job's enqueue the survivor may have given the id to
				// another refund.
				misfiled++
				i5.note("job %d attempt %d: %s's receipt for %s was filed under job id %d, which on the new primary is %s",
					r.JobID, r.Attempt, r.Worker, r.Key, r.JobID, obsKey[k])
			}
			continue
		case fo != nil && r.Filed == "filed" && fo.mayPredateKill(r.Worker, r.FiledAt):
			t.Lost++
			if fo.lossless() {
				i5.fail("LOST IN A LOSSLESS FAILOVER: job %d attempt %d: %s filed the provider's success %s before the kill; "+
					"it is not on file", r.JobID, r.Attempt, r.Worker, r.RefundID)
			} else {
				i5.note("job %d attempt %d: %s's observation (%s, %s) was filed on the old primary and lost in the failover",
					r.JobID, r.Attempt, r.Worker, r.RefundID, r.Why)
			}
			continue
		case strings.HasPrefix(r.Why, "write_failed") && completedUnder(x.events[r.JobID], r.Attempt):
			continue // the write-back had landed after all: the job holds the receipt
		case node && r.Filed == "":
			// The Node worker logs every observation it tries to file, and
			// files one whenever the provider had answered; no such line
			// means there was no answer to keep (its rejection line itself
			// does not say).
			noAnswer++
			continue
		case node && r.Filed == "filed":
			// Falls through to the failure below: the worker was told the
			// observation was filed, yet it is not on file.
		case node:
			unverifiable++
			i5.note("job %d attempt %d: %s's %s write-back carried a provider answer of unknown outcome (not in its "+
				"log) that is not on file: %s", r.JobID, r.Attempt, r.Worker, strings.TrimSuffix(r.Why, "_node"), r.Filed)
			continue
		case r.Killed:
			died++
			i5.note("receipt of job %d attempt %d (%s, %s) died with its worker (SIGKILL before filing)",
				r.JobID, r.Attempt, r.Worker, r.Why)
			continue
		case r.Why == "write_failed" && r.Filed != "filed":
			// Not a stale worker: the coordinator was unreachable for the
			// write-back and then for the observation. The receipt is only
			// in the worker's log; the job is closed by a takeover's
			// reconcile (invariant 2 says whether it was).
			unfiled++
			i5.note("receipt of job %d attempt %d (%s, %s) kept only in the worker's log: the write-back failed and %s",
				r.JobID, r.Attempt, r.Worker, r.RefundID, r.Filed)
			continue
		}
		t.Unobserved++
		i5.fail("job %d attempt %d: %s saw the provider's success %s (%s) but no observation has it: %s%s",
			r.JobID, r.Attempt, r.Worker, r.RefundID, r.Why, or(r.Filed, "no filing logged"), x.historyOf(x.jobByID[r.JobID]))
	}
	i5.Summary = fmt.Sprintf("%d provider successes not written back (%d rejected as stale, %d write-backs failed, "+
		"%d late answers); %d observations on file, %d of them successes; %d died with a killed worker, "+
		"%d unfiled after a failed write-back", counts["stale"]+counts["write_failed"]+counts["late"], counts["stale"],
		counts["write_failed"], counts["late"], len(observations), len(observed), died, unfiled)
	if fo != nil {
		i5.Summary += fmt.Sprintf("; %d filed on the old primary and lost in the failover, %d filed under a job id the "+
			"new primary gave another refund", t.Lost, misfiled)
	}
	if n := counts["stale_node"] + counts["write_failed_node"] + counts["late_node"]; n > 0 {
		i5.Summary += fmt.Sprintf("; Node.js workers: %d write-backs rejected as stale, failed or late (%d with no provider "+
			"answer to keep, %d with one of unknown outcome left unfiled; their logs do not say the outcome)", n, noAnswer, unverifiable)
	}
	return i5, t
}

// checkLedger is invariant 6 (R4, R10): exactly one refund_ledger row per
// succeeded job, with its refund id, attempt and key, none for other jobs
// and none for a job not in refund_jobs; the refund id is the provider's one
// live refund for the key, and that refund is succeeded, not pending.
// completionsLost, after a failover, are the completions the old primary
// accepted and lost with their ledger rows (placeAcks), for the summary.
func checkLedger(db dbState, o fakeprovider.OracleReport, fo *failoverInput, completionsLost int, x *checkFacts) *invariant {
	i6 := &invariant{N: 6, Name: "the ledger agrees with refund_jobs and with the provider (R4, R10)"}
	ledger := map[int64]ledgerRow{}
	for _, l := range db.Ledger {
		ledger[l.JobID] = l
		if _, ok := x.jobByID[l.JobID]; !ok {
			i6.fail("ledger row for job %d, which is not in refund_jobs", l.JobID)
		}
	}
	succeeded, reviewWithRefund := 0, 0
	for _, j := range db.Jobs {
		l, inLedger := ledger[j.ID]
		refunds := liveRefunds(o, j.Key)
		if j.State != "succeeded" {
			if inLedger {
				i6.fail("job %d (%s) is %s but has a ledger row (%s, attempt %d)%s", j.ID, j.Key, j.State,
					l.ProviderRefundID, l.Attempt, x.historyOf(j))
			}
			if j.State == "manual_review" && len(refunds) > 0 {
				reviewWithRefund++
			}
			continue
		}
		succeeded++
		switch {
		case !inLedger:
			i6.fail("job %d (%s) succeeded without a ledger row%s", j.ID, j.Key, x.historyOf(j))
			continue
		case l.ProviderRefundID != j.ProviderRefundID || l.Attempt != j.Attempt || l.Key != j.Key:
			i6.fail("job %d (%s): ledger says %s attempt %d key %s, the job %s attempt %d%s", j.ID, j.Key,
				l.ProviderRefundID, l.Attempt, l.Key, j.ProviderRefundID, j.Attempt, x.historyOf(j))
		}
		switch {
		case len(refunds) != 1:
			i6.fail("job %d (%s) succeeded with %s but the provider has %s", j.ID, j.Key, j.ProviderRefundID,
				describeRefunds(refunds))
		case refunds[0].ID != l.ProviderRefundID:
			i6.fail("job %d (%s): ledger %s, provider's refund %s", j.ID, j.Key, l.ProviderRefundID, refunds[0].ID)
		case refunds[0].Status != fakeprovider.StatusSucceeded:
			i6.fail("job %d (%s) succeeded but the provider's refund %s is %s (R4)", j.ID, j.Key, refunds[0].ID, refunds[0].Status)
		}
	}
	i6.Summary = fmt.Sprintf("%d ledger rows for %d succeeded jobs; %d manual_review jobs have a live refund at the "+
		"provider (a person resolves them)", len(db.Ledger), succeeded, reviewWithRefund)
	if fo != nil {
		i6.Summary += fmt.Sprintf("; %d completions accepted by the old primary were lost in the failover with their "+
			"ledger rows (each job completed again on the new primary, checked above)", completionsLost)
	}
	return i6
}

// grantTally is what invariant 7 counts for the verdict.
type grantTally struct {
	StaleWrites int // writes under a grant that was not the attempt's (counted in stale_writes_accepted)
	GrantsLost  int // grants the workers logged that the failover lost
}

// checkGrants is invariant 7 (R25, R26): no write accepted from a grant the
// (surviving) database never saw. In each history (walkHistory) every
// write-back carries the grant of the claim or takeover before it. From the
// workers' side, every grant a worker logged is in the job's history as the
// claim or takeover of that attempt (or, after a failover, was lost with
// the old primary: counted; a lossless failover must lose none), and every
// write-back it was told succeeded is in the history under the very grant
// it carried, which is the grant the history shows for its attempt — or was
// accepted by the old primary and lost with it (placeAcks). A write under
// the right attempt and another grant is the ABA that tokens prevent; it
// counts in stale_writes_accepted. Lines without a grant fingerprint (a
// worker that does not log it) are checked by attempt alone, counted apart.
func checkGrants(grants []grantLog, writes []ackedWrite, db dbState, fo *failoverInput, x *checkFacts) (i7 *invariant, t grantTally) {
	i7 = &invariant{N: 7, Name: "no write accepted from a grant the surviving database never saw (R25, R26)"}
	for _, w := range x.walked {
		for _, p := range w.h.grantProblems {
			t.StaleWrites++
			i7.fail("job %d (%s): %s%s", w.job.ID, w.job.Key, p, x.historyOf(w.job))
		}
	}

	// grantOf[job][attempt] is the fingerprint of the claim or takeover
	// that granted it (invariant 3 says there is one per attempt).
	grantOf := map[int64]map[int64]string{}
	for _, e := range db.Events {
		if e.Kind == "claimed" || e.Kind == "taken_over" {
			if grantOf[e.JobID] == nil {
				grantOf[e.JobID] = map[int64]string{}
			}
			grantOf[e.JobID][e.Attempt] = e.Grant
		}
	}
	weakGrants, lostListed := 0, 0
	for _, g := range grants {
		j := x.jobOf(g.Key, g.JobID)
		fp, had := grantOf[j.ID][g.Attempt]
		if g.Grant == "" {
			weakGrants++
		}
		if j.ID != 0 && had && (g.Grant == "" || fp == g.Grant) {
			continue
		}
		what := fmt.Sprintf("%s's grant %s of job %d (%s) attempt %d", g.Worker, or(g.Grant, "(no fingerprint)"), g.JobID,
			g.Key, g.Attempt)
		if fo != nil && fo.mayPredateKill(g.Worker, g.Seen) {
			t.GrantsLost++
			if fo.lossless() {
				i7.fail("LOST IN A LOSSLESS FAILOVER: %s is not in the new primary's history%s", what, x.historyOf(j))
			} else if lostListed < 10 {
				lostListed++
				i7.note("grant lost in the failover: %s (the new primary's history has %s)", what, describeGrant(fp, had))
			}
			continue
		}
		i7.fail("%s is not in the history (it has %s): the grant was not made by the database that survived%s", what,
			describeGrant(fp, had), x.historyOf(j))
	}
	if !fo.lossless() && t.GrantsLost > lostListed {
		i7.note("… and %d more grants lost in the failover", t.GrantsLost-lostListed)
	}

	weakAcks, byGrant, writesLost, writesListed := 0, 0, 0, 0
	for _, w := range writes {
		j := w.job
		what := fmt.Sprintf("%s's %s write-back of job %d (%s) under attempt %d, grant %s (replayed=%v)", w.Worker, w.Kind,
			w.JobID, w.Key, w.Attempt, or(w.Grant, "(no fingerprint)"), w.Replayed)
		switch {
		case w.inHistory && w.Grant == "":
			weakAcks++
		case w.inHistory:
			byGrant++
			if fp := grantOf[j.ID][w.Attempt]; fp != w.Grant {
				t.StaleWrites++
				i7.fail("ABA: %s was accepted, but the history's grant of attempt %d is %s: a writer that knew the "+
					"attempt without holding the grant%s", what, w.Attempt, or(fp, "(none)"), x.historyOf(j))
			}
		case fo == nil:
			// invariant 4 reports it
		case w.lost:
			writesLost++
			if fo.lossless() {
				i7.fail("LOST IN A LOSSLESS FAILOVER: %s, accepted before the kill, is not in the new primary's history%s",
					what, x.historyOf(j))
			} else if writesListed < 10 {
				writesListed++
				i7.note("write lost in the failover: %s, accepted by the old primary", what)
			}
		default:
			t.StaleWrites++
			i7.fail("%s was accepted after the failover, but the new primary's history has no such write under that "+
				"grant%s", what, x.historyOf(j))
		}
	}
	if !fo.lossless() && writesLost > writesListed {
		i7.note("… and %d more write-backs lost in the failover", writesLost-writesListed)
	}
	i7.Summary = fmt.Sprintf("%d grants logged by the workers, each in the history under its fingerprint; %d write-backs "+
		"accepted, %d of them matched to the history by grant", len(grants)-t.GrantsLost, len(writes)-writesLost, byGrant)
	if weakGrants+weakAcks > 0 {
		i7.Summary += fmt.Sprintf("; %d grants and %d write-backs by attempt alone (their log lines carry no grant)",
			weakGrants, weakAcks)
	}
	if fo != nil {
		i7.Summary += fmt.Sprintf("; failover (%s): %d grants and %d accepted write-backs lost with the old primary",
			fo.Mode, t.GrantsLost, writesLost)
	}
	return i7, t
}

// describeGrant names what a history has for an attempt's grant.
func describeGrant(fp string, had bool) string {
	switch {
	case !had:
		return "no grant of that attempt"
	case fp == "":
		return "that attempt's grant without a fingerprint"
	}
	return "that attempt under grant " + fp
}

func describeRefunds(rs []fakeprovider.Refund) string {
	if len(rs) == 0 {
		return "no live refund"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.ID + " " + string(r.Status)
	}
	return strings.Join(parts, ", ")
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func nullTime(t sql.NullTime) string {
	if !t.Valid {
		return "NULL"
	}
	return t.Time.Format("15:04:05.000")
}

// print writes the verdict, invariant by invariant, with at most maxDetails
// detail lines each.
func (v verdict) print(w io.Writer) {
	fmt.Fprintln(w, "invariants:")
	for _, i := range v.Invariants {
		status := "ok  "
		if i.Failed {
			status = "FAIL"
		}
		fmt.Fprintf(w, "  %s %d. %s\n         %s\n", status, i.N, i.Name, i.Summary)
		for n, d := range i.Details {
			if n == maxDetails {
				fmt.Fprintf(w, "         … and %d more\n", len(i.Details)-maxDetails)
				break
			}
			fmt.Fprintf(w, "         - %s\n", d)
		}
	}
}
