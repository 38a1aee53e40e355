package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// applyStreamCut cuts every connection between replica f.Slot and its
// workers, the coordinator left running: their worker streams end
// mid-flight, with them grants on their way (handed back by the
// coordinator when it could not write them; one it had written is lost
// with the stream, and its lease runs out into a takeover, R6, R7) and
// calls in flight, a write-back perhaps between its COMMIT and its reply
// (the SDK repeats it, answered replayed, R21). New connections are
// refused for f.For, then the front takes them again and the workers
// reconnect. On cue the cut comes f.Delay after the provider made the
// refund of a job one of them claimed (AfterRefund), or after the producer
// sent an enqueue through the replica (AtEnqueue), and the timeline tells
// what became of that job's write-back or grant.
func (s *system) applyStreamCut(ctx context.Context, f fault) (string, error) {
	r := s.replicas[f.Slot]
	var ps []*proc
	var kinds []workerKind
	for _, w := range s.workers {
		if p := w.current(); w.replica == r && p != nil && !p.exited() {
			ps, kinds = append(ps, p), append(kinds, w.kind)
		}
	}
	if len(ps) == 0 {
		return "no worker of the replica running", nil
	}
	before := recordCounts(ps)
	var holder *proc
	var claim map[string]any
	cue := ""
	switch {
	case f.AfterRefund:
		var skip string
		if holder, claim, skip = s.claimedRefund(ctx, ps); skip != "" {
			return skip, nil
		}
		cue = fmt.Sprintf(" (%s's job %v, %v, attempt %v)", holder.name, claim["job_id"], claim["operation_key"],
			claim["attempt"])
	case f.AtEnqueue:
		var ok bool
		if cue, ok = s.enqueueCues.wait(ctx, f.Slot, min(5*time.Second, time.Until(deadlineOf(ctx)))); !ok {
			return "the producer sent no enqueue through " + r.name + " within 5s", nil
		}
	}
	time.Sleep(f.Delay)
	marks := recordCounts(ps)
	o := s.noteOutage(outage{What: string(f.Kind), N: f.N, Replica: r.name, From: time.Now()})
	r.workerFront.Down()
	cutAt := time.Now()
	s.cueCut(r.name)
	enqueued := cue
	if f.AtEnqueue {
		cue = " (the enqueue of " + cue + ")"
	}
	s.tl.printf("fault #%d %s%s", f.N, f, cue)
	sleepCtx(ctx, f.For)
	err := r.workerFront.Up()
	s.endOutage(o)
	if err != nil {
		return "", err // heal opens it again
	}
	// Each worker logs the end of its stream as it meets the cut.
	ended := make([]bool, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() {
			_, err := p.waitRecord(time.Until(cutAt.Add(f.For+time.Second)), marks[i], func(rec map[string]any) bool {
				_, ok := parseWorkerLine(rec).(streamEndedLine)
				return ok
			})
			ended[i] = err == nil
		})
	}
	wg.Wait()
	var names []string
	for i, p := range ps {
		if ended[i] {
			names = append(names, p.name)
		}
	}
	s.tl.printf("fault #%d end: %s's workers connect again; streams ended in the logs of %s", f.N, r.name, orNone(names))
	outcome := ""
	switch {
	case holder != nil:
		outcome = "write-back " + s.writeBackAfterCut(ctx, f, holder, before[slices.Index(ps, holder)], claim, cutAt)
	case f.AtEnqueue:
		outcome = "grant " + s.grantAfterCut(ctx, f, enqueued)
	}
	s.cuts.add(kinds, ended, outcome)
	return "", nil
}

// writeBackAfterCut waits (up to 2 leases, within the window) for holder's
// line of the outcome of claim's write-back, looking from its record from
// on, prints it and returns its class for the summary: accepted, replayed
// (the cut fell between its COMMIT and its reply, R21), accepted before the
// cut, rejected, failed, or none logged.
func (s *system) writeBackAfterCut(ctx context.Context, f fault, holder *proc, from int, claim map[string]any,
	cutAt time.Time) string {
	key, attempt := str(claim["operation_key"]), num(claim["attempt"])
	wait := min(2*s.cfg.lease, time.Until(deadlineOf(ctx)))
	rec, err := holder.waitRecord(wait, from, func(rec map[string]any) bool {
		switch l := parseWorkerLine(rec).(type) {
		case writtenLine, rejectedLine, writeFailedLine:
			return l.job().Key == key && l.job().Attempt == attempt
		}
		return false
	})
	what := fmt.Sprintf("fault #%d: %s's write-back of job %v (%s, attempt %d)", f.N, holder.name, claim["job_id"], key, attempt)
	if err != nil {
		s.tl.printf("%s: no outcome logged within %s", what, round(wait))
		return "none logged"
	}
	switch l := parseWorkerLine(rec).(type) {
	case writtenLine:
		switch {
		case l.Seen.Before(cutAt):
			s.tl.printf("%s: %s before the cut", what, l.Kind)
			return "accepted before the cut"
		case l.Replayed:
			s.tl.printf("%s: %s, replayed: the cut fell between its COMMIT and its reply, and the repeat was answered "+
				"from the row (R21)", what, l.Kind)
			return "replayed"
		}
		s.tl.printf("%s: %s after the cut, not replayed (the cut came before its COMMIT)", what, l.Kind)
		return "accepted"
	case rejectedLine:
		s.tl.printf("%s: rejected by the fence (decision %s)", what, or(l.Decision, "not logged"))
		return "rejected"
	case writeFailedLine:
		s.tl.printf("%s: failed, its repeats spent (decision %s); its lease runs out and a takeover reconciles", what,
			or(l.Decision, "not logged"))
		return "failed"
	}
	return "none logged"
}

// grantAfterCut follows, for up to 2 leases and a second after the front
// opened again (within the window), what became of the job of key, whose
// enqueue the producer sent just before the cut; it prints it and returns
// its class for the summary: handed back (the coordinator could not deliver
// the grant, docs/DESIGN.md "The worker stream"), delivered (its holder
// logged it), lost with its stream (neither logged nor handed back, and
// taken over once its lease ran out, R6, R7), not logged by then (none of
// these yet), not made by then, or unknown (the database did not answer
// by then).
func (s *system) grantAfterCut(ctx context.Context, f fault, key string) string {
	what := fmt.Sprintf("fault #%d: the job of %s", f.N, key)
	deadline := time.Now().Add(2*s.cfg.lease + time.Second)
	for {
		evs, err := s.historyOfKey(ctx, key)
		last := !time.Now().Before(deadline) || ctx.Err() != nil
		switch {
		case err != nil && last:
			s.tl.printf("%s: history not read: %v", what, err)
			return "unknown"
		case err != nil:
			// A failover moves the campaign's handle to the new primary.
			sleepCtx(ctx, 250*time.Millisecond)
			continue
		}
		i := slices.IndexFunc(evs, func(e eventRow) bool { return e.Kind == "claimed" })
		if i < 0 {
			if last {
				s.tl.printf("%s: not granted by then", what)
				return "not made by then"
			}
			sleepCtx(ctx, 250*time.Millisecond)
			continue
		}
		g := evs[i]
		j := slices.IndexFunc(evs, func(e eventRow) bool { return isHandBack(e) && e.Attempt == g.Attempt })
		switch {
		case j >= 0:
			s.tl.printf("%s: granted to %s (attempt %d) and handed back by the coordinator: %q", what, g.WorkerID,
				g.Attempt, evs[j].Reason)
			return "handed back"
		case s.workerLogged(g.WorkerID, key, g.Attempt):
			s.tl.printf("%s: granted to %s (attempt %d), who logged it", what, g.WorkerID, g.Attempt)
			return "delivered"
		case slices.ContainsFunc(evs, func(e eventRow) bool { return e.Kind == "taken_over" && e.Attempt == g.Attempt+1 }):
			s.tl.printf("%s: granted to %s (attempt %d), neither logged by it nor handed back, and taken over when its "+
				"lease ran out: lost with its stream (R6, R7)", what, g.WorkerID, g.Attempt)
			return "lost with its stream"
		case last:
			s.tl.printf("%s: granted to %s (attempt %d), neither logged by it, handed back nor taken over by then", what,
				g.WorkerID, g.Attempt)
			return "not logged by then"
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

// historyOfKey reads the history of the job of key (kind, attempt, worker
// and reason of each event), on the campaign's own handle: from the archive
// once the job left the working tables (R31).
func (s *system) historyOfKey(ctx context.Context, key string) ([]eventRow, error) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	const history = `SELECT e.id, e.kind, e.attempt, e.worker_id, e.reason FROM refund_job_events%[1]s e
  JOIN refund_jobs%[1]s j ON j.id = e.job_id WHERE j.operation_key = ?`
	query, args := fmt.Sprintf(history, ""), []any{key}
	if s.cfg.retainSucceeded > 0 {
		query += "\nUNION ALL\n" + fmt.Sprintf(history, "_archive")
		args = append(args, key)
	}
	rows, err := s.db().QueryContext(qctx, query+"\nORDER BY id", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var evs []eventRow
	for rows.Next() {
		var e eventRow
		if err := rows.Scan(&e.ID, &e.Kind, &e.Attempt, &e.WorkerID, &e.Reason); err != nil {
			return nil, err
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

// workerLogged reports whether the worker process with id logged a grant
// of key's job under attempt.
func (s *system) workerLogged(id, key string, attempt int64) bool {
	for _, w := range s.workers {
		w.mu.Lock()
		procs := slices.Clone(w.procs)
		w.mu.Unlock()
		for _, wp := range procs {
			if wp.id != id {
				continue
			}
			return slices.ContainsFunc(wp.p.allRecords(), func(rec map[string]any) bool {
				g, ok := parseWorkerLine(rec).(grantLine)
				return ok && g.Key == key && g.Attempt == attempt
			})
		}
	}
	return false
}

// recordCounts is each process's record count now.
func recordCounts(ps []*proc) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.recordCount()
	}
	return out
}

// enqueueCues lets a coordinator-stream-cut wait for the producer's next
// enqueue through a replica: armed by the fault (wait), fired by the
// producer just before it sends one (fire).
type enqueueCues struct {
	mu    sync.Mutex
	armed map[int]chan string // by replica index: the operation key of the enqueue that fired it
}

// wait arms the cue of replica and waits up to d (or ctx) for it to fire;
// it returns the enqueued operation key.
func (c *enqueueCues) wait(ctx context.Context, replica int, d time.Duration) (string, bool) {
	ch := make(chan string, 1)
	c.mu.Lock()
	if c.armed == nil {
		c.armed = map[int]chan string{}
	}
	c.armed[replica] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.armed[replica] == ch {
			delete(c.armed, replica)
		}
		c.mu.Unlock()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case key := <-ch:
		return key, true
	case <-t.C:
	case <-ctx.Done():
	}
	return "", false
}

// fire tells a cut armed on replica that the enqueue of key is being sent;
// it never blocks.
func (c *enqueueCues) fire(replica int, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch := c.armed[replica]; ch != nil {
		ch <- key
		delete(c.armed, replica)
	}
}

// streamCutTally is what the coordinator-stream-cut faults did, for the
// campaign's output.
type streamCutTally struct {
	mu   sync.Mutex
	cuts int
	// cut counts, by kind of worker, the workers running on the replica at
	// a cut, ended those whose log showed their stream ending then.
	cut, ended map[workerKind]int
	// outcomes of the write-backs and grants in flight at a cue
	// (writeBackAfterCut, grantAfterCut), "write-back replayed", "grant
	// handed back"…
	outcomes map[string]int
}

func (t *streamCutTally) add(kinds []workerKind, ended []bool, outcome string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended == nil {
		t.ended, t.cut, t.outcomes = map[workerKind]int{}, map[workerKind]int{}, map[string]int{}
	}
	t.cuts++
	for i, k := range kinds {
		t.cut[k]++
		if ended[i] {
			t.ended[k]++
		}
	}
	if outcome != "" {
		t.outcomes[outcome]++
	}
}

// summary is the campaign's line about the stream cuts; "" when there was
// none.
func (t *streamCutTally) summary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cuts == 0 {
		return ""
	}
	var kinds []string
	for _, k := range []workerKind{goWorker, nodeWorker, pythonWorker} {
		if t.cut[k] > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d of %d", k, t.ended[k], t.cut[k]))
		}
	}
	cues := map[string]int{}
	for _, what := range []string{"write-back ", "grant "} {
		for o, n := range t.outcomes {
			if strings.HasPrefix(o, what) {
				cues[what] += n
			}
		}
	}
	outcomes := make([]string, 0, len(t.outcomes))
	for o, n := range t.outcomes {
		outcomes = append(outcomes, fmt.Sprintf("%s=%d", o, n))
	}
	slices.Sort(outcomes)
	return fmt.Sprintf("worker streams cut: %d cuts, %d on a write-back in flight and %d at an enqueue (what became of "+
		"it: %s); workers whose log showed their stream ending at a cut: %s", t.cuts, cues["write-back "], cues["grant "],
		orNone(outcomes), strings.Join(kinds, ", "))
}
