package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
)

// A worker's log, read into typed records once. Three workers write them:
// the Go one (cmd/refundworker: the Go SDK's slog JSON), the Node.js example
// worker (clients/node examples/refund-worker: JSON lines) and the Python
// example worker (clients/python/examples/refund_worker.py: the logging
// module's records as JSON lines, the Python SDK's worker.py, job.py,
// receipts.py and client.py writing most of them). All name the job on
// every line of it by job_id, operation_key and attempt (the Node worker
// writes its int64s as strings) and, since R25, the grant by its
// fingerprint. The Python SDK words its lines as the Go SDK does, but for
// a takeover, which it logs as the Node.js worker does ("job taken over");
// the Node.js worker differs in the messages of an accepted write-back, a
// takeover, a failed write-back and one repeated, a late answer, a lost
// grant, a failed renewal and a failed filing. All three log the end of a
// worker stream alike. Which worker wrote a log is known from its process
// (workerLog.Kind), not from its lines; the checks read the Node.js
// worker's rejections and filings as of unknown outcome (docs/CHAOS.md,
// notes on 5).

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
	// grantLine is a grant the worker was given: "job claimed" (every
	// worker; refundworker's also for a takeover) and the Node.js and Python
	// workers' "job taken over".
	grantLine struct {
		jobRef
		Grant string // fingerprint; "" when the line lacks it
		Seen  time.Time
	}
	// writtenLine is a write-back the coordinator accepted (replayed or
	// not): refundworker's and the Python worker's "job written" (decision
	// complete, reschedule or escalate) and the Node.js worker's "job
	// completed", "job rescheduled" and "job escalated to manual review".
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
	// unreachable, its retries spent): refundworker's and the Python
	// worker's "…the lease will expire…" and the Node.js worker's "…the
	// lease will lapse…".
	writeFailedLine struct {
		jobRef
		Decision string // as in rejectedLine
		Seen     time.Time
	}
	// lateLine is a provider call that outlived its deadline (its answer,
	// if one comes, is filed as an observation): refundworker's and the
	// Python worker's "handler outlived the provider-call deadline…" and
	// the Node.js worker's "provider call outlived its deadline…".
	lateLine struct {
		jobRef
		Seen time.Time
	}
	// grantLostLine is a renewal that found the grant gone (R27): the
	// worker cancels the handler. Every worker's "grant lost…".
	grantLostLine struct {
		jobRef
		Seen time.Time
	}
	// callFailedLine is a call about the grants a worker holds that
	// failed, the coordinator or its database away: a lease renewal (R27;
	// every worker's "lease renewal failed; …") or a try of a renewal or a
	// write-back that refundworker's or the Python worker's client repeats
	// ("jobfence: repeating call" of RenewLeases, Complete, Reschedule or
	// Escalate), or the Node.js worker's write-back repeated after
	// UNAVAILABLE. It names no job but the Node.js line's: one renewal call
	// renews all of a worker's due jobs, and the client's line does not say.
	callFailedLine struct {
		jobRef
		Seen time.Time
	}
	// observationLine is the end of a filing (R15): "observation filed"
	// (Filed), one of the lines of a filing that failed, or of a receipt
	// the coordinator could not take kept in the worker's receipt spool
	// (Spooled, R28) and filed from it later ("spooled receipt filed":
	// Filed and Refiled) or refused for good and dropped from it (Dropped),
	// logged by whichever process of the slot did it. The Go and Python
	// workers' carry the outcome and refund id.
	observationLine struct {
		jobRef
		Filed    bool
		Spooled  bool
		Refiled  bool
		Dropped  bool
		Outcome  string // the provider's answer filed ("succeeded", …); "" when the line does not say
		RefundID string
		Error    string // why it was not filed
		Seen     time.Time
	}
	// streamEndedLine is a worker stream that ended with an error (its
	// coordinator gone, draining or cut off), which the worker opens again:
	// a claim failure, since the stream is how it takes its grants. A grant
	// the coordinator had written to it just before is lost with it (R7's
	// "no job" from the worker's side; its lease runs out into a takeover,
	// R6). Every SDK's "worker stream ended; opening it again", with the
	// error (the Node.js one's also without, at info, for a stream the
	// coordinator ended cleanly). It names no job.
	streamEndedLine struct {
		jobRef
		Error string
		Seen  time.Time
	}
	// keyLine is any other line that names a job by operation key: it names
	// the job of the attempt's later lines that lack the key.
	keyLine struct{ jobRef }
)

// workerLog is one worker process's log.
type workerLog struct {
	Worker string
	// Kind: which worker wrote it; the Node.js example worker's rejection
	// and filing lines are read as of unknown outcome (weakReceipts).
	Kind workerKind
	// Killed: the campaign SIGKILLed the process, which may have died
	// between a rejection and its filing.
	Killed bool
	Lines  []workerLine
}

// Messages of the lines the checks read; Go: refundworker's and the Python
// worker's (its SDK words them alike) only, JS: the Node.js worker's only.
const (
	msgClaimed       = "job claimed"
	msgTakenOver     = "job taken over" // JS and the Python worker's
	msgWritten       = "job written"    // Go, with the decision
	msgRejected      = "write-back rejected by the fence; filing the answer as an observation"
	msgObservedFiled = "observation filed"
	msgWriteFailedGo = "write-back failed; the lease will expire and a takeover reconciles"
	msgWriteFailedJS = "write-back failed; the lease will lapse and a takeover reconciles"
	msgLateGo        = "handler outlived the provider-call deadline; outcome unknown"
	msgLateJS        = "provider call outlived its deadline; outcome unknown"
	msgNotFiledGo    = "observation not filed: the provider's answer is only in this log"
	msgNotFiledJS    = "filing an observation failed"
	msgNotFiled      = "observation not filed" // no worker logs it now; read as before
	msgNotSpooledGo  = "observation neither filed nor spooled: the provider's answer is only in this log"
	// The receipt spool's (R28): spooled and refiled, every worker's (the
	// Node.js one's too); dropped, refundworker's (the Python worker marks
	// its line of a failed filing dropped_from_spool).
	msgSpooled       = "observation not filed; spooled, to be filed when the coordinator takes it (R28)"
	msgRefiled       = "spooled receipt filed"
	msgDroppedGo     = "spooled receipt refused for good, dropped from the spool: the provider's answer is only in this log"
	msgGrantLostGo   = "grant lost; cancelling the handler before it sends anything new (R27)"
	msgGrantLostJS   = "grant lost: the provider call is cancelled and nothing new is sent (R27)"
	msgRenewFailedGo = "lease renewal failed; trying again soon"
	msgRenewFailedJS = "lease renewal failed; tried again sooner, nothing aborted (R27)"
	msgRepeatingGo   = "jobfence: repeating call" // with the method, of grantCalls
	msgRepeatedJS    = "write-back repeated after UNAVAILABLE (R21)"
	msgStreamEnded   = "worker stream ended; opening it again" // every SDK's
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
	case msgRepeatedJS:
		return callFailedLine{jobRef: ref, Seen: seenAt(r)}
	case msgRepeatingGo:
		if grantCalls[str(r["method"])] {
			return callFailedLine{Seen: seenAt(r)}
		}
		return nil
	case msgStreamEnded:
		return streamEndedLine{Error: str(r["error"]), Seen: seenAt(r)}
	case msgObservedFiled, msgNotFiledGo, msgNotFiledJS, msgNotFiled, msgNotSpooledGo, msgSpooled, msgRefiled, msgDroppedGo:
		// The Python worker drops a spooled receipt with the line of a
		// filing that failed, marked dropped_from_spool.
		dropped, _ := r["dropped_from_spool"].(bool)
		return observationLine{jobRef: ref, Filed: msg == msgObservedFiled || msg == msgRefiled, Spooled: msg == msgSpooled,
			Refiled: msg == msgRefiled, Dropped: dropped || msg == msgDroppedGo, Outcome: str(r["outcome"]),
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

// num is a record's integer field: a JSON number (the Go and Python
// workers') or a decimal string (the Node.js worker's int64s); 0 otherwise.
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
	// Filed is how the worker's log says it ended: receiptFiled,
	// receiptRefiled, "spooled: <error>" (in the slot's receipt spool, to be
	// filed by this process or the one replacing it, R28), "not filed:
	// <error>", "dropped from the spool: <error>", or "" when the worker
	// logged none of these.
	Filed   string
	FiledAt time.Time
	Killed  bool // the worker was SIGKILLed by the campaign before it logged the filing
}

// The ends of a receipt's filing that put it on file (receipt.Filed).
const (
	receiptFiled   = "filed"
	receiptRefiled = "filed from the spool"
)

// filed reports whether the worker logged the receipt on file.
func (r receipt) filed() bool { return r.Filed == receiptFiled || r.Filed == receiptRefiled }

// weakReceipts reports whether the checks read a kind's rejection and
// filing lines as saying neither what the rejected write-back carried nor
// the outcome of the observation filed (docs/CHAOS.md, notes on 5): the
// Node.js worker's, a choice kept so that an older Node worker's log still
// checks. The Python worker is judged as strictly as refundworker (R15):
// its SDK logs the decision a rejected or failed write-back carried
// (job.py's JobRunner._write: decision complete means the provider said
// refunded) and the outcome and refund id of every observation it files or
// fails to file (receipts.py's Receipts.file), so a success it saw and
// did not get on file is a failure, not an answer of unknown outcome.
func (k workerKind) weakReceipts() bool { return k == nodeWorker }

// receiptsOf reads a worker's receipts from its log, and counts its
// write-backs rejected by the fence. A rejected or failed write-back is a
// receipt when it carried a provider success (decision complete); a late
// answer when the worker files it as a success. The lines of a kind with
// weakReceipts are read as saying neither: each of its rejected, failed or
// late write-backs is a receipt of unknown outcome (Why ends in "_node").
func receiptsOf(l workerLog) (out []receipt, staleRejections int) {
	type key struct{ job, attempt int64 }
	open := map[key]int{}    // receipt index waiting for its filing line
	spooled := map[key]int{} // receipt index in the spool, waiting for its refiling line
	late := map[key]bool{}
	weak := l.Kind.weakReceipts()
	suffix := ""
	if weak {
		suffix = "_node"
	}
	carriedSuccess := func(decision string) bool { return weak || decision == "complete" }
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
			if !weak && line.Outcome != "succeeded" {
				continue
			}
			if line.Refiled || line.Dropped {
				// Filed from the spool or dropped from it: a receipt this
				// process spooled, or one a killed process of the slot left
				// there (its own log says it spooled it; the database says
				// whether it is on file).
				if i, ok := spooled[k]; ok {
					delete(spooled, k)
					out[i].FiledAt = line.Seen
					if out[i].Filed = receiptRefiled; line.Dropped {
						out[i].Filed = "dropped from the spool: " + line.Error
					}
				}
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
			switch {
			case line.Filed:
				out[i].Filed = receiptFiled
			case line.Spooled:
				out[i].Filed = "spooled: " + line.Error
				spooled[k] = i
			default:
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
// its kind, its receipts and fence rejections, its accepted write-backs, its grants,
// the grants it let go, its failed calls about them and the ends of its
// worker streams.
func (in *checkInput) addWorkerLog(l workerLog) {
	if in.Kinds == nil {
		in.Kinds = map[string]workerKind{}
	}
	in.Kinds[l.Worker] = l.Kind
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
	for _, line := range l.Lines {
		// A stream the coordinator ended cleanly (the Node.js worker logs
		// it without an error) lost no grant: it was answered in full.
		if e, ok := line.(streamEndedLine); ok && e.Error != "" {
			if in.StreamEnds == nil {
				in.StreamEnds = map[string][]time.Time{}
			}
			in.StreamEnds[l.Worker] = append(in.StreamEnds[l.Worker], e.Seen)
		}
	}
}

// spoolLeft is a receipt a worker left in its slot's receipt spool (R28):
// still there when the campaign stopped the workers, for the slot's next
// worker to file. The lease token of the line is never read.
type spoolLeft struct {
	Spool    string // the spool file
	Key      string
	JobID    int64
	Attempt  int64
	Outcome  string
	RefundID string
}

// spoolName is the receipt spool of slot idx (0-based) in the run's folder:
// every worker of the slot, a killed one's replacement too, keeps it.
func spoolName(idx int) string { return fmt.Sprintf("slot-%d.receipts.jsonl", idx+1) }

// readSpool reads what is left in a receipt spool, in the lines the Go,
// Node.js and Python SDKs share (job_id and attempt as decimal strings). A
// missing file holds nothing (an empty spool's file is removed); an
// unfinished last line, a crash in the middle of an append, holds nothing
// either (the SDKs cut it off); any other line the campaign cannot read is
// an error.
func readSpool(path string) ([]spoolLeft, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []spoolLeft
	lines := bytes.Split(data, []byte{'\n'})
	for n, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal(line, &r); err != nil {
			if n == len(lines)-1 {
				break // unfinished
			}
			return out, fmt.Errorf("%s line %d: %w", path, n+1, err)
		}
		out = append(out, spoolLeft{Spool: path, Key: str(r["operation_key"]), JobID: num(r["job_id"]),
			Attempt: num(r["attempt"]), Outcome: str(r["outcome"]), RefundID: str(r["provider_refund_id"])})
	}
	return out, nil
}
