package main_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// migrateOnly runs the binary with --migrate-only and args on dsn, waits for
// its exit and returns its log.
func migrateOnly(t *testing.T, dsn string, args ...string) string {
	t.Helper()
	p := proctest.Start(t, bin.coordinator, proctest.Options{
		Args: append([]string{"--migrate-only", "--log-format", "json"}, args...),
		Env:  []string{"JOBFENCE_MYSQL_DSN=" + dsn},
	})
	if err := p.Wait(t, 60*time.Second); err != nil {
		t.Fatalf("coordinator --migrate-only %v: %v\n%s", args, err, p.Logs())
	}
	return p.Logs()
}

// A database an earlier release runs on keeps the lease indexes its claims
// name until every coordinator runs this release: a start says the contract
// migration is pending; --migrate-contract applies it (DEPLOY.md, "Upgrades
// that drop what an earlier release uses"). A fresh database gets it at once.
func TestMigrateContractOnlyWhenAsked(t *testing.T) {
	dsn := testdb.MySQL(t)
	migrateOnly(t, dsn)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if n := len(testdb.LeaseIndexes(t, db)); n != 0 {
		t.Fatalf("fresh database: %d lease indexes, want none", n)
	}
	// As an earlier release left it, with this release's expanding migrations
	// applied: the lease indexes there, the contract not recorded.
	for _, q := range []string{
		`CREATE INDEX ix_refund_jobs_lease ON refund_jobs (state, lease_until, id)`,
		`CREATE INDEX ix_refund_jobs_provider_lease ON refund_jobs (state, provider, lease_until, id)`,
		`DELETE FROM jobfence_schema_migrations WHERE name LIKE '%.contract.sql'`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	logs := migrateOnly(t, dsn)
	if !strings.Contains(logs, "contract migrations pending") || !strings.Contains(logs, "0010_drop_lease_indexes.contract.sql") {
		t.Fatalf("a start on a database with a contract pending does not say so:\n%s", logs)
	}
	if n := len(testdb.LeaseIndexes(t, db)); n != 2 {
		t.Fatalf("after a start without --migrate-contract: %d lease indexes, want both kept", n)
	}
	logs = migrateOnly(t, dsn, "--migrate-contract")
	if n := len(testdb.LeaseIndexes(t, db)); n != 0 || strings.Contains(logs, "contract migrations pending") {
		t.Fatalf("after --migrate-contract: %d lease indexes, want none\n%s", n, logs)
	}
}
