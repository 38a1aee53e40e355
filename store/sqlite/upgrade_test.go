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

// R25: an upgrade with running jobs loses nothing (storetest.UpgradeFromUntokened).
func TestUpgradeWithRunningJobs_R25(t *testing.T) {
	ctx := context.Background()
	path := testdb.SQLitePath(t)
	old, err := sqlite.OpenMigratedTo(ctx, path, 3)
	if err != nil {
		t.Fatal(err)
	}
	now := `(CAST(unixepoch('now', 'subsec') * 1000 AS INTEGER) * 1000)`
	_, err = old.DB().ExecContext(ctx, strings.ReplaceAll(
		fmt.Sprintf(legacyJobs, storetest.LegacyAttempt, storetest.LegacyWorker), "NOW", now))
	old.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := openAt(t, path)
	var running, ready int64
	if err := s.DB().QueryRowContext(ctx, `SELECT
  (SELECT id FROM refund_jobs WHERE operation_key = 'legacy-running'),
  (SELECT id FROM refund_jobs WHERE operation_key = 'legacy-ready')`).Scan(&running, &ready); err != nil {
		t.Fatal(err)
	}
	storetest.UpgradeFromUntokened(t, s, running, ready)
}
