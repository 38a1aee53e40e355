package sqlite

import (
	"context"
	"fmt"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	insertObservation = `INSERT INTO refund_observations
  (job_id, operation_key, reported_attempt, job_attempt, source, outcome,
   provider_refund_id, provider_event_id, detail, dedupe_key, created_at, attempt_verified)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ` + nowMicros + `, ?)
RETURNING ` + observationColumns
)

// Observe implements store.Store. It reads the job only to name it; the job
// row is never written (R15). The read and the insert share one transaction,
// so job_attempt is the attempt the job had when the receipt was filed.
func (s *Store) Observe(ctx context.Context, p store.ObservationParams) (store.Observation, bool, error) {
	if err := p.Validate(); err != nil {
		return store.Observation{}, false, err
	}
	var obs store.Observation
	var duplicate bool
	err := s.InTx(ctx, func(tx sqlbase.Tx) error {
		obs, duplicate = store.Observation{}, false
		job, err := jobByRef(ctx, tx, p.Job)
		if err != nil {
			return err
		}
		key := p.DedupeKey(job.ID)
		var full bool
		if obs, full, err = sqlbase.ObservationFull(ctx, tx, scanObservation, job.ID, key); full || err != nil {
			duplicate = err == nil
			return err
		}
		verified, err := sqlbase.HeldGrant(ctx, tx, job.ID, p.Attempt, p.LeaseToken)
		if err != nil {
			return err
		}
		obs, err = scanObservation(tx.QueryRowContext(ctx, insertObservation, job.ID, job.OperationKey, p.Attempt,
			job.Attempt, p.Source, p.Outcome, p.ProviderRefundID, p.ProviderEventID, p.Detail, key, verified))
		if isUnique(err) {
			// The same receipt is on file. A failed statement undoes only
			// itself; the transaction goes on, writing nothing.
			duplicate = true
			obs, err = sqlbase.ObservationByDedupe(ctx, tx, scanObservation, key)
		}
		return err
	})
	switch {
	case err == nil:
		return obs, duplicate, nil
	case sqlbase.IsCommitUnknown(err):
		// Observing again is safe: the receipt is deduplicated.
		return store.Observation{}, false, fmt.Errorf("%w: observe job %+v: %v", store.ErrWriteOutcomeUnknown, p.Job, err)
	default:
		return store.Observation{}, false, unavailable(err)
	}
}
