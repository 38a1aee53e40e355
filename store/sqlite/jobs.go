package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	// next_attempt_at is always set (DESIGN.md, Columns): the caller's
	// not_before, else the database's now.
	selectJobByID   = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id = ?`
	selectJobByKey  = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE operation_key = ?`
	selectJobsByIDs = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id IN (%s)`
	selectEvents    = `SELECT ` + eventColumns + ` FROM refund_job_events WHERE job_id = ? ORDER BY id`
)

// Get implements store.Store. The job, its history and its observations are
// read in one transaction, so they show one moment.
func (s *Store) Get(ctx context.Context, p store.GetParams) (store.JobDetail, error) {
	if err := p.Validate(); err != nil {
		return store.JobDetail{}, err
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true}) // a deferred BEGIN: takes no write lock
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	job, err := jobByRef(ctx, tx, p.JobRef)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	d := store.JobDetail{Job: job}
	d.Events, err = sqlbase.QueryAll(ctx, tx, scanEvent, selectEvents, job.ID)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	d.Observations, d.ObservationCount, d.NextObservationsToken, err = sqlbase.ObservationPage(ctx, tx,
		scanObservation, job.ID, p)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	return d, nil
}

// jobByRef reads one job outside any transaction. Errors: ErrNotFound,
// ErrUnavailable.
func (s *Store) jobByRef(ctx context.Context, ref store.JobRef) (store.Job, error) {
	job, err := jobByRef(ctx, s.db, ref)
	return job, unavailable(err)
}

type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// jobByRef reads one job by id or, when the id is zero, by operation key.
// Errors: ErrNotFound, or the driver's error as is (InTx retries on it).
func jobByRef(ctx context.Context, q rowQuerier, ref store.JobRef) (store.Job, error) {
	var row *sql.Row
	if ref.ID != 0 {
		row = q.QueryRowContext(ctx, selectJobByID, ref.ID)
	} else {
		row = q.QueryRowContext(ctx, selectJobByKey, ref.OperationKey)
	}
	job, err := scanJob(row)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, store.ErrNotFound
	}
	return job, err
}
