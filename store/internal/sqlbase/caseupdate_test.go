package sqlbase_test

import (
	"context"
	"database/sql"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// TestRowUpdateFencesEachRow_R9: each row gets its own values, and only rows
// whose attempt is still their fence and that meet Where change.
func TestRowUpdateFencesEachRow_R9(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
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
