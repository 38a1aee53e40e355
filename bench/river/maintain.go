package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// The bench stands in for PostgreSQL's autovacuum while it measures. Every
// River deployment runs with autovacuum (the server's default), and River's
// fetch depends on it: the client's statements are prepared (pgx caches
// them per connection), and after five executions PostgreSQL may keep a
// generic plan of the fetch. Made while river_job is empty, as it is after
// the table is emptied for a measurement, that plan joins the locked jobs to
// river_job by a nested loop over a sequential scan, a cost that grows with
// the table times the jobs fetched, and it is kept until something
// invalidates it. On a running server, autovacuum's ANALYZE of the growing
// table is that something. Without autovacuum (a server configured with
// autovacuum = off), or within its first naptime (60 s by default) of the
// table being emptied, the fetch stays on that plan for the whole
// measurement. The stand-in applies autovacuum's own rules, with the
// server's thresholds, scale factors and cost delay, every --autovacuum-naptime
// instead of every minute, so that a table emptied for one measurement is
// kept the way autovacuum keeps a deployment's table from its first second.
// Its VACUUM and ANALYZE run in a backend of the server, so their CPU counts
// as PostgreSQL's, against River, as autovacuum's would.

// autovacuumRules are the server's autovacuum thresholds and scale factors.
type autovacuumRules struct {
	vacuumThreshold, vacuumScale   float64
	insertThreshold, insertScale   float64 // insertThreshold < 0: inserts never trigger a vacuum
	analyzeThreshold, analyzeScale float64
}

// tableActivity is one table's line of pg_stat_user_tables, with pg_class's
// reltuples.
type tableActivity struct {
	name                 string
	reltuples            float64 // < 0: never vacuumed or analyzed
	dead                 float64 // n_dead_tup
	insertedSinceVacuum  float64 // n_ins_since_vacuum
	modifiedSinceAnalyze float64 // n_mod_since_analyze
}

// needs reports whether autovacuum would vacuum and analyze t: the test of
// relation_needs_vacanalyze in PostgreSQL 13 to 17 (per-table storage
// parameters aside; River sets none).
func (r autovacuumRules) needs(t tableActivity) (vacuum, analyze bool) {
	tuples := max(t.reltuples, 0) // a table never vacuumed counts as empty
	vacuum = t.dead > r.vacuumThreshold+r.vacuumScale*tuples ||
		(r.insertThreshold >= 0 && t.insertedSinceVacuum > r.insertThreshold+r.insertScale*tuples)
	analyze = t.modifiedSinceAnalyze > r.analyzeThreshold+r.analyzeScale*tuples
	return vacuum, analyze
}

// maintenanceCommand is the statement autovacuum's worker would run for a
// table, "" when it would leave it alone.
func maintenanceCommand(table string, vacuum, analyze bool) string {
	id := pgx.Identifier{table}.Sanitize()
	switch {
	case vacuum && analyze:
		return "VACUUM (ANALYZE) " + id
	case vacuum:
		return "VACUUM " + id
	case analyze:
		return "ANALYZE " + id
	}
	return ""
}

// maintainer is the autovacuum stand-in, on a connection of its own.
type maintainer struct {
	conn    *pgx.Conn
	rules   autovacuumRules
	naptime time.Duration
	server  string // the server's autovacuum setting, for the config line

	vacuums, analyzes atomic.Int64 // since the last start
	stop              chan struct{}
	done              sync.WaitGroup
	err               error // the loop's, read after done
}

// newMaintainer reads the server's autovacuum settings over conn and sets
// the session's cost-based delay to autovacuum's, so that its VACUUM and
// ANALYZE are paced as autovacuum's are.
func newMaintainer(ctx context.Context, conn *pgx.Conn, naptime time.Duration) (*maintainer, error) {
	m := &maintainer{conn: conn, naptime: naptime}
	var delay, limit string
	err := conn.QueryRow(ctx, `SELECT current_setting('autovacuum'),
		current_setting('autovacuum_vacuum_threshold')::float8, current_setting('autovacuum_vacuum_scale_factor')::float8,
		coalesce(current_setting('autovacuum_vacuum_insert_threshold', true)::float8, -1),
		coalesce(current_setting('autovacuum_vacuum_insert_scale_factor', true)::float8, 0),
		current_setting('autovacuum_analyze_threshold')::float8, current_setting('autovacuum_analyze_scale_factor')::float8,
		CASE WHEN current_setting('autovacuum_vacuum_cost_delay') LIKE '-1%' THEN current_setting('vacuum_cost_delay')
			ELSE current_setting('autovacuum_vacuum_cost_delay') END,
		CASE WHEN current_setting('autovacuum_vacuum_cost_limit') = '-1' THEN current_setting('vacuum_cost_limit')
			ELSE current_setting('autovacuum_vacuum_cost_limit') END`).Scan(&m.server,
		&m.rules.vacuumThreshold, &m.rules.vacuumScale, &m.rules.insertThreshold, &m.rules.insertScale,
		&m.rules.analyzeThreshold, &m.rules.analyzeScale, &delay, &limit)
	if err != nil {
		return nil, fmt.Errorf("autovacuum settings: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT set_config('vacuum_cost_delay', $1, false), set_config('vacuum_cost_limit', $2, false)",
		delay, limit); err != nil {
		return nil, fmt.Errorf("autovacuum's cost delay for the stand-in: %w", err)
	}
	return m, nil
}

// pass vacuums and analyzes every table of the bench's database that
// autovacuum would, one after the other. A nil maintainer (the stand-in
// off) does nothing, here and in start and finish.
func (m *maintainer) pass(ctx context.Context) error {
	if m == nil {
		return nil
	}
	rows, err := m.conn.Query(ctx, `SELECT s.relname, c.reltuples::float8, s.n_dead_tup::float8,
		s.n_ins_since_vacuum::float8, s.n_mod_since_analyze::float8
		FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
		WHERE s.schemaname = current_schema() ORDER BY s.relname`)
	if err != nil {
		return fmt.Errorf("table activity: %w", err)
	}
	tables, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (tableActivity, error) {
		var t tableActivity
		err := row.Scan(&t.name, &t.reltuples, &t.dead, &t.insertedSinceVacuum, &t.modifiedSinceAnalyze)
		return t, err
	})
	if err != nil {
		return fmt.Errorf("table activity: %w", err)
	}
	for _, t := range tables {
		vacuum, analyze := m.rules.needs(t)
		if cmd := maintenanceCommand(t.name, vacuum, analyze); cmd != "" {
			if _, err := m.conn.Exec(ctx, cmd); err != nil {
				return fmt.Errorf("%s: %w", cmd, err)
			}
			if vacuum {
				m.vacuums.Add(1)
			}
			if analyze {
				m.analyzes.Add(1)
			}
		}
	}
	return nil
}

// start runs a pass every naptime until finish, the first at once, and
// resets the counts.
func (m *maintainer) start(ctx context.Context) {
	if m == nil {
		return
	}
	m.vacuums.Store(0)
	m.analyzes.Store(0)
	m.stop, m.err = make(chan struct{}), nil
	m.done.Go(func() {
		tick := time.NewTicker(m.naptime)
		defer tick.Stop()
		for {
			if err := m.pass(ctx); err != nil {
				if ctx.Err() == nil {
					m.err = err
				}
				return
			}
			select {
			case <-tick.C:
			case <-m.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	})
}

// finish stops the loop after the statement it is running, if any, and
// returns how many VACUUMs and ANALYZEs it ran since start.
func (m *maintainer) finish() (vacuums, analyzes int64, err error) {
	if m == nil {
		return 0, 0, nil
	}
	close(m.stop)
	m.done.Wait()
	if m.err != nil {
		err = fmt.Errorf("autovacuum stand-in: %w", m.err)
	}
	return m.vacuums.Load(), m.analyzes.Load(), err
}
