package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
)

// Scenario R: what a round trip costs against what a statement costs, at a
// steady rate where every job is alone. It runs the statements of an
// enqueue that hands its job to a waiting claim, in the shape
// store/internal/sqlbase gives them (the job's INSERT and its read-back,
// its operation key's row, the candidate read, the grant's fenced UPDATE,
// the history), one transaction per tick of --roundtrip-rate on one
// connection, in two ways, alternating:
//
//   - prepared: each statement its own round trip, prepared on the server
//     once, as the coordinator runs them (8 round trips with BEGIN and
//     COMMIT);
//   - multi: the same statements in two multi-statement exchanges of text
//     (client-side interpolation, CLIENT_MULTI_STATEMENTS): BEGIN with
//     everything up to the candidate read, then the UPDATE, the history and
//     the COMMIT (2 round trips). The key's row is an INSERT … SELECT there,
//     as it cannot wait for the read-back.
//
// It reports the database server's and this process's CPU per transaction:
// whether fewer round trips would make a lone job cheaper.

const (
	rtCols   = `id, operation_key, order_id, payment_id, amount_minor, currency, provider, state, attempt, next_action, next_attempt_at, created_at`
	rtInsert = `INSERT INTO refund_jobs
  (operation_key, order_id, payment_id, amount_minor, currency, provider,
   state, attempt, next_action, next_attempt_at, created_at, updated_at)
VALUES (?, ?, ?, ?, 'EUR', 'rtrip', 'ready', 0, 'refund', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`
	rtReadBack = `SELECT ` + rtCols + ` FROM refund_jobs WHERE operation_key IN (?)`
	rtKeyRow   = `INSERT INTO refund_operation_keys
  (operation_key, job_id, order_id, payment_id, amount_minor, currency, provider, created_at)
VALUES (?, ?, ?, ?, ?, 'EUR', 'rtrip', ?)`
	rtKeyRowSelect = `INSERT INTO refund_operation_keys
  (operation_key, job_id, order_id, payment_id, amount_minor, currency, provider, created_at)
SELECT operation_key, id, order_id, payment_id, amount_minor, currency, provider, created_at
  FROM refund_jobs WHERE operation_key IN (?)`
	rtCandidates = `SELECT UTC_TIMESTAMP(6), ` + rtCols + `
  FROM refund_jobs FORCE INDEX (ix_refund_jobs_due)
 WHERE state = 'ready' AND next_attempt_at <= UTC_TIMESTAMP(6)
 ORDER BY next_attempt_at, id LIMIT 3 FOR UPDATE SKIP LOCKED`
	rtGrant = `UPDATE refund_jobs FORCE INDEX (PRIMARY)
   SET state = 'running', attempt = attempt + 1, lease_until = TIMESTAMPADD(SECOND, 30, UTC_TIMESTAMP(6)),
       next_attempt_at = TIMESTAMPADD(SECOND, 30, UTC_TIMESTAMP(6)), updated_at = UTC_TIMESTAMP(6)
 WHERE id = ? AND attempt = 0 AND state = 'ready'`
	rtHistory = `INSERT INTO refund_job_events
  (job_id, attempt, kind, worker_id, from_state, to_state, next_action, provider_refund_id, reason, created_at,
   lease_token_hash)
VALUES (?, 0, 'enqueued', '', '', 'ready', 'refund', '', '', UTC_TIMESTAMP(6), ''),
       (?, 1, 'claimed', 'rtrip', 'ready', 'running', 'refund', '', '', UTC_TIMESTAMP(6), '')`
)

// roundTripRounds is how many times scenario R runs each way, alternating.
const roundTripRounds = 2

func (b *bench) roundTrips(ctx context.Context) error {
	if err := b.setDue(ctx, false); err != nil { // the candidate read finds only this scenario's jobs
		return err
	}
	n, rate := b.cfg.roundTripTxs, b.cfg.roundTripRate
	b.logf("scenario R: %d enqueue-and-hand-off transactions at %d/s, statement by statement and in two exchanges, %d rounds",
		n, rate, roundTripRounds)
	per := map[string][]float64{}
	for round := 1; round <= roundTripRounds; round++ {
		for _, mode := range []string{"prepared", "multi"} {
			dbCPU, selfCPU, err := b.roundTripRun(ctx, mode, round, n, rate)
			if err != nil {
				return fmt.Errorf("scenario R, %s: %w", mode, err)
			}
			trips := 8
			if mode == "multi" {
				trips = 2
			}
			b.summary("roundtrips", "mode", mode, "round", round, "rate", rate, "txs", n, "round_trips_per_tx", trips,
				"statements_per_tx", 8, "db_cpu_us_per_tx", num(dbCPU, 1), "bench_cpu_us_per_tx", num(selfCPU, 1))
			per[mode+"_db"] = append(per[mode+"_db"], dbCPU)
			per[mode+"_bench"] = append(per[mode+"_bench"], selfCPU)
		}
	}
	b.summary("roundtrips_ratio", "db_multi_over_prepared", num(ratio(medianOf(per["multi_db"]), medianOf(per["prepared_db"])), 2),
		"bench_multi_over_prepared", num(ratio(medianOf(per["multi_bench"]), medianOf(per["prepared_bench"])), 2))
	return nil
}

// roundTripRun runs n transactions of one mode, one per tick of rate, and
// returns the database server's and this process's CPU per transaction.
func (b *bench) roundTripRun(ctx context.Context, mode string, round, n, rate int) (float64, float64, error) {
	cfg, err := gomysql.ParseDSN(b.dsn)
	if err != nil {
		return 0, 0, err
	}
	// As the store's connections (store/mysql.Open), with multi-statement
	// exchanges for the second way.
	cfg.ParseTime, cfg.Loc, cfg.InterpolateParams = true, time.UTC, true
	cfg.MultiStatements = mode == "multi"
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return 0, 0, err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	c, err := db.Conn(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "SET SESSION time_zone = '+00:00'"); err != nil {
		return 0, 0, err
	}
	run := b.roundTripPrepared
	if mode == "multi" {
		run = roundTripMulti
	}
	tx, err := run(ctx, c)
	if err != nil {
		return 0, 0, err
	}
	meter := startCPU(b.dbPID)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		key := fmt.Sprintf("rtrip-%s-%d-%d-%d", mode, round, time.Now().UnixNano()%1e9, i)
		if err := tx(ctx, key); err != nil {
			c.ExecContext(ctx, "ROLLBACK") //nolint:errcheck // the error above is the one to report
			return 0, 0, err
		}
	}
	cpu, self := meter.perJob(n)
	return cpu[0], self, nil
}

// roundTripPrepared prepares the statements on c and returns the
// transaction that runs them one round trip each.
func (b *bench) roundTripPrepared(ctx context.Context, c *sql.Conn) (func(context.Context, string) error, error) {
	var stmts []*sql.Stmt
	for _, q := range []string{rtInsert, rtReadBack, rtKeyRow, rtCandidates, rtGrant, rtHistory} {
		s, err := c.PrepareContext(ctx, q)
		if err != nil {
			return nil, err
		}
		stmts = append(stmts, s)
	}
	ins, readBack, keyRow, candidates, grant, history := stmts[0], stmts[1], stmts[2], stmts[3], stmts[4], stmts[5]
	return func(ctx context.Context, key string) error {
		if _, err := c.ExecContext(ctx, "START TRANSACTION"); err != nil {
			return err
		}
		if _, err := ins.ExecContext(ctx, key, "order-"+key, "pay-"+key, 100); err != nil {
			return err
		}
		var job rtJob
		if err := job.scanFrom(readBack.QueryContext(ctx, key)); err != nil {
			return err
		}
		if _, err := keyRow.ExecContext(ctx, key, job.id, "order-"+key, "pay-"+key, 100, job.created); err != nil {
			return err
		}
		var granted rtJob
		if err := granted.scanFrom(candidates.QueryContext(ctx)); err != nil {
			return err
		}
		if err := rtOne(grant.ExecContext(ctx, granted.id)); err != nil {
			return err
		}
		if _, err := history.ExecContext(ctx, granted.id, granted.id); err != nil {
			return err
		}
		_, err := c.ExecContext(ctx, "COMMIT")
		return err
	}, nil
}

// roundTripMulti returns the transaction that sends the same statements in
// two exchanges on c.
func roundTripMulti(_ context.Context, c *sql.Conn) (func(context.Context, string) error, error) {
	first := strings.Join([]string{"START TRANSACTION", rtInsert, rtKeyRowSelect, rtReadBack, rtCandidates}, ";\n")
	second := strings.Join([]string{rtGrant, rtHistory, "COMMIT"}, ";\n")
	return func(ctx context.Context, key string) error {
		rows, err := c.QueryContext(ctx, first, key, "order-"+key, "pay-"+key, 100, key, key)
		if err != nil {
			return err
		}
		// The result sets with rows: the read-back, then the candidates.
		var job, granted rtJob
		if err := job.scanSet(rows); err != nil {
			rows.Close()
			return err
		}
		if !rows.NextResultSet() {
			rows.Close()
			return fmt.Errorf("the candidate read's result is missing: %v", rows.Err())
		}
		if err := granted.scanSet(rows); err != nil {
			rows.Close()
			return err
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if job.id == 0 || granted.id == 0 {
			return fmt.Errorf("job %q: read back %d, granted %d", key, job.id, granted.id)
		}
		// On the driver's connection, whose result counts each statement's rows.
		return c.Raw(func(dc any) error {
			res, err := dc.(driver.ExecerContext).ExecContext(ctx, second,
				[]driver.NamedValue{{Ordinal: 1, Value: granted.id}, {Ordinal: 2, Value: granted.id}, {Ordinal: 3, Value: granted.id}})
			if err != nil {
				return err
			}
			if n := res.(gomysql.Result).AllRowsAffected(); len(n) == 0 || n[0] != 1 {
				return fmt.Errorf("the grant's UPDATE changed %v rows, want 1", n)
			}
			return nil
		})
	}, nil
}

// rtJob is what scenario R keeps of a row: its id and creation time.
type rtJob struct {
	id      int64
	created time.Time
}

// scanFrom reads the first row of a query's result (rows, err).
func (j *rtJob) scanFrom(rows *sql.Rows, err error) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	if err := j.scanSet(rows); err != nil {
		return err
	}
	if j.id == 0 {
		return fmt.Errorf("no row")
	}
	return rows.Close()
}

// scanSet reads the current result set of rows, keeping its first row;
// a candidate read's leading clock column is skipped.
func (j *rtJob) scanSet(rows *sql.Rows) error {
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	for rows.Next() {
		dest := make([]any, len(cols))
		for i := range dest {
			dest[i] = new(sql.RawBytes)
		}
		off := len(cols) - 12 // 1 when the clock leads
		var id int64
		var created time.Time
		dest[off], dest[len(cols)-1] = &id, &created
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if j.id == 0 {
			j.id, j.created = id, created
		}
	}
	return rows.Err()
}

// rtOne checks that an UPDATE changed exactly one row.
func rtOne(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("the grant's UPDATE changed %d rows (%v), want 1", n, err)
	}
	return nil
}
