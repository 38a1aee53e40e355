package mysql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"math"

	"github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// allMigrations is the upTo of migrate that applies every file.
const allMigrations = math.MaxInt

const (
	migrateLockName    = "jobfence_migrate"
	migrateLockTimeout = 60 // seconds

	createMigrationsTable = `CREATE TABLE IF NOT EXISTS jobfence_schema_migrations (
  version    INT          NOT NULL,
  name       VARCHAR(255) NOT NULL,
  applied_at DATETIME(6)  NOT NULL,
  PRIMARY KEY (version)
) ENGINE=InnoDB`
	selectAppliedVersions = `SELECT version FROM jobfence_schema_migrations`
	insertAppliedVersion  = `INSERT INTO jobfence_schema_migrations (version, name, applied_at) VALUES (?, ?, UTC_TIMESTAMP(6))`
)

// migrate applies the embedded migrations that are not yet recorded, holding
// GET_LOCK on one connection so that replicas starting together apply each
// file once. MySQL commits DDL implicitly, so a start-up that died half-way
// through a file runs it again: its tables are created IF NOT EXISTS, and a
// column or index that is already there counts as added (alreadyApplied).
// contract applies the contract migrations too (Options.Contract).
func (s *Store) migrate(ctx context.Context, upTo int, contract bool) error {
	migrations, err := store.Migrations(migrationFiles, "migrations")
	if err != nil {
		return err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return unavailable(err)
	}
	defer conn.Close()

	var got int
	if err := conn.QueryRowContext(ctx, `SELECT COALESCE(GET_LOCK(?, ?), 0)`, migrateLockName, migrateLockTimeout).Scan(&got); err != nil {
		return unavailable(err)
	}
	if got != 1 {
		return fmt.Errorf("migrate: another process held %q for %ds", migrateLockName, migrateLockTimeout)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(?)`, migrateLockName) //nolint:errcheck

	applied, err := appliedVersions(ctx, conn)
	if err != nil {
		return err
	}
	// Contract migrations: on a fresh database (no release ran on it) with
	// the rest, else only when asked (store.Migration.Contract).
	s.pendingContract, err = sqlbase.ApplyMigrations(ctx, conn, migrations, applied, upTo, contract || len(applied) == 0,
		insertAppliedVersion,
		func(m store.Migration, err error) error {
			switch {
			case alreadyApplied(err), m.Contract && alreadyDropped(err):
				return nil
			case errors.Is(unavailable(err), store.ErrDatabaseAccessDenied):
				return fmt.Errorf("migrate %s: the database user may not change the schema (%v): apply the "+
					"migrations once with a user that may create and alter tables and indexes in this database "+
					"(coordinator --migrate-only), then start with this one", m.Name, err)
			default:
				return fmt.Errorf("migrate %s: %w", m.Name, err)
			}
		})
	return err
}

// PendingContract names the contract migrations left pending at Open
// (Options.Contract): once every coordinator on the database runs this
// release, apply them with one started with Contract.
func (s *Store) PendingContract() []string { return s.pendingContract }

// appliedVersions reads the versions already applied, creating the table
// that records them on a fresh database. A schema that is up to date thus
// needs no privilege beyond reading it: a least-privilege user (SELECT,
// INSERT, UPDATE, DELETE) can start the coordinator.
func appliedVersions(ctx context.Context, conn *sql.Conn) (map[int]bool, error) {
	versions, err := sqlbase.QueryAll(ctx, conn, func(row sqlbase.Scanner) (int, error) {
		var v int
		err := row.Scan(&v)
		return v, err
	}, selectAppliedVersions)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1146 { // ER_NO_SUCH_TABLE: a fresh database
		if _, err := conn.ExecContext(ctx, createMigrationsTable); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", unavailable(err))
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	return applied, nil
}

// alreadyApplied reports the errors of a statement that an interrupted
// earlier run of its migration had already applied: a duplicate column
// (1060) or index name (1061).
func alreadyApplied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1060 || me.Number == 1061)
}

// alreadyDropped reports ER_CANT_DROP_FIELD_OR_KEY: what a contract
// migration drops is gone already, by an interrupted earlier run.
func alreadyDropped(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1091
}
