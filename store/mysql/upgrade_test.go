package mysql_test

import (
	"context"
	"fmt"
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
