package store

import "time"

// ClaimOutcome is the answer to one claim of a batch.
type ClaimOutcome struct {
	Jobs []ClaimedJob
	Err  error
}

// EnqueueOutcome is the answer to one enqueue of a batch.
type EnqueueOutcome struct {
	Job     Job
	Created bool
	Err     error
}

// WriteOutcome is the answer to one write-back of a batch.
type WriteOutcome struct {
	Result WriteResult
	Err    error
}

// Apply returns job as this write-back leaves it at the database time now.
// Backends use it to answer without reading the row back; the SQL they run
// must set the same values.
func (w Writeback) Apply(job Job, now time.Time) Job {
	expedited := w.ExpeditedBy(job)
	job.State = w.ToState()
	job.LeaseUntil = time.Time{}
	job.UpdatedAt = now
	switch w.Kind {
	case EventCompleted:
		job.ProviderRefundID = w.ProviderRefundID
		job.NextAttemptAt = now // no longer its lease end (Job.NextAttemptAt)
		if job.CancelRequested() {
			// R32, R34: the provider had the refund; the cancel came too late.
			job.AttentionSince = now
			job.AttentionReason = CancelTooLate
		}
	case EventRescheduled:
		job.NextAction = w.NextAction
		job.NextAttemptAt = w.NextAttemptAt(now)
		if expedited && job.NextAttemptAt.After(now) {
			job.NextAttemptAt = now
		}
		job.LastReason = w.Reason
	case EventEscalated:
		// In review from now: a listing by state puts the job that has
		// waited longest first.
		job.NextAttemptAt = now
		job.LastReason = w.Reason
	case EventResolved:
		job.LastReason = w.Reason
		switch w.Resolution {
		case ResolutionRefunded:
			job.ProviderRefundID = w.ProviderRefundID
			job.NextAttemptAt = now // completed now: the archive's retention counts from it (R31)
		case ResolutionCancelled:
			job.NextAttemptAt = now // final from now: the archive's walk (R31)
		default:
			job.NextAction = ActionReconcile
			job.NextAttemptAt = now
		}
	}
	return job
}

// ExpeditedBy reports whether w, applied to before (the row as it stands),
// is a reschedule to reconcile that a receipt makes due now (R28): a receipt
// of success or failure filed during the grant w writes back, at or after the
// grant's time (before.UpdatedAt, see Job.EvidenceAt). Such a receipt came
// while the job ran, when it could not move the job; the holder's reschedule
// is where it takes effect, as if it had come a moment later. A reschedule to
// send the refund again keeps its time: only a reconcile is always safe, and
// the next holder is handed the receipt with its claim.
func (w Writeback) ExpeditedBy(before Job) bool {
	return w.Kind == EventRescheduled && w.NextAction == ActionReconcile && before.State == StateRunning &&
		!before.EvidenceAt.IsZero() && !before.EvidenceAt.Before(before.UpdatedAt)
}

// Event is the history entry of this write-back, applied to job (the row
// before it) at now. It names the writer: the attempt it wrote under and its
// identity (Actor, from its credential; the job's holder when none), so the
// history would show a write that slipped past the fence rather than pass it
// off as the holder's.
func (w Writeback) Event(before Job, now time.Time) Event {
	after := w.Apply(before, now)
	e := Event{JobID: before.ID, Attempt: w.Attempt, Kind: w.Kind, WorkerID: before.WorkerID,
		FromState: before.State, ToState: after.State, NextAction: after.NextAction,
		ProviderRefundID: after.ProviderRefundID, Reason: w.Reason, CreatedAt: now, Grant: w.Grant()}
	if w.Actor != "" {
		e.WorkerID = w.Actor
	}
	return e
}

// Ledgered reports whether the write records a refund in the ledger (R10).
func (w Writeback) Ledgered() bool { return w.ToState() == StateSucceeded }

// NextAttemptAt is when a rescheduled job becomes due: At when given, else now
// (the database's clock, R12) plus Delay, at the microsecond resolution both
// backends store.
func (w Writeback) NextAttemptAt(now time.Time) time.Time {
	if !w.At.IsZero() {
		return w.At.UTC().Truncate(time.Microsecond)
	}
	return now.Add(w.Delay).Truncate(time.Microsecond)
}

// BatchPlan decides a batch of write-backs against the rows as they stand,
// locked, as if the writes were applied one after another in order. A job
// written twice in one batch is applied once; the repeat is then settled
// against the written row (a replay, or JOB_NOT_RUNNING), exactly as it would
// be one call later.
type BatchPlan struct {
	// Apply lists the indexes whose fence holds (running under their attempt),
	// in order; no job appears twice.
	Apply []int
	// After maps every planned index to its job: after its write for Apply,
	// as it stands for the others.
	After map[int]Job
	// Events are the history entries of the writes in Apply, in order.
	Events  []Event
	applied map[int]bool
	// expedited marks the reschedules a receipt made due now (ExpeditedBy).
	expedited map[int]bool
	ws        []Writeback
}

// PlanBatch plans the writes ws[i] for i in idx. current holds the locked rows
// by job id (missing jobs absent); now is the database's time.
func PlanBatch(ws []Writeback, idx []int, current map[int64]Job, now time.Time) BatchPlan {
	p := BatchPlan{After: make(map[int]Job, len(idx)), applied: map[int]bool{}, expedited: map[int]bool{}, ws: ws}
	rows := make(map[int64]Job, len(current))
	for id, j := range current {
		rows[id] = j
	}
	for _, i := range idx {
		w := ws[i]
		cur, ok := rows[w.JobID]
		if !ok {
			continue
		}
		if w.Fenced(cur) {
			p.Events = append(p.Events, w.Event(cur, now))
			expedited := w.ExpeditedBy(cur)
			listed := cur.AttentionSince
			cur = w.Apply(cur, now)
			if expedited {
				p.expedited[i] = true
				p.Events = append(p.Events, ReceiptExpediteEvent(cur))
			}
			if !cur.AttentionSince.Equal(listed) {
				p.Events = append(p.Events, AttentionEvent(cur, cur.AttentionReason))
			}
			rows[w.JobID] = cur
			p.Apply = append(p.Apply, i)
			p.applied[i] = true
		}
		p.After[i] = cur
	}
	return p
}

// Outcome is the answer to ws[i] once the batch committed.
func (p BatchPlan) Outcome(i int) WriteOutcome {
	job, ok := p.After[i]
	if !ok {
		return WriteOutcome{Err: ErrNotFound}
	}
	if p.applied[i] {
		return WriteOutcome{Result: WriteResult{Job: job, Expedited: p.expedited[i]}}
	}
	res, err := Settle(p.ws[i], job)
	return WriteOutcome{Result: res, Err: err}
}

// Applied returns the indexes in Apply whose write matches.
func (p BatchPlan) Applied(match func(Writeback) bool) []int {
	var out []int
	for _, i := range p.Apply {
		if match(p.ws[i]) {
			out = append(out, i)
		}
	}
	return out
}

// JobIDs returns the distinct job ids of ws[i] for i in idx, in order.
func JobIDs(ws []Writeback, idx []int) []int64 {
	seen := make(map[int64]bool, len(idx))
	ids := make([]int64, 0, len(idx))
	for _, i := range idx {
		if id := ws[i].JobID; !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}
