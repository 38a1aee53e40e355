package mysql

import (
	"context"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	insertObservation = `INSERT INTO refund_observations
  (job_id, operation_key, reported_attempt, job_attempt, source, outcome,
   provider_refund_id, provider_event_id, detail, dedupe_key, created_at, attempt_verified)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), ?)`

	selectObservationByID = `SELECT ` + observationColumns + ` FROM refund_observations WHERE id = ?`
)

// Observe implements store.Store. It reads the job only to name it; the job
// row is never written (R15).
func (s *Store) Observe(ctx context.Context, p store.ObservationParams) (store.Observation, bool, error) {
	if err := p.Validate(); err != nil {
		return store.Observation{}, false, err
	}
	job, err := s.jobByRef(ctx, p.Job)
	if err != nil {
		return store.Observation{}, false, err
	}
	key := p.DedupeKey(job.ID)
	if obs, full, err := sqlbase.ObservationFull(ctx, s.db, scanObservation, job.ID, key); full || err != nil {
		return obs, err == nil, unavailable(err)
	}
	verified, err := sqlbase.HeldGrant(ctx, s.db, job.ID, p.Attempt, p.LeaseToken)
	if err != nil {
		return store.Observation{}, false, unavailable(err)
	}
	res, err := s.db.ExecContext(ctx, insertObservation, job.ID, job.OperationKey, p.Attempt, job.Attempt,
		p.Source, p.Outcome, p.ProviderRefundID, p.ProviderEventID, p.Detail, key, verified)
	if isDuplicate(err) {
		obs, err := sqlbase.ObservationByDedupe(ctx, s.db, scanObservation, key)
		return obs, true, unavailable(err)
	}
	if err != nil {
		return store.Observation{}, false, unavailable(err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return store.Observation{}, false, unavailable(err)
	}
	obs, err := scanObservation(s.db.QueryRowContext(ctx, selectObservationByID, id))
	return obs, false, unavailable(err)
}
