package main

import (
	"fmt"
	"time"
)

// A worker's log, read into typed records once. Two workers write them: the
// Go one (cmd/refundworker: the Go SDK's slog JSON) and the Node.js example
// worker (clients/node examples/refund-worker: JSON lines). Both name the job
// on every line of it by job_id, operation_key and attempt (the Node worker
// writes its int64s as strings) and, since R25, the grant by its
// fingerprint. They differ in the messages of an accepted write-back, a
// takeover, a failed write-back and a late answer. Which worker wrote a log
// is known from its process (workerLog.Node), not from its lines; the
// checks read the Node.js worker's rejections and filings as of unknown
// outcome (docs/CHAOS.md, notes on 5).

// jobRef is the job and attempt a worker's line is about.
type jobRef struct {
	Key     string // operation_key; "" when the line lacks it
	JobID   int64
	Attempt int64
}

// workerLine is one typed line of a worker's log: one of the *Line types
// below.
type workerLine interface{ job() jobRef }

func (r jobRef) job() jobRef { return r }

type (
	// grantLine is a grant the worker was given: "job claimed" (both
	// workers; refundworker's also for a takeover) and the Node.js worker's
	// "job taken over".
	grantLine struct {
		jobRef
		Grant string // fingerprint; "" when the line lacks it
		Seen  time.Time
	}
	// writtenLine is a write-back the coordinator accepted (replayed or
	// not): refundworker's "job written" (decision complete, reschedule or
	// escalate) and the Node.js worker's "job completed", "job rescheduled"
	// and "job escalated to manual review".
	writtenLine struct {
		jobRef
		Kind     string // the history's event kind: completed, rescheduled or escalated
		Replayed bool
		Grant    string // fingerprint of the grant the write carried; "" when the line lacks it
		Seen     time.Time
	}
	// rejectedLine is a write-back the fence rejected (R9), whose answer the
	// worker goes on to file as an observation: "write-back rejected by the
	// fence; filing the answer as an observation".
	rejectedLine struct {
		jobRef
		Decision string // what the write carried: "complete" when the provider said refunded; "" when the line does not say
		Seen     time.Time
	}
	// writeFailedLine is a write-back that failed (the coordinator
	// unreachable, its retries spent): refundworker's "…the lease will
	// expire…" and the Node.js worker's "…the lease will lapse…".
	writeFailedLine struct {
		jobRef
		Decision string // as in rejectedLine
		Seen     time.Time
	}
	// lateLine is a provider call that outlived its deadline (its answer,
	// if one comes, is filed as an observation): refundworker's "handler
	// outlived the provider-call deadline…" and the Node.js worker's
	// "provider call outlived its deadline…".
	lateLine struct {
		jobRef
		Seen time.Time
	}
	// grantLostLine is a renewal that found the grant gone (R27): the
	// worker cancels the handler. Both workers' "grant lost…".
	grantLostLine struct {
		jobRef
		Seen time.Time
	}
	// callFailedLine is a call about the grants a worker holds that
	// failed, the coordinator or its database away: a lease renewal (R27;
	// both workers' "lease renewal failed; …") or a try of a renewal or a
	// write-back that refundworker's client repeats ("jobfence: repeating
	// call" of RenewLeases, Complete, Reschedule or Escalate). It names no
	// job: one renewal call renews all of a worker's due jobs, and the
	// client's line does not say.
	callFailedLine struct {
		jobRef
		Seen time.Time
	}
	// observationLine is the end of a filing (R15): "observation filed"
	// (Filed), or one of the lines of a filing that failed.
	observationLine struct {
		jobRef
		Filed    bool
		Outcome  string // the provider's answer filed ("succeeded", …); "" when the line does not say
		RefundID string
		Error    string // why it was not filed
		Seen     time.Time
	}
	// keyLine is any other line that names a job by operation key: it names
	// the job of the attempt's later lines that lack the key.
	keyLine struct{ jobRef }
)

// workerLog is one worker process's log.
type workerLog struct {
	Worker string
	// Node: the Node.js example worker, whose rejection and filing lines
	// are read as of unknown outcome (docs/CHAOS.md, notes on 5).
	Node bool
	// Killed: the campaign SIGKILLed the process, which may have died
	// between a rejection and its filing.
	Killed bool
	Lines  []workerLine
}

// Messages of the lines the checks read; Go: refundworker's only, JS: the
// Node.js worker's only.
const (
	msgClaimed       = "job claimed"
	msgTakenOver     = "job taken over" // JS
	msgWritten       = "job written"    // Go, with the decision
	msgRejected      = "write-back rejected by the fence; filing the answer as an observation"
	msgObservedFiled = "observation filed"
	msgWriteFailedGo = "write-back failed; the lease will expire and a takeover reconciles"
	msgWriteFailedJS = "write-back failed; the lease will lapse and a takeover reconciles"
	msgLateGo        = "handler outlived the provider-call deadline; outcome unknown"
	msgLateJS        = "provider call outlived its deadline; outcome unknown"
	msgNotFiledGo    = "observation not filed: the provider's answer is only in this log"
	msgNotFiledJS    = "filing an observation failed"
	msgNotFiled      = "observation not filed" // neither worker logs it now; read as before
	msgGrantLostGo   = "grant lost; cancelling the handler before it sends anything new (R27)"
	msgGrantLostJS   = "grant lost: the provider call is cancelled and nothing new is sent (R27)"
	msgRenewFailedGo = "lease renewal failed; trying again soon"
	msgRenewFailedJS = "lease renewal failed; tried again sooner, nothing aborted (R27)"
	msgRepeatingGo   = "jobfence: repeating call" // with the method, of grantCalls
)

// grantCalls are the methods of the calls about a held grant: a renewal,
// a write-back.
var grantCalls = map[string]bool{"RenewLeases": true, "Complete": true, "Reschedule": true, "Escalate": true}

// The history's event kind of an accepted write-back's line: refundworker's
// "job written" by its decision, the Node.js worker's by its message.
var (
	writtenKindOfDecision = map[string]string{"complete": "completed", "reschedule": "rescheduled", "escalate": "escalated"}
	writtenKindOfMsg      = map[string]string{"job completed": "completed", "job rescheduled": "rescheduled",
		"job escalated to manual review": "escalated"}
)

// parseWorkerLines types the JSON records of a worker's log, in their order;
// records that are none of the lines above and name no operation key are
// left out.
func parseWorkerLines(recs []map[string]any) []workerLine {
	var out []workerLine
	for _, r := range recs {
		if l := parseWorkerLine(r); l != nil {
			out = append(out, l)
		}
	}
	return out
}

func parseWorkerLine(r map[string]any) workerLine {
	ref := jobRef{Key: str(r["operation_key"]), JobID: num(r["job_id"]), Attempt: num(r["attempt"])}
	msg := str(r["msg"])
	switch msg {
	case msgClaimed, msgTakenOver:
		return grantLine{jobRef: ref, Grant: str(r["grant"]), Seen: seenAt(r)}
	case msgRejected:
		return rejectedLine{jobRef: ref, Decision: str(r["decision"]), Seen: seenAt(r)}
	case msgWriteFailedGo, msgWriteFailedJS:
		return writeFailedLine{jobRef: ref, Decision: str(r["decision"]), Seen: seenAt(r)}
	case msgLateGo, msgLateJS:
		return lateLine{jobRef: ref, Seen: seenAt(r)}
	case msgGrantLostGo, msgGrantLostJS:
		return grantLostLine{jobRef: ref, Seen: seenAt(r)}
	case msgRenewFailedGo, msgRenewFailedJS:
		return callFailedLine{Seen: seenAt(r)}
	case msgRepeatingGo:
		if grantCalls[str(r["method"])] {
			return callFailedLine{Seen: seenAt(r)}
		}
		return nil
	case msgObservedFiled, msgNotFiledGo, msgNotFiledJS, msgNotFiled:
		return observationLine{jobRef: ref, Filed: msg == msgObservedFiled, Outcome: str(r["outcome"]),
			RefundID: str(r["provider_refund_id"]), Error: str(r["error"]), Seen: seenAt(r)}
	}
	kind := writtenKindOfMsg[msg]
	if msg == msgWritten {
		kind = writtenKindOfDecision[str(r["decision"])]
	}
	if kind != "" {
		replayed, _ := r["replayed"].(bool)
		return writtenLine{jobRef: ref, Kind: kind, Replayed: replayed, Grant: str(r["grant"]), Seen: seenAt(r)}
	}
	if ref.Key != "" {
		return keyLine{ref}
	}
	return nil
}

// str is a record's string field; "" when absent or not a string.
func str(v any) string {
	s, _ := v.(string)
	return s
}

// num is a record's integer field: a JSON number (the Go worker's) or a
// decimal string (the Node.js worker's int64s); 0 otherwise.
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

// receiptsOf reads a worker's receipts from its log, and counts its
// write-backs rejected by the fence. A rejected or failed write-back is a
// receipt when it carried a provider success (decision complete); a late
// answer when the worker files it as a success. The Node.js worker's lines
// are read as saying neither what the rejected write-back carried nor the
// outcome of the observation it filed: each of its rejected, failed or late
// write-backs is a receipt of unknown outcome (Why ends in "_node").
func receiptsOf(l workerLog) (out []receipt, staleRejections int) {
	type key struct{ job, attempt int64 }
	open := map[key]int{} // receipt index waiting for its filing line
	late := map[key]bool{}
	suffix := ""
	if l.Node {
		suffix = "_node"
	}
	carriedSuccess := func(decision string) bool { return l.Node || decision == "complete" }
	keys := map[key]string{}
	add := func(k key, why string) {
		open[k] = len(out)
		out = append(out, receipt{Worker: l.Worker, Key: keys[k], JobID: k.job, Attempt: k.attempt, Why: why + suffix})
	}
	for _, line := range l.Lines {
		ref := line.job()
		k := key{ref.JobID, ref.Attempt}
		if ref.Key != "" {
			keys[k] = ref.Key
		}
		switch line := line.(type) {
		case rejectedLine:
			staleRejections++
			if carriedSuccess(line.Decision) {
				add(k, "stale")
			}
		case writeFailedLine:
			if carriedSuccess(line.Decision) {
				add(k, "write_failed")
			}
		case lateLine:
			late[k] = true
		case observationLine:
			if !l.Node && line.Outcome != "succeeded" {
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
			out[i].FiledAt = line.Seen
			out[i].RefundID = line.RefundID
			if line.Filed {
				out[i].Filed = "filed"
			} else {
				out[i].Filed = "not filed: " + line.Error
			}
		}
	}
	for _, i := range open {
		out[i].Killed = l.Killed
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

// acksOf reads the write-backs the coordinator accepted from a worker's log.
func acksOf(l workerLog) []ack {
	var out []ack
	for _, line := range l.Lines {
		if w, ok := line.(writtenLine); ok {
			out = append(out, ack{Worker: l.Worker, Key: w.Key, JobID: w.JobID, Attempt: w.Attempt, Kind: w.Kind,
				Replayed: w.Replayed, Grant: w.Grant, Seen: w.Seen})
		}
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

// grantsOf reads the grants a worker logged.
func grantsOf(l workerLog) []grantLog {
	var out []grantLog
	for _, line := range l.Lines {
		if g, ok := line.(grantLine); ok {
			out = append(out, grantLog{Worker: l.Worker, Key: g.Key, JobID: g.JobID, Attempt: g.Attempt, Grant: g.Grant,
				Seen: g.Seen})
		}
	}
	return out
}

// release is a line that shows a worker done with a grant: its handler
// returned (the write-back's outcome, a late answer) or a renewal found the
// grant gone. From then on the worker renews that lease no more (R27).
type release struct {
	Worker  string
	Key     string
	JobID   int64
	Attempt int64
	Why     string
	Seen    time.Time
}

// releasesOf reads the grants a worker let go, and when its calls about the
// grants it held failed (renewals, write-backs).
func releasesOf(l workerLog) (out []release, callFailures []time.Time) {
	keys := map[[2]int64]string{}
	for _, line := range l.Lines {
		ref := line.job()
		if ref.Key != "" {
			keys[[2]int64{ref.JobID, ref.Attempt}] = ref.Key
		}
		var why string
		var seen time.Time
		switch line := line.(type) {
		case writtenLine:
			why, seen = "its "+line.Kind+" write-back was accepted", line.Seen
		case rejectedLine:
			why, seen = "its write-back was rejected by the fence", line.Seen
		case writeFailedLine:
			why, seen = "its write-back failed", line.Seen
			callFailures = append(callFailures, line.Seen)
		case lateLine:
			why, seen = "its handler outlived the provider-call deadline", line.Seen
		case grantLostLine:
			why, seen = "a renewal found the grant gone", line.Seen
		case callFailedLine:
			callFailures = append(callFailures, line.Seen)
			continue
		default:
			continue
		}
		out = append(out, release{Worker: l.Worker, Key: keys[[2]int64{ref.JobID, ref.Attempt}], JobID: ref.JobID,
			Attempt: ref.Attempt, Why: why, Seen: seen})
	}
	return out, callFailures
}

// addWorkerLog adds what the checks read from one worker's log to the input:
// its receipts and fence rejections, its accepted write-backs, its grants,
// the grants it let go and its failed calls about them.
func (in *checkInput) addWorkerLog(l workerLog) {
	rs, stale := receiptsOf(l)
	in.Receipts = append(in.Receipts, rs...)
	in.StaleRejections += stale
	in.Acks = append(in.Acks, acksOf(l)...)
	in.Grants = append(in.Grants, grantsOf(l)...)
	released, failures := releasesOf(l)
	in.Releases = append(in.Releases, released...)
	if len(failures) > 0 {
		if in.CallFailures == nil {
			in.CallFailures = map[string][]time.Time{}
		}
		in.CallFailures[l.Worker] = append(in.CallFailures[l.Worker], failures...)
	}
}
