package mysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	selectJobByID  = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE id = ?`
	selectJobByKey = `SELECT ` + jobColumns + ` FROM refund_jobs WHERE operation_key = ?`
	selectEvents   = `SELECT ` + eventColumns + ` FROM refund_job_events WHERE job_id = ? ORDER BY id`
)

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, p store.GetParams) (store.JobDetail, error) {
	if err := p.Validate(); err != nil {
		return store.JobDetail{}, err
	}
	job, err := s.jobByRef(ctx, p.JobRef)
	if err != nil {
		return store.JobDetail{}, err
	}
	d := store.JobDetail{Job: job}
	d.Events, err = sqlbase.QueryAll(ctx, s.db, scanEvent, selectEvents, job.ID)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	d.Observations, d.ObservationCount, d.NextObservationsToken, err = sqlbase.ObservationPage(ctx, s.db,
		scanObservation, job.ID, p)
	if err != nil {
		return store.JobDetail{}, unavailable(err)
	}
	return d, nil
}

// jobByRef reads one job without locking it.
func (s *Store) jobByRef(ctx context.Context, ref store.JobRef) (store.Job, error) {
	var row *sql.Row
	if ref.ID != 0 {
		row = s.db.QueryRowContext(ctx, selectJobByID, ref.ID)
	} else {
		row = s.db.QueryRowContext(ctx, selectJobByKey, ref.OperationKey)
	}
	job, err := scanJob(row)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, store.ErrNotFound
	}
	return job, unavailable(err)
}
