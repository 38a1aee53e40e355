package sqlbase

import (
	"context"
	"fmt"

	"github.com/jobfence/jobfence/store"
)

// ApplyMigrations runs in tx, in version order, the migrations that are not
// in applied and not above upTo: each one's statements, then its row in
// jobfence_schema_migrations (insertVersion, taking version and name). A
// contract migration (store.Migration.Contract) runs only when contract is
// set; the names of those it leaves pending are returned. A statement's
// error goes through failed, which returns nil to go on (a statement an
// interrupted earlier run had applied) or the error to stop with. Each
// backend holds its own lock around it.
func ApplyMigrations(ctx context.Context, tx Tx, migrations []store.Migration, applied map[int]bool, upTo int,
	contract bool, insertVersion string, failed func(m store.Migration, err error) error) (pending []string, err error) {
	for _, m := range migrations {
		if applied[m.Version] || m.Version > upTo {
			continue
		}
		if m.Contract && !contract {
			pending = append(pending, m.Name)
			continue
		}
		for _, stmt := range m.Statements {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				if err := failed(m, err); err != nil {
					return pending, err
				}
			}
		}
		if _, err := tx.ExecContext(ctx, insertVersion, m.Version, m.Name); err != nil {
			return pending, fmt.Errorf("migrate %s: %w", m.Name, err)
		}
	}
	return pending, nil
}
