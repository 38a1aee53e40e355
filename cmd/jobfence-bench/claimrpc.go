package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

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
				t1 := time.Now()
				_, err := c.Reschedule(ctx, &pb.RescheduleRequest{
					JobId: j.Job.Id, Attempt: j.Attempt, LeaseToken: j.LeaseToken, NextAction: pb.NextAction_NEXT_ACTION_REFUND,
					When:   &pb.RescheduleRequest_NextAttemptAt{NextAttemptAt: j.Job.NextAttemptAt},
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
