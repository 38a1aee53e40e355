package main

// The fence, on the histories and the workers' logs: attempts only
// increase (invariant 3), no stale write changed a job (4), the ledger
// agrees with the jobs (6), and no write came from a grant the database
// never saw (7).

import (
	"fmt"
	"slices"
	"strings"

	"github.com/jobfence/jobfence/fakeprovider"
)

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
