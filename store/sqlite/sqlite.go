// Package sqlite is the embedded backend of jobfence: the same tables and the
// same fencing semantics as store/mysql, in one SQLite file, with the pure-Go
// driver modernc.org/sqlite (no cgo).
//
// Every transaction is BEGIN IMMEDIATE, so it holds SQLite's single write lock
// from its first statement: claims and write-backs serialise on it the way the
// MySQL backend's row locks serialise one job's hand-over (R5, R13), and a
// claim's read of candidates can never be overtaken by another writer. All
// lease arithmetic uses SQLite's own clock (R12); times are stored as INTEGER
// microseconds since the Unix epoch, UTC.
package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// Options tune the embedded store.
type Options struct {
	// BusyTimeout is how long a transaction waits for the write lock held by
	// another process using the same file before it fails and is retried whole
	// (R20); 5 s when zero.
	BusyTimeout time.Duration
}

// Store is the SQLite backend. It implements store.Store.
type Store struct {
	db   *sql.DB
	lock *processLock // this process's claim on the file
	// Backend implements every store.Store method but Close (and DB), with
	// this package's SQL and reading of errors (the Dialect fields).
	*sqlbase.Backend
}

var _ store.Store = (*Store)(nil)

// nowExpr is the database's clock (R12) as INTEGER microseconds since the
// Unix epoch, UTC. SQLite's 'now' has millisecond resolution and is the same
// for every use within one statement, so the columns a statement stamps agree
// exactly.
const nowExpr = `(CAST(ROUND(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000)`

// Open opens (creating if absent) the database file at path, a file name
// rather than a URI, and its parent directory, forces the settings the fencing logic relies on, and applies
// pending migrations.
//
// Forced: WAL (readers never block the writer), synchronous=FULL (a committed
// claim survives a power cut, so an attempt is never handed out twice, R2),
// busy_timeout, and BEGIN IMMEDIATE for every transaction: a claim takes the
// write lock before it reads its candidates, so no other writer can slip in
// between the read and the bump. One connection: SQLite has one writer anyway,
// and it keeps every transaction on one connection (R10, R11).
//
// Only one process may have the file open as a store: Open takes an
// exclusive lock on path+".lock" until Close, and refuses a file another
// coordinator holds.
//
// Errors: ErrUnavailable when the file cannot be opened or its write lock
// stays busy; an error naming the other process when one holds the file.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	return open(ctx, path, opts, allMigrations, true)
}

// open is Open with the migrations applied up to version upTo, and the
// process lock taken when exclusive.
func open(ctx context.Context, path string, opts Options, upTo int, exclusive bool) (*Store, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, fmt.Errorf("sqlite: path must name a database file, got %q", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o750); err != nil {
		return nil, fmt.Errorf("%w: sqlite: create directory: %v", store.ErrUnavailable, err)
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = 5 * time.Second
	}
	lock := &processLock{}
	if exclusive {
		if lock, err = lockFile(abs); err != nil {
			return nil, err
		}
	}

	db, err := sql.Open("sqlite", dsn(abs, busy))
	if err != nil {
		lock.release()
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	s := &Store{db: db, lock: lock, Backend: &sqlbase.Backend{
		DB:         db,
		Dialect:    dialect{},
		SQL:        statements,
		Retention:  retention,
		LockedRead: lockedRead,
		System:     "sqlite",
		// A deferred BEGIN: a read takes no write lock, and WAL gives it one
		// moment.
		ReadTx: &sql.TxOptions{ReadOnly: true},
	}}

	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		s.Close()
		return nil, fmt.Errorf("%w: open %s: %v", store.ErrUnavailable, abs, err)
	}
	if !strings.EqualFold(mode, "wal") {
		s.Close()
		return nil, fmt.Errorf("sqlite: %s: journal_mode is %q, want wal (is the file on a local file system?)", abs, mode)
	}
	if err := s.migrate(ctx, upTo); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// dsn builds the modernc.org/sqlite data source name: a file: URI (so that any
// path survives, escaped) with the driver's pragma and transaction parameters.
// The driver runs busy_timeout before the other pragmas.
func dsn(absPath string, busy time.Duration) string {
	p := filepath.ToSlash(absPath)
	if !strings.HasPrefix(p, "/") {
		p = "/" + p // a Windows drive letter
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Set("_txlock", "immediate")
	return (&url.URL{Scheme: "file", Path: p, RawQuery: q.Encode()}).String()
}

// DB returns the underlying handle, for the benchmark's direct-SQL baseline and
// for operators' read-only tooling. It has one connection: holding a
// transaction or an open *sql.Rows on it blocks the store.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the database and lets another process open it. Jobs,
// attempts and history stay in the file.
func (s *Store) Close() error {
	err := s.db.Close()
	if lerr := s.lock.release(); err == nil {
		err = lerr
	}
	return err
}

// sqliteCode returns the extended result code of a driver error, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

// dialect is modernc.org/sqlite's errors and INTEGER-microsecond time
// columns.
type dialect struct{}

func (dialect) Retryable(err error) bool { return isRetryable(err) }

// CommitRefused: SQLite refused the COMMIT for a lock and the driver rolled
// the transaction back: nothing happened.
func (dialect) CommitRefused(err error) bool { return isRetryable(err) }
func (dialect) Unavailable(err error) error  { return unavailable(err) }
func (dialect) Duplicate(err error) bool     { return isUnique(err) }
func (dialect) At(t time.Time) any           { return toMicros(t) }

// isRetryable reports SQLITE_BUSY and SQLITE_LOCKED (any extended code): the
// statement or COMMIT did not take effect and the transaction holds nothing.
func isRetryable(err error) bool {
	switch sqliteCode(err) & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}

// isUnique reports a UNIQUE or PRIMARY KEY constraint violation, by its
// extended code (a WITHOUT ROWID table's key is its PRIMARY KEY).
func isUnique(err error) bool {
	c := sqliteCode(err)
	return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

// unavailable marks errors of the database file (it cannot be opened, read or
// written, the disk is full, it is read-only, or the write lock stayed busy
// through every retry) and of a lost connection, so callers can retry:
// nothing was committed. Other errors, context
// errors among them, pass through unchanged.
func unavailable(err error) error {
	if err == nil {
		return nil
	}
	switch sqliteCode(err) & 0xff {
	case sqlite3.SQLITE_FULL:
		return fmt.Errorf("%w: %w: %v", store.ErrUnavailable, store.ErrDatabaseFull, err)
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH:
		return fmt.Errorf("%w: %w: %v", store.ErrUnavailable, store.ErrDatabaseAccessDenied, err)
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR,
		sqlite3.SQLITE_PROTOCOL:
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	return err
}
