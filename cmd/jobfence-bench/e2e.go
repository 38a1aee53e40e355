package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
)

// grant is a claimed job as the drain loop needs it.
// grant is what a write-back carries (R25).
type grant struct {
	id, attempt int64
	token       string
}

// drainer is one way of issuing the claim and complete transactions: through
// the coordinator's gRPC API, or in-process through the store.
type drainer interface {
	claim(ctx context.Context, worker int, max int) ([]grant, error)
	complete(ctx context.Context, worker int, g grant) error
}

// batchCompleter is a drainer that completes a claim's grants together.
type batchCompleter interface {
	completeAll(ctx context.Context, worker int, gs []grant) error
}

type grpcDrainer struct{ clients []pb.CoordinatorClient }

func (d grpcDrainer) claim(ctx context.Context, w int, max int) ([]grant, error) {
	resp, err := d.clients[w].Claim(ctx, &pb.ClaimRequest{
		WorkerId: fmt.Sprintf("bench-drain-%d", w), MaxJobs: int32(max), LeaseDuration: durationpb.New(time.Minute)})
	if err != nil {
		return nil, err
	}
	out := make([]grant, len(resp.Jobs))
	for i, j := range resp.Jobs {
		out[i] = grant{id: j.Job.Id, attempt: j.Attempt, token: j.LeaseToken}
	}
	return out, nil
}

func (d grpcDrainer) complete(ctx context.Context, w int, g grant) error {
	resp, err := d.clients[w].Complete(ctx, &pb.CompleteRequest{
		JobId: g.id, Attempt: g.attempt, LeaseToken: g.token, ProviderRefundId: fmt.Sprintf("re_bench_%d", g.id)})
	if err == nil && resp.Replayed {
		err = fmt.Errorf("job %d: first completion answered as a replay", g.id)
	}
	return err
}

// storeDrainer is the direct baseline: the coordinator's own transactions,
// issued in-process without gRPC.
type storeDrainer struct{ st store.Store }

func (d storeDrainer) claim(ctx context.Context, w int, max int) ([]grant, error) {
	claimed, err := d.st.Claim(ctx, store.ClaimParams{
		WorkerID: fmt.Sprintf("bench-direct-%d", w), MaxJobs: max, Lease: time.Minute})
	if err != nil {
		return nil, err
	}
	out := make([]grant, len(claimed))
	for i, c := range claimed {
		out[i] = grant{id: c.Job.ID, attempt: c.Job.Attempt, token: string(c.LeaseToken)}
	}
	return out, nil
}

func (d storeDrainer) complete(ctx context.Context, _ int, g grant) error {
	res, err := d.st.Write(ctx, store.Writeback{Kind: store.EventCompleted, JobID: g.id, Attempt: g.attempt,
		LeaseToken: store.LeaseToken(g.token), ProviderRefundID: fmt.Sprintf("re_bench_%d", g.id)})
	if err == nil && res.Replayed {
		err = fmt.Errorf("job %d: first completion answered as a replay", g.id)
	}
	return err
}

// drainResult is one drained backlog.
type drainResult struct {
	jobs    int
	elapsed time.Duration   // first claim to last completion
	done    []time.Duration // each completion, since the start, ascending
}

func (r drainResult) rate() float64 { return float64(r.jobs) / r.elapsed.Seconds() }

// steadyRate is the completion rate between 10 % and 90 % of the backlog,
// without the ramp-up and the tail.
func (r drainResult) steadyRate() float64 {
	if len(r.done) < 10 {
		return r.rate()
	}
	lo, hi := len(r.done)/10, len(r.done)*9/10
	return float64(hi-lo) / (r.done[hi] - r.done[lo]).Seconds()
}

// drain runs --workers workers that claim up to batch jobs and complete each,
// until a claim finds nothing; then checks that the backlog keyed tag was
// drained completely.
func (b *bench) drain(ctx context.Context, tag string, batch int, d drainer) (drainResult, error) {
	var mu sync.Mutex
	var done []time.Duration
	start := time.Now()
	err := parallel(ctx, b.cfg.workers, func(ctx context.Context, w int) error {
		var mine []time.Duration
		defer func() {
			mu.Lock()
			done = append(done, mine...)
			mu.Unlock()
		}()
		for {
			grants, err := d.claim(ctx, w, batch)
			if err != nil {
				return fmt.Errorf("%s drain: claim: %w", tag, err)
			}
			if len(grants) == 0 {
				return nil
			}
			if bc, ok := d.(batchCompleter); ok {
				if err := bc.completeAll(ctx, w, grants); err != nil {
					return fmt.Errorf("%s drain: complete: %w", tag, err)
				}
				for range grants {
					mine = append(mine, time.Since(start))
				}
				continue
			}
			// Like a worker runtime, every claimed job is worked at once and
			// written back on its own (the SDKs run one goroutine or promise
			// per claimed job).
			errs := make(chan error, len(grants))
			for _, g := range grants {
				go func(g grant) {
					if err := d.complete(ctx, w, g); err != nil {
						errs <- fmt.Errorf("%s drain: complete job %d attempt %d: %w", tag, g.id, g.attempt, err)
						return
					}
					errs <- nil
				}(g)
			}
			var first error
			for range grants {
				if err := <-errs; err != nil && first == nil {
					first = err
				} else if err == nil {
					mine = append(mine, time.Since(start))
				}
			}
			if first != nil {
				return first
			}
		}
	})
	if err != nil {
		return drainResult{}, err
	}
	return b.drained(ctx, tag, done)
}

// drained is the drain whose completions came at done (since its start, in
// any order), checked with checkDrained.
func (b *bench) drained(ctx context.Context, tag string, done []time.Duration) (drainResult, error) {
	slices.Sort(done)
	r := drainResult{jobs: len(done), done: done}
	if len(done) > 0 {
		r.elapsed = done[len(done)-1]
	}
	return r, b.checkDrained(ctx, tag, r.jobs)
}

// checkDrained verifies that every job of the backlog tag succeeded with its
// ledger row, in the working table or the archive, that the workers completed exactly that many, and that nothing
// is left due or running.
func (b *bench) checkDrained(ctx context.Context, tag string, completed int) error {
	like := "backlog-" + tag + "-%"
	var succeeded, ledger, left int
	if err := b.db.QueryRowContext(ctx,
		// A coordinator run with retention on (--coordinator-flags) may have
		// archived some already: only succeeded jobs are archived (R31).
		`SELECT (SELECT COUNT(*) FROM refund_jobs WHERE operation_key LIKE ? AND state = 'succeeded')
 + (SELECT COUNT(*) FROM refund_jobs_archive WHERE operation_key LIKE ? AND state = 'succeeded')`,
		like, like).Scan(&succeeded); err != nil {
		return err
	}
	if err := b.db.QueryRowContext(ctx,
		`SELECT COUNT(*) FROM refund_ledger WHERE operation_key LIKE ?`, like).Scan(&ledger); err != nil {
		return err
	}
	if err := b.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM refund_jobs
 WHERE (state = 'ready' AND next_attempt_at <= UTC_TIMESTAMP(6)) OR state = 'running'`).Scan(&left); err != nil {
		return err
	}
	if succeeded != b.cfg.backlog || ledger != b.cfg.backlog || completed != b.cfg.backlog || left != 0 {
		return fmt.Errorf("%s drain incomplete: backlog %d, completed by workers %d, succeeded %d, ledger rows %d, still due or running %d",
			tag, b.cfg.backlog, completed, succeeded, ledger, left)
	}
	return nil
}

// endToEnd is scenarios C and D, once per --batch: the same backlog drained
// through a fresh coordinator process, then (a second, identical backlog)
// in-process through the store with the same workers, batch and pool size.
func (b *bench) endToEnd(ctx context.Context) error {
	// Only the backlog is due: the 200 due jobs of Q3 wait a day.
	if err := b.setDue(ctx, false); err != nil {
		return err
	}
	for i, batch := range b.cfg.batches {
		if err := b.drainPair(ctx, batch, i == 0); err != nil {
			return err
		}
	}
	return nil
}

// drainPair drains one backlog through gRPC and one directly, claiming up to
// batch jobs at a time, and prints the lines of C and D for that batch. The
// first pair also measures the candidate query on the backlog (Q4).
func (b *bench) drainPair(ctx context.Context, batch int, first bool) error {
	grpcTag, directTag := fmt.Sprintf("grpc%d", batch), fmt.Sprintf("direct%d", batch)
	if err := b.seedBacklog(ctx, grpcTag, b.cfg.backlog); err != nil {
		return err
	}
	if first && b.cfg.runs('a') {
		// Q4: a large due set whose next_attempt_at values repeat.
		r, err := b.measureCandidate(ctx, "backlog", b.cfg.historyStages[len(b.cfg.historyStages)-1])
		if err != nil {
			return err
		}
		if want := min(b.cfg.backlog, b.cfg.candidateLimit); r.returned != want {
			return fmt.Errorf("candidate query on the backlog returned %d rows, want %d", r.returned, want)
		}
	}
	if err := b.startCoordinator(ctx); err != nil {
		return err
	}
	clients, closeAll, err := b.coord.clients(b.cfg.workers)
	if err != nil {
		return err
	}
	defer closeAll()
	// Connect every client before the clock starts.
	for _, c := range clients {
		if _, err := c.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_OperationKey{
			OperationKey: fmt.Sprintf("backlog-%s-%07d", grpcTag, 0)}}); err != nil {
			return fmt.Errorf("warm-up call: %w", err)
		}
	}
	pid := b.coord.pid()
	b.logf("draining %d jobs through gRPC: %d workers, batch %d", b.cfg.backlog, b.cfg.workers, batch)
	grpcBefore, err := b.readDBCounters(ctx)
	if err != nil {
		return err
	}
	meter := startCPU(pid, b.dbPID)
	viaGRPC, err := b.drain(ctx, grpcTag, batch, grpcDrainer{clients: clients})
	if err != nil {
		return fmt.Errorf("%w\ncoordinator log:\n%s", err, b.coord.logs())
	}
	grpcCPU, grpcSelf := meter.perJob(viaGRPC.jobs)
	grpcAfter, err := b.readDBCounters(ctx)
	if err != nil {
		return err
	}
	b.logf("gRPC: %d jobs in %s", viaGRPC.jobs, viaGRPC.elapsed.Round(10*time.Millisecond))

	// The same backlog through worker streams, on the same coordinator.
	streamTag := fmt.Sprintf("stream%d", batch)
	if err := b.seedBacklog(ctx, streamTag, b.cfg.backlog); err != nil {
		return err
	}
	b.logf("draining %d jobs through worker streams: %d workers, %d credits each", b.cfg.backlog, b.cfg.workers, batch)
	streamBefore, err := b.readDBCounters(ctx)
	if err != nil {
		return err
	}
	meter = startCPU(pid, b.dbPID)
	viaStream, err := b.drainStream(ctx, streamTag, batch, clients)
	if err != nil {
		return fmt.Errorf("%w\ncoordinator log:\n%s", err, b.coord.logs())
	}
	streamCPU, streamSelf := meter.perJob(viaStream.jobs)
	streamAfter, err := b.readDBCounters(ctx)
	if err != nil {
		return err
	}
	b.logf("stream: %d jobs in %s", viaStream.jobs, viaStream.elapsed.Round(10*time.Millisecond))
	peak, err := procPeakRSS(pid)
	if err != nil {
		return err
	}
	if err := b.stopCoordinator(); err != nil {
		return err
	}

	if err := b.seedBacklog(ctx, directTag, b.cfg.backlog); err != nil {
		return err
	}
	b.logf("draining %d jobs directly through the store: %d workers, batch %d", b.cfg.backlog, b.cfg.workers, batch)
	directBefore, err := b.readDBCounters(ctx)
	if err != nil {
		return err
	}
	meter = startCPU(0, b.dbPID)
	direct, err := b.drain(ctx, directTag, batch, storeDrainer{st: b.st})
	if err != nil {
		return err
	}
	directCPU, directSelf := meter.perJob(direct.jobs)
	directAfter, err := b.readDBCounters(ctx)
	if err != nil {
		return err
	}
	b.logf("direct: %d jobs in %s", direct.jobs, direct.elapsed.Round(10*time.Millisecond))

	b.summary("e2e", "backlog", b.cfg.backlog, "workers", b.cfg.workers, "batch", batch,
		"jobs_per_s", num(viaGRPC.rate(), 0), "drain_s", num(viaGRPC.elapsed.Seconds(), 2),
		"direct_jobs_per_s", num(direct.rate(), 0), "direct_drain_s", num(direct.elapsed.Seconds(), 2),
		"efficiency", num(ratio(viaGRPC.rate(), direct.rate()), 2))
	b.summary("e2e_stream", "backlog", b.cfg.backlog, "workers", b.cfg.workers, "credits", batch,
		"jobs_per_s", num(viaStream.rate(), 0), "drain_s", num(viaStream.elapsed.Seconds(), 2),
		"over_unary", num(ratio(viaStream.rate(), viaGRPC.rate()), 2),
		"cpu_us_per_job", num(streamCPU[0], 1), "db_cpu_us_per_job", num(streamCPU[1], 1),
		"bench_cpu_us_per_job", num(streamSelf, 1),
		"statements_per_job", num(streamAfter.perJob(streamBefore, "Questions", viaStream.jobs), 2),
		"commits_per_job", num(streamAfter.perJob(streamBefore, "Com_commit", viaStream.jobs), 2))
	// Q6: drain time is backlog / completion rate, with the rate measured. The
	// steady rate (10-90 % of the backlog) predicts the drain; the difference
	// to the measured drain is ramp-up and tail.
	steady := viaGRPC.steadyRate()
	b.summary("q6", "backlog", b.cfg.backlog, "batch", batch, "steady_jobs_per_s", num(steady, 0),
		"predicted_drain_s", num(float64(b.cfg.backlog)/steady, 2), "measured_drain_s", num(viaGRPC.elapsed.Seconds(), 2),
		"measured_over_predicted", num(viaGRPC.elapsed.Seconds()/(float64(b.cfg.backlog)/steady), 3),
		"article_backlog", 1200, "article_drain_s_at_5_per_s", 400,
		"article_drain_s_at_measured", num(1200/viaGRPC.rate(), 3))
	b.summary("coordinator", "batch", batch, "cpu_us_per_job", num(grpcCPU[0], 1), "peak_rss_mb", num(float64(peak)/(1<<20), 1),
		"db_cpu_us_per_job", num(grpcCPU[1], 1), "bench_cpu_us_per_job", num(grpcSelf, 1),
		"direct_db_cpu_us_per_job", num(directCPU[1], 1), "direct_bench_cpu_us_per_job", num(directSelf, 1))
	// Where the database's time goes: statements and commits per job.
	b.summary("db_work", "batch", batch, "statements_per_job", num(grpcAfter.perJob(grpcBefore, "Questions", viaGRPC.jobs), 2),
		"commits_per_job", num(grpcAfter.perJob(grpcBefore, "Com_commit", viaGRPC.jobs), 2),
		"fsyncs_per_job", num(grpcAfter.perJob(grpcBefore, "Innodb_data_fsyncs", viaGRPC.jobs), 2),
		"direct_statements_per_job", num(directAfter.perJob(directBefore, "Questions", direct.jobs), 2),
		"direct_commits_per_job", num(directAfter.perJob(directBefore, "Com_commit", direct.jobs), 2),
		"direct_fsyncs_per_job", num(directAfter.perJob(directBefore, "Innodb_data_fsyncs", direct.jobs), 2))
	return nil
}
