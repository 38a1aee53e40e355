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
	// Contract applies the contract migrations too (store.Migration.Contract):
	// those that remove what an earlier release still uses. Set it once every
	// coordinator on the database runs this release; a fresh database gets
	// them without it.
	Contract bool
}

// Store is the MySQL backend. It implements store.Store.
type Store struct {
	db *sql.DB
	// pendingContract are the contract migrations Open left pending.
	pendingContract []string
	// Backend implements every store.Store method but Close (and DB), with
	// this package's SQL and reading of errors (the Dialect fields).
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
	switch {
	case err != nil:
		return nil, fmt.Errorf("mysql dsn: %v; the format is user:password@tcp(host:3306)/database "+
			"(go-sql-driver/mysql), not a URL", err)
	case cfg.Net != "tcp" && cfg.Net != "unix":
		return nil, fmt.Errorf("mysql dsn: %q is not a network (tcp or unix): the format is "+
			"user:password@tcp(host:3306)/database (go-sql-driver/mysql), not a URL", cfg.Net)
	case cfg.DBName == "":
		return nil, errors.New("mysql dsn names no database: end it with /database, e.g. " +
			"user:password@tcp(host:3306)/jobfence, after CREATE DATABASE jobfence (the coordinator creates its tables)")
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
		DB:         db,
		Dialect:    dialect{},
		SQL:        statements,
		Retention:  retention,
		Begin:      "START TRANSACTION",
		LockedRead: lockedRead,
		System:     "mysql",
		// One moment for Get: the session's READ COMMITTED would let each
		// statement see a later one.
		ReadTx: &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true},
	}}
	if err := s.migrate(ctx, upTo, opts.Contract); err != nil {
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
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == erUnknownDatabase {
			// The coordinator makes its tables, never its database: the
			// database is where an operator grants its user rights.
			return "", fmt.Errorf("mysql at %s has no database %s: create it first (CREATE DATABASE %s; the "+
				"coordinator creates its tables in it), or name an existing database in the DSN (%v)",
				cfg.Addr, cfg.DBName, quoteName(cfg.DBName), err)
		}
		return "", fmt.Errorf("%w: connect to mysql at %s: %v", store.ErrUnavailable, cfg.Addr, err)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return "tx_isolation", nil
	}
	return "transaction_isolation", nil
}

// erUnknownDatabase is the server's error for a connection naming a
// database it does not have (ER_BAD_DB_ERROR).
const erUnknownDatabase = 1049

// quoteName is name as an identifier in a statement to copy: bare when it
// needs no quoting, else in backquotes.
func quoteName(name string) string {
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '$') {
			return "`" + strings.ReplaceAll(name, "`", "``") + "`"
		}
	}
	return name
}

// DB returns the underlying pool, for the benchmark's direct-SQL baseline and
// for operators' read-only tooling.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the pool.
func (s *Store) Close() error { return s.db.Close() }

// dialect is MySQL's and MariaDB's reading of go-sql-driver's errors, and
// DATETIME(6) time columns.
type dialect struct{}

func (dialect) Retryable(err error) bool { return isRetryable(err) }

// CommitRefused: a COMMIT the server answered with an error did not commit.
func (dialect) CommitRefused(err error) bool { return serverAnswered(err) }
func (dialect) Unavailable(err error) error  { return unavailable(err) }
func (dialect) Duplicate(err error) bool     { return isDuplicate(err) }
func (dialect) At(t time.Time) any           { return t }

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

// unavailable classifies the errors a call cannot act on (R20): the
// connection's (nothing reached the server, or the transaction died with it
// before COMMIT), the server's refusals for now, a full database and a
// missing privilege all mean nothing was changed and a repeat later is safe,
// so they become store.ErrUnavailable (with ErrDatabaseFull or
// ErrDatabaseAccessDenied where an operator must act). Context errors and
// anything else pass through unchanged.
func unavailable(err error) error {
	var ne net.Error
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err // the caller gave up; DeadlineExceeded also claims to be a net.Error
	case errors.As(err, &me) && fullErrors[me.Number]:
		return fmt.Errorf("%w: %w: %v", store.ErrUnavailable, store.ErrDatabaseFull, err)
	case errors.As(err, &me) && deniedErrors[me.Number]:
		return fmt.Errorf("%w: %w: %v", store.ErrUnavailable, store.ErrDatabaseAccessDenied, err)
	case errors.As(err, &me) && transientErrors[me.Number], isRetryable(err),
		errors.Is(err, driver.ErrBadConn), errors.Is(err, mysql.ErrInvalidConn),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.As(err, &ne):
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	default:
		return err
	}
}

// The server errors after which nothing was changed and the server itself
// will take the same statement later, or once an operator has acted. The
// numbers are MySQL's and MariaDB's (mysqld_error.h); 1205 and 1213, the
// retryable ones, come through isRetryable.
var (
	transientErrors = map[uint16]bool{
		1040: true, // ER_CON_COUNT_ERROR: too many connections
		1047: true, // ER_UNKNOWN_COM_ERROR: Galera "WSREP has not yet prepared node"
		1053: true, // ER_SERVER_SHUTDOWN
		1152: true, // ER_ABORTING_CONNECTION
		1180: true, // ER_ERROR_DURING_COMMIT: answered, so not committed
		1203: true, // ER_TOO_MANY_USER_CONNECTIONS
		1226: true, // ER_USER_LIMIT_REACHED
		1290: true, // ER_OPTION_PREVENTS_STATEMENT: --read-only, a demoted primary
		1317: true, // ER_QUERY_INTERRUPTED
		1637: true, // ER_TOO_MANY_CONCURRENT_TRXS
		1792: true, // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
		1836: true, // ER_READ_ONLY_MODE
		1927: true, // ER_CONNECTION_KILLED (MariaDB)
		1969: true, // ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
		3024: true, // ER_QUERY_TIMEOUT (MySQL max_execution_time)
		4031: true, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL)
	}
	fullErrors = map[uint16]bool{
		1021: true, // ER_DISK_FULL
		1037: true, // ER_OUTOFMEMORY
		1038: true, // ER_OUT_OF_SORTMEMORY
		1041: true, // ER_OUT_OF_RESOURCES
		1114: true, // ER_RECORD_FILE_FULL: the table is full
		1135: true, // ER_CANT_CREATE_THREAD
	}
	deniedErrors = map[uint16]bool{
		1044: true, // ER_DBACCESS_DENIED_ERROR
		1045: true, // ER_ACCESS_DENIED_ERROR
		1142: true, // ER_TABLEACCESS_DENIED_ERROR
		1143: true, // ER_COLUMNACCESS_DENIED_ERROR
		1227: true, // ER_SPECIFIC_ACCESS_DENIED_ERROR
		1370: true, // ER_PROCACCESS_DENIED_ERROR
		1698: true, // ER_ACCESS_DENIED_NO_PASSWORD_ERROR
		1820: true, // ER_MUST_CHANGE_PASSWORD
		3118: true, // ER_ACCOUNT_HAS_BEEN_LOCKED (MySQL)
		4151: true, // ER_ACCOUNT_HAS_BEEN_LOCKED (MariaDB)
	}
)
