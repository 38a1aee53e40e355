package sqlbase

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jobfence/jobfence/store"
)

// The reads of one job and the filing of a receipt, the same SQL in every
// backend but for the clock (Dialect.NowExpr).
const (
	selectJobByID  = `SELECT ` + JobColumns + ` FROM refund_jobs WHERE id = ?`
	selectJobByKey = `SELECT ` + JobColumns + ` FROM refund_jobs WHERE operation_key = ?`
	selectEvents   = `SELECT ` + EventColumns + ` FROM refund_job_events WHERE job_id = ? ORDER BY id`
	selectLedger   = `SELECT provider_refund_id, amount_minor, currency, attempt, recorded_at
  FROM refund_ledger WHERE job_id = ?`

	// %s: the database's now.
	insertObservation = `INSERT INTO refund_observations
  (job_id, operation_key, reported_attempt, job_attempt, source, outcome,
   provider_refund_id, provider_event_id, detail, dedupe_key, created_at, attempt_verified)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, %s, ?)`
	selectObservationByID = `SELECT ` + ObservationColumns + ` FROM refund_observations WHERE id = ?`
)

// JobByRef reads one job by id or, when the id is zero, by operation key.
// Errors: store.ErrNotFound, or the driver's error as it is.
func JobByRef(ctx context.Context, tx Tx, ref store.JobRef) (store.Job, error) {
	var row *sql.Row
	if ref.ID != 0 {
		row = tx.QueryRowContext(ctx, selectJobByID, ref.ID)
	} else {
		row = tx.QueryRowContext(ctx, selectJobByKey, ref.OperationKey)
	}
	job, err := ScanJob(row)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Job{}, store.ErrNotFound
	}
	return job, err
}

// Get implements store.Store: the database's clock, the job, its history, a
// page of its receipts and its ledger row, read in one read-only
// transaction, so that they show one moment.
func (b *Backend) Get(ctx context.Context, p store.GetParams) (store.JobDetail, error) {
	if err := p.Validate(); err != nil {
		return store.JobDetail{}, err
	}
	tx, err := b.DB.BeginTx(ctx, b.ReadTx)
	if err != nil {
		return store.JobDetail{}, b.Unavailable(err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	var d store.JobDetail
	if err := tx.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&d.Now}); err != nil {
		return store.JobDetail{}, b.Unavailable(err)
	}
	if d.Job, err = JobByRef(ctx, tx, p.JobRef); err != nil {
		return store.JobDetail{}, b.Unavailable(err)
	}
	if d.Events, err = QueryAll(ctx, tx, ScanEvent, selectEvents, d.Job.ID); err != nil {
		return store.JobDetail{}, b.Unavailable(err)
	}
	d.Observations, d.ObservationCount, d.NextObservationsToken, err = ObservationPage(ctx, tx, d.Job.ID, p)
	if err != nil {
		return store.JobDetail{}, b.Unavailable(err)
	}
	if d.Ledger, err = ledgerEntry(ctx, tx, d.Job.ID); err != nil {
		return store.JobDetail{}, b.Unavailable(err)
	}
	return d, nil
}

// ledgerEntry reads job jobID's ledger row (R10); nil when it has none.
func ledgerEntry(ctx context.Context, tx Tx, jobID int64) (*store.LedgerEntry, error) {
	var e store.LedgerEntry
	err := tx.QueryRowContext(ctx, selectLedger, jobID).Scan(&e.ProviderRefundID, &e.AmountMinor, &e.Currency,
		&e.Attempt, Time{&e.RecordedAt})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &e, nil
}

// Observe implements store.Store. It reads the job only to name it; the job
// row is never written (R15). The read and the insert share one transaction,
// so job_attempt is the attempt the job had when the receipt was filed.
func (b *Backend) Observe(ctx context.Context, p store.ObservationParams) (store.Observation, bool, error) {
	if err := p.Validate(); err != nil {
		return store.Observation{}, false, err
	}
	var obs store.Observation
	var duplicate bool
	err := b.InTx(ctx, func(tx Tx) error {
		var err error
		obs, duplicate, err = b.observeTx(ctx, tx, p)
		return err
	})
	switch {
	case err == nil:
		return obs, duplicate, nil
	case IsCommitUnknown(err):
		// Observing again is safe: the receipt is deduplicated.
		return store.Observation{}, false, fmt.Errorf("%w: observe job %+v: %v", store.ErrWriteOutcomeUnknown, p.Job, err)
	default:
		return store.Observation{}, false, b.Unavailable(err)
	}
}

// observeTx files p in tx: a repeat answers the receipt on file
// (duplicate), a job with store.MaxObservationsPerJob on file refuses a new
// one, and the receipt is marked verified when it carries the grant of the
// attempt it names (R25).
func (b *Backend) observeTx(ctx context.Context, tx Tx, p store.ObservationParams) (store.Observation, bool, error) {
	job, err := JobByRef(ctx, tx, p.Job)
	if err != nil {
		return store.Observation{}, false, err
	}
	key := p.DedupeKey(job.ID)
	if obs, full, err := ObservationFull(ctx, tx, job.ID, key); full || err != nil {
		return obs, err == nil, err
	}
	verified, err := HeldGrant(ctx, tx, job.ID, p.Attempt, p.LeaseToken)
	if err != nil {
		return store.Observation{}, false, err
	}
	res, err := tx.ExecContext(ctx, fmt.Sprintf(insertObservation, b.SQL.NowExpr), job.ID, job.OperationKey,
		p.Attempt, job.Attempt, p.Source, p.Outcome, p.ProviderRefundID, p.ProviderEventID, p.Detail, key, verified)
	if b.Duplicate(err) {
		// The same receipt is on file. A failed statement undoes only
		// itself; the transaction goes on, writing nothing.
		obs, err := ObservationByDedupe(ctx, tx, key)
		return obs, true, err
	}
	if err != nil {
		return store.Observation{}, false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return store.Observation{}, false, err
	}
	obs, err := ScanObservation(tx.QueryRowContext(ctx, selectObservationByID, id))
	return obs, false, err
}

// ExpireLease ends a running job's lease now, by the database clock: a
// seam for tests (storetest.LeaseExpirer), never called by the coordinator.
// It only opens the job to takeover (R8): the holder may still write until
// someone commits a takeover. Errors: store.ErrNotFound, store.ErrNotRunning.
func (b *Backend) ExpireLease(ctx context.Context, jobID int64) error {
	var n int64
	err := b.InTx(ctx, func(tx Tx) error {
		res, err := tx.ExecContext(ctx, b.SQL.ExpireLease, jobID)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	if err != nil {
		return b.Unavailable(err)
	}
	if n == 1 {
		return nil
	}
	if _, err := JobByRef(ctx, b.DB, store.JobRef{ID: jobID}); err != nil {
		return b.Unavailable(err)
	}
	return fmt.Errorf("%w: job %d", store.ErrNotRunning, jobID)
}
