package mysql_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/mysql"
)

// TestClaimLeavesLiveLeasesUnlocked_R8_R13: while a claim's candidate
// statement holds its locks, the worker holding a live lease can still write
// back at once. A locking walk of the lease index would lock the entry that
// ends its range (the earliest live lease) and make that job's write-back
// wait for the claim, the first half of a deadlock with claims that then
// meet the write-back's rows.
func TestClaimLeavesLiveLeasesUnlocked_R8_R13(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openMySQL(t, testdb.MySQL(t), mysql.Options{})
	params := func(key string) store.EnqueueParams {
		return store.EnqueueParams{OperationKey: key, OrderID: "o-" + key, PaymentID: "p-" + key, AmountMinor: 100,
			Currency: "EUR", Provider: "acme"}
	}
	if _, _, err := s.Enqueue(ctx, params("held")); err != nil {
		t.Fatal(err)
	}
	held, err := s.Claim(ctx, store.ClaimParams{WorkerID: "a", MaxJobs: 1, Lease: time.Minute})
	if err != nil || len(held) != 1 {
		t.Fatalf("claim: %v, %d jobs", err, len(held))
	}
	if _, _, err := s.Enqueue(ctx, params("due")); err != nil {
		t.Fatal(err)
	}

	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(mysql.CandidatesSQL, "", "ix_refund_jobs_due", "ix_refund_jobs_due"), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil || n != 1 {
		t.Fatalf("candidates: %d rows, %v; want the due job", n, err)
	}
	rows.Close()

	// The candidate statement's transaction stays open while the holder of
	// the live lease completes.
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	defer wcancel()
	c := held[0]
	if _, err := s.Write(wctx, store.Writeback{Kind: store.EventCompleted, JobID: c.Job.ID, Attempt: c.Job.Attempt,
		LeaseToken: c.LeaseToken, ProviderRefundID: "re_1"}); err != nil {
		t.Fatalf("complete of a live lease while a claim holds its candidates: %v", err)
	}
}
