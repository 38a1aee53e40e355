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
	// Control is what the canceller and the pauser did (invariants 13,
	// 14 and 15); nil when neither ran: the histories and the pauses on
	// file are checked all the same.
	Control *controlInput
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
	// Invariants 13, 14 and 15: jobs with a cancel (cancelled at once or a
	// cancel request), refunds sent and grants or reschedules to refund
	// after a cancel, cancels that did not end as R32 says, the pauses on
	// file and the grants made while one stood.
	Cancels, RefundsAfterCancel, CancelsUnended, TooLate int
	Pauses, GrantsWhilePaused                            int
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

// check evaluates the fifteen invariants (docs/CHAOS.md, "The invariants")
// in order, on what the input was indexed into once: the jobs and their
// histories (checkFacts) and where each acknowledged write-back is in the
// surviving history (placeAcks). Each family of invariants has its file:
// checkpromise.go (1, 2), checkfencing.go (3, 4, 6, 7), checkreceipts.go
// (5, 8, 9), checktakeover.go (10), checknotbefore.go (11),
// checkretention.go (12) and checkcancel.go (13, 14, 15).
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
	i13, after := checkNoRefundAfterCancel(in, x)
	i14, ends := checkCancelsEnd(in, x)
	i15, pauses := checkNoGrantWhilePaused(in, x)

	return verdict{
		Invariants:             []*invariant{i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15},
		Cancels:                after.Cancelled + after.Requested,
		RefundsAfterCancel:     after.RefundsAfterCancel,
		CancelsUnended:         ends.Unended,
		TooLate:                ends.TooLate,
		Pauses:                 pauses.Pauses,
		GrantsWhilePaused:      pauses.GrantsWhilePaused,
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
	s += fmt.Sprintf(" cancels=%d cancels_too_late=%d refunds_after_cancel=%d cancels_unended=%d pauses=%d "+
		"grants_while_paused=%d", v.Cancels, v.TooLate, v.RefundsAfterCancel, v.CancelsUnended, v.Pauses,
		v.GrantsWhilePaused)
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
