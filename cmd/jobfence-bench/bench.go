package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/store/mysql"
)

// bench is one run: its database, its store and what the scenarios found.
type bench struct {
	cfg     config
	stdout  io.Writer
	stderr  io.Writer
	started time.Time
	lines   []string // the summary, also written to the results file

	admin  *sql.DB // the server without a database: CREATE and DROP DATABASE
	dbName string
	refDB  string // the reference copy of the first history size (scenarios A and B), once made
	refDSN string
	// refStore is the reference copy's store (its own pool: a pooled
	// connection never changes database).
	refStore *mysql.Store
	dsn      string       // the bench database, for the coordinator process
	st       *mysql.Store // the same database in-process: seeding, scenario A, the direct baseline
	db       *sql.DB
	version  string
	mariadb  bool
	dbPID    int // the local database server's pid, for its CPU time; 0 when not found

	// base is the database's UTC time when the schedulable jobs were seeded:
	// the fixed cutoff of scenario A (Q5), and the anchor of every seeded
	// next_attempt_at.
	base time.Time
	// parked is true while the 200 due jobs of Q3 are moved a day later.
	parked bool

	binDir   string // a temporary folder for the coordinator binary when the bench builds it
	coordBin string
	coord    *coordinator // the running coordinator, if any
	refCoord *coordinator // a coordinator on the reference copy, while scenario B's history stages run
}

func newBench(ctx context.Context, c config, stdout, stderr io.Writer) (*bench, error) {
	b := &bench{cfg: c, stdout: stdout, stderr: stderr, started: time.Now()}
	cfg, err := gomysql.ParseDSN(c.mysqlDSN)
	if err != nil {
		return nil, fmt.Errorf("--mysql-dsn: %w", err)
	}
	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	admin.SetMaxOpenConns(2)
	if err := admin.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&b.version); err != nil {
		admin.Close()
		return nil, fmt.Errorf("connect to %s: %w", cfg.Addr, err)
	}
	b.admin = admin
	b.mariadb = strings.Contains(strings.ToLower(b.version), "mariadb")

	b.dbName = fmt.Sprintf("jfbench_%s_%d", time.Now().UTC().Format("20060102_150405"), os.Getpid()%100000)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+b.dbName+"`"); err != nil {
		admin.Close()
		return nil, fmt.Errorf("create database %s: %w", b.dbName, err)
	}
	b.logf("database %s on %s (%s)", b.dbName, cfg.Addr, b.version)
	cfg.DBName = b.dbName
	b.dsn = cfg.FormatDSN()
	// mysql.Open applies the schema (the store's embedded migrations), so the
	// bench measures exactly the tables and indexes the coordinator creates.
	b.st, err = mysql.Open(ctx, b.dsn, mysql.Options{MaxOpenConns: c.maxConns})
	if err != nil {
		b.close()
		return nil, err
	}
	b.db = b.st.DB()
	if isLoopback(cfg) {
		b.dbPID = b.serverPID(ctx)
	}
	return b, nil
}

// close stops what the run started and drops its database unless --keep.
func (b *bench) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var firstErr error
	if err := b.stopCoordinator(); err != nil {
		firstErr = err
	}
	for _, st := range []*mysql.Store{b.st, b.refStore} {
		if st != nil {
			st.Close()
		}
	}
	if b.admin != nil {
		for _, name := range []string{b.dbName, b.refDB} {
			if name == "" {
				continue
			}
			if b.cfg.keep {
				b.logf("kept database %s (--keep)", name)
			} else if _, err := b.admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil && firstErr == nil {
				firstErr = fmt.Errorf("drop database %s: %w", name, err)
			}
		}
		b.admin.Close()
	}
	if b.binDir != "" {
		os.RemoveAll(b.binDir)
	}
	return firstErr
}

// logf reports progress on stderr, stamped with the time since the start.
func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.stderr, "[%6.1fs] %s\n", time.Since(b.started).Seconds(), fmt.Sprintf(format, args...))
}

// summary prints one key=value line on stdout and keeps it for the results file.
func (b *bench) summary(name string, kv ...any) {
	line := formatLine(name, kv...)
	b.lines = append(b.lines, line)
	fmt.Fprintln(b.stdout, line)
}

// resultPath names a file under --results, prefixed by the mode so that a
// quick run never overwrites a full run's evidence.
func (b *bench) resultPath(name string) string {
	return filepath.Join(b.cfg.resultsDir, b.cfg.mode()+"-"+name)
}

func (b *bench) writeResult(name string, data []byte) error {
	if err := os.MkdirAll(b.cfg.resultsDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(b.resultPath(name), data, 0o644)
}

func (b *bench) run(ctx context.Context) error {
	// The load average tells a run on a busy machine from a clean one: every
	// process on it competes for the same cores as the bench.
	b.summary("machine", "nproc", runtime.NumCPU(), "cpu", quote(cpuModel()), "server", quote(b.version),
		"go", runtime.Version(), "mode", b.cfg.mode(), "loadavg", loadAvg())
	cal, err := b.calibrate(ctx)
	if err != nil {
		return err
	}
	b.summary("calibration", "db_rtt_us", us(cal.dbRTT), "db_commit_us", us(cal.commit), "grpc_rtt_us", us(cal.grpcRTT))

	if b.cfg.runs('b') || b.cfg.runs('c') || b.cfg.runs('e') || b.cfg.runs('g') || b.cfg.runs('h') {
		if err := b.resolveCoordinator(ctx); err != nil {
			return err
		}
	}
	if err := b.db.QueryRowContext(ctx, `SELECT UTC_TIMESTAMP()`).Scan(&b.base); err != nil {
		return err
	}
	if err := b.seedSchedulable(ctx); err != nil {
		return err
	}
	if b.cfg.runs('w') {
		// Before the history grows: the variants rebuild the indexes they drop.
		if err := b.writeCosts(ctx); err != nil {
			return err
		}
	}
	if err := b.historyStages(ctx); err != nil {
		return err
	}
	if b.cfg.runs('f') {
		if err := b.consolePages(ctx); err != nil {
			return err
		}
	}
	if b.cfg.runs('b') {
		if err := b.claimLevels(ctx); err != nil {
			return err
		}
	}
	if b.cfg.runs('c') {
		if err := b.endToEnd(ctx); err != nil {
			return err
		}
	}
	if b.cfg.runs('e') {
		if err := b.latency(ctx); err != nil {
			return err
		}
	}
	if b.cfg.runs('h') {
		// Before G, whose killed worker's jobs are not this scenario's.
		if err := b.grantDelivery(ctx); err != nil {
			return err
		}
	}
	if b.cfg.runs('g') {
		if err := b.renewal(ctx); err != nil {
			return err
		}
	}
	if b.cfg.runs('r') {
		if err := b.roundTrips(ctx); err != nil {
			return err
		}
	}
	b.summary("run", "seconds", num(time.Since(b.started).Seconds(), 1), "loadavg", loadAvg())
	summary := strings.Join(b.lines, "\n") + "\n"
	if err := b.writeResult("summary.txt", []byte(summary)); err != nil {
		return err
	}
	b.logf("summary written to %s", b.resultPath("summary.txt"))
	return nil
}

// historyStages grows the finished history through --history and, at each
// size, measures the candidate query (A) and a Claim RPC run at 16 claimers
// (B's history ratio).
func (b *bench) historyStages(ctx context.Context) error {
	stages := b.cfg.historyStages
	total := stages[len(stages)-1]
	if b.cfg.runs('b') {
		if err := b.startCoordinator(ctx); err != nil {
			return err
		}
	}
	var cand []candidateStage
	var claims []claimResult
	seeded := 0
	for _, finished := range stages {
		if err := b.seedFinished(ctx, seeded, finished, total); err != nil {
			return err
		}
		seeded = finished
		if len(stages) > 1 && b.refDB == "" {
			if err := b.makeReference(ctx); err != nil {
				return err
			}
			if b.cfg.runs('b') {
				c, err := b.launchCoordinator(ctx, b.refDSN)
				if err != nil {
					return err
				}
				b.refCoord = c
			}
		}
		if b.cfg.runs('a') {
			cs, err := b.candidateAt(ctx, finished)
			if err != nil {
				return err
			}
			cand = append(cand, cs)
		}
		if b.cfg.runs('b') {
			r, err := b.claimRun(ctx, 16, b.cfg.claimDuration, b.refCoord)
			if err != nil {
				return err
			}
			kv := []any{"finished", finished, "rows", finished + schedulableRows, "concurrency", 16,
				"claims", r.claims, "p50_ms", ms(r.lat.percentile(0.50)), "p95_ms", ms(r.lat.percentile(0.95)),
				"p99_ms", ms(r.lat.percentile(0.99))}
			if len(r.ref) > 0 {
				kv = append(kv, "ref_claims", len(r.ref))
			}
			b.summary("claim_rpc_at", append(kv, overRef(r.lat, r.ref)...)...)
			claims = append(claims, r)
		}
	}
	if b.refCoord != nil {
		err := b.refCoord.stop()
		b.refCoord = nil
		if err != nil {
			return err
		}
	}
	if len(cand) > 0 {
		b.candidateSummary(cand)
	}
	if len(claims) > 0 {
		first, last := claims[0], claims[len(claims)-1]
		kv := []any{"concurrency", 16, "finished_first", stages[0], "finished_last", total,
			"p95_ms_last", ms(last.lat.percentile(0.95))}
		b.summary("claim_rpc_history", append(kv, historyRatio(last.lat, first.lat, last.ref, "p95_ms_first")...)...)
	}
	return nil
}

// loadAvg is the 1-minute load average, or "n/a".
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "n/a"
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `'`) + `"` }

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func isLoopback(cfg *gomysql.Config) bool {
	if cfg.Net == "unix" {
		return true
	}
	host := cfg.Addr
	if h, _, ok := strings.Cut(cfg.Addr, ":"); ok && !strings.HasPrefix(cfg.Addr, "[") {
		host = h
	}
	return host == "localhost" || strings.HasPrefix(host, "127.") || host == "[::1]" || strings.HasPrefix(host, "[::1]:")
}
