package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The seeded shape (Q3, Q4). Every next_attempt_at is relative to b.base, the
// database's clock when seeding began, so jobs that are due for the fixed
// cutoff are also due for the coordinator, which reads the database clock (R12).
const (
	notDueRows      = 9800 // ready, next_attempt_at 1 h to 30 days after base
	dueRows         = 200  // ready, next_attempt_at 10 to 3 min before base
	schedulableRows = notDueRows + dueRows

	// Q4: backlog jobs share next_attempt_at in groups this large, so that
	// only id orders them within a group.
	backlogTieGroup = 1000

	seedBatchRows = 4000 // rows per multi-row INSERT
	seedWriters   = 2    // concurrent INSERT connections
)

// Seeding writes rows directly: the store has no bulk-load API, and a fresh
// benchmark database is the bench's own. The columns are those of
// store/mysql/migrations; history, ledger and observation tables stay empty
// for seeded rows (neither the claim nor a write-back reads them by anything
// but the job's id).
const insertSeedRows = `INSERT INTO refund_jobs
  (operation_key, order_id, payment_id, amount_minor, currency, provider, state, attempt, next_action,
   next_attempt_at, lease_until, provider_refund_id, worker_id, last_reason, first_sent_at, created_at, updated_at)
VALUES `

const sqlTime = "2006-01-02 15:04:05.000000"

func ts(t time.Time) string { return "'" + t.UTC().Format(sqlTime) + "'" }

// seedRow appends the VALUES tuple of row i.
type seedRow func(sb *strings.Builder, i int)

// insertRows inserts rows from..to-1 in multi-row batches over a few
// connections.
func (b *bench) insertRows(ctx context.Context, from, to int, row seedRow) error {
	if to <= from {
		return nil
	}
	batches := (to - from + seedBatchRows - 1) / seedBatchRows
	return parallel(ctx, min(seedWriters, batches), func(ctx context.Context, w int) error {
		var sb strings.Builder
		for k := w; k < batches; k += seedWriters {
			lo := from + k*seedBatchRows
			hi := min(lo+seedBatchRows, to)
			sb.Reset()
			sb.WriteString(insertSeedRows)
			for i := lo; i < hi; i++ {
				if i > lo {
					sb.WriteString(",\n")
				}
				row(&sb, i)
			}
			if _, err := b.db.ExecContext(ctx, sb.String()); err != nil {
				return fmt.Errorf("seed rows %d..%d: %w", lo, hi, err)
			}
		}
		return nil
	})
}

// seedFinished adds finished jobs from..to-1 of total: succeeded, one in a
// hundred in manual_review, next_attempt_at spread over the 30 days before
// base and ascending with the row number.
func (b *bench) seedFinished(ctx context.Context, from, to, total int) error {
	if to <= from {
		return nil
	}
	start := time.Now()
	span := 30*24*time.Hour - time.Hour
	err := b.insertRows(ctx, from, to, func(sb *strings.Builder, i int) {
		at := b.base.Add(-30 * 24 * time.Hour).Add(time.Duration(float64(span) * float64(i) / float64(total)))
		state, refund, reason := "succeeded", fmt.Sprintf("'re_h_%d'", i), ""
		if i%100 == 99 {
			state, refund, reason = "manual_review", "NULL", "seeded: provider has no record"
		}
		fmt.Fprintf(sb, "('hist-%09d','order-h-%09d','pay-h-%09d',%d,'EUR','acme','%s',1,'refund',%s,NULL,%s,'seed','%s',%s,%s,%s)",
			i, i, i, 100+i%50000, state, ts(at), refund, reason, ts(at), ts(at.Add(-time.Minute)), ts(at.Add(2*time.Second)))
	})
	if err != nil {
		return err
	}
	d := time.Since(start)
	b.logf("seeded finished rows %d..%d in %s (%.0f rows/s)", from, to, d.Round(10*time.Millisecond),
		float64(to-from)/d.Seconds())
	settled, err := b.settle(ctx)
	if err != nil {
		return err
	}
	b.summary("seed", "finished", to, "added", to-from, "seconds", num(d.Seconds(), 1),
		"rows_per_s", num(float64(to-from)/d.Seconds(), 0), "settle_s", num(settled.Seconds(), 1))
	return nil
}

// settleLimit bounds the wait for the server to write back what seeding left
// in memory.
const settleLimit = 2 * time.Minute

// settle waits, up to settleLimit, until InnoDB has stopped writing back
// the pages the seeding changed (no page flushed for a second, or dirty pages
// under 5 % of the buffer pool), so that the next measurement does not share
// the cores with that flushing: a history size is measured on a settled
// server, as it would be in service. MariaDB's defaults leave dirty pages in
// the pool while nothing forces them out, so the level alone may never fall.
// It returns how long it waited. A quick run does not wait: it checks that
// the scenarios work, not their numbers.
func (b *bench) settle(ctx context.Context) (time.Duration, error) {
	if b.cfg.quick {
		return 0, nil
	}
	const (
		poll  = 250 * time.Millisecond
		quiet = 4 // polls without a page flushed
	)
	start := time.Now()
	lastFlushed, still := int64(-1), 0
	for {
		st, err := b.readStatus(ctx, "Innodb_buffer_pool_pages_dirty", "Innodb_buffer_pool_pages_total",
			"Innodb_buffer_pool_pages_flushed")
		if err != nil {
			return 0, fmt.Errorf("read dirty pages: %w", err)
		}
		dirty, total, flushed := st["Innodb_buffer_pool_pages_dirty"], st["Innodb_buffer_pool_pages_total"],
			st["Innodb_buffer_pool_pages_flushed"]
		if flushed == lastFlushed {
			still++
		} else {
			still = 0
		}
		lastFlushed = flushed
		waited := time.Since(start)
		if dirty*20 < total || still >= quiet || waited > settleLimit {
			b.logf("settled after %s: %d of %d buffer pool pages dirty", waited.Round(100*time.Millisecond), dirty, total)
			return waited, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// seedSchedulable adds the 10,000 schedulable jobs of Q3: 9,800 ready but not
// yet due, 200 due.
func (b *bench) seedSchedulable(ctx context.Context) error {
	err := b.insertRows(ctx, 0, notDueRows, func(sb *strings.Builder, j int) {
		at := b.base.Add(time.Hour).Add(time.Duration(j) * (30 * 24 * time.Hour / notDueRows))
		fmt.Fprintf(sb, "('later-%05d','order-l-%05d','pay-l-%05d',%d,'EUR','acme','ready',0,'refund',%s,NULL,NULL,'','',NULL,%s,%s)",
			j, j, j, 100+j, ts(at), ts(b.base.Add(-time.Hour)), ts(b.base.Add(-time.Hour)))
	})
	if err != nil {
		return err
	}
	err = b.insertRows(ctx, 0, dueRows, func(sb *strings.Builder, j int) {
		at := b.base.Add(-10 * time.Minute).Add(time.Duration(j) * 2 * time.Second)
		fmt.Fprintf(sb, "('due-%05d','order-d-%05d','pay-d-%05d',%d,'EUR','acme','ready',0,'refund',%s,NULL,NULL,'','',NULL,%s,%s)",
			j, j, j, 100+j, ts(at), ts(at.Add(-time.Minute)), ts(at.Add(-time.Minute)))
	})
	if err != nil {
		return err
	}
	b.logf("seeded %d ready jobs (%d due at the cutoff %s)", schedulableRows, dueRows, b.base.Format(time.RFC3339))
	return nil
}

// seedBacklog adds n due jobs keyed backlog-<tag>-…, due 20 minutes before
// base, in groups of backlogTieGroup with identical next_attempt_at (Q4).
func (b *bench) seedBacklog(ctx context.Context, tag string, n int) error {
	start := time.Now()
	err := b.insertRows(ctx, 0, n, func(sb *strings.Builder, k int) {
		at := b.base.Add(-20 * time.Minute).Add(time.Duration(k/backlogTieGroup) * time.Second)
		fmt.Fprintf(sb, "('backlog-%s-%07d','order-b-%s-%07d','pay-b-%s-%07d',%d,'EUR','acme','ready',0,'refund',%s,NULL,NULL,'','',NULL,%s,%s)",
			tag, k, tag, k, tag, k, 100+k, ts(at), ts(at.Add(-time.Minute)), ts(at.Add(-time.Minute)))
	})
	if err != nil {
		return err
	}
	b.logf("seeded backlog %q: %d due jobs in %s", tag, n, time.Since(start).Round(10*time.Millisecond))
	_, err = b.settle(ctx) // the drain is timed on a settled server
	return err
}

// setDue moves the 200 due jobs of Q3 one day later (due=false: the no-due
// variant, and out of the way of scenarios C and E) or back (due=true). DATETIME arithmetic is exact, so the shape is
// restored to the microsecond.
func (b *bench) setDue(ctx context.Context, due bool) error {
	if b.parked == !due {
		return nil
	}
	days := 1
	if due {
		days = -1
	}
	res, err := b.db.ExecContext(ctx, `UPDATE refund_jobs SET next_attempt_at = TIMESTAMPADD(DAY, ?, next_attempt_at)
 WHERE operation_key LIKE 'due-%' AND state = 'ready'`, days)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n != dueRows {
		return fmt.Errorf("moving the due jobs: %d of %d were ready", n, dueRows)
	}
	b.parked = !due
	return nil
}
