package sqlite

import (
	"context"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// List implements store.Store.
func (s *Store) List(ctx context.Context, p store.ListParams) (store.JobPage, error) {
	page, err := sqlbase.List(ctx, s.db, p, toMicros, scanJob)
	return page, unavailable(err)
}
