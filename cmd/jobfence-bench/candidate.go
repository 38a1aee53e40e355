package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/store/mysql"
)

// candidateQuery is the claim's candidate query (Q1), as store/mysql runs
// it, without a provider filter or locks.
var candidateQuery = mysql.DueCandidatesQuery()

// candidateResult is one measured variant of the candidate query.
type candidateResult struct {
	variant  string // due, nodue or backlog
	finished int
	returned int
	examined int64   // handler reads of one execution (rows the engine touched)
	planRows float64 // r_rows on MariaDB; -1 when not reported
	pages    float64 // r_engine_stats.pages_accessed on MariaDB; -1 when not reported
	lat      latencies
	// ref holds the same query's latencies on the reference copy of the
	// first history size, timed in turn with lat (due variant only): the
	// two share the machine's moment, so their ratio is the history's cost
	// and not the machine's drift between stages.
	ref latencies
}

// candidateStage is the due and no-due measurement at one history size.
type candidateStage struct {
	finished   int
	due, nodue candidateResult
}

func (b *bench) candidateAt(ctx context.Context, finished int) (candidateStage, error) {
	cs := candidateStage{finished: finished}
	var err error
	if cs.due, err = b.measureCandidate(ctx, "due", finished); err != nil {
		return cs, err
	}
	if err := b.setDue(ctx, false); err != nil {
		return cs, err
	}
	cs.nodue, err = b.measureCandidate(ctx, "nodue", finished)
	if rerr := b.setDue(ctx, true); err == nil {
		err = rerr
	}
	if err == nil && cs.nodue.returned != 0 {
		err = fmt.Errorf("candidate query on the no-due data returned %d rows, want 0", cs.nodue.returned)
	}
	if want := min(dueRows, b.cfg.candidateLimit); err == nil && cs.due.returned != want {
		err = fmt.Errorf("candidate query on the due data returned %d rows, want %d", cs.due.returned, want)
	}
	return cs, err
}

// measureCandidate runs the candidate query with the fixed cutoff b.base on
// one connection: a warm-up, --candidate-reps timed repetitions, one counted
// execution and the server's plan, saved under --results.
func (b *bench) measureCandidate(ctx context.Context, variant string, finished int) (candidateResult, error) {
	r := candidateResult{variant: variant, finished: finished, planRows: -1, pages: -1}
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return r, err
	}
	defer conn.Close()
	once := candidateOnce(ctx, conn, b.base, b.cfg.candidateLimit)
	timed := []func() (int, error){once}
	if variant == "due" && b.refStore != nil {
		// A connection of the same kind (prepared statements and all) to
		// the copy's own database.
		ref, err := b.refStore.DB().Conn(ctx)
		if err != nil {
			return r, err
		}
		defer ref.Close()
		timed = append(timed, candidateOnce(ctx, ref, b.base, b.cfg.candidateLimit))
	}
	for range min(200, b.cfg.candidateReps) {
		for _, f := range timed {
			if _, err := f(); err != nil {
				return r, err
			}
		}
	}
	lats := make([]latencies, len(timed))
	counts := make([]int, len(timed))
	for i := range b.cfg.candidateReps {
		// In turn, and each first every other time, so neither pays for
		// coming second.
		for k := range timed {
			j := (k + i) % len(timed)
			start := time.Now()
			n, err := timed[j]()
			if err != nil {
				return r, err
			}
			lats[j] = append(lats[j], time.Since(start))
			counts[j] = n
		}
	}
	r.lat, r.returned = lats[0], counts[0]
	if len(timed) > 1 {
		r.ref = lats[1]
		if counts[1] != counts[0] {
			return r, fmt.Errorf("candidate query returned %d rows on the reference copy and %d on the table", counts[1], counts[0])
		}
	}
	if r.examined, err = b.examined(ctx, conn, once); err != nil {
		return r, err
	}
	if err := b.savePlan(ctx, conn, &r); err != nil {
		return r, err
	}
	kv := []any{"finished", finished, "rows", finished + schedulableRows, "variant", variant,
		"returned", r.returned, "examined", r.examined, "r_rows", num(r.planRows, 0), "pages", num(r.pages, 0),
		"p50_ms", ms(r.lat.percentile(0.50)), "p95_ms", ms(r.lat.percentile(0.95)), "p99_ms", ms(r.lat.percentile(0.99))}
	b.summary("candidate_query_at", append(kv, overRef(r.lat, r.ref)...)...)
	return r, nil
}

// candidateOnce returns a function that runs the candidate query once on conn
// and counts the rows it returns.
func candidateOnce(ctx context.Context, conn *sql.Conn, cutoff time.Time, limit int) func() (int, error) {
	return func() (int, error) {
		rows, err := conn.QueryContext(ctx, candidateQuery, cutoff, limit)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			n++
		}
		return n, rows.Err()
	}
}

// makeReference copies the jobs table as it stands (the first history size)
// into a database of its own with the coordinator's schema: the reference
// that the later sizes' due candidate queries (A) and Claim runs (B) are
// timed against, in turn.
func (b *bench) makeReference(ctx context.Context) error {
	name := b.dbName + "_ref"
	if _, err := b.admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	b.refDB = name
	cfg, err := gomysql.ParseDSN(b.dsn)
	if err != nil {
		return err
	}
	cfg.DBName = name
	b.refDSN = cfg.FormatDSN()
	if b.refStore, err = mysql.Open(ctx, b.refDSN, mysql.Options{MaxOpenConns: 2}); err != nil {
		return fmt.Errorf("reference copy: %w", err)
	}
	_, err = b.admin.ExecContext(ctx, fmt.Sprintf("INSERT INTO `%s`.refund_jobs SELECT * FROM `%s`.refund_jobs", name, b.dbName))
	if err != nil {
		return fmt.Errorf("reference copy: %w", err)
	}
	b.logf("reference copy %s of refund_jobs made", name)
	return nil
}

// examined counts the rows the storage engine handed to the server for one
// execution, from the session's Handler_read_* counters (MySQL and MariaDB
// alike), less what reading the counters itself costs.
func (b *bench) examined(ctx context.Context, conn *sql.Conn, once func() (int, error)) (int64, error) {
	reads := func() (int64, error) {
		rows, err := conn.QueryContext(ctx, `SHOW SESSION STATUS LIKE 'Handler_read%'`)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		var sum int64
		for rows.Next() {
			var name, value string
			if err := rows.Scan(&name, &value); err != nil {
				return 0, err
			}
			n, _ := strconv.ParseInt(value, 10, 64)
			sum += n
		}
		return sum, rows.Err()
	}
	overhead := int64(-1)
	for range 3 {
		a, err := reads()
		if err != nil {
			return 0, err
		}
		c, err := reads()
		if err != nil {
			return 0, err
		}
		if overhead < 0 || c-a < overhead {
			overhead = c - a
		}
	}
	before, err := reads()
	if err != nil {
		return 0, err
	}
	if _, err := once(); err != nil {
		return 0, err
	}
	after, err := reads()
	if err != nil {
		return 0, err
	}
	return max(0, after-before-overhead), nil
}

// savePlan executes the query once more under the server's analyzer
// (MariaDB: ANALYZE FORMAT=JSON; MySQL: EXPLAIN ANALYZE FORMAT=TREE) and keeps
// its output as evidence (Q5).
func (b *bench) savePlan(ctx context.Context, conn *sql.Conn, r *candidateResult) error {
	prefix, ext := "EXPLAIN ANALYZE FORMAT=TREE ", "txt"
	if b.mariadb {
		prefix, ext = "ANALYZE FORMAT=JSON ", "json"
	}
	var plan string
	if err := conn.QueryRowContext(ctx, prefix+candidateQuery, b.base, b.cfg.candidateLimit).Scan(&plan); err != nil {
		return fmt.Errorf("plan of the candidate query: %w", err)
	}
	if b.mariadb {
		r.planRows, r.pages = mariadbPlanStats(plan)
	}
	name := fmt.Sprintf("plan-%d-finished-%s.%s", r.finished, r.variant, ext)
	header := fmt.Sprintf("-- %s%s\n-- cutoff %s, limit %d, %d finished rows, variant %s, server %s\n",
		prefix, strings.ReplaceAll(candidateQuery, "\n", "\n-- "), b.base.Format(sqlTime), b.cfg.candidateLimit,
		r.finished, r.variant, b.version)
	if b.mariadb {
		header = "" // keep the file plain JSON; the summary names the query
	}
	return b.writeResult(name, []byte(header+plan+"\n"))
}

// mariadbPlanStats finds refund_jobs in an ANALYZE FORMAT=JSON plan and returns
// its r_rows and pages accessed (-1 each when absent).
func mariadbPlanStats(plan string) (rows, pages float64) {
	rows, pages = -1, -1
	var doc any
	if json.Unmarshal([]byte(plan), &doc) != nil {
		return
	}
	var walk func(v any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case map[string]any:
			if v["table_name"] == "refund_jobs" {
				if n, ok := v["r_rows"].(float64); ok {
					rows = n
				}
				pages = 0 // MariaDB leaves out engine stats that stayed zero
				if es, ok := v["r_engine_stats"].(map[string]any); ok {
					if n, ok := es["pages_accessed"].(float64); ok {
						pages = n
					}
				}
				return true
			}
			for _, x := range v {
				if walk(x) {
					return true
				}
			}
		case []any:
			for _, x := range v {
				if walk(x) {
					return true
				}
			}
		}
		return false
	}
	walk(doc)
	return
}

func (b *bench) candidateSummary(stages []candidateStage) {
	first, last := stages[0], stages[len(stages)-1]
	kv := []any{"rows", last.finished + schedulableRows, "returned", last.due.returned,
		"examined", last.due.examined, "nodue_examined", last.nodue.examined,
		"pages", num(last.due.pages, 0), "nodue_pages", num(last.nodue.pages, 0),
		"p50_ms", ms(last.due.lat.percentile(0.50)), "p95_ms", ms(last.due.lat.percentile(0.95)),
		"p99_ms", ms(last.due.lat.percentile(0.99)),
		"nodue_p95_ms", ms(last.nodue.lat.percentile(0.95)), "finished_first", first.finished}
	b.summary("candidate_query", append(kv, historyRatio(last.due.lat, first.due.lat, last.due.ref, "p95_ms_at_first")...)...)
}
