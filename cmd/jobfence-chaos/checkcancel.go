package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// Cancels and pauses (R32, R33, R34): invariants 13, 14 and 15.

// controlInput is what the canceller and the pauser did.
type controlInput struct {
	// Canceller and Pauser: they ran (--cancel-share above 0, --pauses).
	Canceller, Pauser bool
	Cancels           []cancelAnswer
	Pauses            []pauseAnswer
	// ClaimPoll is the coordinators' --claim-poll-interval: every replica
	// reads the paused providers that often (R33). Lease is the workers'.
	ClaimPoll, Lease time.Duration
}

// Clocks and margins of the checks of cancels and pauses. The history's
// times are the database's clock, brought to the campaign's (the clock of
// the provider's oracle, of the workers' freezes and of the faults) by
// DB.ReadAt - DB.Now, matched to a few milliseconds; clockSlack allows
// for that, as invariant 10 does (takeoverSlackStart). pauseMargin is how
// long after a pause's commit and a claim poll interval a grant may still
// have been made from the paused set read before it (the grant's claim
// read its filter just before its transaction read the database's now).
const (
	clockSlack  = takeoverSlackStart
	pauseMargin = 100 * time.Millisecond
)

// cancelTally is what invariants 13 and 14 count for the verdict.
type cancelTally struct {
	Cancelled, Requested int // jobs cancelled at once (never sent), jobs with a cancel request
	// RefundsAfterCancel are the refunds sent after their job's cancel
	// took effect, and the grants and reschedules to refund after it
	// (refunds_after_cancel).
	RefundsAfterCancel int
	// TooLate: requests that ended succeeded, the provider having the
	// refund (on the attention list); Review: with a person; Unended: a
	// cancel request neither cancelled, succeeded too late nor in review,
	// or a cancel whose end breaks R32 (cancels_unended).
	TooLate, Review, Unended int
}

// offsetOf takes a history time to the campaign's clock.
func offsetOf(db dbState) time.Duration {
	if db.ReadAt.IsZero() || db.Now.IsZero() {
		return 0
	}
	return db.ReadAt.Sub(db.Now)
}

// firstCancel is the index of the first cancelled or cancel_requested
// event of evs, -1 when none.
func firstCancel(evs []eventRow) int {
	return slices.IndexFunc(evs, func(e eventRow) bool { return e.Kind == "cancelled" || e.Kind == "cancel_requested" })
}

// refundsOfKey are every refund the provider made under key (failed ones
// too: their request was sent all the same), in creation order.
func refundsOfKey(o fakeprovider.OracleReport, key string) []fakeprovider.Refund {
	op, ok := o.Operation(key)
	if !ok {
		return nil
	}
	var out []fakeprovider.Refund
	for _, r := range o.Refunds {
		if slices.Contains(op.RefundIDs, r.ID) {
			out = append(out, r)
		}
	}
	return out
}

// frozenWithin is how long worker was frozen between from and to.
func frozenWithin(spans []span, from, to time.Time) time.Duration {
	var d time.Duration
	for _, sp := range spans {
		end := sp.To
		if end.IsZero() || end.After(to) {
			end = to
		}
		start := sp.From
		if start.Before(from) {
			start = from
		}
		if end.After(start) {
			d += end.Sub(start)
		}
	}
	return d
}

// checkNoRefundAfterCancel is invariant 13 (R32): no refund was sent after
// its cancel took effect. In each history, after the job's first cancel
// (a cancelled or cancel_requested event) no claim or takeover carries
// next action refund and no reschedule to refund was accepted. At the
// provider, against its own record of when each create request arrived
// (the oracle's received; created for a provider that does not say), on
// this machine's clock: a job cancelled at once as never sent has no
// refund at all; a refund of a job whose cancel was requested that was
// requested after the cancel (plus clockSlack) was sent by the holder of a
// grant to refund made before the cancel, within a lease of that grant not
// counting the time its holder was frozen: a call already on its way, or a
// holder frozen across the cancel that sent on waking (T1 with a cancel in
// the middle: the coordinator cannot stop a process that does not know).
// A holder learns that the cancel took its grant at its next renewal, a
// third of a lease on. Refunds requested before the cancel are the cancels
// that came too late (invariant 14).
func checkNoRefundAfterCancel(in checkInput, x *checkFacts) (i13 *invariant, t cancelTally) {
	i13 = &invariant{N: 13, Name: "no refund was sent after its cancel took effect: no grant or reschedule to refund after " +
		"a cancel, no refund of a job cancelled as never sent, none requested at the provider after a cancel request but " +
		"by a holder of an earlier grant that could not know yet (R32)"}
	offset := offsetOf(in.DB)
	lease := 4 * time.Second
	if in.Control != nil && in.Control.Lease > 0 {
		lease = in.Control.Lease
	}
	var frozen map[string][]span
	if in.Takeovers != nil {
		frozen = map[string][]span{}
		for id, w := range in.Takeovers.Workers {
			frozen[id] = w.Frozen
		}
	}
	lossy := in.Failover != nil && !in.Failover.lossless()
	before, inFlight, sentAfter, grantsAfter, refunds := 0, 0, 0, 0, 0
	for _, w := range x.walked {
		evs := x.events[w.job.ID]
		ci := firstCancel(evs)
		if ci < 0 {
			continue
		}
		ce := evs[ci]
		if ce.Kind == "cancelled" {
			t.Cancelled++
		} else {
			t.Requested++
		}
		for _, e := range evs[ci+1:] {
			granted := e.Kind == "claimed" || e.Kind == "taken_over"
			if (granted || e.Kind == "rescheduled") && e.NextAction == "refund" {
				grantsAfter++
				what := "GRANT TO REFUND AFTER A CANCEL"
				if !granted {
					what = "RESCHEDULE TO REFUND ACCEPTED AFTER A CANCEL"
				}
				i13.fail("%s: job %d (%s): %s event %d under attempt %d by %s, after the %s event %d by %s: from then on "+
					"no grant may carry refund, and a reschedule asking for it is refused CANCEL_REQUESTED%s", what, w.job.ID,
					w.job.Key, e.Kind, e.ID, e.Attempt, or(e.WorkerID, "(nobody)"), ce.Kind, ce.ID, or(ce.WorkerID, "(nobody)"),
					timedHistoryOf(w.job, x.events))
			}
		}
		cancelAt := ce.At.Add(offset)
		for _, r := range refundsOfKey(in.Oracle, w.job.Key) {
			refunds++
			sent := r.Received
			if sent.IsZero() {
				sent = r.Created
			}
			if ce.Kind == "cancelled" {
				if lossy && sent.Before(in.Failover.Repointed.Add(lease)) {
					i13.note("job %d (%s), cancelled as never sent on the new primary: refund %s requested at %s under "+
						"a grant the failover may have lost (R26)", w.job.ID, w.job.Key, r.ID, dateTime(sent))
					continue
				}
				sentAfter++
				i13.fail("REFUND OF A JOB CANCELLED AS NEVER SENT: job %d (%s) was cancelled at once by %s (event %d at "+
					"%s, database clock), yet the provider has refund %s (%s), requested at %s and made at %s: a job is "+
					"cancelled at once only if no grant to refund was ever made%s", w.job.ID, w.job.Key,
					or(ce.WorkerID, "(nobody)"), ce.ID, dateTime(ce.At), r.ID, r.Status, dateTime(sent), dateTime(r.Created),
					timedHistoryOf(w.job, x.events))
				continue
			}
			if !sent.After(cancelAt.Add(clockSlack)) {
				before++
				continue
			}
			// Sent after the cancel request: by whom? The latest grant to
			// refund made before the request arrived.
			g := -1
			for k, e := range evs {
				if e.Kind == "claimed" && e.NextAction == "refund" && !e.At.Add(offset).After(sent.Add(clockSlack)) {
					g = k
				}
			}
			var why string
			switch {
			case g < 0:
				why = "no grant to refund was made before its request arrived"
			case g > ci:
				why = fmt.Sprintf("the latest grant to refund before it, event %d by %s at %s, came after the cancel",
					evs[g].ID, or(evs[g].WorkerID, "(nobody)"), dateTime(evs[g].At))
			default:
				ge := evs[g]
				grantAt := ge.At.Add(offset)
				held := frozenWithin(frozen[ge.WorkerID], grantAt, sent)
				working := sent.Sub(grantAt) - held
				if working <= lease {
					inFlight++
					i13.note("job %d (%s): refund %s requested %s after the cancel request (event %d), by the holder of "+
						"grant event %d (%s, %s after it, %s of it frozen): sent before it could know", w.job.ID, w.job.Key,
						r.ID, sent.Sub(cancelAt).Round(time.Millisecond), ce.ID, ge.ID, or(ge.WorkerID, "(nobody)"),
						sent.Sub(grantAt).Round(time.Millisecond), held.Round(time.Millisecond))
					continue
				}
				why = fmt.Sprintf("its latest grant to refund, event %d by %s at %s, was made %s before, %s of it not "+
					"frozen: more than a lease (%s), in which its holder's renewal would have told it the cancel took the "+
					"grant", ge.ID, or(ge.WorkerID, "(nobody)"), dateTime(ge.At), sent.Sub(grantAt).Round(time.Millisecond),
					working.Round(time.Millisecond), lease)
			}
			sentAfter++
			i13.fail("REFUND AFTER CANCEL: job %d (%s): refund %s (%s) was requested at the provider at %s, %s after the "+
				"cancel request (event %d by %s at %s, database clock), and made at %s; %s%s", w.job.ID, w.job.Key, r.ID,
				r.Status, dateTime(sent), sent.Sub(cancelAt).Round(time.Millisecond), ce.ID, or(ce.WorkerID, "(nobody)"),
				dateTime(ce.At), dateTime(r.Created), why, timedHistoryOf(w.job, x.events))
		}
	}
	i13.Summary = fmt.Sprintf("%d jobs with a cancel: %d cancelled as never sent, %d cancel requests; %d refunds of them at "+
		"the provider: %d requested before the cancel took effect (too late: invariant 14), %d after it by the holder of "+
		"an earlier grant to refund within a lease of its working time (a call on its way, or a holder frozen across the "+
		"cancel), %d otherwise; %d grants or reschedules to refund after a cancel", t.Cancelled+t.Requested, t.Cancelled,
		t.Requested, refunds, before, inFlight, sentAfter, grantsAfter)
	t.RefundsAfterCancel = sentAfter + grantsAfter
	if in.Control == nil || !in.Control.Canceller {
		i13.Summary += " (no canceller ran: --cancel-share 0)"
	}
	return i13, t
}

// eventAfter is the index of the first event of evs after index from
// that match accepts, -1 when none.
func eventAfter(evs []eventRow, from int, match func(eventRow) bool) int {
	for k := from + 1; k < len(evs); k++ {
		if match(evs[k]) {
			return k
		}
	}
	return -1
}

// checkCancelsEnd is invariant 14 (R32, R34): every cancel ends as R32
// says. A job cancelled at once was never sent (first_sent_at empty) and
// stays cancelled. A cancel request ends succeeded — the provider had the
// refund: completed after the request, with an attention entry whose reason
// begins cancel_too_late — or in manual_review (a person decides), or
// cancelled by a person's resolution; never ready or running, never
// archived (R31). A job that ended cancelled and whose refund the provider
// has (live) is on the attention list (receipt_after_cancel) — with the
// provider's webhooks, its receipt owes it that. And every answer the
// canceller had is in the history: a cancel answered cancelled or
// requested is the job's entry of that kind at the answer's time (the
// job's updated_at), a replay has one, and JOB_NOT_CANCELLABLE was answered
// of a job final or cancelled by then.
func checkCancelsEnd(in checkInput, x *checkFacts) (i14 *invariant, t cancelTally) {
	i14 = &invariant{N: 14, Name: "every cancel ended as R32 says: cancelled if never sent, else succeeded too late on the " +
		"attention list, with a person, or cancelled by one; a refunded job that ended cancelled is on the attention list " +
		"(R32, R34)"}
	resolvedCancelled, resolvedRefunded, listedAfterCancel := 0, 0, 0
	for _, w := range x.walked {
		j, evs := w.job, x.events[w.job.ID]
		ci := firstCancel(evs)
		if ci >= 0 && evs[ci].Kind == "cancel_requested" && j.ArchivedAt.Valid {
			t.Unended++
			i14.fail("ARCHIVED WITH A CANCEL REQUEST: job %d (%s) was archived at %s: cancel-requested jobs are never "+
				"archived (R31)%s", j.ID, j.Key, dateTime(j.ArchivedAt.Time), x.historyOf(j))
		}
		if j.State == "cancelled" && len(liveRefunds(in.Oracle, j.Key)) > 0 {
			switch {
			case eventAfter(evs, -1, func(e eventRow) bool {
				return e.Kind == "attention" && strings.HasPrefix(e.Reason, "receipt_after_cancel")
			}) >= 0:
				listedAfterCancel++
			case !in.Webhooks:
				i14.note("job %d (%s) ended cancelled and the provider has %s; no webhooks (--webhooks=false) owed it a "+
					"receipt", j.ID, j.Key, describeRefunds(liveRefunds(in.Oracle, j.Key)))
			default:
				t.Unended++
				i14.fail("REFUNDED, CANCELLED AND NOT ON THE ATTENTION LIST: job %d (%s) ended cancelled, the provider has "+
					"%s and its webhooks owed a receipt, but no attention entry says receipt_after_cancel: a cancel never "+
					"pretends (R32, R34)%s", j.ID, j.Key, describeRefunds(liveRefunds(in.Oracle, j.Key)), timedHistoryOf(j, x.events))
			}
		}
		if ci < 0 {
			continue
		}
		ce := evs[ci]
		if ce.Kind == "cancelled" {
			t.Cancelled++
			if j.State != "cancelled" || j.FirstSentAt.Valid {
				t.Unended++
				i14.fail("CANCELLED AS NEVER SENT, BUT: job %d (%s) is %s, first sent at %s (the cancelled event %d at %s)%s",
					j.ID, j.Key, j.State, nullTime(j.FirstSentAt), ce.ID, dateTime(ce.At), timedHistoryOf(j, x.events))
			}
			continue
		}
		t.Requested++
		if in.DB.Control && !j.CancelRequestedAt.Valid {
			t.Unended++
			i14.fail("CANCEL REQUEST FORGOTTEN: job %d (%s) has a cancel_requested event (%d) but no cancel_requested_at"+
				"%s", j.ID, j.Key, ce.ID, timedHistoryOf(j, x.events))
		}
		switch j.State {
		case "succeeded":
			done := eventAfter(evs, ci, func(e eventRow) bool {
				return e.Kind == "completed" || (e.Kind == "resolved" && e.ToState == "succeeded")
			})
			listed := eventAfter(evs, max(ci, done-1), func(e eventRow) bool {
				return e.Kind == "attention" && strings.HasPrefix(e.Reason, "cancel_too_late")
			})
			switch {
			case done < 0:
				t.Unended++
				i14.fail("SUCCEEDED BEFORE ITS CANCEL REQUEST?: job %d (%s) is succeeded with no completion after its "+
					"cancel_requested event %d%s", j.ID, j.Key, ce.ID, timedHistoryOf(j, x.events))
			case listed < 0 && evs[done].Kind == "completed":
				t.Unended++
				i14.fail("CANCEL TOO LATE, NOT ON THE ATTENTION LIST: job %d (%s) completed (event %d) after its cancel "+
					"request (event %d) with no attention entry whose reason begins cancel_too_late (R32, R34)%s", j.ID,
					j.Key, evs[done].ID, ce.ID, timedHistoryOf(j, x.events))
			case evs[done].Kind == "completed" && !j.AttentionSince.Valid && in.DB.Control &&
				eventAfter(evs, done, func(e eventRow) bool { return e.Kind == "acknowledged" }) < 0:
				t.Unended++
				i14.fail("OFF THE ATTENTION LIST UNACKNOWLEDGED: job %d (%s) came too late for its cancel but is not on "+
					"the attention list and no person acknowledged it%s", j.ID, j.Key, timedHistoryOf(j, x.events))
			case evs[done].Kind == "resolved":
				resolvedRefunded++ // a person found the refund made
			default:
				t.TooLate++
			}
		case "manual_review":
			t.Review++
		case "cancelled":
			if eventAfter(evs, ci, func(e eventRow) bool { return e.Kind == "resolved" && e.ToState == "cancelled" }) >= 0 {
				resolvedCancelled++
				continue
			}
			t.Unended++
			i14.fail("CANCELLED WITHOUT A PERSON: job %d (%s), which may have been sent (cancel request %d), ended "+
				"cancelled with no person's resolution: only a person closes a maybe-sent refund as cancelled (R32)%s",
				j.ID, j.Key, ce.ID, timedHistoryOf(j, x.events))
		default:
			t.Unended++
			i14.fail("CANCEL REQUEST NOT ENDED: job %d (%s) is %s under attempt %d, next action %s, after its cancel "+
				"request (event %d at %s): it ends succeeded (too late), with a person, or cancelled by one%s", j.ID, j.Key,
				j.State, j.Attempt, j.NextAction, ce.ID, dateTime(ce.At), timedHistoryOf(j, x.events))
		}
	}
	answers := checkCancelAnswers(in, x, i14)
	i14.Summary = fmt.Sprintf("%d cancelled as never sent, each cancelled and never sent; %d cancel requests: %d "+
		"succeeded too late (cancel_too_late on the attention list), %d with a person (manual_review), %d resolved by a "+
		"person as cancelled and %d as refunded, %d otherwise; %d jobs that ended cancelled have a live refund at the "+
		"provider, %d of them on the attention list (receipt_after_cancel); %s", t.Cancelled, t.Requested, t.TooLate,
		t.Review, resolvedCancelled, resolvedRefunded, t.Requested-t.TooLate-t.Review-resolvedCancelled-resolvedRefunded,
		countCancelledRefunded(in, x), listedAfterCancel, answers)
	return i14, t
}

// countCancelledRefunded counts the jobs that ended cancelled with a live
// refund at the provider.
func countCancelledRefunded(in checkInput, x *checkFacts) int {
	n := 0
	for _, w := range x.walked {
		if w.job.State == "cancelled" && len(liveRefunds(in.Oracle, w.job.Key)) > 0 {
			n++
		}
	}
	return n
}

// checkCancelAnswers holds the canceller's answers to the histories
// (invariant 14) and returns the summary's words.
func checkCancelAnswers(in checkInput, x *checkFacts, i14 *invariant) string {
	if in.Control == nil || !in.Control.Canceller {
		return "no canceller ran (--cancel-share 0)"
	}
	lossy := in.Failover != nil && !in.Failover.lossless()
	outcomes := map[string]int{}
	matched, beforeRepoint := 0, 0
	for _, a := range in.Control.Cancels {
		outcomes[a.Outcome]++
		j := x.jobOf(a.Key, a.JobID)
		evs := x.events[j.ID]
		if j.ID == 0 {
			i14.fail("the canceller's cancel of %s (job %d, %s) was answered %s, but the database has no such job", a.Key,
				a.JobID, a.Moment, a.Outcome)
			continue
		}
		if lossy && a.At.Before(in.Failover.Repointed) {
			beforeRepoint++
			continue // the old primary's answer: its history may be gone
		}
		switch a.Outcome {
		case "cancelled", "requested":
			kind := map[string]string{"cancelled": "cancelled", "requested": "cancel_requested"}[a.Outcome]
			if slices.ContainsFunc(evs, func(e eventRow) bool { return e.Kind == kind && e.At.Equal(a.CoordAt) }) {
				matched++
				continue
			}
			i14.fail("CANCEL ANSWERED, NOT IN THE HISTORY: the cancel of job %d (%s, %s, attempt %d seen %s) was answered "+
				"%s at %s (the job's updated_at), but its history has no %s event then%s", j.ID, j.Key, a.Moment, a.Attempt,
				a.StateSeen, a.Outcome, dateTime(a.CoordAt), kind, timedHistoryOf(j, x.events))
		case "replayed":
			if firstCancel(evs) >= 0 {
				matched++
				continue
			}
			i14.fail("CANCEL REPLAYED, NEVER MADE: the cancel of job %d (%s, %s) was answered replayed, but its history "+
				"has no cancel%s", j.ID, j.Key, a.Moment, timedHistoryOf(j, x.events))
		case "JOB_NOT_CANCELLABLE":
			if a.CoordAt.IsZero() || slices.ContainsFunc(evs, func(e eventRow) bool {
				final := e.Kind == "completed" || e.Kind == "cancelled" || e.Kind == "cancel_requested" ||
					(e.Kind == "resolved" && e.ToState != "ready")
				return final && !e.At.After(a.CoordAt)
			}) || (j.ArchivedAt.Valid && !j.ArchivedAt.Time.After(a.CoordAt)) {
				matched++
				continue
			}
			i14.fail("NOT CANCELLABLE, YET NOTHING ENDED IT: the cancel of job %d (%s, %s) was answered "+
				"JOB_NOT_CANCELLABLE, but by %s (the coordinator's time after the answer) its history had neither a "+
				"completion nor a cancel%s", j.ID, j.Key, a.Moment, dateTime(a.CoordAt), timedHistoryOf(j, x.events))
		}
	}
	words := fmt.Sprintf("the canceller's %d cancels answered %s, %d of them matched to the histories (an entry at the "+
		"answer's time, or an end before it)", len(in.Control.Cancels), formatCounts(outcomes), matched)
	if lossy {
		words += fmt.Sprintf(", %d answered before the failover's repoint (the old primary's: not held to the survivor's "+
			"history)", beforeRepoint)
	}
	return words
}

// pauseWindow is one pause of a provider, from the database's record: from
// its paused entry to its resumed one (zero To: never resumed), on the
// database's clock; Effective is when every replica must have seen it:
// its commit (at the latest when the pauser had its answer) and a claim
// poll interval, plus pauseMargin.
type pauseWindow struct {
	Provider              string
	From, To, Effective   time.Time
	PausedEvent, ResumeID int64
	Reason                string
}

// pauseWindows pairs each paused entry of events with the next resumed
// entry of its provider.
func pauseWindows(events []pauseEventRow, answers []pauseAnswer, offset, poll time.Duration) []pauseWindow {
	var out []pauseWindow
	for k, e := range events {
		if e.Action != "paused" {
			continue
		}
		w := pauseWindow{Provider: e.Provider, From: e.At, PausedEvent: e.ID, Reason: e.Reason}
		for _, r := range events[k+1:] {
			if r.Provider == e.Provider && r.Action == "resumed" {
				w.To, w.ResumeID = r.At, r.ID
				break
			}
		}
		committed := e.At
		for _, a := range answers {
			// The pauser's answer to this pause (its reason names the
			// pause's number) came after its commit.
			if a.Action == "paused" && e.Reason == fmt.Sprintf("chaos: pause #%d", a.N) {
				if at := a.At.Add(-offset); at.After(committed) {
					committed = at
				}
			}
		}
		w.Effective = committed.Add(poll + pauseMargin)
		out = append(out, w)
	}
	return out
}

// pauseTally is what invariant 15 counts for the verdict.
type pauseTally struct {
	Pauses int // pauses on file
	// GrantsWhilePaused are the grants of a paused provider's job after
	// every replica must have seen the pause (grants_while_paused).
	GrantsWhilePaused int
}

// checkNoGrantWhilePaused is invariant 15 (R33): no grant of a paused
// provider's job from the moment every replica must have seen its pause
// until its resume. The pauses are the database's own record
// (provider_pause_events), each paused entry paired with the next resumed
// one of its provider; every grant (a claimed or taken_over event) of the
// provider's jobs — every job of the campaign is providerName's — made
// after the pause's commit (at the latest, when the pauser had its answer)
// plus a claim poll interval and pauseMargin, and before the resume, fails.
// A grant within that first stretch is counted: a replica that had not
// read the paused set yet. A grant later than it by a worker of a replica
// whose database connections were faulted meanwhile (its reads of the
// paused set failed: claims keep the last set read) is listed and counted,
// not failed. Every pause the pauser was answered changed=true is on file.
func checkNoGrantWhilePaused(in checkInput, x *checkFacts) (i15 *invariant, t pauseTally) {
	i15 = &invariant{N: 15, Name: "no grant of a paused provider's job after every replica saw its pause and before its " +
		"resume (R33)"}
	poll := 200 * time.Millisecond
	var answers []pauseAnswer
	if in.Control != nil {
		answers = in.Control.Pauses
		if in.Control.ClaimPoll > 0 {
			poll = in.Control.ClaimPoll
		}
	}
	offset := offsetOf(in.DB)
	windows := pauseWindows(in.DB.PauseEvents, answers, offset, poll)
	t.Pauses = len(windows)
	replicaOf := map[string]string{}
	var outages []outage
	if in.Takeovers != nil {
		for id, w := range in.Takeovers.Workers {
			replicaOf[id] = w.Replica
		}
		outages = in.Takeovers.Outages
	}
	var pausedFor, longest time.Duration
	early, explained, after := 0, 0, 0
	for _, w := range windows {
		end := w.To
		if end.IsZero() {
			end = in.DB.Now
			if in.Control != nil && in.Control.Pauser {
				i15.fail("PAUSE NEVER RESUMED: %s's pause (event %d at %s, %q) has no resumed entry", w.Provider,
					w.PausedEvent, dateTime(w.From), w.Reason)
			}
		}
		pausedFor += end.Sub(w.From)
		longest = max(longest, end.Sub(w.From))
		for _, e := range in.DB.Events {
			if (e.Kind != "claimed" && e.Kind != "taken_over") || !e.At.After(w.From) || !e.At.Before(end) ||
				w.Provider != providerName {
				continue
			}
			if e.At.Before(w.Effective) {
				early++
				continue
			}
			j := x.jobByID[e.JobID]
			grantAt, replica := e.At.Add(offset), replicaOf[e.WorkerID]
			if o := slices.IndexFunc(outages, func(o outage) bool {
				return (o.Replica == "" || o.Replica == replica) && isDatabaseOutage(o) && o.From.Before(grantAt) &&
					(o.To.IsZero() || !o.To.Before(w.From.Add(offset)))
			}); replica != "" && o >= 0 {
				explained++
				i15.note("job %d (%s): %s event %d by %s at %s, %s into %s's pause (event %d): %s's database was faulted "+
					"meanwhile (%s #%d from %s to %s): its reads of the paused providers may have failed", j.ID, j.Key,
					e.Kind, e.ID, e.WorkerID, dateTime(e.At), e.At.Sub(w.From).Round(time.Millisecond), w.Provider,
					w.PausedEvent, replica, outages[o].What, outages[o].N, outages[o].From.Format("15:04:05.000"),
					outages[o].To.Format("15:04:05.000"))
				continue
			}
			after++
			t.GrantsWhilePaused++
			i15.fail("GRANT WHILE PAUSED: job %d (%s): %s event %d under attempt %d by %s at %s (database clock), %s after "+
				"%s was paused (event %d at %s, %q) and before its resume (%s); every replica leaves a paused provider's "+
				"jobs out of every grant within a claim poll interval (%s) of the pause%s", j.ID, j.Key, e.Kind, e.ID,
				e.Attempt, or(e.WorkerID, "(nobody)"), dateTime(e.At), e.At.Sub(w.From).Round(time.Millisecond),
				w.Provider, w.PausedEvent, dateTime(w.From), w.Reason, resumeOf(w), poll, timedHistoryOf(j, x.events))
		}
	}
	// The pauser's answers, against the record.
	answered := 0
	for _, a := range answers {
		if a.Action != "paused" || !a.Changed {
			continue
		}
		answered++
		if !slices.ContainsFunc(windows, func(w pauseWindow) bool {
			return w.Reason == fmt.Sprintf("chaos: pause #%d", a.N) && !w.From.Before(a.PausedAt) &&
				w.From.Sub(a.PausedAt) < time.Second
		}) {
			i15.fail("PAUSE ANSWERED, NOT ON FILE: pause #%d of %s was answered changed at %s (paused_at), but "+
				"provider_pause_events has no paused entry for it then", a.N, providerName, dateTime(a.PausedAt))
		}
	}
	i15.Summary = fmt.Sprintf("%d pauses on file (%d answered to the pauser as new), %s paused in all, the longest %s; "+
		"grants of the paused provider's jobs while it was paused: %d before every replica must have seen the pause "+
		"(its commit + the claim poll interval %s + %s), %d later by a replica whose database was faulted meanwhile, %d "+
		"otherwise", t.Pauses, answered, pausedFor.Round(time.Millisecond), longest.Round(time.Millisecond), early, poll,
		pauseMargin, explained, after)
	if in.Control == nil || !in.Control.Pauser {
		i15.Summary += " (no pauser ran: --pauses=false)"
	}
	return i15, t
}

// isDatabaseOutage reports whether o kept a replica from its database (a
// fault on its database proxy, or a failover).
func isDatabaseOutage(o outage) bool {
	return strings.HasPrefix(o.What, "db-")
}

func resumeOf(w pauseWindow) string {
	if w.To.IsZero() {
		return "never resumed"
	}
	return fmt.Sprintf("event %d at %s", w.ResumeID, dateTime(w.To))
}
