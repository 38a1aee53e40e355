package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// earlyTally is what invariant 11 counts for the verdict.
type earlyTally struct {
	FutureDated int // refunds enqueued with a not_before in the future (future_dated)
	// Early counts the refunds the provider made before their job's
	// not_before, and the claims, takeovers and expedites of a job before
	// it (early_refunds).
	Early int
	// Beyond counts the jobs dated beyond the campaign; NotDue those of
	// them as they were enqueued: ready, attempt 0, never claimed or
	// moved, due at their not_before still.
	Beyond, NotDue int
	Forged         int // events the forger sent (forged_webhooks)
	ForgedFiled    int // forged events on file as a job's receipt (forged_filed)
}

// forgedIDs are the provider event ids of the forger's events.
func forgedIDs(forged []forgedEvent) map[string]bool {
	out := make(map[string]bool, len(forged))
	for _, f := range forged {
		out[f.ID] = true
	}
	return out
}

// checkNothingMovesMoneyEarly is invariant 11 (R28: nothing a receipt does
// can make a refund be sent earlier than without it). Against the
// provider's own record of when it made each refund, and the not_before the
// producer enqueued each future-dated refund with (both this machine's wall
// clock; the provider reads its clock after the claim that let the refund
// be sent, which the database made at or after the not_before): no refund
// created before its job's not_before. In the histories, on the database's
// own clock against the not_before it stored: no claim, takeover or
// expedite of a future-dated job before its not_before. A job dated beyond
// the campaign is as it was enqueued: ready, attempt 0, next action
// refund, due at its not_before, never sent (first_sent_at empty), its
// history its enqueue alone, and the provider has no refund of it. And the
// forger's events, correctly signed and about no job they name (another
// provider's, or another amount or currency): none on file as a job's
// receipt; each a coordinator answered 2xx is in the unmatched log under
// the provider that signed it (kept, never dropped); none refused. After
// an async failover an event answered before the proxies pointed at the
// new primary may have been kept by the old one only: counted, not failed.
func checkNothingMovesMoneyEarly(in checkInput, x *checkFacts) (i11 *invariant, t earlyTally) {
	i11 = &invariant{N: 11, Name: "no evidence moved money early: no refund created before its job's not_before, no " +
		"job claimed or expedited before it, none dated beyond the campaign touched, no forged webhook filed on a job (R28)"}
	t.FutureDated = len(in.NotBefore)

	// The provider's record: when it made each refund.
	refundsOf := map[string]int{}
	earlyRefunds := 0
	var margins []time.Duration // refunds of future-dated jobs: created minus not_before
	for _, r := range in.Oracle.Refunds {
		nb, dated := in.NotBefore[r.MerchantReference]
		if !dated {
			continue
		}
		refundsOf[r.MerchantReference]++
		if r.Created.Before(nb) {
			earlyRefunds++
			j := x.jobByKey[r.MerchantReference]
			i11.fail("EARLY REFUND: refund %s (%s, key %s, job %d) was created at the provider at %s, %s before its job's "+
				"not_before %s%s", r.ID, r.Status, r.MerchantReference, j.ID, dateTime(r.Created), aheadBy(nb.Sub(r.Created)),
				dateTime(nb), timedHistoryOf(j, x.events))
			continue
		}
		margins = append(margins, r.Created.Sub(nb))
	}

	// The histories, on the database's clock, and the jobs dated beyond
	// the campaign.
	var early, touched []string
	for _, key := range sortedKeys(in.NotBefore) {
		nb := in.NotBefore[key]
		j, ok := x.jobByKey[key]
		if !ok {
			continue // invariant 2 tells
		}
		for _, e := range x.events[j.ID] {
			if (e.Kind == "claimed" || e.Kind == "taken_over" || e.Kind == "expedited") && e.At.Before(nb) {
				early = append(early, fmt.Sprintf("%s BEFORE ITS NOT_BEFORE: job %d (%s): event %d by %s at %s on the "+
					"database's clock, %s before the not_before %s", strings.ToUpper(e.Kind), j.ID, key, e.ID,
					or(e.WorkerID, "(nobody)"), dateTime(e.At), aheadBy(nb.Sub(e.At)), dateTime(nb)))
			}
		}
		if !x.specByKey[key].Beyond {
			continue
		}
		t.Beyond++
		var wrong []string
		if j.State != "ready" || j.Attempt != 0 || j.NextAction != "refund" {
			wrong = append(wrong, fmt.Sprintf("it is %s under attempt %d, next action %s", j.State, j.Attempt, j.NextAction))
		}
		if !j.NextAttemptAt.Equal(nb) {
			wrong = append(wrong, "it is due at "+dateTime(j.NextAttemptAt))
		}
		if j.FirstSentAt.Valid {
			wrong = append(wrong, "it was first sent at "+dateTime(j.FirstSentAt.Time))
		}
		if evs := x.events[j.ID]; len(evs) != 1 || evs[0].Kind != "enqueued" {
			wrong = append(wrong, fmt.Sprintf("its history has %d events", len(evs)))
		}
		switch n := refundsOf[key]; {
		case n == 1:
			wrong = append(wrong, "the provider has a refund of it")
		case n > 1:
			wrong = append(wrong, fmt.Sprintf("the provider has %d refunds of it", n))
		}
		if len(wrong) > 0 {
			touched = append(touched, fmt.Sprintf("TOUCHED: job %d (%s), dated beyond the campaign (not_before %s): %s", j.ID,
				key, dateTime(nb), strings.Join(wrong, "; ")))
			continue
		}
		t.NotDue++
	}
	for _, d := range touched {
		i11.fail("%s", d)
	}
	forged := checkForgedEvents(in, x, i11, &t)
	// The refunds above show each job's history; the claims and expedites
	// that led to them are listed last, a few.
	failSome(i11, early, 10, "claims, takeovers or expedites before the not_before")
	t.Early = earlyRefunds + len(early)

	i11.Summary = fmt.Sprintf("%d future-dated refunds (%d due within the campaign, %d beyond it); %d refunds of them at "+
		"the provider, %d created before the not_before", t.FutureDated, t.FutureDated-t.Beyond, t.Beyond,
		len(margins)+earlyRefunds, earlyRefunds)
	if len(margins) > 0 {
		slices.Sort(margins)
		i11.Summary += fmt.Sprintf(" (refunds made %s to %s after it, median %s)", margins[0].Round(time.Millisecond),
			margins[len(margins)-1].Round(time.Millisecond), margins[len(margins)/2].Round(time.Millisecond))
	}
	i11.Summary += fmt.Sprintf("; %d of the %d dated beyond the campaign as enqueued: ready, attempt 0, never claimed, "+
		"moved or sent, no refund at the provider; %d claims, takeovers or expedites of a future-dated job before its "+
		"not_before; %s", t.NotDue, t.Beyond, len(early), forged)
	return i11, t
}

// failSome fails i with the first n of details and counts the rest.
func failSome(i *invariant, details []string, n int, what string) {
	for k, d := range details {
		if k == n {
			i.fail("… and %d more %s", len(details)-n, what)
			break
		}
		i.fail("%s", d)
	}
}

// dateTime formats t for invariant 11's details, to the microsecond the
// database keeps, with its date: a not_before may be a year ahead.
func dateTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000000") }

// aheadBy formats a duration for invariant 11's details, in days beyond two.
func aheadBy(d time.Duration) string {
	const day = 24 * time.Hour
	if d < 2*day {
		return d.Round(time.Millisecond).String()
	}
	d = d.Round(time.Second)
	return fmt.Sprintf("%dd%s", d/day, d%day)
}

// checkForgedEvents is invariant 11's part about the forger's events; it
// fails i11 for each one filed on a job, refused, or answered 2xx and not
// kept in the unmatched log, and returns the summary's words.
func checkForgedEvents(in checkInput, x *checkFacts, i11 *invariant, t *earlyTally) string {
	if !in.Forger {
		return "no forger (--forged-webhooks=false or --webhooks=false)"
	}
	t.Forged = len(in.Forged)
	if t.Forged == 0 {
		i11.fail("the forger sent no event: nothing was put to the test")
	}
	ids := forgedIDs(in.Forged)
	filed := map[string]bool{}
	var filedOn []string
	for _, o := range in.DB.Observations {
		if !ids[o.ProviderEventID] {
			continue
		}
		filed[o.ProviderEventID] = true
		t.ForgedFiled++
		f := in.Forged[slices.IndexFunc(in.Forged, func(f forgedEvent) bool { return f.ID == o.ProviderEventID })]
		filedOn = append(filedOn, fmt.Sprintf("FORGED RECEIPT FILED: %s is on file as observation %d of job %d (%s) from "+
			"%s, outcome %s: a receipt that cannot be about the job was taken for one", f.describe(), o.ID, o.JobID, o.Key,
			o.Source, o.Outcome))
	}
	failSome(i11, filedOn, 10, "forged events filed on a job")
	unmatched := map[string]unmatchedRow{}
	for _, u := range in.DB.Unmatched {
		if ids[u.ProviderEventID] {
			unmatched[u.ProviderEventID] = u
		}
	}
	fo := in.Failover
	lossy := fo != nil && !fo.lossless()
	stored, kept, lost, unanswered, early := 0, 0, 0, 0, 0
	for _, f := range in.Forged {
		if f.early() {
			early++
		}
		if f.stored() {
			stored++
		}
		u, isKept := unmatched[f.ID]
		switch {
		case isKept && u.Provider != f.Provider:
			i11.fail("FORGED EVENT KEPT AS ANOTHER'S: %s is in the unmatched log (%d) under provider %s", f.describe(), u.ID,
				u.Provider)
		case isKept:
			kept++
		case filed[f.ID]:
			// failed above
		case f.Status >= 400 && f.Status < 500:
			i11.fail("FORGED EVENT REFUSED: %s was answered %d: a correctly signed event is stored, on its job or in the "+
				"unmatched log, never refused (R28)", f.describe(), f.Status)
		case !f.stored():
			unanswered++ // no coordinator answered it 2xx; if one stored it anyway, it is above or on a job
		case lossy && f.StoredAt.Before(fo.Repointed):
			lost++
			i11.note("%s was answered 2xx before the repoint: kept by the old primary only, lost in the failover", f.describe())
		default:
			i11.fail("FORGED EVENT NOT KEPT: %s was answered 2xx (sent at %s) but is not in the unmatched log: a receipt "+
				"that matches no job is kept, never dropped (R28)", f.describe(), f.StoredAt.Format("15:04:05.000"))
		}
	}
	words := fmt.Sprintf("forged webhooks: %d sent (%d while their job's not_before was ahead), %d answered 2xx, %d in "+
		"the unmatched log under the provider that signed them, %d filed on a job, %d never answered 2xx", t.Forged, early,
		stored, kept, t.ForgedFiled, unanswered)
	if lost > 0 {
		words += fmt.Sprintf(", %d kept by the old primary only (lost in the failover)", lost)
	}
	return words
}

// timedHistoryOf is historyOf with each event's time on the database's
// clock, for the failures of invariant 11.
func timedHistoryOf(j jobRow, events map[int64][]eventRow) string {
	if j.ID == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n        row: state=%s attempt=%d next_action=%s next_attempt_at=%s provider_refund_id=%q", j.State,
		j.Attempt, j.NextAction, j.NextAttemptAt.UTC().Format("15:04:05.000000"), j.ProviderRefundID)
	for _, e := range events[j.ID] {
		fmt.Fprintf(&b, "\n        event %d at %s: %-11s attempt=%d %s→%s next=%s worker=%s", e.ID,
			e.At.UTC().Format("15:04:05.000000"), e.Kind, e.Attempt, e.FromState, e.ToState, e.NextAction, e.WorkerID)
		if e.ProviderRefundID != "" {
			fmt.Fprintf(&b, " refund=%s", e.ProviderRefundID)
		}
	}
	return b.String()
}
