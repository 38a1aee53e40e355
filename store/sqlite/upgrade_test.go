package sqlite_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store/sqlite"
	"github.com/jobfence/jobfence/store/storetest"
)

// legacyJobs are the rows a coordinator from before lease tokens (schema
// version 3) leaves: a job it granted, with a live lease, and one it never
// claimed. NOW stands for the database's clock in microseconds.
const legacyJobs = `INSERT INTO refund_jobs (operation_key, order_id, payment_id, amount_minor, currency, provider,
  state, attempt, next_action, next_attempt_at, lease_until, worker_id, first_sent_at, created_at, updated_at)
VALUES
  ('legacy-running', 'order-1', 'pay-1', 500, 'EUR', 'acme', 'running', %[1]d, 'reconcile', NOW,
   NOW + 600000000, '%[2]s', NOW, NOW, NOW),
  ('legacy-ready', 'order-2', 'pay-2', 700, 'EUR', 'acme', 'ready', 0, 'refund', NOW, NULL, '', NULL, NOW, NOW)`

// legacyReviews are what a coordinator of schema version 5 leaves: a
// review escalated now that was due an hour ago, and a job due in an hour.
const legacyReviews = `INSERT INTO refund_jobs (operation_key, order_id, payment_id, amount_minor, currency, provider,
  state, attempt, next_action, next_attempt_at, lease_until, worker_id, first_sent_at, created_at, updated_at)
VALUES
  ('legacy-review', 'order-3', 'pay-3', 900, 'EUR', 'acme', 'manual_review', 1, 'refund', NOW - 3600000000, NULL, 'A',
   NOW - 3600000000, NOW - 3600000000, NOW),
  ('legacy-parked', 'order-4', 'pay-4', 900, 'EUR', 'acme', 'ready', 0, 'refund', NOW + 3600000000, NULL, '', NULL,
   NOW, NOW)`

// microsNow is the database's clock in microseconds, for NOW in the rows above.
const microsNow = `(CAST(unixepoch('now', 'subsec') * 1000 AS INTEGER) * 1000)`

// R25: an upgrade with running jobs loses nothing (storetest.UpgradeFromUntokened).
func TestUpgradeWithRunningJobs_R25(t *testing.T) {
	path := testdb.SQLitePath(t)
	storetest.UpgradeWithRunningJobs(t,
		func() (storetest.DBStore, error) { return sqlite.OpenMigratedTo(context.Background(), path, 3) },
		strings.ReplaceAll(fmt.Sprintf(legacyJobs, storetest.LegacyAttempt, storetest.LegacyWorker), "NOW", microsNow),
		func() storetest.DBStore { return openAt(t, path) })
}

// A review an earlier release escalated waits since its escalation after the
// upgrade (storetest.UpgradeDatesReviewsFromTheirEscalation).
func TestUpgradeDatesReviewsFromTheirEscalation(t *testing.T) {
	path := testdb.SQLitePath(t)
	storetest.UpgradeDatesReviewsFromTheirEscalation(t,
		func() (storetest.DBStore, error) { return sqlite.OpenMigratedTo(context.Background(), path, 5) },
		strings.ReplaceAll(legacyReviews, "NOW", microsNow), func() storetest.DBStore { return openAt(t, path) })
}

// Claims find every expired lease an earlier release granted, first, and no
// live one (R6, R23; store.Job.NextAttemptAt).
func TestTakeoverFindsRowsOfAnEarlierRelease_R6_R23(t *testing.T) {
	storetest.TakeoverFindsRowsOfAnEarlierRelease(t, openAt(t, testdb.SQLitePath(t)),
		`UPDATE refund_jobs SET next_attempt_at = lease_until - ? * 3600000000 WHERE id = ?`)
}
