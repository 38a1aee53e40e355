package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// grantKeyPrefix begins the operation keys of scenario H's jobs.
const grantKeyPrefix = "grant-"

// grantDelivery is scenario H: grant delivery to busy worker streams on the
// full history (Q3's shape, the last --history stage). --grant-workers
// worker streams with --grant-credits credits each hold every granted job
// for --grant-hold (the provider call), then complete it on the stream and
// give its credit back, while scenario E's steady producer enqueues
// --grant-rate jobs/s for --grant-duration. Grant delivery runs from just
// before a job's EnqueueRefund to the moment a stream's receive loop reads
// the WorkGrant carrying it, both on the bench's clock.
func (b *bench) grantDelivery(ctx context.Context) error {
	// Only the producer's jobs are due.
	if err := b.setDue(ctx, false); err != nil {
		return err
	}
	if err := b.startCoordinator(ctx, "--metrics-listen", "127.0.0.1:0"); err != nil {
		return err
	}
	settled, err := b.settle(ctx)
	if err != nil {
		return err
	}
	r, err := b.grantRun(ctx)
	if err != nil {
		return fmt.Errorf("%w\ncoordinator log:\n%s", err, b.coord.logs())
	}
	finished := b.cfg.historyStages[len(b.cfg.historyStages)-1]
	kv := append([]any{"finished", finished, "rows", finished + schedulableRows}, r.summary(b.cfg)...)
	b.summary("grant_delivery", append(kv, "settle_s", num(settled.Seconds(), 1))...)
	return b.stopCoordinator()
}

// grantResult is one run of scenario H.
type grantResult struct {
	jobs      int
	delivery  latencies // enqueue began → the grant read by the stream
	enqueue   latencies // EnqueueRefund round trips
	e2e       latencies // enqueue began → Complete answered on the stream
	complete  latencies // Complete's round trip on the stream, after the hold
	lag       latencies // how late each enqueue started against the schedule
	achieved  float64   // jobs/s the producer reached
	granted   int       // jobs read in a WorkGrant
	later     int       // of those, first read at an attempt above 1: an earlier grant never reached a stream
	takeovers int       // grants the bench read marked takeover
	grants    int       // WorkGrant messages read
	held      heldShares

	// From the coordinator's metrics: long polls (a stream's claim among
	// them) answered in the enqueue's own transaction, and grants it could
	// not send and handed back.
	handoffs, handedBack float64

	cpu                 []float64 // CPU µs per job: coordinator, database server
	benchCPU            float64
	statements, commits float64 // the database server's, per job
}

// summary is the grant_delivery line's key=value pairs for a run with c's
// flags.
func (r grantResult) summary(c config) []any {
	return []any{"workers", c.grantWorkers, "credits", c.grantCredits, "hold_ms", c.grantHold.Milliseconds(),
		"rate", c.grantRate, "jobs", r.jobs, "granted", r.granted, "granted_later", r.later,
		"achieved_per_s", num(r.achieved, 0),
		"p50_ms", ms(r.delivery.percentile(0.50)), "p95_ms", ms(r.delivery.percentile(0.95)),
		"p99_ms", ms(r.delivery.percentile(0.99)), "max_ms", ms(r.delivery.percentile(1)),
		"enqueue_p50_ms", ms(r.enqueue.percentile(0.50)), "enqueue_p95_ms", ms(r.enqueue.percentile(0.95)),
		"enqueue_p99_ms", ms(r.enqueue.percentile(0.99)),
		"e2e_p50_ms", ms(r.e2e.percentile(0.50)), "e2e_p99_ms", ms(r.e2e.percentile(0.99)),
		"complete_p50_ms", ms(r.complete.percentile(0.50)), "complete_p99_ms", ms(r.complete.percentile(0.99)),
		"producer_lag_p99_ms", ms(r.lag.percentile(0.99)),
		"grants", r.grants, "jobs_per_grant", num(ratio(float64(r.granted), float64(r.grants)), 2),
		"handoff_share", num(ratio(r.handoffs, float64(r.grants)), 2), "handed_back", int64(r.handedBack),
		"takeovers", r.takeovers,
		"held_per_worker", num(r.held.mean, 2), "busy_share", num(r.held.busy, 2), "no_credit_share", num(r.held.full, 3),
		"coordinator_cpu_us_per_job", num(r.cpu[0], 1), "db_cpu_us_per_job", num(r.cpu[1], 1),
		"bench_cpu_us_per_job", num(r.benchCPU, 1),
		"statements_per_job", num(r.statements, 2), "commits_per_job", num(r.commits, 2)}
}

// grantRun is one run of scenario H.
func (b *bench) grantRun(ctx context.Context) (grantResult, error) {
	c := b.cfg
	r := grantResult{jobs: max(1, int(float64(c.grantRate)*c.grantDuration.Seconds()))}
	clients, closeAll, err := b.coord.clients(c.grantWorkers + latencyProducerConns)
	if err != nil {
		return r, err
	}
	defer closeAll()
	workerClients, producerClients := clients[:c.grantWorkers], clients[c.grantWorkers:]

	runCtx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	t := newGrantTracker()
	logs := make([]*heldLog, c.grantWorkers)
	beforeDB, err := b.readDBCounters(ctx)
	if err != nil {
		return r, err
	}
	beforeMetrics, err := scrapeMetrics(ctx, b.coord.metrics())
	if err != nil {
		return r, err
	}
	meter := startCPU(b.coord.pid(), b.dbPID)
	done := make(chan struct{}) // every job completed: the workers close their streams
	var workers sync.WaitGroup
	for w := range c.grantWorkers {
		logs[w] = &heldLog{}
		workers.Go(func() {
			if err := b.grantWorker(runCtx, workerClients[w], w, t, logs[w], done); err != nil {
				fail(fmt.Errorf("grant delivery worker %d: %w", w, err))
			}
		})
	}

	r.achieved, r.lag, r.enqueue, err = produce(runCtx, producerClients, c.grantRate, r.jobs, grantKeyPrefix, t.sent)
	if err == nil {
		err = t.waitCompleted(runCtx, r.jobs, latencyStall)
	}
	if err != nil {
		fail(err) // the workers stop without waiting for answers that may never come
	}
	sentFirst, sentLast := t.sendSpan()
	close(done)
	workers.Wait()
	r.cpu, r.benchCPU = meter.perJob(r.jobs)
	if cause := context.Cause(runCtx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause // a worker's failure is the first error, whatever it cut short
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return r, err
	}
	if afterDB, err := b.readDBCounters(ctx); err == nil {
		r.statements = afterDB.perJob(beforeDB, "Questions", r.jobs)
		r.commits = afterDB.perJob(beforeDB, "Com_commit", r.jobs)
	} else {
		return r, err
	}
	afterMetrics, err := scrapeMetrics(ctx, b.coord.metrics())
	if err != nil {
		return r, err
	}
	r.handoffs = afterMetrics.delta(beforeMetrics, "jobfence_handoff_claims_total")
	r.handedBack = afterMetrics.delta(beforeMetrics, "jobfence_grants_handed_back_total")
	r.delivery, r.e2e, r.complete = t.delivery, t.e2e, t.completeRTT
	r.granted, r.later, r.takeovers, r.grants = t.granted, t.later, t.takeovers, t.grants
	r.held = meanHeldShares(logs, sentFirst, sentLast, c.grantCredits)
	return r, nil
}

// grantWorker is one busy worker of scenario H on its own stream: it holds
// each granted job for --grant-hold, then completes it on the stream and
// gives its credit back. It half-closes its stream once done is closed and
// its jobs are completed, and returns nil when ctx ends.
func (b *bench) grantWorker(ctx context.Context, c pb.CoordinatorClient, w int, t *grantTracker, held *heldLog,
	done <-chan struct{}) error {
	s, err := openTimedStream(ctx, c, fmt.Sprintf("bench-grant-%d", w), b.cfg.grantCredits)
	if err != nil {
		return err
	}
	var inflight sync.WaitGroup
	defer inflight.Wait()
	// On the way out, before the wait: a completion whose stream ended is
	// never answered.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	failed := make(chan error, 1)
	for {
		select {
		case g := <-s.timed:
			jobs := make([]grantedJob, len(g.jobs))
			for i, j := range g.jobs {
				jobs[i] = grantedJob{key: j.Job.OperationKey, id: j.Job.Id, attempt: j.Attempt, takeover: j.Takeover}
			}
			if err := t.grant(w, g.at, jobs...); err != nil {
				return err
			}
			held.change(len(g.jobs), g.at)
			for _, j := range g.jobs {
				inflight.Go(func() {
					select {
					case <-time.After(b.cfg.grantHold): // the provider call
					case <-ctx.Done():
						return
					}
					began := time.Now()
					err := s.complete(ctx, j) // gives the credit back once answered
					if err != nil {
						if ctx.Err() == nil {
							select {
							case failed <- fmt.Errorf("complete job %d attempt %d: %w", j.Job.Id, j.Attempt, err):
							default:
							}
						}
						return
					}
					at := time.Now()
					held.change(-1, at)
					t.complete(j.Job.OperationKey, began, at)
				})
			}
		case err := <-failed:
			return err
		case <-done:
			inflight.Wait()
			select {
			case err := <-failed:
				return err
			default:
			}
			if ctx.Err() != nil {
				return nil
			}
			return s.close()
		case err := <-s.ended:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("worker stream ended: %w", err)
		case <-ctx.Done():
			return nil
		}
	}
}

// grantTracker matches the jobs the streams are granted with the enqueues
// that created them, by operation key, and finds the functional failures of
// scenario H: a grant of a job the producer did not enqueue, a job granted
// again without a takeover, a job never granted.
type grantTracker struct {
	mu          sync.Mutex
	jobs        map[string]*trackedJob // by operation key
	first, last time.Time              // the first and last enqueue began
	delivery    latencies              // per job: enqueue began → its first grant read
	e2e         latencies              // per job: enqueue began → its completion answered
	completeRTT latencies              // per completion: sent → answered
	grants      int                    // WorkGrant messages read
	granted     int                    // jobs granted at least once
	later       int                    // of those, first read at an attempt above 1
	takeovers   int                    // grants read marked takeover
	finished    int                    // jobs completed
	progress    chan struct{}          // a token at each completion
}

// trackedJob is one enqueued job as the tracker follows it.
type trackedJob struct {
	sent          time.Time // just before its EnqueueRefund
	id, attempt   int64     // its latest grant's, once granted
	worker        int
	granted, done bool
}

// grantedJob is one job of a WorkGrant, as the tracker matches it.
type grantedJob struct {
	key         string // operation_key
	id, attempt int64
	takeover    bool
}

func newGrantTracker() *grantTracker {
	return &grantTracker{jobs: map[string]*trackedJob{}, progress: make(chan struct{}, 1)}
}

// sent records that the enqueue of key begins at at (produce's sent).
func (t *grantTracker) sent(key string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.jobs[key] = &trackedJob{sent: at}
	if t.first.IsZero() || at.Before(t.first) {
		t.first = at
	}
	if at.After(t.last) {
		t.last = at
	}
}

// sendSpan is when the first and the last enqueue began.
func (t *grantTracker) sendSpan() (first, last time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.first, t.last
}

// grant records that worker's stream read, at at, one WorkGrant of jobs.
// A job's delivery ends at its first grant read; a later grant of it is only
// legitimate as a takeover (R6), since this scenario's streams live through
// the run. Errors: a job this run did not enqueue, a job granted again
// without a takeover.
func (t *grantTracker) grant(worker int, at time.Time, jobs ...grantedJob) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.grants++
	for _, g := range jobs {
		j, ok := t.jobs[g.key]
		if !ok {
			return fmt.Errorf("granted job %d (%s, attempt %d), which this run did not enqueue", g.id, g.key, g.attempt)
		}
		if g.takeover {
			t.takeovers++
		}
		if j.granted {
			if !g.takeover {
				return fmt.Errorf("job %d (%s) granted twice without a takeover: attempt %d to worker %d, then attempt %d to worker %d",
					g.id, g.key, j.attempt, j.worker, g.attempt, worker)
			}
			j.id, j.attempt, j.worker = g.id, g.attempt, worker
			continue
		}
		j.granted, j.id, j.attempt, j.worker = true, g.id, g.attempt, worker
		t.delivery = append(t.delivery, at.Sub(j.sent))
		t.granted++
		if g.attempt > 1 {
			t.later++ // an earlier grant was handed back before it reached a stream
		}
	}
	return nil
}

// complete records that key's completion, sent at began, was answered at at.
func (t *grantTracker) complete(key string, began, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.completeRTT = append(t.completeRTT, at.Sub(began))
	j, ok := t.jobs[key]
	if !ok || j.done {
		return
	}
	j.done = true
	t.e2e = append(t.e2e, at.Sub(j.sent))
	t.finished++
	select {
	case t.progress <- struct{}{}:
	default:
	}
}

// waitCompleted waits until n jobs are completed. Errors: stall passing
// without a completion (naming the jobs never granted, and those granted but
// never completed), ctx's end.
func (t *grantTracker) waitCompleted(ctx context.Context, n int, stall time.Duration) error {
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for {
		t.mu.Lock()
		finished := t.finished
		t.mu.Unlock()
		if finished >= n {
			return nil
		}
		select {
		case <-t.progress:
			timer.Reset(stall)
		case <-timer.C:
			return t.stalled(n, stall)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// stalled is the error of a run in which no job was completed for stall.
func (t *grantTracker) stalled(n int, stall time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ungranted, uncompleted []string
	for key, j := range t.jobs {
		switch {
		case !j.granted:
			ungranted = append(ungranted, key)
		case !j.done:
			uncompleted = append(uncompleted, fmt.Sprintf("%s (job %d attempt %d, worker %d)", key, j.id, j.attempt, j.worker))
		}
	}
	slices.Sort(ungranted)
	slices.Sort(uncompleted)
	return fmt.Errorf("grant delivery stalled: %d of %d jobs completed, none for %s; never granted %d%s; granted, not completed %d%s",
		t.finished, n, stall, len(ungranted), examples(ungranted), len(uncompleted), examples(uncompleted))
}

// examples is up to five of list, for an error message.
func examples(list []string) string {
	if len(list) == 0 {
		return ""
	}
	more := ""
	if len(list) > 5 {
		list, more = list[:5], ", …"
	}
	return " (" + strings.Join(list, ", ") + more + ")"
}

// heldLog is one worker's jobs held, as changes in time: +n at a grant read,
// -1 at each completion answered. Changes are appended under its lock with
// their times taken before, in order for each worker's goroutines.
type heldLog struct {
	mu      sync.Mutex
	changes []heldChange
}

type heldChange struct {
	at    time.Time
	delta int
}

func (l *heldLog) change(delta int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changes = append(l.changes, heldChange{at: at, delta: delta})
}

// heldShares is how busy workers were over a window: the jobs each held on
// average, the share of the time it held at least one, and the share it held
// as many as its credits (none left to be granted more).
type heldShares struct{ mean, busy, full float64 }

// sharesOver integrates changes (in time order; 0 held before the first)
// over [from, to) for a worker with credits credits. NaN shares for an empty
// window.
func sharesOver(changes []heldChange, from, to time.Time, credits int) heldShares {
	span := to.Sub(from)
	if span <= 0 {
		return heldShares{ratio(0, 0), ratio(0, 0), ratio(0, 0)}
	}
	ordered := slices.Clone(changes)
	slices.SortStableFunc(ordered, func(a, b heldChange) int { return a.at.Compare(b.at) })
	var sum, busy, full time.Duration
	level, at := 0, from
	add := func(until time.Time) {
		if until.After(to) {
			until = to
		}
		if d := until.Sub(at); d > 0 {
			sum += time.Duration(level) * d
			if level > 0 {
				busy += d
			}
			if level >= credits {
				full += d
			}
			at = until
		}
	}
	for _, c := range ordered {
		add(c.at)
		level += c.delta
	}
	add(to)
	return heldShares{mean: float64(sum) / float64(span), busy: float64(busy) / float64(span),
		full: float64(full) / float64(span)}
}

// meanHeldShares is sharesOver averaged over the workers.
func meanHeldShares(logs []*heldLog, from, to time.Time, credits int) heldShares {
	var out heldShares
	for _, l := range logs {
		l.mu.Lock()
		s := sharesOver(l.changes, from, to, credits)
		l.mu.Unlock()
		out.mean += s.mean / float64(len(logs))
		out.busy += s.busy / float64(len(logs))
		out.full += s.full / float64(len(logs))
	}
	return out
}
