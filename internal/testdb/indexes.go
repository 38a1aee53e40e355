package testdb

import (
	"database/sql"
	"slices"
	"testing"
)

// LeaseIndexes names the lease indexes that migration 0010 drops and that db
// (MySQL, its database) still has, in name order.
func LeaseIndexes(t testing.TB, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT DISTINCT index_name FROM information_schema.statistics
 WHERE table_schema = DATABASE() AND table_name = 'refund_jobs'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		if name == "ix_refund_jobs_lease" || name == "ix_refund_jobs_provider_lease" {
			out = append(out, name)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}
