package mysql_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store/mysql"
	"github.com/jobfence/jobfence/store/storetest"
)

// legacyJobs are the rows a coordinator from before lease tokens (schema
// version 3) leaves: a job it granted, with a live lease, and one it never
// claimed.
const legacyJobs = `INSERT INTO refund_jobs (operation_key, order_id, payment_id, amount_minor, currency, provider,
  state, attempt, next_action, next_attempt_at, lease_until, worker_id, first_sent_at, created_at, updated_at)
VALUES
  ('legacy-running', 'order-1', 'pay-1', 500, 'EUR', 'acme', 'running', %[1]d, 'reconcile', UTC_TIMESTAMP(6),
   TIMESTAMPADD(MINUTE, 10, UTC_TIMESTAMP(6)), '%[2]s', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)),
  ('legacy-ready', 'order-2', 'pay-2', 700, 'EUR', 'acme', 'ready', 0, 'refund', UTC_TIMESTAMP(6),
   NULL, '', NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`

// legacyReviews are what a coordinator of schema version 5 leaves: a
// review escalated now that was due an hour ago, and a job due in an hour.
const legacyReviews = `INSERT INTO refund_jobs (operation_key, order_id, payment_id, amount_minor, currency, provider,
  state, attempt, next_action, next_attempt_at, lease_until, worker_id, first_sent_at, created_at, updated_at)
VALUES
  ('legacy-review', 'order-3', 'pay-3', 900, 'EUR', 'acme', 'manual_review', 1, 'refund',
   TIMESTAMPADD(HOUR, -1, UTC_TIMESTAMP(6)), NULL, 'A', TIMESTAMPADD(HOUR, -1, UTC_TIMESTAMP(6)),
   TIMESTAMPADD(HOUR, -1, UTC_TIMESTAMP(6)), UTC_TIMESTAMP(6)),
  ('legacy-parked', 'order-4', 'pay-4', 900, 'EUR', 'acme', 'ready', 0, 'refund',
   TIMESTAMPADD(HOUR, 1, UTC_TIMESTAMP(6)), NULL, '', NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`

// R25: an upgrade with running jobs loses nothing (storetest.UpgradeFromUntokened).
func TestUpgradeWithRunningJobs_R25(t *testing.T) {
	dsn := testdb.MySQL(t)
	storetest.UpgradeWithRunningJobs(t,
		func() (storetest.DBStore, error) { return mysql.OpenMigratedTo(context.Background(), dsn, 3) },
		fmt.Sprintf(legacyJobs, storetest.LegacyAttempt, storetest.LegacyWorker),
		func() storetest.DBStore { return openMySQL(t, dsn, mysql.Options{}) })
}

// A review an earlier release escalated waits since its escalation after the
// upgrade (storetest.UpgradeDatesReviewsFromTheirEscalation).
func TestUpgradeDatesReviewsFromTheirEscalation(t *testing.T) {
	dsn := testdb.MySQL(t)
	storetest.UpgradeDatesReviewsFromTheirEscalation(t,
		func() (storetest.DBStore, error) { return mysql.OpenMigratedTo(context.Background(), dsn, 5) },
		legacyReviews, func() storetest.DBStore { return openMySQL(t, dsn, mysql.Options{}) })
}

// antedate moves a running job's next_attempt_at (job id, second argument)
// to hours (first argument) before its lease end, as an earlier release
// leaves it.
const antedate = `UPDATE refund_jobs SET next_attempt_at = TIMESTAMPADD(HOUR, -?, lease_until) WHERE id = ?`

// While coordinators of the earlier release still run (the lease indexes
// kept, their grants due before their lease end), claims find every expired
// lease first and no live one (R6, R23; store.Job.NextAttemptAt).
func TestTakeoverFindsRowsOfAnEarlierRelease_R6_R23(t *testing.T) {
	dsn := testdb.MySQL(t)
	old, err := mysql.OpenMigratedTo(context.Background(), dsn, 8)
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	s := openMySQL(t, dsn, mysql.Options{})
	if got := testdb.LeaseIndexes(t, s.DB()); len(got) != 2 {
		t.Fatalf("lease indexes after the upgrade = %v, want both kept until the contract", got)
	}
	storetest.TakeoverFindsRowsOfAnEarlierRelease(t, s, antedate)
}

// The contract migration that drops the lease indexes waits, on a database
// an earlier release ran on, until it is asked for; the jobs running at the
// upgrade are due at their lease end at once (0009). A fresh database has
// neither index.
func TestLeaseIndexesDroppedOnlyWhenAsked(t *testing.T) {
	dsn := testdb.MySQL(t)
	old, err := mysql.OpenMigratedTo(context.Background(), dsn, 8)
	if err != nil {
		t.Fatal(err)
	}
	_, err = old.DB().Exec(fmt.Sprintf(legacyJobs, storetest.LegacyAttempt, storetest.LegacyWorker))
	old.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := openMySQL(t, dsn, mysql.Options{})
	if got, want := s.PendingContract(), []string{"0010_drop_lease_indexes.contract.sql",
		"0013_operation_keys_complete.contract.sql"}; !slices.Equal(got, want) {
		t.Fatalf("pending contract migrations = %v, want %v", got, want)
	}
	if got := testdb.LeaseIndexes(t, s.DB()); len(got) != 2 {
		t.Fatalf("lease indexes before the contract = %v, want both", got)
	}
	// R30: until every coordinator writes the keys it enqueues, nothing may
	// leave refund_jobs.
	if ok, err := s.ArchiveAllowed(context.Background()); err != nil || ok {
		t.Fatalf("ArchiveAllowed before the contract = %v, %v; want false", ok, err)
	}
	var late int
	if err := s.DB().QueryRow(`SELECT COUNT(*) FROM refund_jobs
 WHERE state = 'running' AND NOT next_attempt_at <=> lease_until`).Scan(&late); err != nil || late != 0 {
		t.Fatalf("running jobs not due at their lease end after 0009: %d (%v)", late, err)
	}
	s.Close()

	for range 2 { // the second open finds nothing left to do
		s = openMySQL(t, dsn, mysql.Options{Contract: true})
		if got := testdb.LeaseIndexes(t, s.DB()); len(got) != 0 || len(s.PendingContract()) != 0 {
			t.Fatalf("after the contract: lease indexes %v, pending %v; want none", got, s.PendingContract())
		}
		var keys int
		if ok, err := s.ArchiveAllowed(context.Background()); err != nil || !ok ||
			s.DB().QueryRow(`SELECT COUNT(*) FROM refund_operation_keys`).Scan(&keys) != nil || keys == 0 {
			t.Fatalf("after the contract: ArchiveAllowed %v, %v, %d keys; want allowed, the legacy jobs' keys on file", ok, err, keys)
		}
		s.Close()
	}

	fresh := openMySQL(t, testdb.MySQL(t), mysql.Options{})
	if got := testdb.LeaseIndexes(t, fresh.DB()); len(got) != 0 || len(fresh.PendingContract()) != 0 {
		t.Fatalf("fresh database: lease indexes %v, pending %v; want none", got, fresh.PendingContract())
	}
	if ok, err := fresh.ArchiveAllowed(context.Background()); err != nil || !ok {
		t.Fatalf("fresh database: ArchiveAllowed = %v, %v; want true", ok, err)
	}
}
