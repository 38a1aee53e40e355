package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// claimResult is one scenario B run at one concurrency.
type claimResult struct {
	concurrency int
	claims      int // measured claims
	empty       int // measured claims that granted nothing
	elapsed     time.Duration
	lat         latencies // Claim round trips, measured on the claimer
	returns     latencies // Reschedule round trips
	ref         latencies // Claim round trips on the reference coordinator, when there is one
	// CPU microseconds per measured claim (with its Reschedule) of the
	// coordinator, the database server and the bench, and the statements the
	// database ran per claim: on a machine the three share, the cost per
	// claim is what bounds latency, and it is steadier than latency.
	coordCPU, dbCPU, benchCPU, statements float64
}

// claimLevels is scenario B: Claim RPC latency on the full history at each
// --claim-levels concurrency, against the coordinator process started by
// historyStages.
func (b *bench) claimLevels(ctx context.Context) error {
	for _, n := range b.cfg.claimLevels {
		r, err := b.claimRun(ctx, n, b.cfg.claimDuration, nil)
		if err != nil {
			return err
		}
		b.summary("claim_rpc", "concurrency", n, "claims", r.claims, "empty", r.empty,
			"claims_per_s", num(float64(r.claims)/r.elapsed.Seconds(), 0),
			"p50_ms", ms(r.lat.percentile(0.50)), "p95_ms", ms(r.lat.percentile(0.95)),
			"p99_ms", ms(r.lat.percentile(0.99)), "reschedule_p95_ms", ms(r.returns.percentile(0.95)),
			"coordinator_cpu_us_per_claim", num(r.coordCPU, 0), "db_cpu_us_per_claim", num(r.dbCPU, 0),
			"bench_cpu_us_per_claim", num(r.benchCPU, 0), "statements_per_claim", num(r.statements, 2))
	}
	return b.stopCoordinator()
}

// claimBlock is how long the claimers of a run with a reference coordinator
// stay on one coordinator before they all move to the other.
const claimBlock = 500 * time.Millisecond

// claimRun runs n claimers, each on its own connection, for a warm-up and then
// for d. A claimer claims one job and hands it straight back with Reschedule
// to the same next_attempt_at and next action, so the table keeps its shape
// (200 due jobs, the same order) however long the run; only attempt grows.
// With ref, the claimers take turns of claimBlock between the coordinator and
// ref (on the reference copy of the first history size), and ref's Claim
// latencies are kept apart: both are measured in the same seconds.
func (b *bench) claimRun(ctx context.Context, n int, d time.Duration, ref *coordinator) (claimResult, error) {
	r := claimResult{concurrency: n}
	clients, closeAll, err := b.coord.clients(n)
	if err != nil {
		return r, err
	}
	defer closeAll()
	var refClients []pb.CoordinatorClient
	if ref != nil {
		var closeRef func()
		if refClients, closeRef, err = ref.clients(n); err != nil {
			return r, err
		}
		defer closeRef()
	}
	// Each job goes back to the time it was due: the claim answers with its
	// lease end, which is where a running job's next_attempt_at stands.
	dueAt, err := dueTimes(ctx, b.db)
	if err != nil {
		return r, err
	}
	refDueAt := dueAt
	if ref != nil {
		if refDueAt, err = dueTimes(ctx, b.refStore.DB()); err != nil {
			return r, err
		}
	}
	warm := min(time.Second, d/2)
	start := time.Now()
	measureFrom, end := start.Add(warm), start.Add(warm+d)
	var mu sync.Mutex
	// The meters start with the measured part of the run.
	var meter *cpuMeter
	var before dbCounters
	var meterErr error
	warmed := time.AfterFunc(warm, func() {
		mu.Lock()
		defer mu.Unlock()
		before, meterErr = b.readDBCounters(ctx)
		meter = startCPU(b.coord.pid(), b.dbPID)
	})
	defer warmed.Stop()
	err = parallel(ctx, n, func(ctx context.Context, w int) error {
		var lat, refLat, returns latencies
		empty := 0
		worker := fmt.Sprintf("bench-claimer-%d", w)
		for time.Now().Before(end) {
			t0 := time.Now()
			c, onRef := clients[w], refClients != nil && t0.Sub(start)/claimBlock%2 == 1
			if onRef {
				c = refClients[w]
			}
			resp, err := c.Claim(ctx, &pb.ClaimRequest{WorkerId: worker, MaxJobs: 1, LeaseDuration: durationpb.New(time.Minute)})
			took := time.Since(t0)
			if err != nil {
				return fmt.Errorf("claim (%d claimers): %w", n, err)
			}
			measured := t0.After(measureFrom)
			switch {
			case measured && onRef:
				refLat = append(refLat, took)
			case measured:
				lat = append(lat, took)
			}
			if len(resp.Jobs) == 0 {
				if measured && !onRef {
					empty++
				}
				continue
			}
			for _, j := range resp.Jobs {
				due, ok := dueAt[j.Job.Id]
				if onRef {
					due, ok = refDueAt[j.Job.Id]
				}
				if !ok {
					return fmt.Errorf("claimed job %d, which is not one of the due jobs", j.Job.Id)
				}
				t1 := time.Now()
				_, err := c.Reschedule(ctx, &pb.RescheduleRequest{
					JobId: j.Job.Id, Attempt: j.Attempt, LeaseToken: j.LeaseToken, NextAction: pb.NextAction_NEXT_ACTION_REFUND,
					When:   &pb.RescheduleRequest_NextAttemptAt{NextAttemptAt: timestamppb.New(due)},
					Reason: "benchmark: handed back unchanged",
				})
				if err != nil {
					return fmt.Errorf("reschedule job %d attempt %d: %w", j.Job.Id, j.Attempt, err)
				}
				if measured && !onRef {
					returns = append(returns, time.Since(t1))
				}
			}
		}
		mu.Lock()
		r.lat = append(r.lat, lat...)
		r.ref = append(r.ref, refLat...)
		r.returns = append(r.returns, returns...)
		r.empty += empty
		mu.Unlock()
		return nil
	})
	r.elapsed = time.Since(measureFrom)
	r.claims = len(r.lat)
	if err != nil {
		return r, err
	}
	mu.Lock()
	defer mu.Unlock()
	if meter == nil || meterErr != nil {
		return r, fmt.Errorf("claim run (%d claimers): no CPU reading of the measured part: %v", n, meterErr)
	}
	cpu, self := meter.perJob(r.claims)
	r.coordCPU, r.dbCPU, r.benchCPU = cpu[0], cpu[1], self
	after, err := b.readDBCounters(ctx)
	if err != nil {
		return r, err
	}
	r.statements = after.perJob(before, "Questions", r.claims)
	b.logf("claim run: %d claimers, %d claims (%d empty) in %s", n, r.claims, r.empty, r.elapsed.Round(10*time.Millisecond))
	return r, nil
}

// dueTimes reads when each of the due jobs of Q3 is due, by id.
func dueTimes(ctx context.Context, db *sql.DB) (map[int64]time.Time, error) {
	rows, err := db.QueryContext(ctx, `SELECT id, next_attempt_at FROM refund_jobs
 WHERE operation_key LIKE 'due-%' AND state = 'ready'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]time.Time{}
	for rows.Next() {
		var id int64
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return nil, err
		}
		out[id] = at
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) != dueRows {
		return nil, fmt.Errorf("reading the due jobs: %d of %d are ready", len(out), dueRows)
	}
	return out, nil
}
