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
		// Grant is the fingerprint of the event's lease_token_hash (R25):
		// lowercase hex of its first 6 bytes, as workers log it; "" for none.
		// On claimed and taken_over the new grant, on a holder's write-back
		// the grant the writer carried.
		Grant string
	}
	observationRow struct {
		ID               int64
		JobID            int64
		Key              string
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
	// A database from before R25 has no lease_token_hash: its grants have no
	// fingerprint.
	var tokenCols int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
  AND TABLE_NAME = 'refund_job_events' AND COLUMN_NAME = 'lease_token_hash'`).Scan(&tokenCols); err != nil {
		return st, err
	}
	grant := "''"
	if tokenCols > 0 {
		grant = "LOWER(HEX(LEFT(lease_token_hash, 6)))"
	}
	err = scanRows(ctx, tx, `SELECT id, job_id, attempt, kind, worker_id, from_state, to_state, next_action,
  provider_refund_id, `+grant+` FROM refund_job_events ORDER BY id`, func(r *sql.Rows) error {
		var e eventRow
		err := r.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.WorkerID, &e.FromState, &e.ToState, &e.NextAction,
			&e.ProviderRefundID, &e.Grant)
		st.Events = append(st.Events, e)
		return err
	})
	if err != nil {
		return st, err
	}
	err = scanRows(ctx, tx, `SELECT id, job_id, operation_key, reported_attempt, job_attempt, source, outcome,
  provider_refund_id FROM refund_observations ORDER BY id`, func(r *sql.Rows) error {
		var o observationRow
		err := r.Scan(&o.ID, &o.JobID, &o.Key, &o.ReportedAttempt, &o.JobAttempt, &o.Source, &o.Outcome, &o.ProviderRefundID)
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
	Key      string // the job's operation key, when the line names it
	JobID    int64
	Attempt  int64
	Why      string // "stale", "write_failed" or "late"
	RefundID string
	Filed    string // "filed", "not filed: <error>", or "" when the worker logged neither
	FiledAt  time.Time
	Killed   bool // the worker was SIGKILLed by the campaign before it logged the filing
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
	keys := map[key]string{}
	add := func(k key, why string) {
		open[k] = len(out)
		out = append(out, receipt{Worker: worker, Key: keys[k], JobID: k.job, Attempt: k.attempt, Why: why + suffix})
	}
	for _, r := range recs {
		k := key{num(r["job_id"]), num(r["attempt"])}
		if opKey, _ := r["operation_key"].(string); opKey != "" {
			keys[k] = opKey
		}
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
		case "observation filed", "observation not filed", "filing an observation failed",
			"observation not filed: the provider's answer is only in this log":
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
			out[i].FiledAt = seenAt(r)
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
	Key      string // the job's operation key ("" when the line lacks it)
	JobID    int64
	Attempt  int64
	Kind     string // the history's event kind: completed, rescheduled or escalated
	Replayed bool
	Grant    string    // the fingerprint of the grant the write carried; "" when the line lacks it
	Seen     time.Time // when the campaign read the line
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
		key, _ := r["operation_key"].(string)
		grant, _ := r["grant"].(string)
		out = append(out, ack{Worker: worker, Key: key, JobID: num(r["job_id"]), Attempt: num(r["attempt"]), Kind: kind,
			Replayed: replayed, Grant: grant, Seen: seenAt(r)})
	}
	return out
}

// grantLog is a grant a worker logged: its line of a claim or takeover.
type grantLog struct {
	Worker  string
	Key     string
	JobID   int64
	Attempt int64
	Grant   string // fingerprint; "" when the line lacks it
	Seen    time.Time
}

// grantsOf reads the grants a worker logged: refundworker's and the Node.js
// worker's "job claimed", the Node.js worker's "job taken over".
func grantsOf(worker string, recs []map[string]any) []grantLog {
	var out []grantLog
	for _, r := range recs {
		if r["msg"] != "job claimed" && r["msg"] != "job taken over" {
			continue
		}
		key, _ := r["operation_key"].(string)
		grant, _ := r["grant"].(string)
		out = append(out, grantLog{Worker: worker, Key: key, JobID: num(r["job_id"]), Attempt: num(r["attempt"]),
			Grant: grant, Seen: seenAt(r)})
	}
	return out
}

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

// check evaluates the seven invariants.
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
	i7 := inv(7, "no write accepted from a grant the surviving database never saw (R25, R26)")
	fo := in.Failover
	lossless := fo != nil && fo.Mode == failoverSemiSync

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
	// jobOf is the job a worker's line is about: by its operation key when
	// the line names it (after a failover the survivor may have given the
	// job another id, and the id to another job), else by id.
	jobOf := func(key string, id int64) jobRow {
		if key != "" {
			return jobByKey[key]
		}
		return jobByID[id]
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
	if fo != nil {
		// Acknowledged enqueues the old primary committed last are gone with
		// it; the producer enqueued every acknowledged one again (R1), so
		// they are above among the acknowledged, present and final.
		v.EnqueuesLost = len(in.EnqueuesLost)
		i2.Summary += fmt.Sprintf("; %d acknowledged enqueues lost in the failover and re-driven", v.EnqueuesLost)
		for _, k := range in.EnqueuesLost {
			if lossless {
				i2.fail("LOST IN A LOSSLESS FAILOVER: the acknowledged enqueue of %s was not on the new primary", k)
			} else {
				i2.note("enqueue of %s lost in the failover (acknowledged by the old primary), re-driven", k)
			}
		}
	}

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
		for _, p := range h.grantProblems {
			v.StaleWritesAccepted++
			i7.fail("job %d (%s): %s%s", j.ID, j.Key, p, historyOf(j, events))
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
		j := jobOf(a.Key, a.JobID)
		if slices.ContainsFunc(events[j.ID], func(e eventRow) bool { return e.Kind == a.Kind && e.Attempt == a.Attempt }) {
			continue
		}
		if fo != nil {
			continue // lost in the failover, or not: invariant 7 tells
		}
		v.StaleWritesAccepted++
		i4.fail("job %d: %s was told its %s write-back under attempt %d succeeded (replayed=%v), but the history has no "+
			"such write under that attempt%s", a.JobID, a.Worker, a.Kind, a.Attempt, a.Replayed, historyOf(j, events))
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
	obsKey := map[[2]int64]string{} // the operation key the observation of (job, attempt) was filed under
	for _, o := range in.DB.Observations {
		obsKey[[2]int64{o.JobID, o.ReportedAttempt}] = o.Key
	}
	counts := map[string]int{}
	died, unfiled, unverifiable, noAnswer, misfiled := 0, 0, 0, 0, 0
	for _, r := range in.Receipts {
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
			v.ObservationsLost++
			if lossless {
				i5.fail("LOST IN A LOSSLESS FAILOVER: job %d attempt %d: %s filed the provider's success %s before the kill; "+
					"it is not on file", r.JobID, r.Attempt, r.Worker, r.RefundID)
			} else {
				i5.note("job %d attempt %d: %s's observation (%s, %s) was filed on the old primary and lost in the failover",
					r.JobID, r.Attempt, r.Worker, r.RefundID, r.Why)
			}
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
	if fo != nil {
		i5.Summary += fmt.Sprintf("; %d filed on the old primary and lost in the failover, %d filed under a job id the "+
			"new primary gave another refund", v.ObservationsLost, misfiled)
	}
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

	checkGrants(in, &v, i7, events, jobOf)
	if fo != nil {
		i6.Summary += fmt.Sprintf("; %d completions accepted by the old primary were lost in the failover with their "+
			"ledger rows (each job completed again on the new primary, checked above)", v.lostCompletions)
	}
	return v
}

// checkGrants is invariant 7, from the workers' side: every grant a worker
// logged is in the history (or was lost in a failover), and every write-back
// it was told succeeded is in the history under the very grant it carried,
// which is the grant the history shows for its attempt — or was accepted by
// the old primary before a failover and lost with it. A write under the
// right attempt and the wrong grant is the ABA that tokens prevent (R25,
// R26). Lines without a grant fingerprint (a Node.js worker that does not
// log it) are checked by attempt alone.
func checkGrants(in checkInput, v *verdict, i7 *invariant, events map[int64][]eventRow, jobOf func(string, int64) jobRow) {
	fo := in.Failover
	lossless := fo != nil && fo.Mode == failoverSemiSync
	// grantOf[job][attempt] is the fingerprint of the claim or takeover
	// that granted it (invariant 3 says there is one per attempt).
	grantOf := map[int64]map[int64]string{}
	for _, e := range in.DB.Events {
		if e.Kind == "claimed" || e.Kind == "taken_over" {
			if grantOf[e.JobID] == nil {
				grantOf[e.JobID] = map[int64]string{}
			}
			grantOf[e.JobID][e.Attempt] = e.Grant
		}
	}
	weakGrants, lostListed := 0, 0
	for _, g := range in.Grants {
		j := jobOf(g.Key, g.JobID)
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
			v.GrantsLost++
			if lossless {
				i7.fail("LOST IN A LOSSLESS FAILOVER: %s is not in the new primary's history%s", what, historyOf(j, events))
			} else if lostListed < 10 {
				lostListed++
				i7.note("grant lost in the failover: %s (the new primary's history has %s)", what, describeGrant(fp, had))
			}
			continue
		}
		i7.fail("%s is not in the history (it has %s): the grant was not made by the database that survived%s", what,
			describeGrant(fp, had), historyOf(j, events))
	}
	if !lossless && v.GrantsLost > lostListed {
		i7.note("… and %d more grants lost in the failover", v.GrantsLost-lostListed)
	}

	weakAcks, byGrant, writesListed := 0, 0, 0
	for _, a := range in.Acks {
		j := jobOf(a.Key, a.JobID)
		var write *eventRow
		for n, e := range events[j.ID] {
			if e.Kind == a.Kind && e.Attempt == a.Attempt && (a.Grant == "" || e.Grant == a.Grant) {
				write = &events[j.ID][n]
				break
			}
		}
		what := fmt.Sprintf("%s's %s write-back of job %d (%s) under attempt %d, grant %s (replayed=%v)", a.Worker, a.Kind,
			a.JobID, a.Key, a.Attempt, or(a.Grant, "(no fingerprint)"), a.Replayed)
		switch {
		case write != nil && a.Grant == "":
			weakAcks++
			continue
		case write != nil:
			byGrant++
			if fp := grantOf[j.ID][a.Attempt]; fp != a.Grant {
				v.StaleWritesAccepted++
				i7.fail("ABA: %s was accepted, but the history's grant of attempt %d is %s: a writer that knew the "+
					"attempt without holding the grant%s", what, a.Attempt, or(fp, "(none)"), historyOf(j, events))
			}
			continue
		case fo == nil:
			continue // invariant 4 reports it
		case fo.mayPredateKill(a.Worker, a.Seen):
			v.WritesLost++
			if a.Kind == "completed" {
				v.lostCompletions++
			}
			if lossless {
				i7.fail("LOST IN A LOSSLESS FAILOVER: %s, accepted before the kill, is not in the new primary's history%s",
					what, historyOf(j, events))
			} else if writesListed < 10 {
				writesListed++
				i7.note("write lost in the failover: %s, accepted by the old primary", what)
			}
		default:
			v.StaleWritesAccepted++
			i7.fail("%s was accepted after the failover, but the new primary's history has no such write under that "+
				"grant%s", what, historyOf(j, events))
		}
	}
	if !lossless && v.WritesLost > writesListed {
		i7.note("… and %d more write-backs lost in the failover", v.WritesLost-writesListed)
	}
	i7.Summary = fmt.Sprintf("%d grants logged by the workers, each in the history under its fingerprint; %d write-backs "+
		"accepted, %d of them matched to the history by grant", len(in.Grants)-v.GrantsLost, len(in.Acks)-v.WritesLost, byGrant)
	if weakGrants+weakAcks > 0 {
		i7.Summary += fmt.Sprintf("; %d grants and %d write-backs by attempt alone (their log lines carry no grant)",
			weakGrants, weakAcks)
	}
	if fo != nil {
		i7.Summary += fmt.Sprintf("; failover (%s): %d grants and %d accepted write-backs lost with the old primary",
			fo.Mode, v.GrantsLost, v.WritesLost)
	}
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

// history is what walkHistory found in one job's events.
type history struct {
	claims, takeovers, writes int
	attemptProblems           []string // invariant 3
	staleWrites               []string // invariant 4
	grantProblems             []string // invariant 7
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
	curGrant := ""
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
			cur, curGrant = e.Attempt, e.Grant
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
		if e.Grant != "" {
			fmt.Fprintf(&b, " grant=%s", e.Grant)
		}
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
