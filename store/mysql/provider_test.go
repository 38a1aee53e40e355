package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store/mysql"
)

// seedBacklog inserts n due ready jobs and n running jobs with expired
// leases, all of provider, in one statement each.
func seedBacklog(t *testing.T, db *sql.DB, provider string, n int) {
	t.Helper()
	const digits = `(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
  UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)`
	for _, state := range []string{"ready", "running"} {
		q := fmt.Sprintf(`INSERT INTO refund_jobs (operation_key, order_id, payment_id, amount_minor, currency, provider,
  state, attempt, next_action, next_attempt_at, lease_until, created_at, updated_at)
SELECT CONCAT('%[1]s-%[2]s-', n), 'o', 'p', 100, 'EUR', '%[1]s', '%[2]s', 1, 'refund',
       TIMESTAMPADD(MINUTE, -20, UTC_TIMESTAMP(6)),
       CASE WHEN '%[2]s' = 'running' THEN TIMESTAMPADD(MINUTE, -10, UTC_TIMESTAMP(6)) END,
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
  FROM (SELECT a.d + 10*b.d + 100*c.d + 1000*e.d + 10000*f.d AS n
          FROM %[3]s a, %[3]s b, %[3]s c, %[3]s e, %[3]s f) seq
 WHERE n < %[4]d`, provider, state, digits, n)
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
}

// handlerReads is how many index and row reads the session has made.
func handlerReads(t *testing.T, conn *sql.Conn) int64 {
	t.Helper()
	rows, err := conn.QueryContext(context.Background(), `SHOW SESSION STATUS LIKE 'Handler_read%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var total int64
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			t.Fatal(err)
		}
		total += v
	}
	return total
}

// Issue: a provider-filtered claim walked every other provider's backlog
// (20,000 due acme rows examined by an empty Claim{provider: globex}, ~40 ms,
// and 2,000 idle long polls on globex saturated the database). With its own
// index per provider it touches a handful of index entries (Q2, Q3).
func TestProviderClaimWalksOnlyItsProvider_Q2_Q3(t *testing.T) {
	s := openMySQL(t, testdb.MySQL(t), mysql.Options{})
	seedBacklog(t, s.DB(), "acme", 20000)
	ctx := context.Background()
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const cutoff = "2100-01-01 00:00:00"
	for name, c := range map[string]struct {
		query, index string
		cutoffs      []any
	}{
		"due": {mysql.DueJobsSQL, "ix_refund_jobs_provider_due", []any{cutoff}},
		// Expired leases walk the due index too (store.Job.NextAttemptAt).
		"lease": {mysql.ExpiredLeasesSQL, "ix_refund_jobs_provider_due", []any{cutoff, cutoff}},
	} {
		for _, p := range []struct {
			provider string
			want     int
		}{{"globex", 0}, {"acme", 10}} {
			// What reading the counters costs, to take off.
			overhead := -handlerReads(t, conn) + handlerReads(t, conn)
			before := handlerReads(t, conn)
			rows, err := conn.QueryContext(ctx, fmt.Sprintf(c.query, " AND provider = ?", c.index),
				append(append([]any(nil), c.cutoffs...), p.provider, 10)...)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				n++
			}
			rows.Close()
			reads := handlerReads(t, conn) - before - overhead
			if n != p.want || reads > int64(3*p.want+30) {
				t.Errorf("%s for %s: %d rows with %d reads, want %d rows and at most %d reads (the other provider has 20,000)", name, p.provider, n,
					reads, p.want, 3*p.want+30)
			}
		}
	}
}
