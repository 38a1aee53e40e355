package sqlbase_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	_ "modernc.org/sqlite"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// memoryDB is an SQLite database in memory, on one connection.
func memoryDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	return db
}

// TestRowUpdateFencesEachRow_R9: each row gets its own values, and only rows
// whose attempt is still their fence and that meet Where change.
func TestRowUpdateFencesEachRow_R9(t *testing.T) {
	ctx := context.Background()
	db := memoryDB(t)
	for _, q := range []string{
		`CREATE TABLE refund_jobs (id INTEGER PRIMARY KEY, attempt INTEGER, state TEXT, note TEXT, n INTEGER)`,
		`INSERT INTO refund_jobs VALUES (1, 3, 'running', '', 0), (2, 5, 'running', '', 0), (3, 7, 'running', '', 0), (4, 1, 'ready', '', 0)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	u := sqlbase.RowUpdate{
		Table: "refund_jobs", Fixed: "n = ?", FixedArgs: []any{9},
		Cols: []string{"note", "state"},
		IDs:  []int64{1, 2, 3, 4}, Fences: []int64{3, 4, 7, 1}, // job 2: an older attempt
		Vals:  [][]any{{"one", "done"}, {"two", "done"}, {"three", "ready"}, {"four", "done"}},
		Where: "state = ?", WhereArgs: []any{"running"}, // job 4 is not running
	}
	query, args := u.SQL()
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, query)
	}
	if n, _ := res.RowsAffected(); n != 2 {
		t.Fatalf("%d rows changed, want 2 (jobs 1 and 3)", n)
	}
	want := map[int64]string{1: "one done 9", 2: " running 0", 3: "three ready 9", 4: " ready 0"}
	rows, err := db.QueryContext(ctx, `SELECT id, note || ' ' || state || ' ' || n FROM refund_jobs`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var got string
		if err := rows.Scan(&id, &got); err != nil {
			t.Fatal(err)
		}
		if got != want[id] {
			t.Errorf("job %d = %q, want %q", id, got, want[id])
		}
	}
}

// TestRowUpdateFencesEachRowByItsGrant_R25: with Grants set, a row changes
// only where its lease token hash is the writer's too: the current attempt
// with another token, or with none, changes nothing. The fence's last line,
// below the plan's own check, on both databases.
func TestRowUpdateFencesEachRowByItsGrant_R25(t *testing.T) {
	ctx := context.Background()
	lite := memoryDB(t)
	cfg, err := mysql.ParseDSN(testdb.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientFoundRows = true // as store/mysql forces it
	my, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer my.Close()
	for name, c := range map[string]struct {
		db     *sql.DB
		create string
	}{
		"sqlite": {lite, `CREATE TABLE refund_jobs (id INTEGER PRIMARY KEY, attempt INTEGER,
  lease_token_hash BLOB NOT NULL DEFAULT X'', note TEXT)`},
		"mysql": {my, `CREATE TABLE refund_jobs (id BIGINT PRIMARY KEY, attempt BIGINT,
  lease_token_hash VARBINARY(32) NOT NULL DEFAULT '', note VARCHAR(8))`},
	} {
		t.Run(name, func(t *testing.T) { testGrantFence(ctx, t, c.db, c.create) })
	}
}

func testGrantFence(ctx context.Context, t *testing.T, db *sql.DB, create string) {
	grants := map[int64]store.TokenHash{1: store.NewLeaseToken().Hash(), 2: store.NewLeaseToken().Hash(),
		3: {}, 4: {}, 5: store.NewLeaseToken().Hash()}
	if _, err := db.ExecContext(ctx, create); err != nil {
		t.Fatal(err)
	}
	for id, g := range grants {
		if _, err := db.ExecContext(ctx, `INSERT INTO refund_jobs VALUES (?, 2, ?, '')`, id, g); err != nil {
			t.Fatal(err)
		}
	}
	guess := func() store.TokenHash { return store.NewLeaseToken().Hash() }
	u := sqlbase.RowUpdate{
		Table: "refund_jobs", Fixed: "note = 'x'",
		IDs: []int64{1, 2, 3, 4, 5}, Fences: []int64{2, 2, 2, 2, 2},
		// 1: the holder; 2: the current attempt with a guessed token; 3: a
		// grant without a token, written without one; 4: a guessed token for
		// a grant that has none; 5: job 1's token, on job 5.
		Grants: []store.TokenHash{grants[1], guess(), {}, guess(), grants[1]},
		Vals:   [][]any{{}, {}, {}, {}, {}},
	}
	query, args := u.SQL()
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, query)
	}
	if n, _ := res.RowsAffected(); n != 2 {
		t.Errorf("%d rows matched, want 2 (jobs 1 and 3)", n)
	}
	want := map[int64]string{1: "x", 2: "", 3: "x", 4: "", 5: ""}
	for id, note := range want {
		var got string
		if err := db.QueryRowContext(ctx, `SELECT note FROM refund_jobs WHERE id = ?`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != note {
			t.Errorf("job %d: note %q, want %q", id, got, note)
		}
	}
}

// countingTx counts a transaction's statements and the most rows one of
// them named (its CASE ... WHEN clauses per column).
type countingTx struct {
	sqlbase.Tx
	statements, mostRows int
}

func (c *countingTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	c.statements++
	c.mostRows = max(c.mostRows, strings.Count(query[:strings.Index(query, " END")], " WHEN "))
	return c.Tx.ExecContext(ctx, query, args...)
}

// TestRowUpdateExecAllInBoundedStatements_R9_R25: an update of more rows
// than one statement takes goes out in statements of at most 128 rows, each
// row still set to its own values under its own attempt and token, and a
// row that fails its fence in a later statement fails the update.
func TestRowUpdateExecAllInBoundedStatements_R9_R25(t *testing.T) {
	ctx := context.Background()
	db := memoryDB(t)
	const n = 300
	if _, err := db.ExecContext(ctx, `CREATE TABLE refund_jobs (id INTEGER PRIMARY KEY, attempt INTEGER,
  lease_token_hash BLOB, note TEXT)`); err != nil {
		t.Fatal(err)
	}
	u := sqlbase.RowUpdate{Table: "refund_jobs", Cols: []string{"note"}}
	for i := int64(1); i <= n; i++ {
		token := store.NewLeaseToken().Hash()
		if _, err := db.ExecContext(ctx, `INSERT INTO refund_jobs VALUES (?, ?, ?, '')`, i, i%7, token); err != nil {
			t.Fatal(err)
		}
		u.IDs, u.Fences, u.Grants = append(u.IDs, i), append(u.Fences, i%7), append(u.Grants, token)
		u.Vals = append(u.Vals, []any{fmt.Sprintf("row %d", i)})
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	counted := &countingTx{Tx: tx}
	if err := u.ExecAll(ctx, counted, "test"); err != nil {
		t.Fatal(err)
	}
	if counted.statements != 3 || counted.mostRows != 128 {
		t.Errorf("%d statements of at most %d rows, want 3 of at most 128", counted.statements, counted.mostRows)
	}
	var wrong int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM refund_jobs WHERE note <> 'row ' || id`).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d rows without their own value (%v)", wrong, err)
	}
	// A fence that no longer holds, in the last statement.
	u.Fences[n-1]++
	if err := u.ExecAll(ctx, tx, "test"); err == nil || !strings.Contains(err.Error(), "44 rows held and checked but 43 matched") {
		t.Fatalf("ExecAll with a stale row in its last statement = %v, want its count refused", err)
	}
}
