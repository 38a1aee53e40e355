package mysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/mysql"
)

// sessionCounter reads a counter of the session's own connection.
func sessionCounter(t *testing.T, db *sql.DB, name string) int64 {
	t.Helper()
	var got string
	var n int64
	if err := db.QueryRowContext(context.Background(), "SHOW SESSION STATUS LIKE '"+name+"'").Scan(&got, &n); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// A connection prepares each statement with arguments the second time it
// runs it, and keeps it: claims and write-backs, round after round, are
// executed as the statements prepared in the first rounds, fenced as ever
// (R5, R9: each claim finds the attempt its reschedule left; the
// conformance suite runs on the same pool).
func TestStatementsPreparedOncePerConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openMySQL(t, testdb.MySQL(t), mysql.Options{MaxOpenConns: 1}) // every statement on one connection
	job, _, err := s.Enqueue(ctx, store.EnqueueParams{OperationKey: "op-1", OrderID: "o-1", PaymentID: "p-1",
		AmountMinor: 100, Currency: "EUR", Provider: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	prepared, executed := sessionCounter(t, s.DB(), "Com_stmt_prepare"), sessionCounter(t, s.DB(), "Com_stmt_execute")
	const rounds = 30
	for i := range rounds {
		claimed, err := s.Claim(ctx, store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: time.Minute})
		if err != nil || len(claimed) != 1 || claimed[0].Job.ID != job.ID || claimed[0].Job.Attempt != int64(i+1) {
			t.Fatalf("round %d: claim = %+v, %v", i, claimed, err)
		}
		if _, err := s.Write(ctx, store.Writeback{Kind: store.EventRescheduled, JobID: job.ID,
			Attempt: claimed[0].Job.Attempt, LeaseToken: claimed[0].LeaseToken, NextAction: store.ActionRefund}); err != nil {
			t.Fatalf("round %d: reschedule: %v", i, err)
		}
	}
	prepared = sessionCounter(t, s.DB(), "Com_stmt_prepare") - prepared
	executed = sessionCounter(t, s.DB(), "Com_stmt_execute") - executed
	if want := int64(rounds-1) * 5; executed < want { // the first round runs as text
		t.Fatalf("%d statements executed as prepared in %d rounds of claim and reschedule, want at least %d",
			executed, rounds, want)
	}
	if prepared > 10 {
		t.Fatalf("%d statements prepared for %d rounds: prepared statements are not kept", prepared, rounds)
	}
}

// A connection keeps at most its bound of prepared statements, closing the
// least recently used, and every statement still answers right. A
// statement runs as text the first time.
func TestPreparedStatementsBoundedPerConnection(t *testing.T) {
	queries := []string{`SELECT ? + 0`, `SELECT ? + 1`, `SELECT ? + 2`}
	for _, tc := range []struct{ keep, prepares, closes int64 }{
		{keep: 3, prepares: 3, closes: 0}, // all kept: prepared once each
		{keep: 2, prepares: 9, closes: 7}, // cycling through three, the next is always the one closed
	} {
		db, err := mysql.OpenKeeping(testdb.MySQL(t), int(tc.keep))
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		prepared, closed := sessionCounter(t, db, "Com_stmt_prepare"), sessionCounter(t, db, "Com_stmt_close")
		for round := range 4 {
			for k, q := range queries {
				var got int64
				if err := db.QueryRowContext(context.Background(), q, int64(10*round)).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if want := int64(10*round + k); got != want {
					t.Fatalf("keep %d: %s with %d = %d, want %d", tc.keep, q, 10*round, got, want)
				}
			}
		}
		prepared = sessionCounter(t, db, "Com_stmt_prepare") - prepared
		closed = sessionCounter(t, db, "Com_stmt_close") - closed
		if prepared != tc.prepares || closed != tc.closes {
			t.Fatalf("keep %d: %d prepared and %d closed, want %d and %d", tc.keep, prepared, closed, tc.prepares, tc.closes)
		}
		db.Close()
	}
}

// A statement the server will not prepare (SHOW with a placeholder) runs as
// text, and the connection does not ask again.
func TestUnpreparableStatementsRunAsText(t *testing.T) {
	db, err := mysql.OpenKeeping(testdb.MySQL(t), 8)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	prepared := sessionCounter(t, db, "Com_stmt_prepare")
	for range 4 {
		var name string
		var n int64
		if err := db.QueryRowContext(context.Background(), `SHOW SESSION STATUS LIKE ?`, "Com_stmt_prepare").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		if name != "Com_stmt_prepare" {
			t.Fatalf("SHOW answered %q", name)
		}
	}
	if n := sessionCounter(t, db, "Com_stmt_prepare") - prepared; n != 1 {
		t.Fatalf("%d attempts to prepare it, want 1 (the second run; then it is known to run as text)", n)
	}
}
