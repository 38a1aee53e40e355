package mariadbpair

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Rows committed before the replica is held back (replicated everywhere) and
// after (on the primary only, until a failover decides their fate).
const (
	rowsBefore = 20
	rowsAfter  = 10
)

// The application's account: no SUPER, so read_only applies to it (root
// would bypass read_only and prove nothing about writability).
const (
	appUser     = "app"
	appPassword = "app-secret"
)

func TestAsyncFailoverLosesHeldBackCommits(t *testing.T) {
	// Dir empty: the pair's own temp dir, removed by Close.
	failover(t, Options{}, rowsBefore)
}

func TestSemiSyncFailoverKeepsEveryCommit(t *testing.T) {
	failover(t, Options{SemiSync: true, Dir: t.TempDir()}, rowsBefore+rowsAfter)
}

// failover runs the whole story on a real pair: replicate rowsBefore rows,
// hold the replica back, commit rowsAfter more on the primary, kill -9 it,
// promote the replica, and check the promoted replica has exactly want rows
// and takes writes from an ordinary user.
func failover(t *testing.T, o Options, want int) {
	if testing.Short() {
		t.Skip("-short: starts a MariaDB primary and replica")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o.Logf = t.Logf
	began := time.Now()
	p, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
	t.Logf("pair up in %v", time.Since(began).Round(time.Millisecond))

	root := open(t, p.DSN(p.PrimaryAddr(), ""))
	mustExec(t, root,
		"CREATE DATABASE app",
		"CREATE TABLE app.refunds (id INT PRIMARY KEY, note VARCHAR(64) NOT NULL)",
		"CREATE USER '"+appUser+"'@'127.0.0.1' IDENTIFIED BY '"+appPassword+"'",
		"GRANT SELECT, INSERT ON app.* TO '"+appUser+"'@'127.0.0.1'",
	)
	onPrimary := open(t, appDSN(p.PrimaryAddr()))
	insertRows(t, onPrimary, 1, rowsBefore)
	if err := p.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	onReplica := open(t, appDSN(p.ReplicaAddr()))
	wantCount(t, "replica before hold-back", onReplica, rowsBefore)
	wantReadOnlyRefusal(t, onReplica)

	if err := p.HoldBack(ctx); err != nil {
		t.Fatal(err)
	}
	// Every one of these commits returns success to its client: whatever a
	// failover loses, it loses acknowledged work.
	insertRows(t, onPrimary, rowsBefore+1, rowsAfter)
	wantCount(t, "primary after hold-back", onPrimary, rowsBefore+rowsAfter)
	wantCount(t, "held-back replica", onReplica, rowsBefore)
	if o.SemiSync {
		wantEveryCommitAcknowledged(t, root)
	}
	primaryPos, err := p.PrimaryGTID(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if err := p.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	if err := onPrimary.PingContext(ctx); err == nil {
		t.Fatal("the killed primary still answers")
	}
	if err := p.KillPrimary(); err == nil {
		t.Error("KillPrimary on a dead primary did not fail")
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	replicaPos, err := p.ReplicaGTID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("primary committed %s; promoted replica has %s", primaryPos, replicaPos)

	wantCount(t, "promoted replica", onReplica, want)
	var maxID int
	if err := onReplica.QueryRowContext(ctx, "SELECT COALESCE(MAX(id), 0) FROM refunds").Scan(&maxID); err != nil {
		t.Fatal(err)
	}
	if maxID != want {
		t.Errorf("promoted replica's highest id is %d, want %d: it kept other rows than the first %d", maxID, want, want)
	}
	var readOnly int
	if err := onReplica.QueryRowContext(ctx, "SELECT @@global.read_only").Scan(&readOnly); err != nil {
		t.Fatal(err)
	}
	if readOnly != 0 {
		t.Errorf("promoted replica has read_only=%d", readOnly)
	}
	insertRows(t, onReplica, 1000, 1)
	wantCount(t, "promoted replica after a new insert", onReplica, want+1)
	t.Logf("failover story done in %v", time.Since(began).Round(time.Millisecond))

	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// A Dir that already holds a pair's folder is refused before anything
// starts, and Close after that failed Start has nothing left to do.
func TestStartRefusesUsedDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "primary"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := Start(context.Background(), Options{Dir: dir})
	if err == nil {
		p.Close()
		t.Fatal("Start on a used Dir succeeded")
	}
	if !strings.Contains(err.Error(), "already exists") {
		t.Errorf("Start on a used Dir: %v, want an error saying the folder exists", err)
	}
}

func appDSN(addr string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = appUser, appPassword, "tcp", addr, "app"
	cfg.Timeout = 2 * time.Second
	return cfg.FormatDSN()
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t *testing.T, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// insertRows commits n rows with ids from first on, one autocommit each.
func insertRows(t *testing.T, db *sql.DB, first, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for id := first; id < first+n; id++ {
		if _, err := db.ExecContext(ctx, "INSERT INTO refunds (id, note) VALUES (?, 'refund')", id); err != nil {
			t.Fatalf("insert id %d: %v", id, err)
		}
	}
}

func wantCount(t *testing.T, what string, db *sql.DB, want int) {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM refunds").Scan(&n); err != nil {
		t.Fatalf("%s: count: %v", what, err)
	}
	if n != want {
		t.Fatalf("%s has %d rows, want %d", what, n, want)
	}
}

// wantReadOnlyRefusal checks that the replica refuses an ordinary user's
// write, so the writability checked after Promote means something.
func wantReadOnlyRefusal(t *testing.T, replica *sql.DB) {
	t.Helper()
	_, err := replica.Exec("INSERT INTO refunds (id, note) VALUES (-1, 'must be refused')")
	var myErr *mysql.MySQLError
	// 1290: ER_OPTION_PREVENTS_STATEMENT, "running with the --read-only option".
	if !errors.As(err, &myErr) || myErr.Number != 1290 {
		t.Fatalf("write on the read-only replica as %s: %v, want error 1290 (read-only)", appUser, err)
	}
}

// wantEveryCommitAcknowledged checks on the primary that semi-sync is still
// on and that no commit was ever let through without the replica's
// acknowledgement (no silent fallback to async).
func wantEveryCommitAcknowledged(t *testing.T, root *sql.DB) {
	t.Helper()
	ctx := context.Background()
	status, err := globalStatus(ctx, root, "Rpl_semi_sync_master_status")
	if err != nil {
		t.Fatal(err)
	}
	noTx, err := globalStatus(ctx, root, "Rpl_semi_sync_master_no_tx")
	if err != nil {
		t.Fatal(err)
	}
	yesTx, err := globalStatus(ctx, root, "Rpl_semi_sync_master_yes_tx")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("semi-sync on the primary: status=%s acknowledged=%s unacknowledged=%s", status, yesTx, noTx)
	if status != "ON" || noTx != "0" {
		t.Fatalf("semi-sync fell back: Rpl_semi_sync_master_status=%s Rpl_semi_sync_master_no_tx=%s", status, noTx)
	}
}
