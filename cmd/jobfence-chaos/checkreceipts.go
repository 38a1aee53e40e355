package main

// The receipts: every late success a worker saw is on file (invariant 5),
// no receipt changed a job (8), and every refund the provider made has its
// webhook receipts, once each (9).

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

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
		"coordinators' hand-backs of grants they could not deliver) and people's resolutions and cancels did; an " +
		"expedite only made a ready job due (R15, R28, R29, R32)"}
	claims, takeovers, writes, resolutions, byWebhook, seen := 0, 0, 0, 0, 0, 0
	cancels, cancelRequests, attentions := 0, 0, 0
	for _, w := range x.walked {
		claims += w.h.claims
		takeovers += w.h.takeovers
		writes += w.h.writes
		resolutions += w.h.resolutions
		cancels += w.h.cancels
		cancelRequests += w.h.cancelRequests
		attentions += w.h.attentions
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
	if cancels+cancelRequests+attentions > 0 {
		i8.Summary += fmt.Sprintf(", %d cancels of jobs never sent and %d cancel requests (invariants 13, 14), and %d "+
			"attention entries, which change no state (R34)", cancels, cancelRequests, attentions)
	}
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
