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
	// SpoolsLeft are the receipts left in the slots' receipt spools when
	// the workers stopped (R28).
	SpoolsLeft []spoolLeft
	// Acks are the write-backs the workers were told succeeded.
	Acks []ack
	// Grants are the grants the workers logged.
	Grants []grantLog
	// Kinds is which worker wrote each log read (by worker id), for the
	// counts by kind in invariant 7's summary.
	Kinds map[string]workerKind
	// Failover is set when the campaign failed the database over; then
	// EnqueuesLost are the acknowledged enqueues the new primary did not
	// have (re-driven, answered created: true).
	Failover     *failoverInput
	EnqueuesLost []string
	// Webhooks: the provider was given the coordinators' webhook endpoint
	// (--webhooks), so every refund it made owes receipts (invariant 9).
	Webhooks bool
	// Releases are the grants the workers let go, CallFailures when each
	// worker's calls about the grants it held failed (renewals,
	// write-backs; by worker id), and Takeovers the workers and faults the
	// campaign ran (invariant 10; nil: not judged).
	Releases     []release
	CallFailures map[string][]time.Time
	Takeovers    *takeoverInput
	// StreamEnds are when each worker's log showed its worker stream
	// ending (by worker id): a grant on its way then was lost with it
	// (invariant 10).
	StreamEnds map[string][]time.Time
	// NotBefore is the not_before the producer enqueued each future-dated
	// refund with, by operation key (the specs say which are dated beyond
	// the campaign); Forged the events the forger sent, when it ran
	// (Forger). Invariant 11.
	NotBefore map[string]time.Time
	Forged    []forgedEvent
	Forger    bool
	// Enqueues are the answers the producer had, to its enqueues, a
	// failover's re-drives and its late re-enqueues of keys whose jobs
	// were archived or due to be; Retention the coordinators'
	// --retain-succeeded (0: the default of a week, nothing archived).
	// Invariant 12.
	Enqueues  []enqueueAnswer
	Retention time.Duration
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
	// Webhooks (invariants 8 and 9): events the provider delivered,
	// receipts with a webhook source on file, expedites in the histories,
	// receipts lost, event ids on file more than once, and after a failover
	// the receipts it legitimately lost.
	WebhooksDelivered, WebhookObservations, Expedited       int
	ReceiptsLost, DuplicateReceipts, ReceiptsLostInFailover int
	// Takeovers in the histories, and those of a live renewing worker
	// (invariant 10).
	Takeovers, FalseTakeovers int
	// HandedBack counts the coordinators' hand-backs of grants they could
	// not deliver (invariant 8).
	HandedBack int
	// Invariant 11: refunds enqueued with a not_before in the future, the
	// refunds, claims and expedites before it, the forger's events, and
	// those of them on file as a job's receipt.
	FutureDated, EarlyRefunds, ForgedWebhooks, ForgedFiled int
	// Invariant 12: jobs in the archive, late re-enqueues of archived keys
	// answered with their job, keys with a second job, jobs whose key is
	// not on file naming them.
	Archived, ArchivedReenqueues, SecondJobs, KeysUnrecorded int
	ArchivedEvents, ArchivedReceipts                         int // the archived jobs' history and receipts
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

// check evaluates the twelve invariants (docs/CHAOS.md, "The invariants") in
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
	i5, receipts := checkLateSuccessesObserved(in.Receipts, workerObservations(in.DB.Observations), in.SpoolsLeft,
		in.Failover, x)
	i6 := checkLedger(in.DB, in.Oracle, in.Failover, completionsLost, x)
	i7, grants := checkGrants(in.Grants, writes, in.DB, in.Failover, x)
	if by := countByKind(in.Kinds, in.Grants, in.Acks); by != "" {
		i7.Summary += "; logged by kind of worker (grants, write-backs accepted): " + by
	}
	i8, expedites, handedBack := checkReceiptsChangeNoState(in.DB, in.Grants, x)
	i9, hooks := checkWebhookReceipts(in, x)
	i10, takeovers := checkNoFalseTakeover(in, x)
	i11, early := checkNothingMovesMoneyEarly(in, x)
	i12, keys := checkOneJobPerKey(in, x)

	return verdict{
		Invariants:             []*invariant{i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12},
		DoubleRefunds:          doubleRefunds,
		Lost:                   jobs.Lost,
		StaleWritesAccepted:    staleAttempts + grants.StaleWrites,
		UnobservedLateSuccess:  receipts.Unobserved,
		Succeeded:              jobs.Succeeded,
		Review:                 jobs.Review,
		Pending:                jobs.Pending,
		GrantsLost:             grants.GrantsLost,
		WritesLost:             writesLost,
		EnqueuesLost:           jobs.EnqueuesLost,
		ObservationsLost:       receipts.Lost,
		lostCompletions:        completionsLost,
		WebhooksDelivered:      hooks.Delivered,
		WebhookObservations:    hooks.Observations,
		Expedited:              expedites,
		ReceiptsLost:           hooks.Lost,
		DuplicateReceipts:      hooks.Duplicates,
		ReceiptsLostInFailover: hooks.LostInFailover,
		Takeovers:              takeovers.Takeovers,
		FalseTakeovers:         takeovers.False,
		HandedBack:             handedBack,
		FutureDated:            early.FutureDated,
		EarlyRefunds:           early.Early,
		ForgedWebhooks:         early.Forged,
		ForgedFiled:            early.ForgedFiled,
		Archived:               keys.Archived,
		ArchivedReenqueues:     keys.LateArchived,
		SecondJobs:             keys.SecondJobs,
		KeysUnrecorded:         keys.KeysUnrecorded,
		ArchivedEvents:         keys.ArchivedEvents,
		ArchivedReceipts:       keys.ArchivedReceipts,
	}
}

// summaryLine is the campaign's last line: its size and the verdict's
// numbers, with the failover's losses when it ran one.
func (v verdict) summaryLine(seed uint64, jobs, faults int, failover string, enqueuesLost int) string {
	s := fmt.Sprintf("seed=%d jobs=%d faults=%d double_refunds=%d lost=%d stale_writes_accepted=%d unobserved_late_success=%d "+
		"takeovers=%d false_takeovers=%d handed_back=%d webhooks_delivered=%d webhook_observations=%d expedited=%d "+
		"webhook_receipts_lost=%d duplicate_receipts=%d", seed, jobs, faults, v.DoubleRefunds, v.Lost, v.StaleWritesAccepted,
		v.UnobservedLateSuccess, v.Takeovers, v.FalseTakeovers, v.HandedBack, v.WebhooksDelivered, v.WebhookObservations,
		v.Expedited, v.ReceiptsLost, v.DuplicateReceipts)
	s += fmt.Sprintf(" future_dated=%d early_refunds=%d forged_webhooks=%d forged_filed=%d", v.FutureDated, v.EarlyRefunds,
		v.ForgedWebhooks, v.ForgedFiled)
	s += fmt.Sprintf(" archived=%d archived_reenqueues=%d second_jobs=%d keys_unrecorded=%d", v.Archived,
		v.ArchivedReenqueues, v.SecondJobs, v.KeysUnrecorded)
	if failover != "" {
		s += fmt.Sprintf(" failover=%s grants_lost_in_failover=%d writes_lost_in_failover=%d enqueues_lost_in_failover=%d "+
			"receipts_lost_in_failover=%d", failover, v.GrantsLost, v.WritesLost, enqueuesLost, v.ReceiptsLostInFailover)
	}
	return s
}

// checkFacts is what the invariants share, indexed once: the campaign's
// refunds by key, the jobs by key and by id, each job's history, and what
// walkHistory found in it. The jobs are those of refund_jobs and of its
// archive together (R31); a key with two jobs (invariant 12 fails) is
// known by its first.
type checkFacts struct {
	specByKey map[string]refundSpec
	jobByKey  map[string]jobRow
	jobByID   map[int64]jobRow
	events    map[int64][]eventRow // by job id, each in id order
	walked    []walkedJob          // every job, in id order
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
		if _, ok := x.jobByKey[j.Key]; !ok {
			x.jobByKey[j.Key] = j
		}
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
		if j, ok := x.jobByID[id]; ok && j.Key == key {
			return j // of a key with two jobs (invariant 12), the one the line names
		}
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
	NotDue            int // dated beyond the campaign, ready, not due
	Lost              int // acknowledged and missing, or unfinished without a pending refund
	EnqueuesLost      int // acknowledged enqueues the failover lost (re-driven)
}

// checkPresentAndFinal is invariant 2, the other half of the promise:
// nothing dropped, nothing stuck. Every acknowledged enqueue has its row
// under its acknowledged id, every row is a refund the campaign enqueued,
// and every row is final (succeeded or manual_review) or legitimately
// pending: the provider still reports its refund pending (R4), counted and
// listed apart; or dated beyond the campaign, still ready under attempt 0
// and not due (invariant 11 holds it to what it was enqueued as), counted
// apart. After a failover the acknowledged enqueues it lost are
// counted (re-driven by the producer, so they are among the acknowledged
// above); a lossless (semi-sync) failover must lose none.
func checkPresentAndFinal(acked map[string]int64, db dbState, o fakeprovider.OracleReport, fo *failoverInput,
	enqueuesLost []string, x *checkFacts) (i2 *invariant, t jobTally) {
	i2 = &invariant{N: 2, Name: "every enqueued job is present and final (succeeded or manual_review), or dated beyond " +
		"the campaign and not due"}
	unacked, archived := 0, 0
	for _, j := range db.Jobs {
		if j.ArchivedAt.Valid {
			archived++
		}
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
			i2.fail("LOST: job %d (%s) was enqueued and acknowledged but is neither in refund_jobs nor in its archive", id,
				key)
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
		if x.specByKey[j.Key].Beyond && j.State == "ready" && j.Attempt == 0 && j.NextAttemptAt.After(db.Now) {
			t.NotDue++
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
	i2.Summary = fmt.Sprintf("%d acknowledged, %d rows (%d of them archived, %d enqueued without acknowledgement); %d "+
		"succeeded, %d manual_review, %d legitimately pending, %d dated beyond the campaign (ready, not due: invariant "+
		"11), %d missing, %d not final", len(acked), len(db.Jobs), archived, unacked, t.Succeeded, t.Review, t.Pending,
		t.NotDue, missing, unfinished-t.Pending)
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
			i3.fail("history of job %d, which is neither in refund_jobs nor in its archive", id)
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
// write-back whose filing failed too (closed by a takeover's reconcile; but
// not one the worker spooled, which R28 owes the observation log), receipts
// spooled and still in the slot's spool when the workers stopped (left,
// read from the spool files: durable, for the slot's next worker to file,
// R28), and after a failover observations filed on the old primary before
// the kill (counted as lost; a lossless failover must lose none). For the Node.js
// worker the check is weaker (its receipts' Why ends in "_node"): any
// observation on file for the attempt will do, a rejection with no filing
// line had no provider answer to keep, and one whose filing failed is an
// answer of unknown outcome; but every observation it says it filed must be
// on file.
func checkLateSuccessesObserved(receipts []receipt, observations []observationRow, left []spoolLeft, fo *failoverInput,
	x *checkFacts) (i5 *invariant, t receiptTally) {
	i5 = &invariant{N: 5, Name: "every late success a stale worker saw is in the observation log (R15)"}
	observed := map[[2]int64]bool{}    // a success on file for (job, attempt)
	observedAny := map[[2]int64]bool{} // any outcome on file
	// The same by operation key: after a failover that lost a job's enqueue
	// the re-driven job has another id, and a receipt the worker files
	// after the repoint lands on it.
	type keyAttempt struct {
		key     string
		attempt int64
	}
	observedKey, observedAnyKey := map[keyAttempt]bool{}, map[keyAttempt]bool{}
	for _, o := range observations {
		k, ka := [2]int64{o.JobID, o.ReportedAttempt}, keyAttempt{o.Key, o.ReportedAttempt}
		observedAny[k], observedAnyKey[ka] = true, true
		if o.Outcome == "succeeded" {
			observed[k], observedKey[ka] = true, true
		}
	}
	obsKey := map[[2]int64]string{} // the operation key the observation of (job, attempt) was filed under
	for _, o := range observations {
		obsKey[[2]int64{o.JobID, o.ReportedAttempt}] = o.Key
	}
	// spooledNow finds r in what the spools hold: the same job (by key
	// where both name it) and attempt, a success (any outcome for a receipt
	// of unknown outcome).
	spooledNow := func(r receipt, node bool) (spoolLeft, bool) {
		for _, l := range left {
			if l.Attempt == r.Attempt && ((r.Key != "" && l.Key == r.Key) || (r.Key == "" && l.JobID == r.JobID)) &&
				(node || l.Outcome == "succeeded") {
				return l, true
			}
		}
		return spoolLeft{}, false
	}
	counts := map[string]int{}
	died, unfiled, unverifiable, noAnswer, misfiled, refiled, inSpool := 0, 0, 0, 0, 0, 0, 0
	for _, r := range receipts {
		counts[r.Why]++
		k := [2]int64{r.JobID, r.Attempt}
		node := strings.HasSuffix(r.Why, "_node")
		spooled := strings.HasPrefix(r.Filed, "spooled: ")
		l, inSpoolNow := spooledNow(r, node)
		ka := keyAttempt{r.Key, r.Attempt}
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
		case fo != nil && r.Key != "" && (observedKey[ka] || node && observedAnyKey[ka]):
			// On file under the key's job, which the new primary made again
			// under another id when the failover lost its enqueue.
			refiled++
			continue
		case fo != nil && r.filed() && fo.mayPredateKill(r.Worker, r.FiledAt):
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
		case spooled && inSpoolNow:
			// Durable (R28): the spool file still holds it.
			inSpool++
			i5.note("receipt of job %d attempt %d (%s, %s, %s) not on file but in %s when the workers stopped, for the "+
				"slot's next worker to file (R28); %s", r.JobID, r.Attempt, r.Worker, l.RefundID, r.Why, l.Spool, r.Filed)
			continue
		case node && r.Filed == "":
			// The Node worker logs every observation it tries to file, and
			// files one whenever the provider had answered; no such line
			// means there was no answer to keep (its rejection line itself
			// does not say).
			noAnswer++
			continue
		case node && r.filed():
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
		case r.Why == "write_failed" && !r.filed() && !spooled:
			// Not a stale worker: the coordinator was unreachable for the
			// write-back and then for the observation. The receipt is only
			// in the worker's log; the job is closed by a takeover's
			// reconcile (invariant 2 says whether it was). One the worker
			// spooled is owed to the observation log all the same (R28):
			// the slot's next filing pass, by this process or the one
			// replacing it, files it, or it is still in the spool (above).
			unfiled++
			i5.note("receipt of job %d attempt %d (%s, %s) kept only in the worker's log: the write-back failed and %s",
				r.JobID, r.Attempt, r.Worker, r.RefundID, or(r.Filed, "no filing logged"))
			continue
		}
		if spooled {
			r.Filed += ", neither filed from the spool nor left in it (R28)"
		}
		t.Unobserved++
		i5.fail("job %d attempt %d: %s saw the provider's success %s (%s) but no observation has it: %s%s",
			r.JobID, r.Attempt, r.Worker, r.RefundID, r.Why, or(r.Filed, "no filing logged"), x.historyOf(x.jobByID[r.JobID]))
	}
	i5.Summary = fmt.Sprintf("%d provider successes not written back (%d rejected as stale, %d write-backs failed, "+
		"%d late answers); %d observations on file, %d of them successes; %d died with a killed worker, "+
		"%d unfiled after a failed write-back", counts["stale"]+counts["write_failed"]+counts["late"], counts["stale"],
		counts["write_failed"], counts["late"], len(observations), len(observed), died, unfiled)
	if inSpool > 0 || len(left) > 0 {
		i5.Summary += fmt.Sprintf("; %d receipts left in the slots' receipt spools when the workers stopped (%d of them "+
			"receipts above, not on file), for their next workers to file (R28)", len(left), inSpool)
	}
	if fo != nil {
		i5.Summary += fmt.Sprintf("; %d filed on the old primary and lost in the failover, %d filed under a job id the "+
			"new primary gave another refund, %d on file under the id the new primary gave their refund's re-driven "+
			"enqueue", t.Lost, misfiled, refiled)
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
			i6.fail("ledger row for job %d, which is neither in refund_jobs nor in its archive", l.JobID)
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

// webhookSourcePrefix starts the source of every receipt a webhook filed
// ("webhook:<provider>"); a worker's is "worker:<id>".
const webhookSourcePrefix = "webhook:"

// workerObservations are the receipts workers filed (invariant 5 is about
// theirs; a webhook's receipt names no attempt).
func workerObservations(obs []observationRow) []observationRow {
	var out []observationRow
	for _, o := range obs {
		if !strings.HasPrefix(o.Source, webhookSourcePrefix) {
			out = append(out, o)
		}
	}
	return out
}

// checkReceiptsChangeNoState is invariant 8 (R15, R28, R29): evidence moves
// work, never state. In each history (walkHistory) every expedite took a
// ready job to ready, due to reconcile, under the attempt of the event
// before it and holding no grant; a resolution holds no grant; a
// coordinator's hand-back of a grant it could not deliver is a fenced
// write like the holder's own, under the grant's attempt and token, in the
// holder's name, making the job ready with the grant's next action; and,
// where the history keeps grants (R25), every claim and takeover minted
// one. With invariant 3 (no kind of event but these) and invariant 7 (every
// holder's write-back under the grant of its attempt), every change of a
// job is a claim, a takeover, its holder's fenced write (or the
// coordinator's hand-back in its name) or a person's resolution. expedites
// counts the expedited events (the summary's expedited), handedBack the
// hand-backs (handed_back); those of a grant its holder logged are listed:
// gRPC cannot rule out that a grant it handed to the transport just before
// a cut reached the worker, whose token the hand-back ended (R25).
func checkReceiptsChangeNoState(db dbState, grants []grantLog, x *checkFacts) (i8 *invariant, expedites, handedBack int) {
	i8 = &invariant{N: 8, Name: "no receipt changed a job: only claims, takeovers, holders' fenced write-backs (or the " +
		"coordinators' hand-backs of grants they could not deliver) and people's resolutions did; an expedite only made a " +
		"ready job due (R15, R28, R29)"}
	claims, takeovers, writes, resolutions, byWebhook, seen := 0, 0, 0, 0, 0, 0
	for _, w := range x.walked {
		claims += w.h.claims
		takeovers += w.h.takeovers
		writes += w.h.writes
		resolutions += w.h.resolutions
		expedites += w.h.expedites
		byWebhook += w.h.webhookExpedites
		handedBack += len(w.h.handBacks)
		for _, p := range w.h.evidenceProblems {
			i8.fail("job %d (%s): %s%s", w.job.ID, w.job.Key, p, x.historyOf(w.job))
		}
		for _, e := range w.h.handBacks {
			if g := slices.IndexFunc(grants, func(g grantLog) bool {
				return g.Worker == e.WorkerID && g.Attempt == e.Attempt && x.jobOf(g.Key, g.JobID).ID == w.job.ID
			}); g >= 0 {
				seen++
				i8.note("job %d (%s): hand-back %d (%q) of attempt %d, a grant %s had logged at %s: it may have reached "+
					"the worker before the cut; the hand-back ended its token (R25)", w.job.ID, w.job.Key, e.ID, e.Reason,
					e.Attempt, e.WorkerID, grants[g].Seen.Format("15:04:05.000"))
			}
		}
	}
	if db.Tokens {
		for _, e := range db.Events {
			if (e.Kind == "claimed" || e.Kind == "taken_over") && e.Grant == "" {
				j := x.jobByID[e.JobID]
				i8.fail("job %d (%s): %s event %d under attempt %d by %s minted no grant: a job running without a "+
					"lease token could be written by anyone who knows the attempt (R25)%s", e.JobID, j.Key, e.Kind, e.ID,
					e.Attempt, e.WorkerID, x.historyOf(j))
			}
		}
	}
	i8.Summary = fmt.Sprintf("%d expedites (%d by webhooks' receipts, %d by workers'), each ready → ready under the "+
		"attempt before it, with no grant; changes of jobs: %d claims and %d takeovers", expedites, byWebhook,
		expedites-byWebhook, claims, takeovers)
	if db.Tokens {
		i8.Summary += " each minting a grant"
	}
	i8.Summary += fmt.Sprintf(", %d holders' write-backs under their grants (invariant 7; %d of them the coordinators' "+
		"hand-backs of grants they could not deliver, %d of grants their holder had logged), %d resolutions", writes,
		handedBack, seen, resolutions)
	return i8, expedites, handedBack
}

// webhookTally is what invariant 9 counts for the verdict.
type webhookTally struct {
	Delivered    int // events the provider delivered at least once (webhooks_delivered)
	Observations int // receipts with a webhook source on file (webhook_observations)
	// Lost are events owed a receipt that has none: never delivered, given
	// up, kept in the unmatched log although their job exists, or answered
	// 2xx and not on file (webhook_receipts_lost).
	Lost int
	// Duplicates are provider event ids on file more than once
	// (duplicate_receipts).
	Duplicates int
	// LostInFailover are receipts an async failover legitimately lost:
	// stored by the old primary only, or unmatched for an enqueue it lost.
	LostInFailover int
}

// receiptEventID is the provider_event_id the coordinator files event e
// under: its id, and for charge.refunded (which lists every refund of the
// charge) ':' and the refund it reports.
func receiptEventID(e fakeprovider.WebhookEvent) string {
	if e.Type == fakeprovider.EventChargeRefunded {
		return e.ID + ":" + e.RefundID
	}
	return e.ID
}

// checkWebhookReceipts is invariant 9 (R15, R28), against the provider's
// own record of its webhooks (the oracle): no receipt lost, none twice.
// Every refund the provider made has a receipt with source
// webhook:<provider> in refund_observations — unless every event of it was
// dropped by a webhook-drop fault, the one thing that may keep a receipt
// from the coordinators (counted and left out). Event by event: every event
// not dropped was delivered, and is on file once under its event id, on the
// job of its operation key, with its refund id and outcome; never in the
// unmatched log, since its job exists; no delivery attempt the provider
// spoiled on purpose (a wrong secret, a stale timestamp) was answered 2xx;
// no provider event id is on file twice, whatever the redeliveries and
// duplicates; and no webhook receipt names an event the provider never
// sent. After an async failover, a delivered event is lost with the old
// primary when every 2xx answer it got was to an attempt sent before the
// proxies pointed at the new primary, and an event of an enqueue the
// failover lost may have reached the new primary before the re-drive, which
// keeps it unmatched: counted, not failed; a lossless failover loses none.
func checkWebhookReceipts(in checkInput, x *checkFacts) (i9 *invariant, t webhookTally) {
	i9 = &invariant{N: 9, Name: "every refund the provider made has its webhook receipts in the observation log, one per " +
		"event, and no spoiled delivery was taken (R15, R28)"}
	source := webhookSourcePrefix + providerName
	// The forger's events are not the provider's: invariant 11 judges them.
	forged := forgedIDs(in.Forged)
	byEventID := map[string][]observationRow{}
	var eventIDs []string
	for _, o := range in.DB.Observations {
		if strings.HasPrefix(o.Source, webhookSourcePrefix) && !forged[o.ProviderEventID] {
			t.Observations++
			if o.Source != source || o.ProviderEventID == "" {
				i9.fail("observation %d of job %d has source %q and provider_event_id %q: a webhook's receipt is filed "+
					"under %s with the provider's event id", o.ID, o.JobID, o.Source, o.ProviderEventID, source)
			}
		}
		if o.ProviderEventID != "" {
			if byEventID[o.ProviderEventID] == nil {
				eventIDs = append(eventIDs, o.ProviderEventID)
			}
			byEventID[o.ProviderEventID] = append(byEventID[o.ProviderEventID], o)
		}
	}
	for _, id := range eventIDs {
		if obs := byEventID[id]; len(obs) > 1 {
			t.Duplicates++
			var desc []string
			for _, o := range obs {
				desc = append(desc, fmt.Sprintf("observation %d of job %d (%s)", o.ID, o.JobID, o.Key))
			}
			i9.fail("DUPLICATE RECEIPT: provider event %s is on file %d times: %s; a redelivery is the receipt on file (R28)",
				id, len(obs), strings.Join(desc, ", "))
		}
	}
	wh := in.Oracle.Webhooks
	if !in.Webhooks {
		i9.Summary = fmt.Sprintf("webhooks off (--webhooks=false): no receipt owed; %d receipts on file name a provider "+
			"event, none twice", len(eventIDs)-t.Duplicates)
		return i9, t
	}
	if !wh.Enabled {
		i9.fail("the provider sent no webhooks (its oracle says they are off) although the campaign gave it the coordinators' " +
			"endpoint: no receipt was put to the test")
	}

	unmatched := map[string]unmatchedRow{}
	for _, u := range in.DB.Unmatched {
		unmatched[u.ProviderEventID] = u
	}
	sent := map[string]bool{} // every event id the provider made, and every receipt id of them
	for _, e := range wh.Events {
		sent[e.ID], sent[receiptEventID(e)] = true, true
	}
	enqueueLost := map[string]bool{}
	for _, k := range in.EnqueuesLost {
		enqueueLost[k] = true
	}
	fo := in.Failover
	lossy := fo != nil && !fo.lossless()

	received := map[string]bool{} // by refund id: a receipt of one of its events is on file, or excused
	dropped, deliveries, duplicated, spoiled := 0, 0, 0, 0
	spoiledBy := map[string]int{} // by fault: bad_signature, old_timestamp
	for _, e := range wh.Events {
		j := x.jobByKey[e.OperationKey]
		what := fmt.Sprintf("event %s (%s of refund %s, %s, key %s, job %d)", e.ID, e.Type, e.RefundID, e.Status,
			e.OperationKey, j.ID)
		var okAt []time.Time // when the attempts answered 2xx were sent
		for _, a := range e.Attempts {
			ok := a.Status >= 200 && a.Status < 300
			if ok {
				okAt = append(okAt, a.At)
			}
			if a.Fault == "" {
				continue
			}
			spoiled++
			for _, f := range strings.Split(a.Fault, ",") {
				spoiledBy[strings.TrimPrefix(f, "webhook_")]++
			}
			if ok {
				i9.fail("SPOILED DELIVERY TAKEN: %s: the attempt sent at %s under %s was answered %d; a delivery that "+
					"fails verification must be refused before anything is stored (R28)", what, a.At.Format("15:04:05.000"),
					a.Fault, a.Status)
			}
		}
		if e.Dropped {
			dropped++
			continue
		}
		deliveries += e.Deliveries
		if e.Deliveries > 1 {
			duplicated++
		}
		if e.Delivered {
			t.Delivered++
		}
		id := receiptEventID(e)
		if obs := byEventID[id]; len(obs) > 0 {
			received[e.RefundID] = true
			o := obs[0]
			if o.Source != source || o.ProviderRefundID != e.RefundID || o.Key != e.OperationKey ||
				o.Outcome != string(e.Status) {
				i9.fail("MISFILED: %s is on file as observation %d of job %d (%s) from %s, refund %s, outcome %s%s", what,
					o.ID, o.JobID, o.Key, o.Source, o.ProviderRefundID, o.Outcome, x.historyOf(j))
			}
			continue
		}
		u, isUnmatched := unmatched[id]
		switch {
		case isUnmatched && lossy && enqueueLost[e.OperationKey]:
			t.LostInFailover++
			received[e.RefundID] = true
			i9.note("%s reached the new primary before the re-drive of its enqueue, lost in the failover: kept in the "+
				"unmatched log (%d)", what, u.ID)
		case isUnmatched:
			t.Lost++
			i9.fail("RECEIPT LOST: %s is in the unmatched log (%d, key %q, refund %q), not on its job%s", what, u.ID, u.Key,
				u.ProviderRefundID, x.historyOf(j))
		case !e.Delivered:
			t.Lost++
			last := "none"
			if n := len(e.Attempts); n > 0 {
				a := e.Attempts[n-1]
				last = fmt.Sprintf("%d %s", a.Status, a.Error)
			}
			i9.fail("RECEIPT LOST: %s was never delivered: %d attempts (gave up: %v), the last answered %s", what,
				len(e.Attempts), e.GaveUp, strings.TrimSpace(last))
		case lossy && len(okAt) > 0 && !slices.ContainsFunc(okAt, func(at time.Time) bool { return !at.Before(fo.Repointed) }):
			t.LostInFailover++
			received[e.RefundID] = true
			i9.note("%s was stored by the old primary only (answered 2xx to attempts sent before the repoint): lost in the "+
				"failover", what)
		default:
			t.Lost++
			i9.fail("RECEIPT LOST: %s was answered 2xx %d times (first sent at %s) but no observation has provider event "+
				"id %s%s", what, e.Deliveries, okAt[0].Format("15:04:05.000"), id, x.historyOf(j))
		}
	}
	for id := range byEventID {
		evt, _, _ := strings.Cut(id, ":")
		if strings.HasPrefix(byEventID[id][0].Source, webhookSourcePrefix) && !sent[id] && !sent[evt] && !forged[id] {
			i9.fail("observation %d of job %d names provider event %s, which the provider never sent", byEventID[id][0].ID,
				byEventID[id][0].JobID, id)
		}
	}
	forgedKept := 0
	for _, u := range in.DB.Unmatched {
		if forged[u.ProviderEventID] {
			forgedKept++
			continue
		}
		if evt, _, _ := strings.Cut(u.ProviderEventID, ":"); !sent[u.ProviderEventID] && !sent[evt] {
			i9.fail("unmatched event %d names provider event %s (%s, key %q), which the provider never sent", u.ID,
				u.ProviderEventID, u.EventType, u.Key)
		}
	}

	allDropped := 0
	for _, r := range in.Oracle.Refunds {
		evs := wh.ForRefund(r.ID)
		j := x.jobByKey[r.MerchantReference]
		switch {
		case len(evs) > 0 && !slices.ContainsFunc(evs, func(e fakeprovider.WebhookEvent) bool { return !e.Dropped }):
			// webhook-drop: the provider never sent a receipt of it; the
			// job was closed by its workers' reconcile alone.
			allDropped++
		case received[r.ID]:
		case len(evs) == 0:
			i9.fail("NO RECEIPT: refund %s (%s, key %s, job %d): the provider made no webhook event of it", r.ID, r.Status,
				r.MerchantReference, j.ID)
		default:
			var ids []string
			for _, e := range evs {
				ids = append(ids, e.ID+" "+e.Type)
			}
			i9.fail("NO RECEIPT: refund %s (%s, key %s, job %d) has no receipt from %s in refund_observations; its events: %s",
				r.ID, r.Status, r.MerchantReference, j.ID, source, strings.Join(ids, ", "))
		}
	}
	i9.Summary = fmt.Sprintf("%d refunds at the provider, each with a receipt from %s on file (%d left out: every event "+
		"dropped); %d events (%d dropped), %d delivered in %d answers 2xx (%d more than once); %d attempts spoiled on purpose "+
		"(%s), none taken; %d receipts on file with a webhook source, %d provider event ids on file more than once; %d "+
		"events in the unmatched log (and %d forged ones, invariant 11)", len(in.Oracle.Refunds)-allDropped, source,
		allDropped, len(wh.Events), dropped, t.Delivered, deliveries, duplicated, spoiled, formatCounts(spoiledBy),
		t.Observations, t.Duplicates, len(in.DB.Unmatched)-forgedKept, forgedKept)
	if fo != nil {
		i9.Summary += fmt.Sprintf("; failover (%s): %d receipts lost with the old primary or kept unmatched for an enqueue it "+
			"lost", fo.Mode, t.LostInFailover)
	}
	return i9, t
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

// formatCounts prints a count map as "a=1 b=2", in key order.
func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
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

// takeoverInput is what invariant 10 knows besides the histories and the
// workers' logs: who each worker was, and when the campaign's faults could
// keep a worker's lease renewals from the database.
type takeoverInput struct {
	Lease time.Duration
	// Start is the campaign's start: details give times as the timeline does.
	Start   time.Time
	Workers map[string]workerFacts // by worker id
	Outages []outage
}

// workerFacts is one worker process as invariant 10 sees it.
type workerFacts struct {
	Kind    workerKind
	Renews  bool // it renews its leases while a job's provider calls run (R27)
	Patient bool // its provider-call deadline outlasts the provider-slow calls
	Replica string
	Frozen  []span
	// Ended is when the campaign sent it SIGKILL or SIGTERM, or it exited;
	// zero when it ran to the end.
	Ended time.Time
}

// outage is a fault that may keep workers' renewals from the database: a
// coordinator down (from its kill until a new process serves, whether the
// fault or the heal restarted it), a fault on one replica's database
// connections, a database failover.
type outage struct {
	What    string
	N       int    // the fault's number; 0 for a coordinator down
	Replica string // the replica whose workers it hit; "" for every replica
	From    time.Time
	To      time.Time // zero: until the end
}

// takeoverSlackStart is how much earlier than the earliest time a fault
// could cost a lease a takeover may be and still be its effect: the clocks
// of the history and of the campaign are matched to a few milliseconds.
const takeoverSlackStart = 50 * time.Millisecond

// takeoverTally is what invariant 10 counts for the verdict.
type takeoverTally struct {
	Takeovers int // taken_over events in the histories (takeovers)
	False     int // takeovers of a live renewing worker (false_takeovers)
}

// impairment is a stretch of time in which a worker's renewals could not
// reach the database (To zero: until the end), and what caused it.
type impairment struct {
	From, To time.Time
	Why      string
}

// Kinds of outage for impairmentsOf: a stall holds renewals until it ends
// (they may then succeed late, logging nothing); a fast failure fails them
// at once, and the worker logs each failed renewal or write-back (a commit
// cut is neither: it cuts at most four COMMITs, and a renewal it fails is
// repeated at once). A stream cut is a fast failure: the renewal in flight
// is answered UNAVAILABLE and repeated, and so is every renewal while the
// worker cannot connect again (R27).
var (
	stallOutages    = map[string]bool{string(faultDBLatency): true, string(faultDBBlackhole): true, string(faultDBFailover): true}
	fastFailOutages = map[string]bool{"coordinator down": true, string(faultDBDown): true, string(faultDBReset): true,
		string(faultCoordinatorStreamCut): true}
)

// streamEndSlack is how long after a grant was made its holder's log may
// show its worker stream ending and the grant still have been on its way
// (lost with the stream): the coordinator sends a grant the moment it
// commits, so the stream ended before it could arrive.
const streamEndSlack = time.Second

// impairmentsOf lists what kept a worker's renewals from the database, in
// order of start: every freeze, its end (a kill or the stop) on, a stall of
// its replica's database or of every replica's (a failover), and a fast
// failure of its coordinator, of its connections to it (a stream cut) or of
// its replica's database while its log shows a renewal or a write-back
// failing (a holder that tried nothing during the outage lost nothing to
// it). Each lasts, beyond its end, for as long as the log shows such calls
// failing within a lease of it (failures, its failed calls, sorted).
func impairmentsOf(wf workerFacts, outages []outage, failures []time.Time, lease time.Duration) []impairment {
	var out []impairment
	for _, sp := range wf.Frozen {
		out = append(out, impairment{From: sp.From, To: sp.To, Why: "frozen"})
	}
	if !wf.Ended.IsZero() {
		out = append(out, impairment{From: wf.Ended, Why: "killed-or-stopped"})
	}
	for _, o := range outages {
		if o.Replica != "" && o.Replica != wf.Replica {
			continue
		}
		why := "database-fault"
		switch {
		case o.What == "coordinator down":
			why = "coordinator-down"
		case o.What == string(faultCoordinatorStreamCut):
			why = "stream-cut"
		case o.Replica == "":
			why = "failover"
		}
		switch {
		case stallOutages[o.What]:
		case fastFailOutages[o.What]:
			if !slices.ContainsFunc(failures, func(f time.Time) bool {
				return !f.Before(o.From) && (o.To.IsZero() || !f.After(o.To.Add(lease)))
			}) {
				continue
			}
		default:
			continue
		}
		out = append(out, impairment{From: o.From, To: o.To, Why: why})
	}
	for i := range out {
		if out[i].To.IsZero() {
			continue
		}
		for _, f := range failures {
			if f.After(out[i].To) && !f.After(out[i].To.Add(lease)) {
				out[i].To = f
			}
		}
	}
	slices.SortFunc(out, func(a, b impairment) int { return a.From.Compare(b.From) })
	return out
}

// checkNoFalseTakeover is invariant 10 (R8, R27): a worker that renews its
// leases is never taken over while it lives. It renews at a third of the
// lease (±10 %), so after its last renewal its lease has two thirds of a
// lease to run: a fault can cost it the lease only when it began at least a
// third of a lease before the takeover (with room for a slow renewal) and
// held the worker's renewals until a lease before it or later (the room a
// renewal needs after a fault: a gRPC reconnect, the client's backoff, a
// pool refilling). So every taken_over event of a grant (the claim or
// takeover of the attempt before) whose holder renews must fall in such a
// window of an impairment of the holder (impairmentsOf): frozen, killed or
// stopped, its replica's database stalled (db-latency, db-blackhole) or
// failing over, or its coordinator down, its connections to it cut
// (coordinator-stream-cut: R27's renewals failing while it reconnects) or
// its replica's database refusing (db-down, db-reset) while its log shows
// renewals or write-backs failing. Or the takeover came after the holder
// let the grant go (its log shows the write-back's outcome, a late answer
// or the grant lost, before the takeover), or took a grant its holder
// never learnt of: a claim whose COMMIT's reply was lost grants nothing
// (R7), and a grant the coordinator had written to a worker stream that
// ended before it arrived (a cut, a dying coordinator: the holder's log
// shows its stream ending as the grant was made) is as lost, the
// coordinator handing back only what it could not write; its lease runs
// out into a takeover (R6). Anything else is a false takeover: a live
// holder lost its job to the clock. Takeovers of workers that do not renew
// are counted, not judged (R17 keeps their provider calls inside the lease
// instead).
func checkNoFalseTakeover(in checkInput, x *checkFacts) (i10 *invariant, t takeoverTally) {
	i10 = &invariant{N: 10, Name: "no live worker that renews its leases was taken over: each takeover of a renewing " +
		"worker's grant came while a fault held it from renewing (R8, R27)"}
	for _, w := range x.walked {
		t.Takeovers += w.h.takeovers
	}
	ti := in.Takeovers
	if ti == nil {
		i10.Summary = fmt.Sprintf("%d takeovers; not judged: the campaign's workers and faults are not known", t.Takeovers)
		return i10, t
	}
	offset := time.Duration(0)
	if !in.DB.ReadAt.IsZero() && !in.DB.Now.IsZero() {
		offset = in.DB.ReadAt.Sub(in.DB.Now)
	}
	at := func(tm time.Time) string {
		if ti.Start.IsZero() {
			return tm.Format("15:04:05.000")
		}
		return fmt.Sprintf("+%.3fs", tm.Sub(ti.Start).Seconds())
	}
	failures := map[string][]time.Time{}
	for w, fs := range in.CallFailures {
		failures[w] = slices.SortedFunc(slices.Values(fs), func(a, b time.Time) int { return a.Compare(b) })
	}
	impaired := map[string][]impairment{}
	for w, wf := range ti.Workers {
		impaired[w] = impairmentsOf(wf, ti.Outages, failures[w], ti.Lease)
	}
	ofGrant := func(key string, id int64, attempt int64, j jobRow) bool {
		return attempt != 0 && ((key != "" && key == j.Key) || (key == "" && id == j.ID))
	}

	excused := map[string]int{}
	notRenewing := map[string]int{}
	unknown := 0
	for _, wj := range x.walked {
		j := wj.job
		evs := x.events[j.ID]
		for n, e := range evs {
			if e.Kind != "taken_over" {
				continue
			}
			var prev *eventRow
			for k := n - 1; k >= 0; k-- {
				if (evs[k].Kind == "claimed" || evs[k].Kind == "taken_over") && evs[k].Attempt == e.Attempt-1 {
					prev = &evs[k]
					break
				}
			}
			if prev == nil {
				continue // invariant 3 tells
			}
			holder := prev.WorkerID
			wf, ok := ti.Workers[holder]
			switch {
			case !ok:
				unknown++
				continue
			case !wf.Renews:
				notRenewing[kindOf(wf)]++
				continue
			}
			tm := e.At.Add(offset)
			why := ""
			var near []string // the holder's impairments in the two leases before, for the details
			for _, m := range impaired[holder] {
				if why == "" && !tm.Before(m.From.Add(ti.Lease/3-takeoverSlackStart)) &&
					(m.To.IsZero() || !tm.After(m.To.Add(ti.Lease))) {
					why = m.Why
				}
				if !m.From.After(tm) && (m.To.IsZero() || m.To.After(tm.Add(-2*ti.Lease))) {
					near = append(near, fmt.Sprintf("%s from %s to %s", m.Why, at(m.From), or(optAt(m.To, at), "the end")))
				}
			}
			var faults []string // the faults on the holder's path in the two leases before, for the details
			for _, o := range ti.Outages {
				if (o.Replica == "" || o.Replica == wf.Replica) && !o.From.After(tm) &&
					(o.To.IsZero() || o.To.After(tm.Add(-2*ti.Lease))) {
					desc := o.What
					if o.N > 0 {
						desc = fmt.Sprintf("%s #%d", o.What, o.N)
					}
					if o.Replica != "" {
						desc += " on " + o.Replica
					}
					faults = append(faults, fmt.Sprintf("%s from %s to %s", desc, at(o.From), or(optAt(o.To, at), "the end")))
				}
			}
			var after string // what the holder did with the grant after the takeover, for the details
			if why == "" {
				for _, r := range in.Releases {
					if r.Worker != holder || r.Attempt != prev.Attempt || !ofGrant(r.Key, r.JobID, r.Attempt, j) {
						continue
					}
					if r.Seen.Before(tm) {
						why = "let-go"
						break
					}
					if after == "" {
						after = fmt.Sprintf("; at %s %s", at(r.Seen), r.Why)
					}
				}
			}
			if why == "" && !slices.ContainsFunc(in.Grants, func(g grantLog) bool {
				return g.Worker == holder && g.Attempt == prev.Attempt && ofGrant(g.Key, g.JobID, g.Attempt, j)
			}) {
				// Nobody renews what nobody knows it holds (R7); one lost
				// with its stream waited for its lease like a lost Claim
				// answer (R6).
				why = "grant-unknown-R7"
				made := prev.At.Add(offset)
				if slices.ContainsFunc(in.StreamEnds[holder], func(e time.Time) bool {
					return !e.Before(made.Add(-takeoverSlackStart)) && !e.After(made.Add(streamEndSlack))
				}) {
					why = "grant-lost-with-stream-R6"
				}
			}
			if why != "" {
				excused[why]++
				continue
			}
			t.False++
			kind := kindOf(wf)
			if wf.Patient {
				kind += ", patient"
			}
			recent := 0
			for _, f := range failures[holder] {
				if !f.After(tm) && f.After(tm.Add(-ti.Lease)) {
					recent++
				}
			}
			i10.fail("FALSE TAKEOVER: job %d (%s): event %d, %s took attempt %d over at %s from %s (%s, renewing, on %s), "+
				"whose grant (event %d at %s) nothing the campaign did could have cost: nothing held it from renewing that began "+
				"by %s (a third of a lease before) and lasted to %s (a lease before); what held it in the two leases before: %s; "+
				"faults on its path then: %s; failed renewals or write-backs in its log in the lease before: %d%s%s", j.ID, j.Key, e.ID,
				or(e.WorkerID, "(no worker)"), e.Attempt, at(tm), holder, kind, wf.Replica, prev.ID, at(prev.At.Add(offset)),
				at(tm.Add(-ti.Lease/3)), at(tm.Add(-ti.Lease)), orNone(near), orNone(faults), recent, after, x.historyOf(j))
		}
	}
	judged := 0
	for _, n := range excused {
		judged += n
	}
	judged += t.False
	i10.Summary = fmt.Sprintf("%d takeovers; %d of a renewing worker's grant: %d while a fault held the holder or after it "+
		"let the grant go (%s), %d false; %d of workers that do not renew, not judged (%s); %d of holders the campaign did "+
		"not run", t.Takeovers, judged, judged-t.False, formatCounts(excused), t.False, countOf(notRenewing),
		formatCounts(notRenewing), unknown)
	if n, longest := heldPastLease(in, ti); n > 0 {
		i10.Summary += fmt.Sprintf("; %d grants of renewing workers held past their lease, unfrozen, and written back "+
			"with no takeover (the longest %s)", n, longest.Round(100*time.Millisecond))
	}
	return i10, t
}

// heldPastLease counts the grants of renewing workers held longer than a
// lease, never frozen, whose write-back was accepted: what renewal kept
// from a takeover (R27), or, fewer, a lapsed lease nobody claimed in time;
// and the longest of them.
func heldPastLease(in checkInput, ti *takeoverInput) (n int, longest time.Duration) {
	type ref struct {
		worker, key  string
		job, attempt int64
	}
	granted := map[ref]time.Time{}
	for _, g := range in.Grants {
		if ti.Workers[g.Worker].Renews && !g.Seen.IsZero() {
			granted[ref{g.Worker, g.Key, g.JobID, g.Attempt}] = g.Seen
		}
	}
	for _, r := range in.Releases {
		from, ok := granted[ref{r.Worker, r.Key, r.JobID, r.Attempt}]
		if !ok || !strings.HasSuffix(r.Why, "was accepted") {
			continue
		}
		frozen := slices.ContainsFunc(ti.Workers[r.Worker].Frozen, func(sp span) bool {
			return sp.From.Before(r.Seen) && (sp.To.IsZero() || sp.To.After(from))
		})
		if d := r.Seen.Sub(from); d > ti.Lease && !frozen {
			n++
			longest = max(longest, d)
		}
	}
	return n, longest
}

// countByKind counts the grants logged and the write-backs accepted by
// each kind of worker that wrote a log, e.g. "Go 250, 240; Python 48, 44":
// evidence that every kind the campaign ran did its share. "" when no log
// was read.
func countByKind(kinds map[string]workerKind, grants []grantLog, acks []ack) string {
	if len(kinds) == 0 {
		return ""
	}
	type tally struct{ grants, writes int }
	n := map[workerKind]*tally{}
	for _, k := range kinds {
		n[k] = &tally{}
	}
	for _, g := range grants {
		if t, ok := n[kinds[g.Worker]]; ok {
			t.grants++
		}
	}
	for _, a := range acks {
		if t, ok := n[kinds[a.Worker]]; ok {
			t.writes++
		}
	}
	var parts []string
	for _, k := range []workerKind{goWorker, nodeWorker, pythonWorker} {
		if t := n[k]; t != nil {
			parts = append(parts, fmt.Sprintf("%s %d, %d", k, t.grants, t.writes))
		}
	}
	return strings.Join(parts, "; ")
}

// kindOf names a worker's kind for the details.
func kindOf(w workerFacts) string { return w.Kind.String() }

// optAt formats t with format, or "" for the zero time.
func optAt(t time.Time, format func(time.Time) string) string {
	if t.IsZero() {
		return ""
	}
	return format(t)
}

// countOf sums a count map.
func countOf(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
