package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/server"
)

const (
	// holdProvider is the provider of the jobs the killed worker holds: only
	// it and the worker taking them over claim that provider's jobs.
	holdProvider = "bench_hold"
	// renewSlots is the concurrency of each worker of the cost measurement.
	renewSlots = 100
	// holderClaimTimeout bounds how long the holder may take to claim its jobs.
	holderClaimTimeout = time.Minute
)

// renewal is scenario G, lease renewal (R27), in three measurements on one
// coordinator process that serves its metrics:
//
//   - takeover: a worker process holding --takeover-jobs jobs in provider
//     calls that never return is killed with SIGKILL, and a long-polling
//     worker takes them over; the time from the kill to each takeover, once
//     with a short renewed lease and once with a long lease not renewed
//     (R17's arithmetic, measured);
//   - cost: scenario E's steady producer at --renew-rate with Go SDK workers
//     whose provider calls take --renew-hold, once without renewal (a lease
//     that outlasts the call) and once with a lease the calls outlast, so
//     that each job is renewed; the database's and the coordinator's CPU per
//     job and per renewal, from the difference;
//   - renewals alone: every slot of those workers holding a job that is only
//     renewed, nothing else running; the CPU per renewal directly.
func (b *bench) renewal(ctx context.Context) error {
	// Only the scenario's own jobs are due.
	if err := b.setDue(ctx, false); err != nil {
		return err
	}
	if err := b.startCoordinator(ctx, "--metrics-listen", "127.0.0.1:0"); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the bench's own binary, to run the worker process: %w", err)
	}
	var recovered []takeoverResult
	for _, renew := range []bool{true, false} {
		r, err := b.takeoverRun(ctx, self, renew)
		if err != nil {
			return fmt.Errorf("%w\ncoordinator log:\n%s", err, b.coord.logs())
		}
		recovered = append(recovered, r)
		lease := b.cfg.plainLease
		kv := []any{"renewal", onOff(renew)}
		if renew {
			lease = b.cfg.takeoverLease
			kv = append(kv, "renew_interval_s", num(renewEvery(b.cfg.renewInterval, lease).Seconds(), 2))
		}
		poll := b.claimPollInterval()
		b.summary("takeover", append(kv, "lease_s", num(lease.Seconds(), 1), "jobs", b.cfg.takeoverJobs,
			"kill_after_s", num(b.cfg.takeoverKillAfter.Seconds(), 1), "renewals_before_kill", r.renewals,
			"taken_before_kill", r.early, "recovery_p50_s", secs(r.recovery.percentile(0.5)),
			"recovery_max_s", secs(r.recovery.percentile(1)), "lease_left_p50_s", secs(r.leaseLeft.percentile(0.5)),
			"lease_left_max_s", secs(r.leaseLeft.percentile(1)), "after_expiry_p50_ms", ms(r.afterExpiry.percentile(0.5)),
			"after_expiry_max_ms", ms(r.afterExpiry.percentile(1)), "r17_lease_plus_poll_s", secs(lease+poll))...)
	}
	on, off := recovered[0], recovered[1]
	b.summary("takeover_ratio", "p50_without_over_with",
		num(ratio(float64(off.recovery.percentile(0.5)), float64(on.recovery.percentile(0.5))), 2),
		"max_without_over_with", num(ratio(float64(off.recovery.percentile(1)), float64(on.recovery.percentile(1))), 2))

	var costs [2][]renewCost // without, with renewal
	for k := range b.cfg.renewPairs {
		for i, renew := range []bool{false, true} {
			settled, err := b.settle(ctx)
			if err != nil {
				return err
			}
			r, err := b.renewCostRun(ctx, k, renew)
			if err != nil {
				return fmt.Errorf("%w\ncoordinator log:\n%s", err, b.coord.logs())
			}
			costs[i] = append(costs[i], r)
			lease := b.cfg.plainLease
			kv := []any{"renewal", onOff(renew)}
			if renew {
				lease = b.cfg.renewLease
				kv = append(kv, "renew_interval_s", num(renewEvery(b.cfg.renewInterval, lease).Seconds(), 2))
			}
			b.summary("renew_cost", append(kv, "pair", k+1, "lease_s", num(lease.Seconds(), 1), "rate", b.cfg.renewRate,
				"jobs", r.jobs, "achieved_per_s", num(r.achieved, 0), "producer_lag_p99_ms", ms(r.lag.percentile(0.99)),
				"hold_s", num(b.cfg.renewHold.Seconds(), 2), "renewals_per_job", num(r.renewalsPerJob(), 2),
				"renew_calls_per_job", num(ratio(float64(r.renewals.calls), float64(r.jobs)), 3),
				"renew_tx_per_job", num(ratio(r.renewals.txs, float64(r.jobs)), 3),
				"rows_per_renew_tx", num(ratio(r.renewals.rows, r.renewals.txs), 1),
				"refused", r.renewals.refusedList(), "takeovers", int64(r.renewals.takeovers),
				"coordinator_cpu_us_per_job", num(r.cpu[0], 1), "db_cpu_us_per_job", num(r.cpu[1], 1),
				"bench_cpu_us_per_job", num(r.self, 1), "statements_per_job", num(r.statements, 2),
				"commits_per_job", num(r.commits, 2), "settle_s", num(settled.Seconds(), 1))...)
		}
	}
	b.summary("renew_cost_extra", renewExtra(costs[0], costs[1])...)
	if err := b.renewOnly(ctx); err != nil {
		return fmt.Errorf("%w\ncoordinator log:\n%s", err, b.coord.logs())
	}
	return b.stopCoordinator()
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// renewEvery is the SDK's renewal interval for lease: interval, or a third
// of the lease (each renewal within ±10 % of it).
func renewEvery(interval, lease time.Duration) time.Duration {
	if interval > 0 {
		return interval
	}
	return lease / 3
}

// claimPollInterval is the coordinator's --claim-poll-interval: how often a
// long poll looks again for expired leases.
func (b *bench) claimPollInterval() time.Duration {
	for i, f := range b.cfg.coordFlags {
		v, ok := strings.CutPrefix(f, "--claim-poll-interval=")
		if !ok && f == "--claim-poll-interval" && i+1 < len(b.cfg.coordFlags) {
			v, ok = b.cfg.coordFlags[i+1], true
		}
		if d, err := time.ParseDuration(v); ok && err == nil {
			return d
		}
	}
	return server.Defaults.ClaimPollInterval
}

// secs formats d in seconds with millisecond resolution.
func secs(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// takeoverResult is one kill and takeover.
type takeoverResult struct {
	recovery    latencies // kill → the takeover's grant, per job
	leaseLeft   latencies // the lease each job had left at the kill (database clock)
	afterExpiry latencies // recovery less the lease left: the takeover's own delay
	renewals    int64     // leases the coordinator renewed while the holder lived
	early       int       // jobs taken over before the kill (a renewal that came too late)
}

// takeoverRun enqueues the held jobs, starts the holder process on them,
// kills it --takeover-kill-after after it claimed them all, and measures
// when a long-polling worker in the bench takes each over.
func (b *bench) takeoverRun(ctx context.Context, self string, renew bool) (takeoverResult, error) {
	var r takeoverResult
	n := b.cfg.takeoverJobs
	clients, closeAll, err := b.coord.clients(1)
	if err != nil {
		return r, err
	}
	defer closeAll()
	ids := make([]int64, 0, n)
	for i := range n {
		key := fmt.Sprintf("hold-%s-%03d", onOff(renew), i)
		resp, err := clients[0].EnqueueRefund(ctx, &pb.EnqueueRefundRequest{
			OperationKey: key, OrderId: "order-" + key, PaymentId: "pay-" + key,
			AmountMinor: int64(100 + i), Currency: "EUR", Provider: holdProvider})
		if err != nil {
			return r, fmt.Errorf("enqueue %s: %w", key, err)
		}
		ids = append(ids, resp.Job.Id)
	}
	before, err := scrapeMetrics(ctx, b.coord.metrics())
	if err != nil {
		return r, err
	}

	hc := holderConfig{coordinator: b.coord.addr, workerID: "bench-holder-" + onOff(renew), provider: holdProvider,
		jobs: n, lease: b.cfg.plainLease, noRenewal: !renew, hold: 5 * time.Minute}
	if renew {
		hc.lease, hc.renewInterval = b.cfg.takeoverLease, b.cfg.renewInterval
	}
	h, err := startHolder(self, hc)
	if err != nil {
		return r, err
	}
	defer h.kill()
	b.logf("worker process pid %d holds %d jobs, lease %s, renewal %s", h.cmd.Process.Pid, n, hc.lease, onOff(renew))
	claimed, err := h.waitClaimed(ctx, ids, holderClaimTimeout)
	if err != nil {
		return r, err
	}

	// The worker that takes over: long polls, as a worker in production does.
	var mu sync.Mutex
	grants := map[int64]time.Time{}
	var badGrant error
	var completed atomic.Int64
	done := func(ctx context.Context, job jobfence.ClaimedJob) jobfence.Result {
		return jobfence.Succeeded(fmt.Sprintf("re_bench_hold_%d", job.Job.ID))
	}
	tc, err := jobfence.Dial(b.coord.addr)
	if err != nil {
		return r, err
	}
	defer tc.Close()
	tw, err := jobfence.NewWorker(tc, jobfence.HandlerFuncs{RefundFunc: done, ReconcileFunc: done}, jobfence.WorkerOptions{
		WorkerID: "bench-takeover-" + onOff(renew), Concurrency: n, Provider: holdProvider, Lease: time.Minute,
		ClaimWait: b.cfg.claimWait, ReceiptSpool: jobfence.ReceiptSpoolOff,
		OnEvent: func(e jobfence.WorkerEvent) {
			switch {
			case e.Kind == jobfence.WorkerClaimed:
				at := time.Now()
				mu.Lock()
				if _, twice := grants[e.Job.Job.ID]; !twice {
					grants[e.Job.Job.ID] = at
				}
				if (!e.Job.Takeover || e.Job.NextAction != jobfence.ActionReconcile) && badGrant == nil {
					badGrant = fmt.Errorf("job %d granted to the second worker as takeover=%v, next action %s: want a takeover to reconcile",
						e.Job.Job.ID, e.Job.Takeover, e.Job.NextAction)
				}
				mu.Unlock()
			case e.Kind == jobfence.WorkerWritten && e.Decision.Kind == jobfence.DecideComplete:
				completed.Add(1)
			}
		},
	})
	if err != nil {
		return r, err
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- tw.Run(runCtx) }()
	var runErr error
	stopped := false
	stopWorker := func() error {
		if !stopped {
			stop()
			runErr, stopped = <-ran, true
		}
		return runErr
	}
	defer stopWorker() //nolint:errcheck

	select {
	case <-time.After(time.Until(claimed.Add(b.cfg.takeoverKillAfter))):
	case <-ctx.Done():
		return r, ctx.Err()
	}
	if h.exited() {
		return r, fmt.Errorf("the worker process exited before it was killed\n%s", h.logs())
	}
	killed := time.Now()
	h.kill()
	q0 := time.Now()
	left, err := b.leaseLeft(ctx, ids)
	if err != nil {
		return r, err
	}
	sinceKill := q0.Sub(killed)
	after, err := scrapeMetrics(ctx, b.coord.metrics())
	if err != nil {
		return r, err
	}
	r.renewals = int64(after.delta(before, `jobfence_lease_renewals_total{result="renewed"}`))
	b.logf("killed the worker process %s after its last claim; %d renewals while it lived",
		b.cfg.takeoverKillAfter, r.renewals)

	// Every job is taken over after its lease, and completed.
	deadline := time.Now().Add(max(b.cfg.plainLease, b.cfg.takeoverLease) + time.Minute)
	for completed.Load() < int64(n) {
		if time.Now().After(deadline) {
			return r, fmt.Errorf("takeover: %d of %d held jobs completed by the second worker %s after the kill",
				completed.Load(), n, time.Since(killed).Round(time.Second))
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return r, ctx.Err()
		}
	}
	if err := stopWorker(); err != nil {
		return r, fmt.Errorf("the second worker: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if badGrant != nil {
		return r, badGrant
	}
	for _, id := range ids {
		at, ok := grants[id]
		if !ok {
			return r, fmt.Errorf("job %d completed without a grant to the second worker", id)
		}
		if at.Before(killed) {
			r.early++
			continue
		}
		rec := at.Sub(killed)
		l := left[id] + sinceKill // the lease it had left at the kill
		r.recovery = append(r.recovery, rec)
		r.leaseLeft = append(r.leaseLeft, l)
		r.afterExpiry = append(r.afterExpiry, rec-l)
	}
	return r, b.checkTakenOver(ctx, ids)
}

// leaseLeft is each job's lease_until less the database's now.
func (b *bench) leaseLeft(ctx context.Context, ids []int64) (map[int64]time.Duration, error) {
	rows, err := b.db.QueryContext(ctx, `SELECT id, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until)
 FROM refund_jobs WHERE id IN (`+idList(ids)+`)`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]time.Duration{}
	for rows.Next() {
		var id int64
		var us sql.NullInt64
		if err := rows.Scan(&id, &us); err != nil {
			return nil, err
		}
		if !us.Valid {
			return nil, fmt.Errorf("held job %d has no lease", id)
		}
		out[id] = time.Duration(us.Int64) * time.Microsecond
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) != len(ids) {
		return nil, fmt.Errorf("found %d of %d held jobs", len(out), len(ids))
	}
	return out, nil
}

// checkTakenOver verifies that each held job succeeded in its second
// attempt: one claim by the killed worker, one takeover, nothing else.
func (b *bench) checkTakenOver(ctx context.Context, ids []int64) error {
	var ok int
	if err := b.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM refund_jobs
 WHERE id IN (`+idList(ids)+`) AND state = 'succeeded' AND attempt = 2`).Scan(&ok); err != nil {
		return err
	}
	if ok != len(ids) {
		return fmt.Errorf("takeover: %d of %d held jobs succeeded in their second attempt", ok, len(ids))
	}
	return nil
}

func idList(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ",")
}

// renewCost is one run of the cost measurement.
type renewCost struct {
	jobs     int
	achieved float64
	lag      latencies
	cpu      []float64 // CPU µs per job: coordinator, database server
	self     float64   // the bench's own CPU µs per job

	statements, commits float64 // the database server's, per job
	renewals            renewCounts
}

func (r renewCost) renewalsPerJob() float64 { return ratio(r.renewals.renewed, float64(r.jobs)) }

// renewCounts is what the coordinator's metrics and the workers' calls say
// about renewals over a measurement.
type renewCounts struct {
	calls     int64   // RenewLeases calls the workers made
	renewed   float64 // grants renewed
	refused   map[string]float64
	txs, rows float64 // renewal transactions and the grants they renewed
	takeovers float64
}

func (c renewCounts) refusedTotal() float64 {
	var n float64
	for _, v := range c.refused {
		n += v
	}
	return n
}

// refusedList is "result:count,…" of the refused renewals, "none" without.
func (c renewCounts) refusedList() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(c.refused)) {
		if c.refused[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s:%.0f", k, c.refused[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// renewCountsBetween reads renewCounts from two scrapes and the call count.
func renewCountsBetween(before, after promSample, calls int64) renewCounts {
	c := renewCounts{calls: calls, refused: map[string]float64{},
		txs:       after.delta(before, "jobfence_renew_batch_size_count"),
		rows:      after.delta(before, "jobfence_renew_batch_size_sum"),
		takeovers: after.delta(before, "jobfence_takeovers_total")}
	const prefix = `jobfence_lease_renewals_total{result="`
	for series := range after {
		result, ok := strings.CutPrefix(series, prefix)
		if !ok {
			continue
		}
		result = strings.TrimSuffix(result, `"}`)
		if d := after.delta(before, series); result == "renewed" {
			c.renewed = d
		} else {
			c.refused[result] = d
		}
	}
	return c
}

// renewFleet is --renew-workers Go SDK workers in the bench process, each
// on its own connection with --claim-wait long polls and renewSlots slots,
// calling work for every job.
type renewFleet struct {
	calls     atomic.Int64 // RenewLeases calls
	completed atomic.Int64
	failed    atomic.Int64
	first     atomic.Pointer[string] // the first failure
	stop      func()
}

func (b *bench) startRenewFleet(ctx context.Context, name string, renew bool, lease time.Duration,
	work func(ctx context.Context, job jobfence.ClaimedJob) jobfence.Result) (*renewFleet, error) {
	f := &renewFleet{}
	count := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == pb.Coordinator_RenewLeases_FullMethodName {
			f.calls.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	reconcile := func(ctx context.Context, job jobfence.ClaimedJob) jobfence.Result {
		return jobfence.Succeeded(fmt.Sprintf("re_bench_%d", job.Job.ID))
	}
	runCtx, cancel := context.WithCancel(ctx)
	var running sync.WaitGroup
	var conns []*jobfence.Client
	f.stop = func() {
		cancel()
		running.Wait()
		for _, c := range conns {
			c.Close()
		}
	}
	for w := range b.cfg.renewWorkers {
		c, err := jobfence.Dial(b.coord.addr, jobfence.WithDialOptions(count))
		if err != nil {
			f.stop()
			return nil, err
		}
		conns = append(conns, c)
		wk, err := jobfence.NewWorker(c, jobfence.HandlerFuncs{RefundFunc: work, ReconcileFunc: reconcile}, jobfence.WorkerOptions{
			WorkerID: fmt.Sprintf("bench-%s-%d", name, w), Concurrency: renewSlots, Lease: lease,
			RenewInterval: b.cfg.renewInterval, NoLeaseRenewal: !renew, ProviderTimeout: 10 * time.Minute,
			ClaimWait: b.cfg.claimWait, ReceiptSpool: jobfence.ReceiptSpoolOff,
			OnEvent: func(e jobfence.WorkerEvent) {
				switch e.Kind {
				case jobfence.WorkerWritten:
					if e.Decision.Kind == jobfence.DecideComplete {
						f.completed.Add(1)
						return
					}
					fallthrough
				case jobfence.WorkerWriteFailed, jobfence.WorkerClaimFailed:
					f.failed.Add(1)
					msg := fmt.Sprintf("%s job %d: %v %v", e.Kind, e.Job.Job.ID, e.Decision.Kind, e.Err)
					f.first.CompareAndSwap(nil, &msg)
				}
			},
		})
		if err != nil {
			f.stop()
			return nil, err
		}
		running.Go(func() { wk.Run(runCtx) }) //nolint:errcheck // the drain of workers whose jobs are done
	}
	return f, nil
}

// err is the fleet's first failed call, if any.
func (f *renewFleet) err() error {
	if m := f.first.Load(); m != nil {
		return fmt.Errorf("%d workers' calls failed, the first: %s", f.failed.Load(), *m)
	}
	return nil
}

// waitCompleted waits until n jobs are completed, failing on a failed call
// or when none completes for latencyStall.
func (f *renewFleet) waitCompleted(ctx context.Context, n int) error {
	seen, progress := f.completed.Load(), time.Now()
	for seen < int64(n) {
		if err := f.err(); err != nil {
			return err
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		if now := f.completed.Load(); now != seen {
			seen, progress = now, time.Now()
		} else if time.Since(progress) > latencyStall {
			return fmt.Errorf("stalled at %d of %d jobs completed, none for %s", seen, n, latencyStall)
		}
	}
	return f.err()
}

// renewCostRun is run k of the cost measurement, with renewal or without.
func (b *bench) renewCostRun(ctx context.Context, k int, renew bool) (renewCost, error) {
	r := renewCost{jobs: max(1, int(float64(b.cfg.renewRate)*b.cfg.renewDuration.Seconds()))}
	lease := b.cfg.plainLease
	if renew {
		lease = b.cfg.renewLease
	}
	hold := b.cfg.renewHold
	work := func(ctx context.Context, job jobfence.ClaimedJob) jobfence.Result {
		select {
		case <-time.After(hold):
		case <-ctx.Done():
			return jobfence.Unknown(context.Cause(ctx))
		}
		return jobfence.Succeeded(fmt.Sprintf("re_bench_%d", job.Job.ID))
	}
	f, err := b.startRenewFleet(ctx, fmt.Sprintf("renew-%d-%s", k, onOff(renew)), renew, lease, work)
	if err != nil {
		return r, err
	}
	defer f.stop()
	producers, closeAll, err := b.coord.clients(latencyProducerConns)
	if err != nil {
		return r, err
	}
	defer closeAll()
	// Let every worker's first long poll arrive.
	time.Sleep(500 * time.Millisecond)

	before, err := b.readDBCounters(ctx)
	if err != nil {
		return r, err
	}
	mBefore, err := scrapeMetrics(ctx, b.coord.metrics())
	if err != nil {
		return r, err
	}
	b.logf("renewal %s: %d jobs at %d/s, each held %s under a %s lease, %d workers × %d slots",
		onOff(renew), r.jobs, b.cfg.renewRate, hold, lease, b.cfg.renewWorkers, renewSlots)
	meter := startCPU(b.coord.pid(), b.dbPID)
	prefix := fmt.Sprintf("renew-%d-%s-", k, onOff(renew))
	if r.achieved, r.lag, _, err = produce(ctx, producers, b.cfg.renewRate, r.jobs, prefix, nil); err != nil {
		return r, err
	}
	if err := f.waitCompleted(ctx, r.jobs); err != nil {
		return r, fmt.Errorf("renewal %s: %w", onOff(renew), err)
	}
	r.cpu, r.self = meter.perJob(r.jobs)
	after, err := b.readDBCounters(ctx)
	if err != nil {
		return r, err
	}
	mAfter, err := scrapeMetrics(ctx, b.coord.metrics())
	if err != nil {
		return r, err
	}
	r.statements = after.perJob(before, "Questions", r.jobs)
	r.commits = after.perJob(before, "Com_commit", r.jobs)
	r.renewals = renewCountsBetween(mBefore, mAfter, f.calls.Load())
	return r, nil
}

// renewOnly measures renewals alone: the fleet's every slot holds a job
// whose provider call lasts until the end, so that nothing but renewals
// (and the coordinator's own health checks) reaches the database for
// --renew-duration; then the calls return and the jobs complete. The same
// time with no worker connected, just before, is the idle baseline: what
// the database and the coordinator spend doing nothing.
func (b *bench) renewOnly(ctx context.Context) error {
	n := b.cfg.renewWorkers * renewSlots
	if _, err := b.settle(ctx); err != nil {
		return err
	}
	idle := startCPU(b.coord.pid(), b.dbPID)
	idleStart := time.Now()
	select {
	case <-time.After(b.cfg.renewDuration):
	case <-ctx.Done():
		return ctx.Err()
	}
	// CPU µs per second of idleness: coordinator, database server.
	idleRate, _ := idle.perJob(1)
	for i := range idleRate {
		idleRate[i] /= time.Since(idleStart).Seconds()
	}

	release := make(chan struct{})
	var held atomic.Int64
	work := func(ctx context.Context, job jobfence.ClaimedJob) jobfence.Result {
		held.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return jobfence.Unknown(context.Cause(ctx))
		}
		return jobfence.Succeeded(fmt.Sprintf("re_bench_%d", job.Job.ID))
	}
	f, err := b.startRenewFleet(ctx, "renew-only", true, b.cfg.renewLease, work)
	if err != nil {
		return err
	}
	defer f.stop()
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	producers, closeAll, err := b.coord.clients(latencyProducerConns)
	if err != nil {
		return err
	}
	defer closeAll()
	// As fast as the coordinator takes them: the rate is not measured here.
	if _, _, _, err := produce(ctx, producers, 1_000_000, n, "renew-only-", nil); err != nil {
		return err
	}
	for deadline := time.Now().Add(time.Minute); held.Load() < int64(n); {
		if err := f.err(); err != nil {
			return fmt.Errorf("renewals alone: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("renewals alone: %d of %d jobs held a minute after their enqueue", held.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// One renewal interval for the claims' transactions to leave the
	// database's CPU time, and for the renewals to spread out.
	time.Sleep(renewEvery(b.cfg.renewInterval, b.cfg.renewLease))
	settled, err := b.settle(ctx)
	if err != nil {
		return err
	}
	before, err := b.readDBCounters(ctx)
	if err != nil {
		return err
	}
	mBefore, err := scrapeMetrics(ctx, b.coord.metrics())
	if err != nil {
		return err
	}
	calls0 := f.calls.Load()
	b.logf("renewals alone: %d jobs held, each renewed every %s under a %s lease, for %s",
		n, renewEvery(b.cfg.renewInterval, b.cfg.renewLease), b.cfg.renewLease, b.cfg.renewDuration)
	meter := startCPU(b.coord.pid(), b.dbPID)
	start := time.Now()
	select {
	case <-time.After(b.cfg.renewDuration):
	case <-ctx.Done():
		return ctx.Err()
	}
	elapsed := time.Since(start)
	mAfter, err := scrapeMetrics(ctx, b.coord.metrics())
	if err != nil {
		return err
	}
	c := renewCountsBetween(mBefore, mAfter, f.calls.Load()-calls0)
	perRenewal, self := meter.perJob(int(c.renewed))
	perSecond := func(i int) string { return num(perRenewal[i]*c.renewed/elapsed.Seconds(), 0) }
	after, err := b.readDBCounters(ctx)
	if err != nil {
		return err
	}
	close(release)
	released = true
	if err := f.waitCompleted(ctx, n); err != nil {
		return fmt.Errorf("renewals alone: %w", err)
	}
	b.summary("renew_only", "jobs_held", n, "lease_s", num(b.cfg.renewLease.Seconds(), 1),
		"renew_interval_s", num(renewEvery(b.cfg.renewInterval, b.cfg.renewLease).Seconds(), 2),
		"seconds", num(elapsed.Seconds(), 1), "renewals", int64(c.renewed),
		"renewals_per_s", num(c.renewed/elapsed.Seconds(), 0), "refused", c.refusedList(),
		"renew_calls", c.calls, "grants_per_call", num(ratio(c.renewed+c.refusedTotal(), float64(c.calls)), 1),
		"renew_tx", int64(c.txs), "rows_per_renew_tx", num(ratio(c.rows, c.txs), 1), "takeovers", int64(c.takeovers),
		"db_cpu_us_per_renewal", num(perRenewal[1], 1), "coordinator_cpu_us_per_renewal", num(perRenewal[0], 1),
		"bench_cpu_us_per_renewal", num(self, 1), "db_cpu_us_per_s", perSecond(1), "idle_db_cpu_us_per_s", num(idleRate[1], 0),
		"coordinator_cpu_us_per_s", perSecond(0), "idle_coordinator_cpu_us_per_s", num(idleRate[0], 0),
		"statements_per_renew_tx", num(ratio(float64(after["Questions"]-before["Questions"]), c.txs), 2),
		"commits_per_renew_tx", num(ratio(float64(after["Com_commit"]-before["Com_commit"]), c.txs), 2),
		"settle_s", num(settled.Seconds(), 1))
	return nil
}

// renewExtra is the key=value pairs of what renewal added: the means of the
// runs with renewal less those without, per job and per renewal, and each
// pair's difference in database CPU per job.
func renewExtra(off, on []renewCost) []any {
	mean := func(rs []renewCost, f func(renewCost) float64) float64 {
		var sum float64
		for _, r := range rs {
			sum += f(r)
		}
		return sum / float64(len(rs))
	}
	db := func(r renewCost) float64 { return r.cpu[1] }
	coord := func(r renewCost) float64 { return r.cpu[0] }
	stmts := func(r renewCost) float64 { return r.statements }
	commits := func(r renewCost) float64 { return r.commits }
	perJob := mean(on, renewCost.renewalsPerJob)
	extraDB, extraCoord := mean(on, db)-mean(off, db), mean(on, coord)-mean(off, coord)
	extraStmts, extraCommits := mean(on, stmts)-mean(off, stmts), mean(on, commits)-mean(off, commits)
	var pairs []string
	for i := range min(len(on), len(off)) {
		pairs = append(pairs, num(on[i].cpu[1]-off[i].cpu[1], 1))
	}
	return []any{"pairs", len(on), "renewals_per_job", num(perJob, 2),
		"db_cpu_us_per_job_off", num(mean(off, db), 1), "db_cpu_us_per_job_on", num(mean(on, db), 1),
		"extra_db_cpu_us_per_job", num(extraDB, 1), "extra_db_cpu_us_per_renewal", num(ratio(extraDB, perJob), 1),
		"extra_db_cpu_us_per_job_by_pair", strings.Join(pairs, ","),
		"extra_db_cpu_share", num(ratio(extraDB, mean(off, db)), 3),
		"coordinator_cpu_us_per_job_off", num(mean(off, coord), 1), "coordinator_cpu_us_per_job_on", num(mean(on, coord), 1),
		"extra_coordinator_cpu_us_per_job", num(extraCoord, 1),
		"extra_coordinator_cpu_us_per_renewal", num(ratio(extraCoord, perJob), 1),
		"extra_statements_per_renewal", num(ratio(extraStmts, perJob), 2),
		"extra_commits_per_renewal", num(ratio(extraCommits, perJob), 3)}
}

// promSample is a scrape of the coordinator's /metrics: each series
// (name{labels}) and its value.
type promSample map[string]float64

func scrapeMetrics(ctx context.Context, addr string) (promSample, error) {
	if addr == "" {
		return nil, errors.New("the coordinator serves no metrics")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape the coordinator's metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape the coordinator's metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads Prometheus' text format: "series value" lines, comments
// skipped.
func parseMetrics(r io.Reader) (promSample, error) {
	out := promSample{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[strings.TrimSpace(line[:i])] = v
	}
	return out, sc.Err()
}

// delta is series' growth since before (a series not yet exported counts 0).
func (after promSample) delta(before promSample, series string) float64 {
	return after[series] - before[series]
}
