package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jobfence/jobfence/store"
)

// writeCostVariant is one shape of the schema scenario W drains the same
// backlog on: the indexes it drops, or adds, for its drain, undone after.
type writeCostVariant struct {
	name        string
	drops, adds []writeCostIndex
}

type writeCostIndex struct{ table, name, columns string }

// The secondary indexes a job's claim and completion maintain. The claim
// queries name the due and provider indexes (FORCE INDEX), so those cannot
// be dropped: a copy of one is added instead, and its cost is what the
// original costs. The lease index is one of the two that migration 0010
// dropped (takeovers walk the due index: store.Job.NextAttemptAt); adding it
// back shows what each of them cost. The others are dropped in turn. None
// is changed for good here.
var writeCostVariants = []writeCostVariant{
	{name: "baseline"},
	{name: "plus_a_lease_index", adds: []writeCostIndex{ // like the dropped ix_refund_jobs_lease (0010)
		{"refund_jobs", "ix_wcost_lease", "state, lease_until, id"}}},
	{name: "plus_a_provider_due_index", adds: []writeCostIndex{ // like ix_refund_jobs_provider_due: claims by provider
		{"refund_jobs", "ix_wcost_provider_due", "state, provider, next_attempt_at, id"}}},
	{name: "no_provider_refund_index", drops: []writeCostIndex{ // webhooks and lookups by refund id (R28, Q7)
		{"refund_jobs", "ix_refund_jobs_provider_refund", "provider_refund_id"}}},
	{name: "no_ledger_key_index", drops: []writeCostIndex{ // one ledger row per operation key (R10)
		{"refund_ledger", "uk_refund_ledger_operation_key", "operation_key"}}},
	{name: "no_history_job_index", drops: []writeCostIndex{ // a job's history, in order (R3)
		{"refund_job_events", "ix_refund_job_events_job", "job_id, id"}}},
	{name: "baseline_again"},
}

// writeCostCounters are what scenario W counts per job besides CPU: the
// redo log bytes, buffer pool page writes and handler row operations, which
// do not depend on how busy the machine is.
var writeCostCounters = []string{"Innodb_os_log_written", "Innodb_buffer_pool_write_requests",
	"Handler_write", "Handler_update", "Handler_read_key"}

// writeCostRounds is how many times scenario W drains each variant.
const writeCostRounds = 3

// medianOf is the median of xs (not empty).
func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func joinNums(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = num(x, 1)
	}
	return strings.Join(parts, ",")
}

// writeCosts is scenario W: what each row and index entry a job writes costs
// the database. The same backlog is drained in-process through the store's
// shared transactions, as the coordinator issues them (ClaimMany of one
// claim of --batch jobs, then one WriteMany of their completions, per
// worker), once per schema variant; the difference of the database's CPU
// per job to the baseline is what the dropped indexes' entries cost. The
// history and ledger rows are then measured alone: rows of their shape
// inserted in batches of the same size into copies of their tables. Run it
// with --history 0: the variants rebuild the indexes they dropped.
func (b *bench) writeCosts(ctx context.Context) error {
	if err := b.setDue(ctx, false); err != nil {
		return err
	}
	batch := b.cfg.batches[len(b.cfg.batches)-1]
	// Each variant is drained writeCostRounds times, the variants
	// alternating, so that a busy moment of the machine spreads over all of
	// them instead of landing on one.
	cpu := make([][]float64, len(writeCostVariants))
	rate := make([][]float64, len(writeCostVariants))
	work := make([][]float64, len(writeCostVariants)) // writeCostCounters per job, first round
	for round := range writeCostRounds {
		for i, v := range writeCostVariants {
			tag := fmt.Sprintf("w%d-%d", round, i)
			if err := b.seedBacklog(ctx, tag, b.cfg.backlog); err != nil {
				return err
			}
			if err := b.alterIndexes(ctx, v.drops, v.adds); err != nil {
				return fmt.Errorf("variant %s: %w", v.name, err)
			}
			b.logf("write costs, round %d, %s: draining %d jobs in shared transactions, batch %d", round+1, v.name,
				b.cfg.backlog, batch)
			before, err := b.readStatus(ctx, writeCostCounters...)
			if err != nil {
				return err
			}
			meter := startCPU(0, b.dbPID)
			r, err := b.drain(ctx, tag, batch, batchedStoreDrainer{st: b.st})
			if err != nil {
				return fmt.Errorf("variant %s: %w", v.name, err)
			}
			perJob, _ := meter.perJob(r.jobs)
			after, err := b.readStatus(ctx, writeCostCounters...)
			if err != nil {
				return err
			}
			cpu[i], rate[i] = append(cpu[i], perJob[1]), append(rate[i], r.rate())
			if round == 0 {
				work[i] = make([]float64, len(writeCostCounters))
				for k, name := range writeCostCounters {
					work[i][k] = after.perJob(before, name, r.jobs)
				}
			}
			if err := b.alterIndexes(ctx, v.adds, v.drops); err != nil {
				return fmt.Errorf("variant %s: restoring the schema: %w", v.name, err)
			}
		}
	}
	base := (medianOf(cpu[0]) + medianOf(cpu[len(cpu)-1])) / 2
	for i, v := range writeCostVariants {
		b.summary("write_cost", "variant", v.name, "batch", batch, "rounds", writeCostRounds,
			"jobs_per_s", num(medianOf(rate[i]), 0), "db_cpu_us_per_job", num(medianOf(cpu[i]), 1),
			"db_cpu_us_per_job_each", quote(joinNums(cpu[i])), "over_baseline_us_per_job", num(medianOf(cpu[i])-base, 1),
			"redo_bytes_per_job", num(work[i][0], 0), "page_writes_per_job", num(work[i][1], 1),
			"row_writes_per_job", num(work[i][2], 2), "row_updates_per_job", num(work[i][3], 2),
			"key_reads_per_job", num(work[i][4], 1))
	}
	for _, t := range []struct{ table, cols, row string }{
		{"refund_job_events", "job_id, attempt, kind, worker_id, from_state, to_state, next_action, created_at, lease_token_hash",
			"(%d, 1, 'claimed', 'bench-w', 'ready', 'running', 'refund', UTC_TIMESTAMP(6), REPEAT('h', 32))"},
		{"refund_ledger", "job_id, operation_key, provider, provider_refund_id, amount_minor, currency, attempt, recorded_at",
			"(%d, CONCAT('wcost-', %[1]d), 'acme', CONCAT('re_', %[1]d), 100, 'EUR', 1, UTC_TIMESTAMP(6))"},
	} {
		perRow, err := b.insertCost(ctx, t.table, t.cols, t.row, batch)
		if err != nil {
			return err
		}
		b.summary("row_cost", "table", t.table, "batch", batch, "db_cpu_us_per_row", num(perRow, 1))
	}
	return nil
}

// alterIndexes drops the indexes drops and creates adds.
func (b *bench) alterIndexes(ctx context.Context, drops, adds []writeCostIndex) error {
	for _, ix := range drops {
		if _, err := b.db.ExecContext(ctx, fmt.Sprintf("ALTER TABLE %s DROP INDEX %s", ix.table, ix.name)); err != nil {
			return err
		}
	}
	for _, ix := range adds {
		if _, err := b.db.ExecContext(ctx, fmt.Sprintf("CREATE INDEX %s ON %s (%s)", ix.name, ix.table, ix.columns)); err != nil {
			return err
		}
	}
	return nil
}

// insertCost inserts --backlog rows of row's shape, batch to a statement
// and one statement to a transaction, into a copy of table, and returns the
// database's CPU per row.
func (b *bench) insertCost(ctx context.Context, table, cols, row string, batch int) (float64, error) {
	copyTable := table + "_wcost"
	if _, err := b.db.ExecContext(ctx, fmt.Sprintf("CREATE TABLE %s LIKE %s", copyTable, table)); err != nil {
		return 0, err
	}
	defer b.db.ExecContext(context.WithoutCancel(ctx), "DROP TABLE "+copyTable) //nolint:errcheck
	statements := (b.cfg.backlog + batch - 1) / batch
	meter := startCPU(0, b.dbPID)
	start := time.Now()
	err := parallel(ctx, b.cfg.workers, func(ctx context.Context, w int) error {
		var sb strings.Builder
		for k := w; k < statements; k += b.cfg.workers {
			sb.Reset()
			fmt.Fprintf(&sb, "INSERT INTO %s (%s) VALUES ", copyTable, cols)
			for i := k * batch; i < min((k+1)*batch, b.cfg.backlog); i++ {
				if i > k*batch {
					sb.WriteString(",")
				}
				fmt.Fprintf(&sb, row, i+1)
			}
			if _, err := b.db.ExecContext(ctx, sb.String()); err != nil {
				return fmt.Errorf("%s rows: %w", table, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	cpu, _ := meter.perJob(b.cfg.backlog)
	b.logf("%s: %d rows in %s", table, b.cfg.backlog, time.Since(start).Round(10*time.Millisecond))
	return cpu[1], nil
}

// batchedStoreDrainer claims and completes through the store's shared
// transactions, as the coordinator's dispatcher issues them: a worker's
// claim in one ClaimMany, and the completions of what it granted in one
// WriteMany.
type batchedStoreDrainer struct{ st store.Store }

func (d batchedStoreDrainer) claim(ctx context.Context, w int, max int) ([]grant, error) {
	out := d.st.ClaimMany(ctx, []store.ClaimParams{{WorkerID: fmt.Sprintf("bench-batched-%d", w), MaxJobs: max,
		Lease: time.Minute}})[0]
	if out.Err != nil {
		return nil, out.Err
	}
	gs := make([]grant, len(out.Jobs))
	for i, c := range out.Jobs {
		gs[i] = grant{id: c.Job.ID, attempt: c.Job.Attempt, token: string(c.LeaseToken)}
	}
	return gs, nil
}

func (d batchedStoreDrainer) complete(ctx context.Context, w int, g grant) error {
	return storeDrainer(d).complete(ctx, w, g)
}

// completeAll completes gs in one WriteMany.
func (d batchedStoreDrainer) completeAll(ctx context.Context, _ int, gs []grant) error {
	ws := make([]store.Writeback, len(gs))
	for i, g := range gs {
		ws[i] = store.Writeback{Kind: store.EventCompleted, JobID: g.id, Attempt: g.attempt,
			LeaseToken: store.LeaseToken(g.token), ProviderRefundID: fmt.Sprintf("re_bench_%d", g.id)}
	}
	for i, o := range d.st.WriteMany(ctx, ws) {
		if o.Err != nil {
			return fmt.Errorf("job %d: %w", gs[i].id, o.Err)
		}
		if o.Result.Replayed {
			return fmt.Errorf("job %d: first completion answered as a replay", gs[i].id)
		}
	}
	return nil
}
