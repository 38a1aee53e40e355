// Package testdb gives each test its own empty database on a real server.
//
// MySQL is mandatory: the tests fail, never skip, when the server at
// JOBFENCE_TEST_MYSQL_DSN cannot be reached. Without that variable they use
// MariaDB at 127.0.0.1:3306 (root, no password) when it answers, and
// otherwise a private MariaDB that the test process starts from the
// installed package (mariadbd, mariadb-install-db) on a free port and that
// dies with it; only where neither is there do they fail. .ci/run starts
// MariaDB before the tests.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/internal/mariadbpair"
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
		base = defaultServer(t)
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

// fallback is the server of this test process when JOBFENCE_TEST_MYSQL_DSN
// is unset: DefaultMySQLDSN if it answers, else a private one.
var fallback struct {
	once sync.Once
	dsn  string
	err  error
}

// defaultServer returns the DSN of the fallback server, starting a private
// MariaDB the first time when nothing answers at DefaultMySQLDSN.
func defaultServer(t testing.TB) string {
	t.Helper()
	fallback.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if db, err := sql.Open("mysql", DefaultMySQLDSN+"?timeout=2s"); err == nil {
			pinged := db.PingContext(ctx)
			db.Close()
			if pinged == nil {
				fallback.dsn = DefaultMySQLDSN
				return
			}
		}
		one, _, err := startPrivate(ctx)
		if err != nil {
			fallback.err = err
			return
		}
		fallback.dsn = one.DSN("")
		fmt.Fprintf(os.Stderr, "testdb: nothing answers at 127.0.0.1:3306; this test process runs a private "+
			"MariaDB (%s)\n", fallback.dsn)
	})
	if fallback.err != nil {
		t.Fatalf("MySQL is required for these tests: %v\nstart MariaDB/MySQL, or set JOBFENCE_TEST_MYSQL_DSN", fallback.err)
	}
	return fallback.dsn
}

// startPrivate starts a private MariaDB in a temp folder named after this
// process, first removing the folders of earlier processes that have exited
// (their servers died with them; nothing else removes those folders).
func startPrivate(ctx context.Context) (one *mariadbpair.Single, dir string, err error) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), privatePrefix+"*"))
	for _, dir := range dirs {
		pid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(dir), privatePrefix), "-")
		if n, err := strconv.Atoi(pid); err == nil && n != os.Getpid() && syscall.Kill(n, 0) != nil {
			os.RemoveAll(dir)
		}
	}
	if dir, err = os.MkdirTemp("", privatePrefix+strconv.Itoa(os.Getpid())+"-"); err != nil {
		return nil, "", err
	}
	if one, err = mariadbpair.StartSingle(ctx, mariadbpair.Options{Dir: dir}); err != nil {
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("nothing answers at 127.0.0.1:3306 and a private MariaDB would not start: %w", err)
	}
	return one, dir, nil
}

// privatePrefix names the folders of private servers in the temp dir.
const privatePrefix = "jobfence-testdb-"
