package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// The rows the checks read, straight from MariaDB.
type (
	jobRow struct {
		ID               int64
		Key              string
		State            string
		Attempt          int64
		NextAction       string
		NextAttemptAt    time.Time
		LeaseUntil       sql.NullTime
		ProviderRefundID string
		LastReason       string
	}
	eventRow struct {
		ID               int64
		JobID            int64
		Attempt          int64
		Kind             string
		WorkerID         string
		FromState        string
		ToState          string
		NextAction       string
		ProviderRefundID string
	}
	observationRow struct {
		ID               int64
		JobID            int64
		ReportedAttempt  int64
		JobAttempt       int64
		Source           string
		Outcome          string
		ProviderRefundID string
	}
	ledgerRow struct {
		JobID            int64
		Key              string
		ProviderRefundID string
		Attempt          int64
	}
)

// dbState is everything the checks read from the database, in one
// read-only snapshot.
type dbState struct {
	Now          time.Time
	Jobs         []jobRow
	Events       []eventRow
	Observations []observationRow
	Ledger       []ledgerRow
}

// readDB reads the campaign's tables in one read-only, repeatable-read
// transaction. Errors: the database's.
func readDB(ctx context.Context, db *sql.DB) (dbState, error) {
	var st dbState
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return st, err
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	if err := tx.QueryRowContext(ctx, `SELECT UTC_TIMESTAMP(6)`).Scan(&st.Now); err != nil {
		return st, err
	}
	err = scanRows(ctx, tx, `SELECT id, operation_key, state, attempt, next_action, next_attempt_at, lease_until,
  COALESCE(provider_refund_id, ''), last_reason FROM refund_jobs ORDER BY id`, func(r *sql.Rows) error {
		var j jobRow
		err := r.Scan(&j.ID, &j.Key, &j.State, &j.Attempt, &j.NextAction, &j.NextAttemptAt, &j.LeaseUntil,
			&j.ProviderRefundID, &j.LastReason)
		st.Jobs = append(st.Jobs, j)
		return err
	})
	if err != nil {
		return st, err
	}
	err = scanRows(ctx, tx, `SELECT id, job_id, attempt, kind, worker_id, from_state, to_state, next_action,
  provider_refund_id FROM refund_job_events ORDER BY id`, func(r *sql.Rows) error {
		var e eventRow
		err := r.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.WorkerID, &e.FromState, &e.ToState, &e.NextAction,
			&e.ProviderRefundID)
		st.Events = append(st.Events, e)
		return err
	})
	if err != nil {
		return st, err
	}
	err = scanRows(ctx, tx, `SELECT id, job_id, reported_attempt, job_attempt, source, outcome, provider_refund_id
  FROM refund_observations ORDER BY id`, func(r *sql.Rows) error {
		var o observationRow
		err := r.Scan(&o.ID, &o.JobID, &o.ReportedAttempt, &o.JobAttempt, &o.Source, &o.Outcome, &o.ProviderRefundID)
		st.Observations = append(st.Observations, o)
		return err
	})
	if err != nil {
		return st, err
	}
	err = scanRows(ctx, tx, `SELECT job_id, operation_key, provider_refund_id, attempt FROM refund_ledger ORDER BY job_id`,
		func(r *sql.Rows) error {
			var l ledgerRow
			err := r.Scan(&l.JobID, &l.Key, &l.ProviderRefundID, &l.Attempt)
			st.Ledger = append(st.Ledger, l)
			return err
		})
	return st, err
}

func scanRows(ctx context.Context, tx *sql.Tx, query string, scan func(*sql.Rows) error) error {
	rows, err := tx.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// receipt is a provider success a worker saw but could not write back: its
// write-back was rejected by the fence (a stale worker, R9), failed, or its
// answer came after the provider-call deadline. R15 wants each in the
// observation log.
type receipt struct {
	Worker   string
	JobID    int64
	Attempt  int64
	Why      string // "stale", "write_failed" or "late"
	RefundID string
	Filed    string // "filed", "not filed: <error>", or "" when the worker logged neither
	Killed   bool   // the worker was SIGKILLed by the campaign before it logged the filing
}

// receiptsOf reads a worker's receipts from its JSON log records: the Go
// SDK's messages (clients/go Worker, as cmd/refundworker logs them) or, with
// node, those of the Node.js example worker. The Node worker's lines say
// neither what the rejected write-back carried nor the outcome of the
// observation it filed, so its receipts are of unknown outcome (Why ends in
// "_node").
func receiptsOf(worker string, node bool, recs []map[string]any, killed bool) (out []receipt, staleRejections int) {
	type key struct{ job, attempt int64 }
	open := map[key]int{} // receipt index waiting for its filing line
	late := map[key]bool{}
	suffix := ""
	if node {
		suffix = "_node"
	}
	add := func(k key, why string) {
		open[k] = len(out)
		out = append(out, receipt{Worker: worker, JobID: k.job, Attempt: k.attempt, Why: why + suffix})
	}
	for _, r := range recs {
		k := key{num(r["job_id"]), num(r["attempt"])}
		msg, _ := r["msg"].(string)
		success := node || r["outcome"] == "succeeded"
		switch msg {
		case "write-back rejected by the fence; filing the answer as an observation":
			staleRejections++
			if node || r["decision"] == "complete" {
				add(k, "stale")
			}
		case "write-back failed; the lease will expire and a takeover reconciles",
			"write-back failed; the lease will lapse and a takeover reconciles":
			if node || r["decision"] == "complete" {
				add(k, "write_failed")
			}
		case "handler outlived the provider-call deadline; outcome unknown",
			"provider call outlived its deadline; outcome unknown":
			late[k] = true
		case "observation filed", "observation not filed", "filing an observation failed":
			if !success {
				continue
			}
			i, ok := open[k]
			if !ok && late[k] {
				delete(late, k)
				add(k, "late")
				i, ok = open[k], true
			}
			if !ok {
				continue
			}
			delete(open, k)
			out[i].RefundID, _ = r["provider_refund_id"].(string)
			if msg == "observation filed" {
				out[i].Filed = "filed"
			} else {
				e, _ := r["error"].(string)
				out[i].Filed = "not filed: " + e
			}
		}
	}
	for _, i := range open {
		out[i].Killed = killed
	}
	return out, staleRejections
}

// ack is a write-back a worker was told had succeeded (replayed or not).
type ack struct {
	Worker   string
	JobID    int64
	Attempt  int64
	Kind     string // the history's event kind: completed, rescheduled or escalated
	Replayed bool
}

// acksOf reads the write-backs the coordinator accepted from a worker's JSON
// log records: refundworker's "job written" (decision complete, reschedule or
// escalate) and the Node.js worker's "job completed", "job rescheduled" and
// "job escalated to manual review".
func acksOf(worker string, recs []map[string]any) []ack {
	kinds := map[string]string{
		"complete": "completed", "reschedule": "rescheduled", "escalate": "escalated",
		"job completed": "completed", "job rescheduled": "rescheduled", "job escalated to manual review": "escalated",
	}
	var out []ack
	for _, r := range recs {
		msg, _ := r["msg"].(string)
		kind := kinds[msg]
		if msg == "job written" {
			d, _ := r["decision"].(string)
			kind = kinds[d]
		}
		if kind == "" {
			continue
		}
		replayed, _ := r["replayed"].(bool)
		out = append(out, ack{Worker: worker, JobID: num(r["job_id"]), Attempt: num(r["attempt"]), Kind: kind, Replayed: replayed})
	}
	return out
}

func num(v any) int64 {
	switch n := v.(type) {
	case float64:
		return int64(n)
	case string:
		var x int64
		fmt.Sscan(n, &x) //nolint:errcheck // zero when not a number
		return x
	}
	return 0
}

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

// check evaluates the six invariants.
func check(in checkInput) verdict {
	var v verdict
	inv := func(n int, name string) *invariant {
		i := &invariant{N: n, Name: name}
		v.Invariants = append(v.Invariants, i)
		return i
	}
	i1 := inv(1, "every refund happened at most once per operation key (R1, R14, T3)")
	i2 := inv(2, "every enqueued job is present and final (succeeded or manual_review)")
	i3 := inv(3, "attempts only increased, claims and takeovers by exactly one, the row agrees with its history (R2, R3, R5, R6)")
	i4 := inv(4, "no write with a stale attempt changed a job (R8, R9, R10, R21, T1, T4)")
	i5 := inv(5, "every late success a stale worker saw is in the observation log (R15)")
	i6 := inv(6, "the ledger agrees with refund_jobs and with the provider (R4, R10)")

	specByKey := map[string]refundSpec{}
	for _, s := range in.Specs {
		specByKey[s.Key] = s
	}
	jobByKey := map[string]jobRow{}
	jobByID := map[int64]jobRow{}
	for _, j := range in.DB.Jobs {
		jobByKey[j.Key] = j
		jobByID[j.ID] = j
	}
	events := map[int64][]eventRow{}
	for _, e := range in.DB.Events {
		events[e.JobID] = append(events[e.JobID], e)
	}

	// 1. The provider's own records.
	live := func(op fakeprovider.OperationTruth) []fakeprovider.Refund {
		var out []fakeprovider.Refund
		for _, r := range in.Oracle.Refunds {
			if slices.Contains(op.RefundIDs, r.ID) && r.Status != fakeprovider.StatusFailed {
				out = append(out, r)
			}
		}
		return out
	}
	dups := 0
	for _, op := range in.Oracle.Operations {
		if _, ours := specByKey[op.MerchantReference]; !ours {
			i1.fail("operation %q at the provider is not one of the campaign's refunds", op.MerchantReference)
		}
		if op.Refunds > 1 || len(op.MerchantReferences) > 1 || len(op.IdempotencyKeys) > 1 {
			dups++
			i1.fail("operation %s: %d live refunds %v (references %v, keys %v)%s", op.MerchantReference, op.Refunds,
				op.RefundIDs, op.MerchantReferences, op.IdempotencyKeys, historyOf(jobByKey[op.MerchantReference], events))
		}
	}
	for _, p := range in.Oracle.Payments {
		if p.OverRefunded {
			i1.fail("payment %s over-refunded: %d of %d minor units in %v", p.PaymentID, p.RefundedMinor, p.AmountMinor, p.RefundIDs)
		}
	}
	v.DoubleRefunds = max(in.Oracle.DoubleRefunds, dups)
	if in.Oracle.DoubleRefunds > 0 {
		i1.Failed = true
	}
	i1.Summary = fmt.Sprintf("%d refunds at the provider for %d operations; oracle double_refunds=%d",
		len(in.Oracle.Refunds), len(in.Oracle.Operations), in.Oracle.DoubleRefunds)

	// 2. Presence and final states.
	unacked := 0
	for _, j := range in.DB.Jobs {
		if _, ours := specByKey[j.Key]; !ours {
			i2.fail("job %d has operation key %q, which the campaign never enqueued", j.ID, j.Key)
		}
		if _, ok := in.Acked[j.Key]; !ok {
			unacked++
		}
	}
	missing := 0
	for key, id := range in.Acked {
		j, ok := jobByKey[key]
		switch {
		case !ok:
			missing++
			i2.fail("LOST: job %d (%s) was enqueued and acknowledged but is not in refund_jobs", id, key)
		case j.ID != id:
			i2.fail("job for %s: acknowledged as %d, stored as %d", key, id, j.ID)
		}
	}
	unfinished := 0
	for _, j := range in.DB.Jobs {
		switch j.State {
		case "succeeded":
			v.Succeeded++
			continue
		case "manual_review":
			v.Review++
			continue
		}
		unfinished++
		op, _ := in.Oracle.Operation(j.Key)
		refunds := live(op)
		pendingAtProvider := slices.ContainsFunc(refunds, func(r fakeprovider.Refund) bool { return r.Status == fakeprovider.StatusPending })
		desc := fmt.Sprintf("job %d (%s) is %s, next_action %s at %s, lease_until %s, last reason %q; provider: %s%s",
			j.ID, j.Key, j.State, j.NextAction, j.NextAttemptAt.Format("15:04:05.000"), nullTime(j.LeaseUntil),
			j.LastReason, describeRefunds(refunds), historyOf(j, events))
		if pendingAtProvider {
			v.Pending++
			i2.note("pending (R4, the provider still says pending): %s", desc)
		} else {
			i2.fail("NOT FINAL: %s", desc)
		}
	}
	v.Lost = missing + unfinished - v.Pending
	i2.Summary = fmt.Sprintf("%d acknowledged, %d rows (%d enqueued without acknowledgement); %d succeeded, "+
		"%d manual_review, %d legitimately pending, %d missing, %d not final",
		len(in.Acked), len(in.DB.Jobs), unacked, v.Succeeded, v.Review, v.Pending, missing, unfinished-v.Pending)

	// 3 and 4. The history of each job.
	claims, takeovers, writes := 0, 0, 0
	for _, j := range in.DB.Jobs {
		h := walkHistory(j, events[j.ID])
		claims += h.claims
		takeovers += h.takeovers
		writes += h.writes
		for _, p := range h.attemptProblems {
			i3.fail("job %d (%s): %s%s", j.ID, j.Key, p, historyOf(j, events))
		}
		for _, p := range h.staleWrites {
			v.StaleWritesAccepted++
			i4.fail("job %d (%s): %s%s", j.ID, j.Key, p, historyOf(j, events))
		}
	}
	for id := range events {
		if _, ok := jobByID[id]; !ok {
			i3.fail("history of job %d, which is not in refund_jobs", id)
		}
	}
	// A history entry records the row's attempt and holder, which the fence
	// makes the writer's own; the workers' side shows a write that slipped
	// through anyway: accepted under an attempt with no such write in the
	// history (R9), or a "replayed" answer with no first write (R21).
	for _, a := range in.Acks {
		if slices.ContainsFunc(events[a.JobID], func(e eventRow) bool { return e.Kind == a.Kind && e.Attempt == a.Attempt }) {
			continue
		}
		v.StaleWritesAccepted++
		i4.fail("job %d: %s was told its %s write-back under attempt %d succeeded (replayed=%v), but the history has no "+
			"such write under that attempt%s", a.JobID, a.Worker, a.Kind, a.Attempt, a.Replayed, historyOf(jobByID[a.JobID], events))
	}
	i3.Summary = fmt.Sprintf("%d events: %d claims, %d takeovers", len(in.DB.Events), claims, takeovers)
	replayed := 0
	for _, a := range in.Acks {
		if a.Replayed {
			replayed++
		}
	}
	i4.Summary = fmt.Sprintf("%d write-backs in the histories, each under the attempt current then; workers' logs: "+
		"%d write-backs accepted (%d of them replayed, R21) and checked against the history, %d rejected by the fence",
		writes, len(in.Acks), replayed, in.StaleRejections)

	// 5. Receipts of stale workers.
	observed := map[[2]int64]bool{}    // a success on file for (job, attempt)
	observedAny := map[[2]int64]bool{} // any outcome on file
	for _, o := range in.DB.Observations {
		k := [2]int64{o.JobID, o.ReportedAttempt}
		observedAny[k] = true
		if o.Outcome == "succeeded" {
			observed[k] = true
		}
	}
	counts := map[string]int{}
	died, unfiled, unverifiable, noAnswer := 0, 0, 0, 0
	for _, r := range in.Receipts {
		counts[r.Why]++
		k := [2]int64{r.JobID, r.Attempt}
		node := strings.HasSuffix(r.Why, "_node")
		switch {
		case observed[k], node && observedAny[k]:
			continue
		case strings.HasPrefix(r.Why, "write_failed") && completedUnder(events[r.JobID], r.Attempt):
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
		v.UnobservedLateSuccess++
		i5.fail("job %d attempt %d: %s saw the provider's success %s (%s) but no observation has it: %s%s",
			r.JobID, r.Attempt, r.Worker, r.RefundID, r.Why, or(r.Filed, "no filing logged"), historyOf(jobByID[r.JobID], events))
	}
	i5.Summary = fmt.Sprintf("%d provider successes not written back (%d rejected as stale, %d write-backs failed, "+
		"%d late answers); %d observations on file, %d of them successes; %d died with a killed worker, "+
		"%d unfiled after a failed write-back", counts["stale"]+counts["write_failed"]+counts["late"], counts["stale"],
		counts["write_failed"], counts["late"], len(in.DB.Observations), len(observed), died, unfiled)
	if n := counts["stale_node"] + counts["write_failed_node"] + counts["late_node"]; n > 0 {
		i5.Summary += fmt.Sprintf("; Node.js workers: %d write-backs rejected as stale, failed or late (%d with no provider "+
			"answer to keep, %d with one of unknown outcome left unfiled; their logs do not say the outcome)", n, noAnswer, unverifiable)
	}

	// 6. Ledger, jobs and provider.
	ledger := map[int64]ledgerRow{}
	for _, l := range in.DB.Ledger {
		ledger[l.JobID] = l
		if _, ok := jobByID[l.JobID]; !ok {
			i6.fail("ledger row for job %d, which is not in refund_jobs", l.JobID)
		}
	}
	reviewWithRefund := 0
	for _, j := range in.DB.Jobs {
		l, inLedger := ledger[j.ID]
		op, _ := in.Oracle.Operation(j.Key)
		refunds := live(op)
		if j.State != "succeeded" {
			if inLedger {
				i6.fail("job %d (%s) is %s but has a ledger row (%s, attempt %d)%s", j.ID, j.Key, j.State,
					l.ProviderRefundID, l.Attempt, historyOf(j, events))
			}
			if j.State == "manual_review" && len(refunds) > 0 {
				reviewWithRefund++
			}
			continue
		}
		switch {
		case !inLedger:
			i6.fail("job %d (%s) succeeded without a ledger row%s", j.ID, j.Key, historyOf(j, events))
			continue
		case l.ProviderRefundID != j.ProviderRefundID || l.Attempt != j.Attempt || l.Key != j.Key:
			i6.fail("job %d (%s): ledger says %s attempt %d key %s, the job %s attempt %d%s", j.ID, j.Key,
				l.ProviderRefundID, l.Attempt, l.Key, j.ProviderRefundID, j.Attempt, historyOf(j, events))
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
		"provider (a person resolves them)", len(in.DB.Ledger), v.Succeeded, reviewWithRefund)
	return v
}

// history is what walkHistory found in one job's events.
type history struct {
	claims, takeovers, writes int
	attemptProblems           []string // invariant 3
	staleWrites               []string // invariant 4
}

// walkHistory replays one job's events in id order: the attempt must start at
// 0, step by exactly one on each claim or takeover and never go down; a
// takeover sets next action reconcile (R6); each write-back must be made
// under the attempt of the latest claim or takeover while the job was
// running (the fence, R9); there is at most one completion and nothing
// follows it; the row agrees with the end of its history (state, attempt,
// next action, refund id) — a row changed without a history entry shows
// there.
func walkHistory(j jobRow, evs []eventRow) history {
	var h history
	cur, maxAttempt := int64(0), int64(0)
	state := ""
	completed := false
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
		if completed {
			h.staleWrites = append(h.staleWrites, fmt.Sprintf("event %d (%s, attempt %d) after the completion", e.ID, e.Kind, e.Attempt))
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
			cur = e.Attempt
		case "completed", "rescheduled", "escalated":
			h.writes++
			if e.Attempt != cur || state != "running" {
				h.staleWrites = append(h.staleWrites, fmt.Sprintf("%s event %d under attempt %d while the current attempt was %d "+
					"and the job %s", e.Kind, e.ID, e.Attempt, cur, state))
			}
			completed = completed || e.Kind == "completed"
		case "resolved":
			if e.Attempt != cur || state != "manual_review" {
				h.staleWrites = append(h.staleWrites, fmt.Sprintf("resolved event %d under attempt %d while the current attempt was %d "+
					"and the job %s", e.ID, e.Attempt, cur, state))
			}
			completed = completed || e.ToState == "succeeded"
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
		if e.ProviderRefundID != "" {
			fmt.Fprintf(&b, " refund=%s", e.ProviderRefundID)
		}
	}
	return b.String()
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
