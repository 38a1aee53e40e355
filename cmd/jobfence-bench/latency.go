package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

const (
	latencyProducers     = 64 // concurrent EnqueueRefund callers keeping to the schedule
	latencyProducerConns = 4
	// latencyStall fails a run in which no job completed for this long: a
	// functional failure. A slow drain of a saturated run is only a number.
	latencyStall = 30 * time.Second
)

// latency is scenario E: for each rate a steady producer enqueues jobs through
// gRPC while long-polling workers claim (max_jobs = their free slots) and
// complete them at once. Latency runs from just before EnqueueRefund to
// Complete's reply, both on the bench's clock.
func (b *bench) latency(ctx context.Context) error {
	// Only the producer's jobs are due.
	if err := b.setDue(ctx, false); err != nil {
		return err
	}
	if err := b.startCoordinator(ctx); err != nil {
		return err
	}
	for k, rate := range b.cfg.latencyRates {
		for _, api := range b.cfg.latencyAPIs {
			// What the drains or the previous run left for InnoDB to write
			// back is not this run's work.
			settled, err := b.settle(ctx)
			if err != nil {
				return err
			}
			r, err := b.latencyRun(ctx, k, rate, api)
			if err != nil {
				return fmt.Errorf("%w\ncoordinator log:\n%s", err, b.coord.logs())
			}
			name := "latency"
			if api == "stream" {
				name = "latency_stream"
			}
			b.summary(name, "rate", rate, "jobs", len(r.e2e), "achieved_per_s", num(r.achieved, 0),
				"p50_ms", ms(r.e2e.percentile(0.50)), "p95_ms", ms(r.e2e.percentile(0.95)),
				"p99_ms", ms(r.e2e.percentile(0.99)), "max_ms", ms(r.e2e.percentile(1)),
				"enqueue_p50_ms", ms(r.enqueue.percentile(0.50)), "enqueue_p99_ms", ms(r.enqueue.percentile(0.99)),
				"producer_lag_p99_ms", ms(r.lag.percentile(0.99)), "claims", r.claims, "empty_claims", r.emptyClaims,
				"jobs_per_claim", num(ratio(float64(len(r.e2e)), float64(r.claims)), 2),
				"coordinator_cpu_us_per_job", num(r.cpu[0], 1), "db_cpu_us_per_job", num(r.cpu[1], 1),
				"bench_cpu_us_per_job", num(r.benchCPU, 1),
				"statements_per_job", num(r.statements, 2), "commits_per_job", num(r.commits, 2),
				"settle_s", num(settled.Seconds(), 1))
		}
	}
	return b.stopCoordinator()
}

// claimCounts counts a run's Claim calls.
type claimCounts struct{ claims, empty atomic.Int64 }

type latencyResult struct {
	e2e      latencies // enqueue → completed
	enqueue  latencies // EnqueueRefund round trips
	lag      latencies // how late each enqueue started against the schedule
	achieved float64   // jobs/s the producer actually reached
	claims   int64     // claims that granted at least one job
	// long polls that ended empty (the wait ran out, or the job they were
	// woken for went to another claimer)
	emptyClaims int64
	cpu         []float64 // CPU µs per job: coordinator, database server
	benchCPU    float64   // the bench's own: the producer and the workers

	statements, commits float64 // the database server's, per job
}

// latencyRun is run k of scenario E, at rate jobs/s, with workers of api
// (unary: long-polling Claim calls; stream: worker streams).
func (b *bench) latencyRun(ctx context.Context, k, rate int, api string) (latencyResult, error) {
	var r latencyResult
	n := max(1, int(float64(rate)*b.cfg.latencyDuration.Seconds()))
	clients, closeAll, err := b.coord.clients(b.cfg.latencyWorkers + latencyProducerConns)
	if err != nil {
		return r, err
	}
	defer closeAll()
	workerClients, producerClients := clients[:b.cfg.latencyWorkers], clients[b.cfg.latencyWorkers:]

	runCtx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	var (
		pending   sync.Map // operation_key → time just before its EnqueueRefund
		mu        sync.Mutex
		completed atomic.Int64
		counts    claimCounts
	)
	record := func(key string, at time.Time) {
		if t0, ok := pending.LoadAndDelete(key); ok {
			mu.Lock()
			r.e2e = append(r.e2e, at.Sub(t0.(time.Time)))
			mu.Unlock()
			completed.Add(1)
		}
	}

	before, err := b.readDBCounters(ctx)
	if err != nil {
		return r, err
	}
	meter := startCPU(b.coord.pid(), b.dbPID)
	workCtx, stopWorkers := context.WithCancel(runCtx)
	defer stopWorkers()
	var workers sync.WaitGroup
	for w := range b.cfg.latencyWorkers {
		workers.Go(func() {
			work := b.latencyWorker
			if api == "stream" {
				work = b.latencyStreamWorker
			}
			if err := work(workCtx, workerClients[w], fmt.Sprintf("bench-latency-%s-%d-%d", api, rate, w), &counts, record); err != nil {
				fail(err)
			}
		})
	}

	var achieved float64
	achieved, r.lag, r.enqueue, err = produce(runCtx, producerClients, rate, n, fmt.Sprintf("lat-%d-%d-%s-", k, rate, api),
		func(key string, t0 time.Time) { pending.Store(key, t0) })
	if err == nil {
		seen, progress := completed.Load(), time.Now()
		for seen < int64(n) && runCtx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
			if now := completed.Load(); now != seen {
				seen, progress = now, time.Now()
			} else if time.Since(progress) > latencyStall {
				err = fmt.Errorf("latency at %d/s: stalled at %d of %d jobs completed, none for %s", rate, seen, n, latencyStall)
				break
			}
		}
	}
	stopWorkers()
	workers.Wait()
	r.cpu, r.benchCPU = meter.perJob(n)
	r.claims, r.emptyClaims = counts.claims.Load(), counts.empty.Load()
	if after, cerr := b.readDBCounters(ctx); cerr == nil {
		r.statements = after.perJob(before, "Questions", n)
		r.commits = after.perJob(before, "Com_commit", n)
	} else if err == nil {
		err = cerr
	}
	if cause := context.Cause(runCtx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	if err == nil {
		err = ctx.Err()
	}
	r.achieved = achieved
	return r, err
}

// produce enqueues n jobs keyed prefix<i> (i in 7 digits) through clients on
// scenario E's schedule: job i at start + i/rate, by latencyProducers
// callers. sent, when set, is told each key and when its enqueue began. It
// returns the rate achieved (from the first send to the last), how late each
// send started, and how long each enqueue took.
func produce(ctx context.Context, clients []pb.CoordinatorClient, rate, n int, prefix string,
	sent func(key string, t0 time.Time)) (achieved float64, lags, enqueues latencies, err error) {
	interval := time.Second / time.Duration(rate)
	var next atomic.Int64
	var first, last atomic.Int64 // send start times, ns since start
	var mu sync.Mutex
	start := time.Now().Add(100 * time.Millisecond)
	err = parallel(ctx, latencyProducers, func(ctx context.Context, p int) error {
		c := clients[p%len(clients)]
		var lat, lag latencies
		defer func() {
			mu.Lock()
			enqueues, lags = append(enqueues, lat...), append(lags, lag...)
			mu.Unlock()
		}()
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return nil
			}
			at := start.Add(time.Duration(i) * interval)
			select {
			case <-time.After(time.Until(at)):
			case <-ctx.Done():
				return nil
			}
			key := fmt.Sprintf("%s%07d", prefix, i)
			t0 := time.Now()
			lag = append(lag, t0.Sub(at))
			if sent != nil {
				sent(key, t0)
			}
			if _, err := c.EnqueueRefund(ctx, &pb.EnqueueRefundRequest{
				OperationKey: key, OrderId: "order-" + key, PaymentId: "pay-" + key,
				AmountMinor: int64(100 + i), Currency: "EUR", Provider: "acme"}); err != nil {
				return fmt.Errorf("enqueue %s: %w", key, err)
			}
			lat = append(lat, time.Since(t0))
			if i == 0 {
				first.Store(int64(t0.Sub(start)))
			}
			if i == n-1 {
				last.Store(int64(t0.Sub(start)))
			}
		}
	})
	if span := time.Duration(last.Load() - first.Load()); n > 1 && span > 0 {
		achieved = float64(n-1) / span.Seconds()
	}
	return achieved, lags, enqueues, err
}

// latencyStreamWorker is latencyWorker on a worker stream: it opens the
// stream with --latency-slots credits and completes each grant at once in
// its own goroutine, its credit given back with the answer. It returns nil
// when ctx ends.
func (b *bench) latencyStreamWorker(ctx context.Context, c pb.CoordinatorClient, id string, counts *claimCounts,
	record func(string, time.Time)) error {
	s, err := openStream(ctx, c, id, b.cfg.latencySlots)
	if err != nil {
		return err
	}
	var inflight sync.WaitGroup
	defer inflight.Wait()
	var failed atomic.Pointer[error]
	for {
		select {
		case j := <-s.grants:
			counts.claims.Add(1)
			inflight.Go(func() {
				if err := s.complete(ctx, j); err != nil {
					if ctx.Err() == nil {
						err = fmt.Errorf("complete job %d attempt %d: %w", j.Job.Id, j.Attempt, err)
						failed.CompareAndSwap(nil, &err)
					}
					return
				}
				record(j.Job.OperationKey, time.Now())
			})
		case err := <-s.ended:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("worker stream ended: %w", err)
		case <-ctx.Done():
			return nil
		}
		if e := failed.Load(); e != nil {
			return *e
		}
	}
}

// latencyWorker is a worker with --latency-slots slots: whenever a slot is
// free it long-polls Claim for as many jobs as it has free slots, and
// completes each claimed job at once in its own goroutine. It returns nil when
// ctx ends.
func (b *bench) latencyWorker(ctx context.Context, c pb.CoordinatorClient, id string, counts *claimCounts,
	record func(string, time.Time)) error {
	slots := b.cfg.latencySlots
	free := make(chan struct{}, slots)
	for range slots {
		free <- struct{}{}
	}
	var inflight sync.WaitGroup
	defer inflight.Wait()
	var failed atomic.Pointer[error]
	for {
		select {
		case <-free:
		case <-ctx.Done():
			return nil
		}
		n := 1
	more:
		for n < slots {
			select {
			case <-free:
				n++
			default:
				break more
			}
		}
		if e := failed.Load(); e != nil {
			return *e
		}
		cctx, cancel := context.WithTimeout(ctx, b.cfg.claimWait+10*time.Second)
		resp, err := c.Claim(cctx, &pb.ClaimRequest{WorkerId: id, MaxJobs: int32(n),
			LeaseDuration: durationpb.New(time.Minute), Wait: durationpb.New(b.cfg.claimWait)})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("claim: %w", err)
		}
		if len(resp.Jobs) > 0 {
			counts.claims.Add(1)
		} else {
			counts.empty.Add(1)
		}
		for range n - len(resp.Jobs) {
			free <- struct{}{}
		}
		for _, j := range resp.Jobs {
			inflight.Go(func() {
				defer func() { free <- struct{}{} }()
				_, err := c.Complete(ctx, &pb.CompleteRequest{JobId: j.Job.Id, Attempt: j.Attempt, LeaseToken: j.LeaseToken,
					ProviderRefundId: fmt.Sprintf("re_bench_%d", j.Job.Id)})
				if err != nil {
					if ctx.Err() == nil {
						err = fmt.Errorf("complete job %d attempt %d: %w", j.Job.Id, j.Attempt, err)
						failed.CompareAndSwap(nil, &err)
					}
					return
				}
				record(j.Job.OperationKey, time.Now())
			})
		}
	}
}
