package main

import (
	"io"
	"testing"
	"time"
)

// PostgreSQL's defaults: autovacuum_vacuum_threshold 50, _scale_factor 0.2,
// _insert_threshold 1000, _insert_scale_factor 0.2, autovacuum_analyze_threshold 50,
// _scale_factor 0.1.
var defaultRules = autovacuumRules{
	vacuumThreshold: 50, vacuumScale: 0.2,
	insertThreshold: 1000, insertScale: 0.2,
	analyzeThreshold: 50, analyzeScale: 0.1,
}

func TestNeedsFollowsAutovacuumsThresholds(t *testing.T) {
	for _, c := range []struct {
		what            string
		rules           autovacuumRules
		t               tableActivity
		vacuum, analyze bool
	}{
		{"an emptied table, never analyzed, 50 changes: not yet", defaultRules,
			tableActivity{reltuples: -1, modifiedSinceAnalyze: 50, insertedSinceVacuum: 50}, false, false},
		{"an emptied table, never analyzed, 51 changes: analyze", defaultRules,
			tableActivity{reltuples: -1, modifiedSinceAnalyze: 51, insertedSinceVacuum: 51}, false, true},
		{"20,000 rows: analyze after 50 + 2,000 changes", defaultRules,
			tableActivity{reltuples: 20000, modifiedSinceAnalyze: 2050}, false, false},
		{"20,000 rows, 2,051 changes", defaultRules,
			tableActivity{reltuples: 20000, modifiedSinceAnalyze: 2051}, false, true},
		{"20,000 rows, 4,050 dead: not yet", defaultRules,
			tableActivity{reltuples: 20000, dead: 4050}, false, false},
		{"20,000 rows, 4,051 dead: vacuum", defaultRules,
			tableActivity{reltuples: 20000, dead: 4051}, true, false},
		{"an emptied table, 1,001 inserts: vacuum", defaultRules,
			tableActivity{reltuples: 0, insertedSinceVacuum: 1001}, true, false},
		{"inserts do not count when their threshold is -1 (before PostgreSQL 13)",
			autovacuumRules{vacuumThreshold: 50, vacuumScale: 0.2, insertThreshold: -1, analyzeThreshold: 50, analyzeScale: 0.1},
			tableActivity{reltuples: 0, insertedSinceVacuum: 1e9}, false, false},
		{"both", defaultRules,
			tableActivity{reltuples: 100, dead: 71, modifiedSinceAnalyze: 61}, true, true},
	} {
		vacuum, analyze := c.rules.needs(c.t)
		if vacuum != c.vacuum || analyze != c.analyze {
			t.Errorf("%s: needs = vacuum %v, analyze %v; want %v, %v", c.what, vacuum, analyze, c.vacuum, c.analyze)
		}
	}
}

func TestMaintenanceCommand(t *testing.T) {
	for _, c := range []struct {
		vacuum, analyze bool
		want            string
	}{
		{false, false, ""},
		{true, false, `VACUUM "river_job"`},
		{false, true, `ANALYZE "river_job"`},
		{true, true, `VACUUM (ANALYZE) "river_job"`},
	} {
		if got := maintenanceCommand("river_job", c.vacuum, c.analyze); got != c.want {
			t.Errorf("maintenanceCommand(%v, %v) = %q, want %q", c.vacuum, c.analyze, got, c.want)
		}
	}
	if got := maintenanceCommand(`odd "name`, true, false); got != `VACUUM "odd ""name"` {
		t.Errorf("a table name is quoted as an identifier: %q", got)
	}
}

func TestAutovacuumNaptimeFlag(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil || c.autovacuumNaptime != time.Second {
		t.Fatalf("default: %v, %v; want 1s", c.autovacuumNaptime, err)
	}
	if c, err := parseFlags([]string{"--autovacuum-naptime", "0"}, io.Discard); err != nil || c.autovacuumNaptime != 0 {
		t.Fatalf("0 (off): %v, %v", c.autovacuumNaptime, err)
	}
	if _, err := parseFlags([]string{"--autovacuum-naptime", "-1s"}, io.Discard); err == nil {
		t.Fatal("a negative naptime was accepted")
	}
}

// A nil maintainer is the stand-in turned off: its methods do nothing.
func TestNilMaintainerIsOff(t *testing.T) {
	var m *maintainer
	if err := m.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	m.start(t.Context())
	if v, a, err := m.finish(); v != 0 || a != 0 || err != nil {
		t.Fatalf("finish = %d, %d, %v", v, a, err)
	}
}
