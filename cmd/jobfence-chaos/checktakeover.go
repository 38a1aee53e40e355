package main

// Renewal: no live worker that renews its leases was taken over
// (invariant 10).

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// takeoverInput is what invariant 10 knows besides the histories and the
// workers' logs: who each worker was, and when the campaign's faults could
// keep a worker's lease renewals from the database.
type takeoverInput struct {
	Lease time.Duration
	// Start is the campaign's start: details give times as the timeline does.
	Start   time.Time
	Workers map[string]workerFacts // by worker id
	Outages []outage
}

// workerFacts is one worker process as invariant 10 sees it.
type workerFacts struct {
	Kind    workerKind
	Renews  bool // it renews its leases while a job's provider calls run (R27)
	Patient bool // its provider-call deadline outlasts the provider-slow calls
	Replica string
	Frozen  []span
	// Ended is when the campaign sent it SIGKILL or SIGTERM, or it exited;
	// zero when it ran to the end.
	Ended time.Time
}

// outage is a fault that may keep workers' renewals from the database: a
// coordinator down (from its kill until a new process serves, whether the
// fault or the heal restarted it), a fault on one replica's database
// connections, a database failover.
type outage struct {
	What    string
	N       int    // the fault's number; 0 for a coordinator down
	Replica string // the replica whose workers it hit; "" for every replica
	From    time.Time
	To      time.Time // zero: until the end
}

// takeoverSlackStart is how much earlier than the earliest time a fault
// could cost a lease a takeover may be and still be its effect: the clocks
// of the history and of the campaign are matched to a few milliseconds.
const takeoverSlackStart = 50 * time.Millisecond

// takeoverTally is what invariant 10 counts for the verdict.
type takeoverTally struct {
	Takeovers int // taken_over events in the histories (takeovers)
	False     int // takeovers of a live renewing worker (false_takeovers)
}

// impairment is a stretch of time in which a worker's renewals could not
// reach the database (To zero: until the end), and what caused it.
type impairment struct {
	From, To time.Time
	Why      string
}

// Kinds of outage for impairmentsOf: a stall holds renewals until it ends
// (they may then succeed late, logging nothing); a fast failure fails them
// at once, and the worker logs each failed renewal or write-back (a commit
// cut is neither: it cuts at most four COMMITs, and a renewal it fails is
// repeated at once). A stream cut is a fast failure: the renewal in flight
// is answered UNAVAILABLE and repeated, and so is every renewal while the
// worker cannot connect again (R27).
var (
	stallOutages    = map[string]bool{string(faultDBLatency): true, string(faultDBBlackhole): true, string(faultDBFailover): true}
	fastFailOutages = map[string]bool{"coordinator down": true, string(faultDBDown): true, string(faultDBReset): true,
		string(faultCoordinatorStreamCut): true}
)

// streamEndSlack is how long after a grant was made its holder's log may
// show its worker stream ending and the grant still have been on its way
// (lost with the stream): the coordinator sends a grant the moment it
// commits, so the stream ended before it could arrive.
const streamEndSlack = time.Second

// impairmentsOf lists what kept a worker's renewals from the database, in
// order of start: every freeze, its end (a kill or the stop) on, a stall of
// its replica's database or of every replica's (a failover), and a fast
// failure of its coordinator, of its connections to it (a stream cut) or of
// its replica's database while its log shows a renewal or a write-back
// failing (a holder that tried nothing during the outage lost nothing to
// it). Each lasts, beyond its end, for as long as the log shows such calls
// failing within a lease of it (failures, its failed calls, sorted).
func impairmentsOf(wf workerFacts, outages []outage, failures []time.Time, lease time.Duration) []impairment {
	var out []impairment
	for _, sp := range wf.Frozen {
		out = append(out, impairment{From: sp.From, To: sp.To, Why: "frozen"})
	}
	if !wf.Ended.IsZero() {
		out = append(out, impairment{From: wf.Ended, Why: "killed-or-stopped"})
	}
	for _, o := range outages {
		if o.Replica != "" && o.Replica != wf.Replica {
			continue
		}
		why := "database-fault"
		switch {
		case o.What == "coordinator down":
			why = "coordinator-down"
		case o.What == string(faultCoordinatorStreamCut):
			why = "stream-cut"
		case o.Replica == "":
			why = "failover"
		}
		switch {
		case stallOutages[o.What]:
		case fastFailOutages[o.What]:
			if !slices.ContainsFunc(failures, func(f time.Time) bool {
				return !f.Before(o.From) && (o.To.IsZero() || !f.After(o.To.Add(lease)))
			}) {
				continue
			}
		default:
			continue
		}
		out = append(out, impairment{From: o.From, To: o.To, Why: why})
	}
	for i := range out {
		if out[i].To.IsZero() {
			continue
		}
		for _, f := range failures {
			if f.After(out[i].To) && !f.After(out[i].To.Add(lease)) {
				out[i].To = f
			}
		}
	}
	slices.SortFunc(out, func(a, b impairment) int { return a.From.Compare(b.From) })
	return out
}

// checkNoFalseTakeover is invariant 10 (R8, R27): a worker that renews its
// leases is never taken over while it lives. It renews at a third of the
// lease (±10 %), so after its last renewal its lease has two thirds of a
// lease to run: a fault can cost it the lease only when it began at least a
// third of a lease before the takeover (with room for a slow renewal) and
// held the worker's renewals until a lease before it or later (the room a
// renewal needs after a fault: a gRPC reconnect, the client's backoff, a
// pool refilling). So every taken_over event of a grant (the claim or
// takeover of the attempt before) whose holder renews must fall in such a
// window of an impairment of the holder (impairmentsOf): frozen, killed or
// stopped, its replica's database stalled (db-latency, db-blackhole) or
// failing over, or its coordinator down, its connections to it cut
// (coordinator-stream-cut: R27's renewals failing while it reconnects) or
// its replica's database refusing (db-down, db-reset) while its log shows
// renewals or write-backs failing. Or the takeover came after the holder
// let the grant go (its log shows the write-back's outcome, a late answer
// or the grant lost, before the takeover), or took a grant its holder
// never learnt of: a claim whose COMMIT's reply was lost grants nothing
// (R7), and a grant the coordinator had written to a worker stream that
// ended before it arrived (a cut, a dying coordinator: the holder's log
// shows its stream ending as the grant was made) is as lost, the
// coordinator handing back only what it could not write; its lease runs
// out into a takeover (R6). Anything else is a false takeover: a live
// holder lost its job to the clock. Takeovers of workers that do not renew
// are counted, not judged (R17 keeps their provider calls inside the lease
// instead).
func checkNoFalseTakeover(in checkInput, x *checkFacts) (i10 *invariant, t takeoverTally) {
	i10 = &invariant{N: 10, Name: "no live worker that renews its leases was taken over: each takeover of a renewing " +
		"worker's grant came while a fault held it from renewing (R8, R27)"}
	for _, w := range x.walked {
		t.Takeovers += w.h.takeovers
	}
	ti := in.Takeovers
	if ti == nil {
		i10.Summary = fmt.Sprintf("%d takeovers; not judged: the campaign's workers and faults are not known", t.Takeovers)
		return i10, t
	}
	offset := time.Duration(0)
	if !in.DB.ReadAt.IsZero() && !in.DB.Now.IsZero() {
		offset = in.DB.ReadAt.Sub(in.DB.Now)
	}
	at := func(tm time.Time) string {
		if ti.Start.IsZero() {
			return tm.Format("15:04:05.000")
		}
		return fmt.Sprintf("+%.3fs", tm.Sub(ti.Start).Seconds())
	}
	failures := map[string][]time.Time{}
	for w, fs := range in.CallFailures {
		failures[w] = slices.SortedFunc(slices.Values(fs), func(a, b time.Time) int { return a.Compare(b) })
	}
	impaired := map[string][]impairment{}
	for w, wf := range ti.Workers {
		impaired[w] = impairmentsOf(wf, ti.Outages, failures[w], ti.Lease)
	}
	ofGrant := func(key string, id int64, attempt int64, j jobRow) bool {
		return attempt != 0 && ((key != "" && key == j.Key) || (key == "" && id == j.ID))
	}

	excused := map[string]int{}
	notRenewing := map[string]int{}
	unknown := 0
	for _, wj := range x.walked {
		j := wj.job
		evs := x.events[j.ID]
		for n, e := range evs {
			if e.Kind != "taken_over" {
				continue
			}
			var prev *eventRow
			for k := n - 1; k >= 0; k-- {
				if (evs[k].Kind == "claimed" || evs[k].Kind == "taken_over") && evs[k].Attempt == e.Attempt-1 {
					prev = &evs[k]
					break
				}
			}
			if prev == nil {
				continue // invariant 3 tells
			}
			holder := prev.WorkerID
			wf, ok := ti.Workers[holder]
			switch {
			case !ok:
				unknown++
				continue
			case !wf.Renews:
				notRenewing[kindOf(wf)]++
				continue
			}
			tm := e.At.Add(offset)
			why := ""
			var near []string // the holder's impairments in the two leases before, for the details
			for _, m := range impaired[holder] {
				if why == "" && !tm.Before(m.From.Add(ti.Lease/3-takeoverSlackStart)) &&
					(m.To.IsZero() || !tm.After(m.To.Add(ti.Lease))) {
					why = m.Why
				}
				if !m.From.After(tm) && (m.To.IsZero() || m.To.After(tm.Add(-2*ti.Lease))) {
					near = append(near, fmt.Sprintf("%s from %s to %s", m.Why, at(m.From), or(optAt(m.To, at), "the end")))
				}
			}
			var faults []string // the faults on the holder's path in the two leases before, for the details
			for _, o := range ti.Outages {
				if (o.Replica == "" || o.Replica == wf.Replica) && !o.From.After(tm) &&
					(o.To.IsZero() || o.To.After(tm.Add(-2*ti.Lease))) {
					desc := o.What
					if o.N > 0 {
						desc = fmt.Sprintf("%s #%d", o.What, o.N)
					}
					if o.Replica != "" {
						desc += " on " + o.Replica
					}
					faults = append(faults, fmt.Sprintf("%s from %s to %s", desc, at(o.From), or(optAt(o.To, at), "the end")))
				}
			}
			var after string // what the holder did with the grant after the takeover, for the details
			if why == "" {
				for _, r := range in.Releases {
					if r.Worker != holder || r.Attempt != prev.Attempt || !ofGrant(r.Key, r.JobID, r.Attempt, j) {
						continue
					}
					if r.Seen.Before(tm) {
						why = "let-go"
						break
					}
					if after == "" {
						after = fmt.Sprintf("; at %s %s", at(r.Seen), r.Why)
					}
				}
			}
			if why == "" && !slices.ContainsFunc(in.Grants, func(g grantLog) bool {
				return g.Worker == holder && g.Attempt == prev.Attempt && ofGrant(g.Key, g.JobID, g.Attempt, j)
			}) {
				// Nobody renews what nobody knows it holds (R7); one lost
				// with its stream waited for its lease like a lost Claim
				// answer (R6).
				why = "grant-unknown-R7"
				made := prev.At.Add(offset)
				if slices.ContainsFunc(in.StreamEnds[holder], func(e time.Time) bool {
					return !e.Before(made.Add(-takeoverSlackStart)) && !e.After(made.Add(streamEndSlack))
				}) {
					why = "grant-lost-with-stream-R6"
				}
			}
			if why != "" {
				excused[why]++
				continue
			}
			t.False++
			kind := kindOf(wf)
			if wf.Patient {
				kind += ", patient"
			}
			recent := 0
			for _, f := range failures[holder] {
				if !f.After(tm) && f.After(tm.Add(-ti.Lease)) {
					recent++
				}
			}
			i10.fail("FALSE TAKEOVER: job %d (%s): event %d, %s took attempt %d over at %s from %s (%s, renewing, on %s), "+
				"whose grant (event %d at %s) nothing the campaign did could have cost: nothing held it from renewing that began "+
				"by %s (a third of a lease before) and lasted to %s (a lease before); what held it in the two leases before: %s; "+
				"faults on its path then: %s; failed renewals or write-backs in its log in the lease before: %d%s%s", j.ID, j.Key, e.ID,
				or(e.WorkerID, "(no worker)"), e.Attempt, at(tm), holder, kind, wf.Replica, prev.ID, at(prev.At.Add(offset)),
				at(tm.Add(-ti.Lease/3)), at(tm.Add(-ti.Lease)), orNone(near), orNone(faults), recent, after, x.historyOf(j))
		}
	}
	judged := 0
	for _, n := range excused {
		judged += n
	}
	judged += t.False
	i10.Summary = fmt.Sprintf("%d takeovers; %d of a renewing worker's grant: %d while a fault held the holder or after it "+
		"let the grant go (%s), %d false; %d of workers that do not renew, not judged (%s); %d of holders the campaign did "+
		"not run", t.Takeovers, judged, judged-t.False, formatCounts(excused), t.False, countOf(notRenewing),
		formatCounts(notRenewing), unknown)
	if n, longest := heldPastLease(in, ti); n > 0 {
		i10.Summary += fmt.Sprintf("; %d grants of renewing workers held past their lease, unfrozen, and written back "+
			"with no takeover (the longest %s)", n, longest.Round(100*time.Millisecond))
	}
	return i10, t
}

// heldPastLease counts the grants of renewing workers held longer than a
// lease, never frozen, whose write-back was accepted: what renewal kept
// from a takeover (R27), or, fewer, a lapsed lease nobody claimed in time;
// and the longest of them.
func heldPastLease(in checkInput, ti *takeoverInput) (n int, longest time.Duration) {
	type ref struct {
		worker, key  string
		job, attempt int64
	}
	granted := map[ref]time.Time{}
	for _, g := range in.Grants {
		if ti.Workers[g.Worker].Renews && !g.Seen.IsZero() {
			granted[ref{g.Worker, g.Key, g.JobID, g.Attempt}] = g.Seen
		}
	}
	for _, r := range in.Releases {
		from, ok := granted[ref{r.Worker, r.Key, r.JobID, r.Attempt}]
		if !ok || !strings.HasSuffix(r.Why, "was accepted") {
			continue
		}
		frozen := slices.ContainsFunc(ti.Workers[r.Worker].Frozen, func(sp span) bool {
			return sp.From.Before(r.Seen) && (sp.To.IsZero() || sp.To.After(from))
		})
		if d := r.Seen.Sub(from); d > ti.Lease && !frozen {
			n++
			longest = max(longest, d)
		}
	}
	return n, longest
}

// kindOf names a worker's kind for the details.
func kindOf(w workerFacts) string { return w.Kind.String() }

// optAt formats t with format, or "" for the zero time.
func optAt(t time.Time, format func(time.Time) string) string {
	if t.IsZero() {
		return ""
	}
	return format(t)
}

// countOf sums a count map.
func countOf(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
