package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/internal/mariadbpair"
)

// failoverFacts is what the db-failover fault did, for the timeline, the
// checks (kill and repoint times split what a lossy failover may have lost
// from what the survivor must have) and the summary.
type failoverFacts struct {
	mu          sync.Mutex
	Mode        string
	Applied     bool // the replica was promoted and the proxies repointed
	HeldAt      time.Time
	KilledAt    time.Time
	RepointedAt time.Time
	PrimaryGTID string // the old primary's @@gtid_binlog_pos just before the kill
	ReplicaGTID string // the promoted replica's @@gtid_current_pos
	Err         error
	// Reconnected names, per replica, how its coordinator came back: a
	// process that lived through the failover and answered from the new
	// primary without a restart, or why it is no evidence of that.
	Reconnected []string
	Problems    []string
}

func (f *failoverFacts) problem(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Problems = append(f.Problems, fmt.Sprintf(format, args...))
}

// startPair starts the campaign's own MariaDB primary and replica (their
// datadirs and error logs under dir, kept with the logs of a failing
// campaign) and points c.dsn at the primary.
func startPair(ctx context.Context, c *config, dir string, tl *timeline) (*mariadbpair.Pair, string, error) {
	// A --log-dir used before may hold an earlier campaign's pair.
	pairDir := filepath.Join(dir, "mariadb")
	for n := 2; ; n++ {
		if _, err := os.Stat(pairDir); errors.Is(err, os.ErrNotExist) {
			break
		}
		pairDir = filepath.Join(dir, fmt.Sprintf("mariadb-%d", n))
	}
	if err := os.MkdirAll(pairDir, 0o755); err != nil {
		return nil, "", err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	p, err := mariadbpair.Start(sctx, mariadbpair.Options{SemiSync: c.failover == failoverSemiSync, Dir: pairDir,
		Logf: tl.printf})
	if err != nil {
		return nil, pairDir, err
	}
	if c.dsn, err = mysql.ParseDSN(p.DSN(p.PrimaryAddr(), "")); err != nil {
		p.Close()
		return nil, pairDir, err
	}
	return p, pairDir, nil
}

// workerProcNow is a worker slot's current process.
type workerProcNow struct {
	slot *workerSlot
	p    *proc
	id   string
	kind workerKind
}

func (s *system) currentWorkers() []workerProcNow {
	var out []workerProcNow
	for _, w := range s.workers {
		w.mu.Lock()
		if w.proc != nil && !w.proc.exited() && len(w.procs) > 0 {
			wp := w.procs[len(w.procs)-1]
			out = append(out, workerProcNow{slot: w, p: w.proc, id: wp.id, kind: w.kind})
		}
		w.mu.Unlock()
	}
	return out
}

// isGrantRecord tells a worker's log line of a claim or takeover: the Go
// worker's "job claimed" (takeover true or false), the Node.js and Python
// workers' "job claimed" and "job taken over".
func isGrantRecord(r map[string]any) bool {
	return r["msg"] == "job claimed" || r["msg"] == "job taken over"
}

// zombieOfLostGrant is a worker the failover froze right after a grant made
// on the primary only.
type zombieOfLostGrant struct {
	w            workerProcNow
	key, grant   string
	job, attempt int64
}

// applyFailover plays R26 for real: hold the replica back, let the workers
// take grants on the primary only (freezing one of them right after such a
// grant: the zombie), kill -9 the primary, promote the replica, repoint every
// proxy at it, move the campaign's own handle, tell the producer to re-drive
// its enqueues, check that each coordinator answers from the new primary
// without a restart, and finally let the zombie write under its lost grant
// while the job's re-grant (the same attempt, another token) is held by
// another, frozen worker: the ABA write that tokens must refuse.
func (s *system) applyFailover(ctx context.Context, f fault) (string, error) {
	if s.pair == nil {
		return "no database pair (--failover not set)", nil
	}
	fo := &s.fo
	failed := func(err error) (string, error) {
		fo.mu.Lock()
		fo.Err = err
		fo.mu.Unlock()
		return "", err
	}
	// Once begun, the failover runs to its end even when the window closes:
	// the database must not be left dead or half promoted.
	bg := context.WithoutCancel(ctx)
	s.failingOver.Store(true)
	defer s.failingOver.Store(false)

	defer s.endFailover()
	// The replica, read-only, tells which grants a promote will lose: a job
	// it has under the attempt before the grant.
	rd := s.cfg.dsn.Clone()
	rd.Addr, rd.DBName = s.pair.ReplicaAddr(), s.dbName
	replicaDB, err := sql.Open("mysql", rd.FormatDSN())
	if err != nil {
		return failed(err)
	}
	defer replicaDB.Close()

	// A short pause of the workers lets jobs wait, replicated, to be
	// claimed: right after the hold-back they are granted on the primary
	// only, while the replica keeps them claimable under the attempt before.
	marks := s.recordMarks()
	paused := s.pauseWorkers()
	var resumeOnce sync.Once
	resume := func() {
		resumeOnce.Do(func() {
			// Unlocked first: the zombie is chosen among the very first
			// grants, logged the moment a worker continues.
			for _, w := range paused {
				w.slot.busy.Unlock()
				_ = w.p.signal(syscall.SIGCONT)
			}
		})
	}
	defer resume()
	s.tl.printf("fault #%d %s: %d workers paused for %s", f.N, f, len(paused), round(f.Pause))
	time.Sleep(f.Pause)
	hctx, cancel := context.WithTimeout(bg, 10*time.Second)
	err = s.pair.HoldBack(hctx)
	cancel()
	if err != nil {
		return failed(err)
	}
	heldAt := time.Now()
	fo.mu.Lock()
	fo.Mode, fo.HeldAt = f.Mode, heldAt
	fo.mu.Unlock()
	s.tl.printf("fault #%d: replica %s held back; workers continue", f.N, s.pair.ReplicaAddr())

	zombie, claims := s.watchGrantsOnPrimaryOnly(f, heldAt, marks, replicaDB, resume)
	if zombie == nil {
		s.tl.printf("fault #%d: no grant to freeze as the zombie of a lost grant", f.N)
	}
	unfreezeZombie := func() {
		if zombie != nil {
			_ = zombie.w.p.signal(syscall.SIGCONT)
			zombie.w.slot.busy.Unlock()
			zombie = nil
		}
	}
	defer unfreezeZombie()

	gctx, cancel := context.WithTimeout(bg, 5*time.Second)
	primaryGTID, gerr := s.pair.PrimaryGTID(gctx)
	cancel()
	if gerr != nil {
		primaryGTID = "unknown: " + gerr.Error()
	}
	if err := s.pair.KillPrimary(); err != nil {
		return failed(err)
	}
	killedAt := time.Now()
	s.tl.printf("fault #%d: %d grants logged since the hold-back (%s); primary %s killed (SIGKILL) at gtid_binlog_pos %q",
		f.N, claims, killedAt.Sub(heldAt).Round(time.Millisecond), s.pair.PrimaryAddr(), primaryGTID)
	time.Sleep(f.Delay) // failure detection

	pctx, cancel := context.WithTimeout(bg, time.Minute)
	err = s.pair.Promote(pctx)
	cancel()
	if err != nil {
		return failed(fmt.Errorf("promote: %w", err))
	}
	gctx, cancel = context.WithTimeout(bg, 5*time.Second)
	replicaGTID, gerr := s.pair.ReplicaGTID(gctx)
	cancel()
	if gerr != nil {
		replicaGTID = "unknown: " + gerr.Error()
	}
	promotedAt := time.Now()
	var errs []error
	for _, r := range s.replicas {
		if err := r.proxy.Repoint(s.pair.ReplicaAddr()); err != nil {
			errs = append(errs, err)
		}
	}
	repointedAt := time.Now()
	marks = s.recordMarks()
	if err := s.reconnectCheckDB(); err != nil {
		errs = append(errs, err)
	}
	fo.mu.Lock()
	fo.Applied, fo.KilledAt, fo.RepointedAt = true, killedAt, repointedAt
	fo.PrimaryGTID, fo.ReplicaGTID = primaryGTID, replicaGTID
	fo.mu.Unlock()
	s.tl.printf("fault #%d: replica %s promoted %s after the kill at gtid_current_pos %q; %d proxies repointed at it "+
		"(open connections cut); the campaign's handle moved", f.N, s.pair.ReplicaAddr(),
		promotedAt.Sub(killedAt).Round(time.Millisecond), replicaGTID, len(s.replicas))
	s.endFailover()
	if err := errors.Join(errs...); err != nil {
		return failed(err)
	}

	s.checkReconnected(bg, f, repointedAt)
	s.failingOver.Store(false)

	if zombie != nil {
		s.playABA(ctx, f, zombie, repointedAt, marks)
		unfreezeZombie()
	}
	return "", nil
}

// watchGrantsOnPrimaryOnly calls resume once it watches the workers' lines,
// then waits until they have logged 3 grants since heldAt and one of them
// froze its worker as the zombie, or until f.For passes. The zombie is
// frozen on the spot, before its provider call and write-back: it holds a
// grant that, with async replication, only the old primary will ever have
// made. It must be the grant of a job that the replica has under the
// attempt before, so that the new primary grants that very attempt again
// (a job whose enqueue is lost too is made again by the re-drive under
// another id, and the zombie's write-back would find no such job). With
// semi-sync nothing is lost, and any grant will do: its zombie meets a
// takeover (T1).
func (s *system) watchGrantsOnPrimaryOnly(f fault, heldAt time.Time, marks map[*proc]int, replicaDB *sql.DB,
	resume func()) (*zombieOfLostGrant, int) {
	var mu sync.Mutex
	var zombie *zombieOfLostGrant
	trying := false
	claims := 0
	ready := make(chan struct{})
	var once sync.Once
	done := make(chan struct{})
	anyJob := f.Mode == failoverSemiSync
	// regrantable reports whether the replica has key under attempt-1;
	// why counts the answers, for a failover that found no zombie.
	why := map[string]int{}
	regrantable := func(key string, attempt int64) bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var have int64
		err := replicaDB.QueryRowContext(ctx, "SELECT attempt FROM refund_jobs WHERE operation_key = ?", key).Scan(&have)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case errors.Is(err, sql.ErrNoRows):
			why["enqueued after the hold-back"]++
		case err != nil:
			why["replica unreadable: "+err.Error()]++
		case have != attempt-1:
			why["the replica has another attempt"]++
		default:
			return true
		}
		return false
	}
	watch := func(w workerProcNow, from int) {
		_, _ = w.p.waitRecord(f.For+time.Second, from, func(r map[string]any) bool {
			select {
			case <-done:
				return true
			default:
			}
			// Paused across the hold-back, the workers log after it what
			// they are granted after it (the replica is asked whether the
			// zombie's grant is really not on it).
			if !isGrantRecord(r) || !seenAt(r).After(heldAt) {
				return false
			}
			key, _ := r["operation_key"].(string)
			attempt := num(r["attempt"])
			mu.Lock()
			claims++
			try := zombie == nil && !trying && key != "" && !w.p.stopped.Load() && w.slot.busy.TryLock()
			trying = trying || try
			mu.Unlock()
			if try {
				// Freeze first (its write-back is milliseconds away), then ask
				// the replica; a grant the new primary would not repeat is let go.
				ok := w.p.signal(syscall.SIGSTOP) == nil
				if ok && !anyJob && !regrantable(key, attempt) {
					_ = w.p.signal(syscall.SIGCONT)
					ok = false
				}
				if !ok {
					w.slot.busy.Unlock()
				}
				mu.Lock()
				trying = false
				if ok {
					grant, _ := r["grant"].(string)
					zombie = &zombieOfLostGrant{w: w, key: key, grant: or(grant, "(not logged)"), job: num(r["job_id"]),
						attempt: attempt}
					where := "on the primary only: the replica has the job under the attempt before"
					if anyJob {
						where = "acknowledged by the replica, not yet applied"
					}
					s.tl.printf("fault #%d: %s frozen right after its grant of job %d (%s, attempt %d, grant %s), %s", f.N,
						w.id, zombie.job, key, attempt, zombie.grant, where)
				}
				mu.Unlock()
			}
			mu.Lock()
			if claims >= 3 && zombie != nil {
				once.Do(func() { close(ready) })
			}
			mu.Unlock()
			return false
		})
	}
	watched := map[*proc]bool{}
	deadline := time.NewTimer(f.For)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for first := true; ; first = false {
		// Workers started since (a worker-kill's replacement) are watched
		// from their first line.
		for _, w := range s.currentWorkers() {
			if !watched[w.p] {
				watched[w.p] = true
				go watch(w, marks[w.p])
			}
		}
		if first {
			resume()
		}
		select {
		case <-ready:
		case <-deadline.C:
		case <-tick.C:
			continue
		}
		break
	}
	close(done)
	mu.Lock()
	defer mu.Unlock()
	if zombie == nil && len(why) > 0 {
		var parts []string
		for _, k := range sortedKeys(why) {
			parts = append(parts, fmt.Sprintf("%d %s", why[k], k))
		}
		s.tl.printf("fault #%d: grants tried as the zombie: %s", f.N, strings.Join(parts, ", "))
	}
	return zombie, claims
}

// pauseWorkers freezes every worker whose slot no other fault holds, and
// returns them with their slots held.
func (s *system) pauseWorkers() []workerProcNow {
	var out []workerProcNow
	for _, w := range s.currentWorkers() {
		if !w.slot.busy.TryLock() {
			continue
		}
		if w.p.stopped.Load() || w.p.signal(syscall.SIGSTOP) != nil {
			w.slot.busy.Unlock()
			continue
		}
		out = append(out, w)
	}
	return out
}

// recordMarks is how many log records each current worker and coordinator
// has so far.
func (s *system) recordMarks() map[*proc]int {
	m := map[*proc]int{}
	for _, w := range s.currentWorkers() {
		m[w.p] = w.p.recordCount()
	}
	for _, r := range s.replicas {
		if p := r.current(); p != nil {
			m[p] = p.recordCount()
		}
	}
	return m
}

// endFailover tells the producer that the failover is over, done or not:
// it re-drives its enqueues when the replica was promoted.
func (s *system) endFailover() {
	if s.redrive != nil {
		s.redriveOnce.Do(func() { close(s.redrive) })
	}
}

// failoverApplied reports whether the replica was promoted and the proxies
// repointed.
func (s *system) failoverApplied() bool {
	s.fo.mu.Lock()
	defer s.fo.mu.Unlock()
	return s.fo.Applied
}

// reconnectCheckDB moves the campaign's own handle to the promoted replica.
func (s *system) reconnectCheckDB() error {
	d := s.cfg.dsn.Clone()
	d.Addr, d.DBName, d.ParseTime, d.Loc = s.pair.ReplicaAddr(), s.dbName, true, time.UTC
	db, err := sql.Open("mysql", d.FormatDSN())
	if err != nil {
		return err
	}
	s.dbMu.Lock()
	old := s.checkDB
	s.checkDB = db
	s.dbMu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// checkReconnected asks each coordinator, through its own gRPC address, for
// a job until its answer comes from a database (found or not found: the old
// primary is dead, so it is the new one), and notes whether the process that
// answers is the one that served before the failover (R26: a coordinator
// reconnects to a new primary behind the same address without a restart).
func (s *system) checkReconnected(ctx context.Context, f fault, repointedAt time.Time) {
	key := ""
	if p := s.prod.Load(); p != nil {
		p.mu.Lock()
		for k := range p.acked {
			key = k
			break
		}
		p.mu.Unlock()
	}
	var wg sync.WaitGroup
	notes := make([]string, len(s.replicas))
	for i, r := range s.replicas {
		before := r.current()
		wg.Go(func() {
			c, err := jobfence.Dial(r.listen, jobfence.WithCallTimeout(2*time.Second), jobfence.WithRetry(1, 0, 0))
			if err != nil {
				notes[i] = fmt.Sprintf("%s: dial: %v", r.name, err)
				return
			}
			defer c.Close()
			deadline := time.Now().Add(20 * time.Second)
			var last error
			for time.Now().Before(deadline) {
				_, err := c.GetJobByKey(ctx, or(key, "chaos-probe"))
				if err == nil || errors.Is(err, jobfence.ErrNotFound) {
					after := r.current()
					switch {
					case before == nil || after != before:
						notes[i] = fmt.Sprintf("%s answered from the new primary %s after the repoint, but its "+
							"coordinator was restarted meanwhile (a coordinator-kill): no evidence either way",
							r.name, time.Since(repointedAt).Round(time.Millisecond))
					default:
						notes[i] = fmt.Sprintf("%s (pid %d, not restarted) answered from the new primary %s after the repoint",
							r.name, after.pid(), time.Since(repointedAt).Round(time.Millisecond))
					}
					return
				}
				last = err
				if !sleepCtx(ctx, 100*time.Millisecond) {
					break
				}
			}
			notes[i] = fmt.Sprintf("%s did not answer from the new primary within 20s of the repoint: %v", r.name, last)
			s.fo.problem("%s", notes[i])
		})
	}
	wg.Wait()
	restartFree := 0
	for _, n := range notes {
		s.tl.printf("fault #%d: %s", f.N, n)
		if strings.Contains(n, "not restarted") {
			restartFree++
		}
	}
	s.fo.mu.Lock()
	s.fo.Reconnected = notes
	s.fo.mu.Unlock()
	if restartFree == 0 {
		s.fo.problem("no coordinator lived through the failover and answered from the new primary without a restart")
	}
}

// playABA waits for another worker to be granted the zombie's job under
// the zombie's attempt by the new primary (R26's story: attempt 1 granted
// twice, once by each primary), freezes that holder, lets the zombie write
// back under its lost grant, and continues the holder after f.Hold. With
// tokens the zombie's write is STALE_ATTEMPT; without them it would land as
// the holder's (invariant 7).
func (s *system) playABA(ctx context.Context, f fault, z *zombieOfLostGrant, repointedAt time.Time, marks map[*proc]int) {
	type hit struct {
		w              workerProcNow
		rec            map[string]any
		frozen, locked bool
	}
	found := make(chan hit, 1)
	done := make(chan struct{})
	var once sync.Once
	wait := s.cfg.lease + 6*time.Second
	workers := map[string]workerProcNow{}
	for _, w := range s.currentWorkers() {
		if w.p != z.w.p {
			workers[w.id] = w
		}
	}
	// The holder is frozen on the first line that shows the re-grant: its
	// provider call and write-back take milliseconds. A takeover shows first
	// in its coordinator's log, before the reply reaches the worker.
	regrant := func(w workerProcNow, r map[string]any) {
		once.Do(func() {
			// A slot held by its lane's fault is frozen all the same (that
			// fault may end the freeze early); one its fault froze already
			// is left to it.
			h := hit{w: w, rec: r}
			if !w.p.stopped.Load() {
				h.locked = w.slot.busy.TryLock()
				h.frozen = w.p.signal(syscall.SIGSTOP) == nil
				if h.locked && !h.frozen {
					w.slot.busy.Unlock()
					h.locked = false
				}
			}
			_ = z.w.p.signal(syscall.SIGCONT)
			found <- h
		})
	}
	// The same attempt again: the zombie's grant was lost. A later one: it
	// survived (semi-sync; or committed before the hold-back) and this is a
	// takeover after its lease, T1 as usual.
	ofJob := func(r map[string]any) bool {
		return r["operation_key"] == z.key && num(r["attempt"]) >= z.attempt
	}
	stopped := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	for _, w := range workers {
		go func() {
			_, _ = w.p.waitRecord(wait, marks[w.p], func(r map[string]any) bool {
				if stopped() {
					return true
				}
				if isGrantRecord(r) && ofJob(r) {
					regrant(w, r)
					return true
				}
				return false
			})
		}()
	}
	for _, rp := range s.replicas {
		p := rp.current()
		if p == nil {
			continue
		}
		go func() {
			_, _ = p.waitRecord(wait, marks[p], func(r map[string]any) bool {
				if stopped() {
					return true
				}
				id, _ := r["worker_id"].(string)
				if w, ok := workers[id]; ok && r["msg"] == "job taken over; next action reconcile" && ofJob(r) {
					regrant(w, r)
					return true
				}
				return false
			})
		}()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	var h hit
	select {
	case h = <-found:
		close(done)
	case <-t.C:
		close(done)
		s.tl.printf("fault #%d: nobody was granted %s attempt %d again within %s; %s continues", f.N, z.key,
			z.attempt, wait, z.w.id)
		return
	}
	grant, _ := h.rec["grant"].(string)
	seen := "grant " + or(grant, "(not logged)")
	if h.rec["msg"] == "job taken over; next action reconcile" {
		seen = "seen in its coordinator's log"
	}
	how := "is frozen"
	if !h.frozen {
		how = "was frozen by another fault already"
	}
	what := fmt.Sprintf("was granted job %d (%s) attempt %d again by the new primary", num(h.rec["job_id"]), z.key, z.attempt)
	if a := num(h.rec["attempt"]); a != z.attempt {
		what = fmt.Sprintf("took job %d (%s) over at attempt %d: the zombie's grant survived", num(h.rec["job_id"]), z.key, a)
	}
	s.tl.printf("fault #%d: %s %s (%s; the zombie's grant %s) %s after the repoint and %s; %s (the zombie) continues",
		f.N, h.w.id, what, seen, z.grant, time.Since(repointedAt).Round(time.Millisecond), how, z.w.id)
	sleepCtx(ctx, f.Hold)
	if h.frozen {
		_ = h.w.p.signal(syscall.SIGCONT)
	}
	if h.locked {
		h.w.slot.busy.Unlock()
	}
}
