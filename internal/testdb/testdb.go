// Package testdb gives each test its own empty database on a real server.
//
// MySQL is mandatory: the tests fail, never skip, when the server at
// JOBFENCE_TEST_MYSQL_DSN (default root@tcp(127.0.0.1:3306)/) cannot be
// reached. .ci/run starts MariaDB before the tests.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultMySQLDSN is the server the tests use unless JOBFENCE_TEST_MYSQL_DSN
// names another. The database part is ignored: each test gets its own.
const DefaultMySQLDSN = "root@tcp(127.0.0.1:3306)/"

// MySQL creates a fresh database for t and returns its DSN. The database is
// dropped when t ends.
func MySQL(t testing.TB) string {
	t.Helper()
	base := os.Getenv("JOBFENCE_TEST_MYSQL_DSN")
	if base == "" {
		base = DefaultMySQLDSN
	}
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatalf("JOBFENCE_TEST_MYSQL_DSN: %v", err)
	}
	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("mysql: %v", err)
	}
	t.Cleanup(func() { admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		t.Fatalf("MySQL is required for these tests and is not reachable at %s: %v\n"+
			"start MariaDB/MySQL or set JOBFENCE_TEST_MYSQL_DSN", cfg.Addr, err)
	}
	name := "jftest_" + randomSuffix(t)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// SQLitePath returns a database file path in a directory removed when t ends.
func SQLitePath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "jobfence.db")
}

func randomSuffix(t testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
