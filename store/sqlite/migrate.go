package sqlite

import (
	"context"
	"embed"
	"fmt"
	"math"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// allMigrations is the upTo of migrate that applies every file.
const allMigrations = math.MaxInt

const (
	createMigrationsTable = `CREATE TABLE IF NOT EXISTS jobfence_schema_migrations (
  version    INTEGER NOT NULL PRIMARY KEY,
  name       TEXT    NOT NULL,
  applied_at INTEGER NOT NULL
) STRICT`
	selectAppliedVersions = `SELECT version FROM jobfence_schema_migrations`
	insertAppliedVersion  = `INSERT INTO jobfence_schema_migrations (version, name, applied_at)
VALUES (?, ?, ` + nowExpr + `)`
)

// migrate applies the embedded migrations that are not yet recorded in one
// BEGIN IMMEDIATE transaction: processes opening the same file together wait
// for each other's write lock, so each file is applied once. SQLite's DDL is
// transactional, so a start-up that dies half-way leaves no half-built schema.
func (s *Store) migrate(ctx context.Context, upTo int) error {
	migrations, err := store.Migrations(migrationFiles, "migrations")
	if err != nil {
		return err
	}
	err = s.InTx(ctx, func(tx sqlbase.Tx) error {
		if _, err := tx.ExecContext(ctx, createMigrationsTable); err != nil {
			return err
		}
		versions, err := sqlbase.QueryAll(ctx, tx, scanID, selectAppliedVersions)
		if err != nil {
			return err
		}
		applied := make(map[int]bool, len(versions))
		for _, v := range versions {
			applied[int(v)] = true
		}
		// Contract migrations at once: one process has the file (the lock
		// file), so no earlier release runs beside this one.
		_, err = sqlbase.ApplyMigrations(ctx, tx, migrations, applied, upTo, true, insertAppliedVersion,
			func(m store.Migration, err error) error { return fmt.Errorf("%s: %w", m.Name, err) })
		return err
	})
	if err != nil {
		return fmt.Errorf("migrate: %w", unavailable(err))
	}
	return nil
}
