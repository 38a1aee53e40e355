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
   provider_refund_id, provider_event_id, detail, dedupe_key, created_at, attempt_verified, reporter)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, %s, ?, ?)`
	selectObservationByID = `SELECT ` + ObservationColumns + ` FROM refund_observations WHERE id = ?`

	// expediteJob makes a ready job due now, to reconcile (R28), and
	// matches no row when that would change nothing: a job already due to
	// reconcile, or one that is not ready. It moves only a job that may
	// already have been sent (first_sent_at, R22): one never sent waits for
	// its own time, the producer's not_before among them, so that no receipt
	// makes a refund be sent earlier than without it. It never touches
	// state, attempt, lease or grant. A job that was due earlier is due from now on too:
	// that is what keeps a claim with an earlier cutoff from taking it (see
	// expedite). The equality on id keeps it on the primary key in every
	// backend, so it locks that one row and no index range. %[1]s: the
	// database's now (R12), one value for the whole statement.
	expediteJob = `UPDATE refund_jobs SET next_attempt_at = %[1]s, next_action = 'reconcile', updated_at = %[1]s
 WHERE id = ? AND state = 'ready' AND first_sent_at IS NOT NULL
   AND (next_attempt_at > %[1]s OR next_action <> 'reconcile')`

	// markEvidence records on an unfinished job when a receipt of success
	// or failure was filed (store.Job.EvidenceAt, R28). It never touches
	// state, attempt, lease, grant or updated_at: a running row's
	// updated_at stays its grant's time.
	markEvidence = `UPDATE refund_jobs SET evidence_at = ? WHERE id = ? AND state <> 'succeeded'`
)

// JobByRef reads one job by id or, when the id is zero, by operation key:
// from the working tables, else from the archive (ArchivedJob, R31).
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
		return ArchivedJob(ctx, tx, ref)
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
	events := selectEvents
	if !d.Job.ArchivedAt.IsZero() {
		events = archived(events, "refund_job_events") // R31: it left with its job
	}
	if d.Events, err = QueryAll(ctx, tx, ScanEvent, events, d.Job.ID); err != nil {
		return store.JobDetail{}, b.Unavailable(err)
	}
	d.Observations, d.ObservationCount, d.NextObservationsToken, err = ObservationPage(ctx, tx, d.Job, p)
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

// Observe implements store.Store. It reads the job to name it; the insert,
// and the expedite a new receipt of success or failure makes (R28), share
// one transaction with that read.
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

// observeTx files p in tx: a receipt that cannot be about the job is
// refused (store.ErrReceiptMismatch), a repeat answers the receipt on file
// (duplicate), one the job has no room for is kept in the unmatched log
// (store.ObservationRoom), the receipt is marked verified when it carries
// the grant of the attempt it names (R25), and a new one of success or
// failure expedites its job (R28).
func (b *Backend) observeTx(ctx context.Context, tx Tx, p store.ObservationParams) (store.Observation, bool, error) {
	job, err := b.lockJobForReceipt(ctx, tx, p.Job)
	if err != nil {
		return store.Observation{}, false, err
	}
	if why := p.Mismatch(job); why != "" {
		return store.Observation{}, false, fmt.Errorf("%w: %s", store.ErrReceiptMismatch, why)
	}
	key := p.DedupeKey(job.ID)
	verified, err := HeldGrant(ctx, tx, job.ID, p.Attempt, p.LeaseToken)
	if err != nil {
		return store.Observation{}, false, err
	}
	// R31: an archived job's receipts are filed in the archive, beside the
	// ones it left with; it is final, so nothing moves.
	q := observationSQL(!job.ArchivedAt.IsZero())
	room, err := ObservationRoomOf(ctx, tx, q.countObservationRoom, job.ID, p.Reporter)
	if err != nil {
		return store.Observation{}, false, err
	}
	if why := room.Refusal(verified); why != "" {
		obs, err := ScanObservation(tx.QueryRowContext(ctx, q.selectObservationByDedupe, key))
		if err == nil || !errors.Is(err, sql.ErrNoRows) {
			return obs, err == nil, err // a repeat of one on file is its duplicate
		}
		return b.keepAside(ctx, tx, job, p, verified, why)
	}
	res, err := tx.ExecContext(ctx, fmt.Sprintf(insertObservation, b.SQL.NowExpr), job.ID, job.OperationKey,
		p.Attempt, job.Attempt, p.Source, p.Outcome, p.ProviderRefundID, p.ProviderEventID, p.Detail, key, verified,
		p.Reporter)
	if b.Duplicate(err) {
		// The same receipt is on file. A failed statement undoes only
		// itself; the transaction goes on, writing nothing.
		obs, err := ScanObservation(tx.QueryRowContext(ctx, q.selectObservationByDedupe, key))
		return obs, true, err
	}
	if err != nil {
		return store.Observation{}, false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return store.Observation{}, false, err
	}
	if !job.ArchivedAt.IsZero() {
		if dup, err := b.moveToArchive(ctx, tx, id); err != nil || dup {
			obs, err := ScanObservation(tx.QueryRowContext(ctx, q.selectObservationByDedupe, key))
			return obs, err == nil && dup, err
		}
	}
	obs, err := ScanObservation(tx.QueryRowContext(ctx, q.selectObservationByID, id))
	if err != nil || !job.ArchivedAt.IsZero() {
		return obs, false, err
	}
	if obs.Attention, err = b.raiseAttention(ctx, tx, obs); err != nil || !obs.Outcome.Expedites() {
		return obs, false, err
	}
	if _, err := tx.ExecContext(ctx, markEvidence, b.At(obs.CreatedAt), obs.JobID); err != nil {
		return store.Observation{}, false, err
	}
	obs.Expedited, err = b.expedite(ctx, tx, obs)
	return obs, false, err
}

// observationStatements are the reads of a job's receipts, in the working
// table or in the archive's; each field is named as its statement.
type observationStatements struct{ countObservationRoom, selectObservationByDedupe, selectObservationByID string }

var observationsLive, observationsArchived = observationStatements{
	countObservationRoom:      countObservationRoom,
	selectObservationByDedupe: selectObservationByDedupe,
	selectObservationByID:     selectObservationByID,
}, observationStatements{
	countObservationRoom:      archived(countObservationRoom, "refund_observations"),
	selectObservationByDedupe: archived(selectObservationByDedupe, "refund_observations"),
	selectObservationByID:     archived(selectObservationByID, "refund_observations"),
}

// selectJobIDForReceipt locks a job's row for a receipt (%s: the locking
// read's suffix).
const selectJobIDForReceipt = `SELECT id FROM refund_jobs WHERE id = ?%s`

// lockJobForReceipt reads the job a receipt names and locks its row, so
// that the archiver cannot move it while the receipt is filed: a receipt
// filed on the working table after its job left would be where nobody
// reads it (R28, R31). A job that left meanwhile, or before, is read from
// the archive, and its receipt is filed there.
func (b *Backend) lockJobForReceipt(ctx context.Context, tx Tx, ref store.JobRef) (store.Job, error) {
	job, err := JobByRef(ctx, tx, ref)
	if err != nil || !job.ArchivedAt.IsZero() {
		return job, err
	}
	var id int64
	err = tx.QueryRowContext(ctx, fmt.Sprintf(selectJobIDForReceipt, b.Retention.ForUpdate), job.ID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return ArchivedJob(ctx, tx, store.JobRef{ID: job.ID})
	}
	return job, err
}

// moveToArchive moves the receipt id, just filed for an archived job, to
// the archive; dup is true when the same receipt was on file there (the
// new row is then deleted, nothing added).
func (b *Backend) moveToArchive(ctx context.Context, tx Tx, id int64) (dup bool, err error) {
	_, err = tx.ExecContext(ctx, moveObservation, id)
	if dup = b.Duplicate(err); err != nil && !dup {
		return false, err
	}
	_, err = tx.ExecContext(ctx, deleteObservation, id)
	return dup, err
}

// observationSQL is the statements for a live or an archived job.
func observationSQL(isArchived bool) observationStatements {
	if isArchived {
		return observationsArchived
	}
	return observationsLive
}

// keepAside keeps receipt p, which job has no room for (why), in the
// unmatched log in tx (store.ObservationParams.KeptAsideEvent): never
// dropped, and moving nothing (R28). The answer is the receipt as it would
// have been filed, with the entry kept (KeptAside); duplicate when that
// entry was on file.
func (b *Backend) keepAside(ctx context.Context, tx Tx, job store.Job, p store.ObservationParams, verified bool,
	why string) (store.Observation, bool, error) {
	kept, duplicate, err := b.keepUnmatchedTx(ctx, tx, p.KeptAsideEvent(job, verified, why))
	if err != nil {
		return store.Observation{}, false, err
	}
	return store.Observation{JobID: job.ID, OperationKey: job.OperationKey, ReportedAttempt: p.Attempt,
		JobAttempt: job.Attempt, Source: p.Source, Outcome: p.Outcome, ProviderRefundID: p.ProviderRefundID,
		ProviderEventID: p.ProviderEventID, Detail: p.Detail, CreatedAt: kept.ReceivedAt, AttemptVerified: verified,
		Reporter: p.Reporter, KeptAside: &kept}, duplicate, nil
}

// expedite makes obs's job due now with next action reconcile when it is
// ready (expediteJob), and records the move in its history
// (store.Observation.ExpediteEvent), in the receipt's transaction (R28). It
// reports whether the job moved.
//
// Receipts move work forward, never state: a worker's fenced write is what
// closes the job. Reconcile even when the job was to send its refund: the
// provider says the refund exists or failed, and a blind resend could refund
// twice once the idempotency window has passed (R14); a reconcile is always
// safe.
//
// Locking: the job was read without a lock (JobByRef), and the receipt's
// insert locks only its own row of refund_observations; markEvidence, then
// expediteJob, take the job's row lock, by primary key, last, and
// expediteJob re-checks state = 'ready' on the row as committed then, never
// on that earlier read. A claim locks due rows
// FOR UPDATE SKIP LOCKED (or, in the embedded store, holds the only write
// lock): if it holds the row first, expediteJob waits for its COMMIT, then
// finds the job running and matches nothing; if expediteJob holds it first,
// the claim skips the row, or (a job not yet due) does not see it in the due
// range, and takes it, due now, in a later transaction after this one
// commits. A claim whose cutoff is earlier than this statement's now cannot
// take the job even after this COMMIT: its locking read sees next_attempt_at
// after its cutoff. So a claim never hands out a job that a receipt then
// changes, and the history stays in order: a claim of the job after this
// event is at or after this event's time. No transaction holds
// a job's row lock while it waits for a lock of refund_observations, so this
// adds no lock cycle; a deadlock would roll everything back and run again
// whole (InTx, R20).
func (b *Backend) expedite(ctx context.Context, tx Tx, obs store.Observation) (bool, error) {
	res, err := tx.ExecContext(ctx, fmt.Sprintf(expediteJob, b.SQL.NowExpr), obs.JobID)
	if err != nil {
		return false, err
	}
	// Matched rows (clientFoundRows on MySQL) are changed rows here: the
	// statement matches no row it would leave as it was.
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	// Read back under the row lock: the attempt and time of the move as
	// the row holds them, not as the unlocked read saw them.
	job, err := JobByRef(ctx, tx, store.JobRef{ID: obs.JobID})
	if err != nil {
		return false, err
	}
	return true, InsertHistory(ctx, tx, []store.Event{obs.ExpediteEvent(job)}, b.At)
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
