package main

import (
	"fmt"
	"slices"
	"strings"
)

// history is what walkHistory found in one job's events.
type history struct {
	claims, takeovers, writes int
	resolutions               int
	// cancels are the cancelled events (a refund never sent, cancelled at
	// once), cancelRequests the cancel_requested ones, attentions the
	// attention events (R32, R34).
	cancels, cancelRequests, attentions int
	expedites, webhookExpedites         int        // expedited events, and those a webhook's receipt made (R28)
	handBacks                           []eventRow // the coordinator's hand-backs of grants it could not deliver (of writes)
	attemptProblems                     []string   // invariant 3
	staleWrites                         []string   // invariant 4
	grantProblems                       []string   // invariant 7
	evidenceProblems                    []string   // invariant 8
}

// handBackReasons begin the reason of a coordinator's hand-back: a grant it
// committed and could not deliver, ended by a fenced Reschedule under the
// grant's own attempt and token, due now, keeping its next action, in the
// name of the grant's holder (docs/DESIGN.md, "The worker stream"): the
// worker stream failed, was cut or closed before the grant went out
// (server/stream.go), or the caller of the dispatcher's long-polled claim —
// a Claim call, or a stream's claimer whose stream just ended — left before
// the answer (dispatch).
var handBackReasons = []string{"worker stream", "claim abandoned by its caller"}

// isHandBack reports whether e is a coordinator's hand-back.
func isHandBack(e eventRow) bool {
	return e.Kind == "rescheduled" && slices.ContainsFunc(handBackReasons, func(p string) bool {
		return strings.HasPrefix(e.Reason, p)
	})
}

// walkHistory replays one job's events in id order: the attempt must start at
// 0, step by exactly one on each claim or takeover and never go down; a
// takeover sets next action reconcile (R6); each write-back must be made
// under the attempt of the latest claim or takeover while the job was
// running (the fence, R9), a coordinator's hand-back too, which also names
// the grant's holder, makes the job ready and keeps the grant's next action;
// there is at most one completion and nothing follows it; the row agrees
// with the end of its history (state, attempt, next action, refund id) — a
// row changed without a history entry shows there. A person's cancel (R32)
// of a job never sent takes it from ready or manual_review to cancelled,
// final, under the attempt it had; a cancel request of a running job is a
// takeover by nobody (attempt + 1, ready, next action reconcile), of a
// ready one due to reconcile under its attempt, of one in review leaves it
// there; neither carries a grant. An attention entry or its
// acknowledgement (R34) changes no state and may follow the end.
func walkHistory(j jobRow, evs []eventRow) history {
	var h history
	cur, maxAttempt := int64(0), int64(0)
	curGrant, curHolder, curNext := "", "", ""
	state := ""
	completed := false // completed, or otherwise final: cancelled, resolved
	for n, e := range evs {
		if n > 0 && e.Attempt < evs[n-1].Attempt {
			h.attemptProblems = append(h.attemptProblems,
				fmt.Sprintf("attempt went down from %d to %d at event %d", evs[n-1].Attempt, e.Attempt, e.ID))
		}
		maxAttempt = max(maxAttempt, e.Attempt)
		if n > 0 && e.FromState != state {
			h.attemptProblems = append(h.attemptProblems,
				fmt.Sprintf("event %d (%s) starts from %s but the history left the job %s", e.ID, e.Kind, e.FromState, state))
		}
		if completed && e.Kind != "attention" && e.Kind != "acknowledged" {
			h.staleWrites = append(h.staleWrites, fmt.Sprintf("event %d (%s, attempt %d) after the job was final (%s)", e.ID,
				e.Kind, e.Attempt, state))
		}
		switch e.Kind {
		case "enqueued":
			if n != 0 || e.Attempt != 0 {
				h.attemptProblems = append(h.attemptProblems, fmt.Sprintf("enqueued event %d at position %d, attempt %d", e.ID, n, e.Attempt))
			}
		case "claimed", "taken_over":
			if e.Kind == "claimed" {
				h.claims++
			} else {
				h.takeovers++
			}
			if e.Attempt != cur+1 {
				h.attemptProblems = append(h.attemptProblems,
					fmt.Sprintf("%s event %d stepped the attempt from %d to %d", e.Kind, e.ID, cur, e.Attempt))
			}
			want := "ready"
			if e.Kind == "taken_over" {
				want = "running"
			}
			if state != want {
				h.attemptProblems = append(h.attemptProblems, fmt.Sprintf("%s event %d while the job was %s", e.Kind, e.ID, state))
			}
			if e.Kind == "taken_over" && e.NextAction != "reconcile" {
				h.attemptProblems = append(h.attemptProblems, fmt.Sprintf("takeover %d with next action %q, not reconcile (R6)",
					e.ID, e.NextAction))
			}
			cur, curGrant, curHolder, curNext = e.Attempt, e.Grant, e.WorkerID, e.NextAction
		case "completed", "rescheduled", "escalated":
			h.writes++
			if e.Attempt != cur || state != "running" {
				h.staleWrites = append(h.staleWrites, fmt.Sprintf("%s event %d under attempt %d while the current attempt was %d "+
					"and the job %s", e.Kind, e.ID, e.Attempt, cur, state))
			} else if e.Grant != curGrant {
				// R25: the history keeps the grant the writer carried.
				h.grantProblems = append(h.grantProblems, fmt.Sprintf("%s event %d under attempt %d carried grant %s, but "+
					"the attempt's grant is %s", e.Kind, e.ID, e.Attempt, or(e.Grant, "(none)"), or(curGrant, "(none)")))
			}
			if isHandBack(e) {
				// Fenced like the holder's own write (above), it ends a grant
				// that never reached the holder, or may have (R25: its token
				// writes nothing more): nothing but giving the job back.
				h.handBacks = append(h.handBacks, e)
				if e.WorkerID != curHolder || e.ToState != "ready" || e.NextAction != curNext {
					h.evidenceProblems = append(h.evidenceProblems, fmt.Sprintf("hand-back %d (%q) under attempt %d names %s, "+
						"takes the job to %s, next %s: a grant the coordinator could not deliver goes back in its holder's "+
						"name (%s), to ready, keeping the grant's next action (%s)", e.ID, e.Reason, e.Attempt,
						or(e.WorkerID, "(nobody)"), e.ToState, e.NextAction, or(curHolder, "(nobody)"), curNext))
				}
			}
			completed = completed || e.Kind == "completed"
		case "resolved":
			h.resolutions++
			if e.Attempt != cur || state != "manual_review" {
				h.staleWrites = append(h.staleWrites, fmt.Sprintf("resolved event %d under attempt %d while the current attempt was %d "+
					"and the job %s", e.ID, e.Attempt, cur, state))
			}
			if e.Grant != "" {
				// R29: a person holds no grant; the attempt they saw fences them.
				h.evidenceProblems = append(h.evidenceProblems, fmt.Sprintf("resolved event %d by %s carries grant %s: "+
					"an operator's resolution holds none", e.ID, e.WorkerID, e.Grant))
			}
			completed = completed || e.ToState == "succeeded" || e.ToState == "cancelled"
		case "cancelled":
			// R32: a refund never sent, cancelled at once by a person (or
			// its producer): final, from ready or in review, under the
			// attempt it had, holding no grant.
			h.cancels++
			if e.Attempt != cur || (state != "ready" && state != "manual_review") || e.ToState != "cancelled" ||
				e.Grant != "" {
				h.evidenceProblems = append(h.evidenceProblems, fmt.Sprintf("cancelled event %d by %s under attempt %d "+
					"(the current grant's: %d) took the job from %s to %s, grant %s: a cancel of a refund never sent "+
					"takes a ready job or one in review to cancelled under its attempt, holding no grant", e.ID,
					or(e.WorkerID, "(nobody)"), e.Attempt, cur, state, e.ToState, or(e.Grant, "(none)")))
			}
			completed = true
		case "cancel_requested":
			// R32: a refund that may have been sent. A running job is taken
			// over by nobody (its holder's token writes nothing more); a
			// ready one is due to reconcile; one in review waits for its
			// person.
			h.cancelRequests++
			wantAttempt, wantTo, wantNext := cur, state, e.NextAction
			switch state {
			case "running":
				wantAttempt, wantTo, wantNext = cur+1, "ready", "reconcile"
			case "ready":
				wantNext = "reconcile"
			}
			if (state != "running" && state != "ready" && state != "manual_review") || e.Attempt != wantAttempt ||
				e.ToState != wantTo || e.NextAction != wantNext || e.Grant != "" {
				h.evidenceProblems = append(h.evidenceProblems, fmt.Sprintf("cancel_requested event %d by %s under "+
					"attempt %d (the current grant's: %d) took the job from %s to %s, next %s, grant %s: a cancel request "+
					"takes a running job over (attempt + 1, ready, reconcile), makes a ready one due to reconcile and "+
					"leaves one in review there, holding no grant", e.ID, or(e.WorkerID, "(nobody)"), e.Attempt, cur,
					state, e.ToState, e.NextAction, or(e.Grant, "(none)")))
			}
			if e.Attempt == cur+1 {
				cur, curGrant, curHolder, curNext = e.Attempt, e.Grant, "", e.NextAction
			}
		case "attention", "acknowledged":
			// R34: a finished job raised to a person, or taken off the
			// list by one: no state changes.
			if e.Kind == "attention" {
				h.attentions++
			}
			if e.ToState != state || e.Attempt != cur || e.Grant != "" {
				h.evidenceProblems = append(h.evidenceProblems, fmt.Sprintf("%s event %d under attempt %d (the current "+
					"grant's: %d) took the job from %s to %s, grant %s: the attention list changes no state", e.Kind, e.ID,
					e.Attempt, cur, state, e.ToState, or(e.Grant, "(none)")))
			}
		case "expedited":
			// R28: a receipt (a webhook's or a worker's late one) made a
			// waiting job due to reconcile: it moves work, never state —
			// ready to ready under the attempt the job already had, with no
			// grant, since only a holder's fenced write changes a job (R15).
			h.expedites++
			if strings.HasPrefix(e.WorkerID, webhookSourcePrefix) {
				h.webhookExpedites++
			}
			prev := int64(-1)
			if n > 0 {
				prev = evs[n-1].Attempt
			}
			if e.Attempt != cur || e.Attempt != prev || state != "ready" || e.FromState != "ready" || e.ToState != "ready" ||
				e.NextAction != "reconcile" || e.Grant != "" {
				h.evidenceProblems = append(h.evidenceProblems, fmt.Sprintf("expedited event %d by %s under attempt %d "+
					"(the event before it: attempt %d; the current grant's: %d) took the job from %s to %s, next %s, grant %s: "+
					"a receipt may only make a ready job due to reconcile, under its attempt, holding no grant",
					e.ID, or(e.WorkerID, "(no source)"), e.Attempt, prev, cur, e.FromState, e.ToState, e.NextAction,
					or(e.Grant, "(none)")))
			}
		default:
			h.attemptProblems = append(h.attemptProblems, fmt.Sprintf("event %d of unknown kind %q", e.ID, e.Kind))
		}
		state = e.ToState
	}
	switch {
	case len(evs) == 0:
		h.attemptProblems = append(h.attemptProblems, "no history at all")
	case j.Attempt != maxAttempt:
		h.attemptProblems = append(h.attemptProblems, fmt.Sprintf("row attempt %d, history's highest %d", j.Attempt, maxAttempt))
	case j.State != state:
		h.attemptProblems = append(h.attemptProblems, fmt.Sprintf("row state %s, history ends in %s", j.State, state))
	case j.NextAction != evs[len(evs)-1].NextAction:
		h.attemptProblems = append(h.attemptProblems, fmt.Sprintf("row next action %s, history ends in %s", j.NextAction,
			evs[len(evs)-1].NextAction))
	case j.State == "succeeded" && j.ProviderRefundID != evs[len(evs)-1].ProviderRefundID:
		h.staleWrites = append(h.staleWrites, fmt.Sprintf("row refund %q, its completion recorded %q", j.ProviderRefundID,
			evs[len(evs)-1].ProviderRefundID))
	}
	return h
}

// completedUnder reports whether the history holds a completion under attempt.
func completedUnder(evs []eventRow, attempt int64) bool {
	return slices.ContainsFunc(evs, func(e eventRow) bool { return e.Kind == "completed" && e.Attempt == attempt })
}

// historyOf formats a job's history for a failure's details.
func historyOf(j jobRow, events map[int64][]eventRow) string {
	if j.ID == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n        row: state=%s attempt=%d next_action=%s provider_refund_id=%q", j.State, j.Attempt,
		j.NextAction, j.ProviderRefundID)
	for _, e := range events[j.ID] {
		fmt.Fprintf(&b, "\n        event %d: %-11s attempt=%d %s→%s worker=%s", e.ID, e.Kind, e.Attempt, e.FromState, e.ToState, e.WorkerID)
		if e.Grant != "" {
			fmt.Fprintf(&b, " grant=%s", e.Grant)
		}
		if e.ProviderRefundID != "" {
			fmt.Fprintf(&b, " refund=%s", e.ProviderRefundID)
		}
	}
	return b.String()
}
