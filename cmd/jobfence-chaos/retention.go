package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
)

// Retention in the campaign (R30, R31): the coordinators archive succeeded
// jobs a few seconds after their completion (--retain-succeeded), one of
// them at a time under the archive's lease, while the faults run; the
// late re-enqueuer gives invariant 12 its evidence by enqueuing keys again
// once their jobs left, or as they are due to.

// The late re-enqueuer's pace: every lateEvery one key whose job is in the
// archive and one due for it, not yet archived (an enqueue that may race
// the archiving of its key, R30); a quarter of them with another amount,
// which must be a conflict. After the settle it sends lateSweep more of
// archived keys.
const (
	lateEvery       = 2 * time.Second
	lateSweep       = 10
	lateOtherShare  = 0.25
	lateTries       = 5                      // replicas tried per re-enqueue, a killed one answering nothing
	lateRetry       = 300 * time.Millisecond // between two tries
	lateCallTimeout = 3 * time.Second
)

// answerLog keeps the answers of enqueues in the order they came.
type answerLog struct {
	mu      sync.Mutex
	answers []enqueueAnswer
}

// record completes a with what an enqueue was answered (job and created,
// or err) and keeps it.
func (l *answerLog) record(a enqueueAnswer, job jobfence.Job, created bool, err error) {
	a.At = time.Now()
	switch {
	case errors.Is(err, jobfence.ErrKeyConflict):
		a.Conflict = true
	case err != nil:
		a.Err = err.Error()
	default:
		a.JobID, a.Created, a.ArchivedAt = job.ID, created, job.ArchivedAt
	}
	l.mu.Lock()
	l.answers = append(l.answers, a)
	l.mu.Unlock()
}

// all is every answer kept so far.
func (l *answerLog) all() []enqueueAnswer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.answers)
}

// lateEnqueuer re-enqueues a sample of the keys whose jobs completed more
// than the retention ago, archived or about to be, as a producer that
// repeats an old request does: R30 must answer each with its job
// (created=false), or with OPERATION_KEY_CONFLICT for other values, and
// never make a second job.
type lateEnqueuer struct {
	s       *system
	clients []*jobfence.Client
	specs   map[string]refundSpec
	rng     *rand.Rand
	tried   map[string]bool
	next    int
	answers answerLog
}

// newLateEnqueuer dials every replica (directly, as the producer does). Its
// choices come from seed on a stream of their own; which keys there are to
// choose from depends on the campaign's timing. Errors: a dial's.
func (s *system) newLateEnqueuer(seed uint64, specs []refundSpec) (*lateEnqueuer, error) {
	h := fnv.New64a()
	h.Write([]byte("late-enqueuer"))
	l := &lateEnqueuer{s: s, specs: map[string]refundSpec{}, rng: rand.New(rand.NewPCG(seed, h.Sum64())),
		tried: map[string]bool{}}
	for _, sp := range specs {
		l.specs[sp.Key] = sp
	}
	for _, r := range s.replicas {
		c, err := jobfence.Dial(r.listen, jobfence.WithCallTimeout(lateCallTimeout))
		if err != nil {
			l.close()
			return nil, err
		}
		l.clients = append(l.clients, c)
	}
	return l, nil
}

func (l *lateEnqueuer) close() {
	for _, c := range l.clients {
		c.Close()
	}
}

// run re-enqueues, every lateEvery until ctx ends, one archived key and one
// due for the archive that it did not send before; not while a database
// failover is under way (the producer's re-drive is the failover's).
func (l *lateEnqueuer) run(ctx context.Context) {
	for sleepCtx(ctx, lateEvery) {
		if l.s.failingOver.Load() {
			continue
		}
		archived, due, err := l.candidates(ctx)
		if err != nil {
			continue // the database away, or a failover moving the handle
		}
		if key, ok := l.pick(archived); ok {
			l.send(ctx, key, true, false)
		}
		if key, ok := l.pick(due); ok {
			l.send(ctx, key, false, true)
		}
	}
}

// sweep re-enqueues up to n archived keys it did not send before: the
// evidence that archived keys are answered with their jobs, however the
// fault window went.
func (l *lateEnqueuer) sweep(ctx context.Context, n int) int {
	archived, _, err := l.candidates(ctx)
	if err != nil {
		l.s.tl.printf("late re-enqueues: the archive not read: %v", err)
		return 0
	}
	sent := 0
	for ; sent < n; sent++ {
		key, ok := l.pick(archived)
		if !ok {
			break
		}
		l.send(ctx, key, true, false)
	}
	return sent
}

// candidates reads the keys of the jobs in the archive, and of those
// succeeded more than the retention ago still in the working tables (a
// succeeded job's next_attempt_at is its completion, which the archive
// goes by), each list sorted.
func (l *lateEnqueuer) candidates(ctx context.Context) (archived, due []string, err error) {
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	rows, err := l.s.db().QueryContext(qctx, `SELECT operation_key, TRUE FROM refund_jobs_archive
UNION ALL
SELECT operation_key, FALSE FROM refund_jobs
 WHERE state = 'succeeded' AND next_attempt_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND`,
		l.s.cfg.retainSucceeded.Microseconds())
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var inArchive bool
		if err := rows.Scan(&key, &inArchive); err != nil {
			return nil, nil, err
		}
		if inArchive {
			archived = append(archived, key)
		} else {
			due = append(due, key)
		}
	}
	slices.Sort(archived)
	slices.Sort(due)
	return archived, due, rows.Err()
}

// pick draws a key of pool the re-enqueuer did not send before.
func (l *lateEnqueuer) pick(pool []string) (string, bool) {
	fresh := slices.DeleteFunc(slices.Clone(pool), func(k string) bool { return l.tried[k] || l.specs[k].Key == "" })
	if len(fresh) == 0 {
		return "", false
	}
	key := fresh[l.rng.IntN(len(fresh))]
	l.tried[key] = true
	return key, true
}

// send enqueues key again, with the refund's own values or, a share of the
// time, another amount, starting with the next replica and trying the
// others while one does not answer; it records the answer.
func (l *lateEnqueuer) send(ctx context.Context, key string, archived, due bool) {
	sp := l.specs[key]
	a := enqueueAnswer{Key: key, Why: answerLate, WasArchived: archived, DueForArchive: due,
		OtherValues: l.rng.Float64() < lateOtherShare}
	req := jobfence.EnqueueRequest{OperationKey: sp.Key, OrderID: sp.Order, PaymentID: sp.Payment,
		AmountMinor: sp.AmountMinor, Currency: "EUR", Provider: providerName}
	if a.OtherValues {
		req.AmountMinor++
	}
	if p := l.s.prod.Load(); p != nil {
		if nb, ok := p.notBeforeOf(key); ok {
			req.NotBefore = nb // the producer's own request, repeated
		}
	}
	var job jobfence.Job
	var created bool
	var err error
	for try := range lateTries {
		if try > 0 && !sleepCtx(ctx, lateRetry) {
			break
		}
		cctx, cancel := context.WithTimeout(ctx, lateCallTimeout)
		job, created, err = l.clients[l.next%len(l.clients)].EnqueueRefund(cctx, req)
		cancel()
		l.next++
		if err == nil || errors.Is(err, jobfence.ErrKeyConflict) || ctx.Err() != nil {
			break
		}
	}
	if ctx.Err() != nil {
		return
	}
	l.answers.record(a, job, created, err)
}

// lateSummary says what the late re-enqueues among answers were answered.
func lateSummary(answers []enqueueAnswer) string {
	var sent, archived, due, other, same, conflicts, unanswered, created int
	for _, a := range answers {
		if a.Why != answerLate {
			continue
		}
		sent++
		switch {
		case a.WasArchived:
			archived++
		case a.DueForArchive:
			due++
		}
		if a.OtherValues {
			other++
		}
		switch {
		case a.Err != "":
			unanswered++
		case a.Conflict:
			conflicts++
		case a.Created:
			created++
		default:
			same++
		}
	}
	return fmt.Sprintf("late re-enqueues: %d sent (%d of keys in the archive, %d of keys due for it; %d with another "+
		"amount); answered: created=false %d, OPERATION_KEY_CONFLICT %d, created=true %d, not answered %d", sent,
		archived, due, other, same, conflicts, created, unanswered)
}

// archiveFacts is what the campaign's kills did to the archive.
type archiveFacts struct {
	// holderKills counts the coordinator kills of the archive's lease
	// holder, its lease not run out; midBatch those that came during one
	// of its batches (awaitArchiveBatch).
	holderKills, midBatch atomic.Int64
}

// archiveBatchWait bounds how long a kill of the archive's lease holder
// waits for one of its batches: the archive looks for due jobs every
// --archive-interval.
const archiveBatchWait = 5 * time.Second

// archiveStatements begin statements only an archive batch runs, in the
// transaction that moves its jobs (store/internal/sqlbase/retention.go),
// from the lock of its jobs to the deletion of their history (an enqueue
// that meets an archived key deletes the job it made from refund_jobs too,
// and a late receipt moves to the archive alone: neither is listed).
var archiveStatements = []string{"SELECT id, operation_key, state FROM refund_jobs WHERE id IN",
	"INSERT IGNORE INTO refund_operation_keys", "UPDATE refund_operation_keys SET final_state",
	"INSERT INTO refund_jobs_archive", "INSERT INTO refund_job_events_archive",
	"DELETE FROM refund_observations WHERE job_id IN", "DELETE FROM refund_job_events WHERE job_id IN"}

// awaitArchiveBatch waits (at most archiveBatchWait, looking again as soon
// as the database answers) until a connection to the campaign's database
// runs a statement of an archive batch, and says which, for the kill that
// follows at once: the lease holder is then killed with its batch undone
// or half done, which must be in the archive whole or not at all (R31: one
// transaction). Without one in time the kill comes anyway. It reads the
// process list, which is live; InnoDB's view of its transactions is a
// copy that a reader more often than every 100 ms keeps from refreshing.
func (s *system) awaitArchiveBatch(ctx context.Context) string {
	s.archive.holderKills.Add(1)
	conds := make([]string, len(archiveStatements))
	args := make([]any, len(archiveStatements))
	for i, st := range archiveStatements {
		conds[i] = "INFO LIKE ?"
		args[i] = st + "%"
	}
	query := `SELECT INFO FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND (` +
		strings.Join(conds, " OR ") + `) LIMIT 1`
	began := time.Now()
	deadline := began.Add(min(archiveBatchWait, time.Until(deadlineOf(ctx))))
	looks := 0
	var lastErr error // the last look that failed, for the line
	for time.Now().Before(deadline) && ctx.Err() == nil {
		looks++
		qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		var stmt string
		err := s.db().QueryRowContext(qctx, query, args...).Scan(&stmt)
		cancel()
		switch {
		case err == nil:
			s.archive.midBatch.Add(1)
			if stmt = strings.Join(strings.Fields(stmt), " "); len(stmt) > 50 {
				stmt = stmt[:50] + "…"
			}
			return fmt.Sprintf("killed %s into the wait, during an archive batch, which ran %s",
				time.Since(began).Round(time.Millisecond), stmt)
		case !errors.Is(err, sql.ErrNoRows):
			lastErr = err
		}
	}
	if lastErr != nil {
		return fmt.Sprintf("no archive batch seen within %s (%d looks, the last failed: %v)",
			time.Since(began).Round(time.Millisecond), looks, lastErr)
	}
	return fmt.Sprintf("no archive batch in flight within %s (%d looks)", time.Since(began).Round(time.Millisecond), looks)
}

// archiveLeaseHolder reports whether the coordinator process pid holds the
// archive's lease now (not run out, on the database's clock), and its
// generation. The holder is named host:pid (archiver.Options.Holder).
func (s *system) archiveLeaseHolder(ctx context.Context, pid int) (held bool, generation int64) {
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var holder string
	var live bool
	err := s.db().QueryRowContext(qctx, `SELECT holder, generation, lease_until > UTC_TIMESTAMP(6) FROM jobfence_leases
 WHERE name = 'archiver'`).Scan(&holder, &generation, &live)
	if err != nil {
		return false, 0
	}
	return live && strings.HasSuffix(holder, fmt.Sprintf(":%d", pid)), generation
}

// archiveSummary is the campaign's line about the archive: what the
// coordinators logged of it (runs and the jobs they moved; batches that
// failed, which they log as having moved nothing, though one whose
// COMMIT's outcome was unknown may have moved whole), how often its lease
// was taken (its generation), the kills of the lease holder, and what the
// archive tables hold at the end.
func (s *system) archiveSummary(ctx context.Context, jobs, events, receipts int) string {
	var runs, moved, batches, failed, unknown int64
	s.eachCoordinatorRecord(func(rec map[string]any) {
		switch rec["msg"] {
		case "archive run":
			runs++
			moved += num(rec["jobs"])
			batches += num(rec["batches"])
		case "archive batch failed; nothing moved":
			failed++
			if e, _ := rec["error"].(string); strings.Contains(e, "outcome unknown") {
				unknown++ // its COMMIT may have landed: the batch moved whole or not at all
			}
		}
	})
	var generation int64
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_ = s.db().QueryRowContext(qctx, `SELECT generation FROM jobfence_leases WHERE name = 'archiver'`).Scan(&generation)
	return fmt.Sprintf("archive (--retain-succeeded %s, --archive-interval %s): %d jobs in the archive at the end, with "+
		"%d events and %d receipts; the coordinators logged %d runs moving %d jobs in %d batches, and %d batches failed "+
		"(%d of them at a COMMIT whose outcome was unknown: moved whole or not at all); the lease taken %d times, its "+
		"holder killed %d times, %d of them during a batch", s.cfg.retainSucceeded, s.cfg.archiveInterval, jobs, events,
		receipts, runs, moved, batches, failed, unknown, generation, s.archive.holderKills.Load(), s.archive.midBatch.Load())
}
