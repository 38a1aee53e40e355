// Package mysql is the production backend of jobfence: refund_jobs and its
// history, observation and ledger tables on MySQL 8.4 or MariaDB 10.11+.
//
// Every claim and write-back is one short transaction on one connection (R11);
// claims lock candidates with FOR UPDATE SKIP LOCKED (R13) and all lease
// arithmetic uses the server's UTC_TIMESTAMP (R12).
package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// Options tune the connection pool.
type Options struct {
	// MaxOpenConns bounds the pool; 32 when zero.
	MaxOpenConns int
}

// Store is the MySQL backend. It implements store.Store.
type Store struct {
	db *sql.DB
	// Backend provides Claim, Write, WriteMany and ConfigureBudgets around
	// this package's SQL.
	*sqlbase.Backend
}

var _ store.Store = (*Store)(nil)

// Open connects with dsn (go-sql-driver/mysql format), forces the options the
// fencing logic relies on, and applies pending migrations under a lock.
//
// Forced: parseTime and loc=UTC (timestamps are the database's UTC clock, R12),
// clientFoundRows (RowsAffected counts matched rows, so a fenced UPDATE reports
// 1 even when nothing changed), interpolateParams (a statement that is not
// prepared takes one round trip), the session time zone +00:00 and READ
// COMMITTED (no gap locks in claims). Statements with arguments run prepared
// on the server (preparedConnector).
// Defaulted: readTimeout and writeTimeout of defaultIOTimeout, which bound a
// statement of a transaction in flight (transactions check their context
// between statements, not during one: see sqlbase.Backend.Begin); a DSN
// that sets its own keeps it.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	return open(ctx, dsn, opts, allMigrations)
}

// open is Open with the migrations applied up to version upTo.
func open(ctx context.Context, dsn string, opts Options, upTo int) (*Store, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.ClientFoundRows = true
	cfg.InterpolateParams = true
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = defaultIOTimeout
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = defaultIOTimeout
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"

	isolationVar, err := isolationVariable(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cfg.Params[isolationVar] = "'READ-COMMITTED'"

	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(preparedConnector{Connector: conn, keep: keptPerConn})
	n := opts.MaxOpenConns
	if n <= 0 {
		n = 32
	}
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	db.SetConnMaxLifetime(5 * time.Minute)
	s := &Store{db: db, Backend: &sqlbase.Backend{
		DB:            db,
		Retryable:     isRetryable,
		CommitRefused: serverAnswered,
		Unavailable:   unavailable,
		Duplicate:     isDuplicate,
		Begin:         "START TRANSACTION",
		Claims:        claimSQL,
		LockedRead:    selectJobsLocked,
	}}
	if err := s.migrate(ctx, upTo); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// defaultIOTimeout bounds one read or write of a statement on a connection
// whose DSN sets none: longer than InnoDB's default lock wait (50 s) and the
// migration lock's wait, so that only a server that stopped answering hits it.
const defaultIOTimeout = 90 * time.Second

// isolationVariable names the session variable for the isolation level:
// MariaDB before 11.1 knows only tx_isolation, MySQL 8 only
// transaction_isolation.
func isolationVariable(ctx context.Context, cfg *mysql.Config) (string, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return "", err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	var version string
	if err := db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		return "", fmt.Errorf("%w: connect to mysql at %s: %v", store.ErrUnavailable, cfg.Addr, err)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return "tx_isolation", nil
	}
	return "transaction_isolation", nil
}

// DB returns the underlying pool, for the benchmark's direct-SQL baseline and
// for operators' read-only tooling.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the pool.
func (s *Store) Close() error { return s.db.Close() }

// isRetryable reports a deadlock or lock-wait timeout: MySQL rolled the whole
// transaction back (R20).
func isRetryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// serverAnswered reports an error the server sent: a COMMIT answered with one
// did not commit.
func serverAnswered(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me)
}

func isDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062
}

// unavailable marks errors of the connection (nothing reached the server, or
// the transaction died with it before COMMIT) and retries exhausted on
// deadlocks, so callers can retry: nothing was committed. Other errors pass
// through unchanged.
func unavailable(err error) error {
	var ne net.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err // the caller gave up; DeadlineExceeded also claims to be a net.Error
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, mysql.ErrInvalidConn),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.As(err, &ne), isRetryable(err):
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	default:
		return err
	}
}
