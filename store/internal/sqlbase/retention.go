package sqlbase

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jobfence/jobfence/store"
)

// RetentionStatements are a backend's SQL of the archive (R30, R31) that
// differs between databases.
type RetentionStatements struct {
	// ForUpdate ends a locking read ("" where a transaction holds the
	// database's only write lock).
	ForUpdate string
	// InsertIgnore begins an insert that skips rows whose key is on file.
	InsertIgnore string
	// ArchiveCandidates reads the ids of succeeded jobs completed at or
	// before its cutoff, oldest first, with a limit, walking an index of
	// state and completion time; CancelledCandidates the same of
	// cancelled jobs (their next_attempt_at is when they were cancelled).
	// Neither takes a job on the attention list (R34).
	ArchiveCandidates, CancelledCandidates string
	// OldestSucceeded reads the completion time of the oldest succeeded job
	// (NULL when none), on the same index.
	OldestSucceeded string
	// PurgeBacklog reads how many undo logs the database has yet to purge
	// (InnoDB's history list length); "" where there is no such thing.
	PurgeBacklog string
}

// The archive's statements that are the same in every backend. %[1]s: the
// database's now; %[2]s: a locking read's suffix.
const (
	selectLeaseForTake = `SELECT holder, generation, lease_until, %[1]s FROM jobfence_leases WHERE name = ?%[2]s`
	insertLease        = `INSERT INTO jobfence_leases (name, holder, generation, lease_until) VALUES (?, ?, 1, ?)`
	takeLease          = `UPDATE jobfence_leases SET holder = ?, generation = generation + 1, lease_until = ? WHERE name = ?`
	renewLease         = `UPDATE jobfence_leases SET lease_until = ? WHERE name = ? AND holder = ? AND generation = ?`
	// %s: the database's now.
	releaseLease = `UPDATE jobfence_leases SET lease_until = %s WHERE name = ? AND holder = ? AND generation = ?`
	// lockHeldLease locks the lease a batch runs under, still its holder's
	// and not run out, and reads the database's now (R12).
	lockHeldLease = `SELECT %[1]s FROM jobfence_leases
 WHERE name = ? AND holder = ? AND generation = ? AND lease_until > %[1]s%[2]s`

	// %[1]s: the ids; %[2]s: a locking read's suffix.
	// R31, R34: a job on the attention list stays until a person
	// acknowledged it; one with a cancel request stays (R31).
	lockArchivable = `SELECT id, operation_key, state FROM refund_jobs
 WHERE id IN (%[1]s) AND state IN ('succeeded', 'cancelled') AND attention_since IS NULL AND cancel_requested_at IS NULL
 ORDER BY id%[2]s`
	// %[1]s: INSERT IGNORE; %[2]s: the ids.
	keepKeysOf = `%[1]s INTO refund_operation_keys
  (operation_key, job_id, order_id, payment_id, amount_minor, currency, provider, created_at)
SELECT operation_key, id, order_id, payment_id, amount_minor, currency, provider, created_at
  FROM refund_jobs WHERE id IN (%[2]s)`
	// %s: the ids.
	markKeysArchived = `UPDATE refund_operation_keys SET final_state = ?, archived_at = ? WHERE operation_key IN (%s)`
	archiveJobs      = `INSERT INTO refund_jobs_archive (` + JobColumns + `, archived_at)
SELECT ` + JobColumns + `, ? FROM refund_jobs WHERE id IN (%s)`
	archiveEvents = `INSERT INTO refund_job_events_archive (` + EventColumns + `)
SELECT ` + EventColumns + ` FROM refund_job_events WHERE job_id IN (%s)`
	archiveObservations = `INSERT INTO refund_observations_archive (` + ObservationColumns + `, dedupe_key)
SELECT ` + ObservationColumns + `, dedupe_key FROM refund_observations WHERE job_id IN (%s)`
	deleteObservationsOf = `DELETE FROM refund_observations WHERE job_id IN (%s)`
	deleteEventsOf       = `DELETE FROM refund_job_events WHERE job_id IN (%s)`
	deleteJobs           = `DELETE FROM refund_jobs WHERE id IN (%s)`

	// A receipt for an archived job takes its id from refund_observations
	// (one sequence: an archived id is never handed out again) and moves.
	moveObservation = `INSERT INTO refund_observations_archive (` + ObservationColumns + `, dedupe_key)
SELECT ` + ObservationColumns + `, dedupe_key FROM refund_observations WHERE id = ?`
	deleteObservation = `DELETE FROM refund_observations WHERE id = ?`
)

// TakeLease takes lease name for holder until ttl from the database's now,
// bumping its generation, when it is free, has run out, or is holder's own
// (a restarted holder takes it again). Errors: store.ErrLeaseHeld (with the
// holder), ErrUnavailable.
func (b *Backend) TakeLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	var l store.Lease
	var err error
	for try := 1; try <= 2; try++ { // two first takes at once: one inserts, the other reads it on its second try
		err = b.InTx(ctx, func(tx Tx) error {
			return b.takeLeaseTx(ctx, tx, name, holder, ttl, &l)
		})
		if !b.Duplicate(err) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, store.ErrLeaseHeld) {
			return store.Lease{}, err
		}
		return store.Lease{}, b.Unavailable(err)
	}
	return l, nil
}

// takeLeaseTx is TakeLease in tx, its answer in l.
func (b *Backend) takeLeaseTx(ctx context.Context, tx Tx, name, holder string, ttl time.Duration, l *store.Lease) error {
	var cur store.Lease
	var now time.Time
	err := tx.QueryRowContext(ctx, fmt.Sprintf(selectLeaseForTake, b.SQL.NowExpr, b.Retention.ForUpdate), name).Scan(
		&cur.Holder, &cur.Generation, Time{&cur.Until}, Time{&now})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if err := tx.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&now}); err != nil {
			return err
		}
		*l = store.Lease{Name: name, Holder: holder, Generation: 1, Until: now.Add(ttl)}
		_, err = tx.ExecContext(ctx, insertLease, name, holder, b.At(l.Until))
		return err
	case err != nil:
		return err
	case cur.Holder != holder && cur.Until.After(now):
		return fmt.Errorf("%w: %s holds %s until %s", store.ErrLeaseHeld, cur.Holder, name,
			cur.Until.UTC().Format(time.RFC3339))
	}
	*l = store.Lease{Name: name, Holder: holder, Generation: cur.Generation + 1, Until: now.Add(ttl)}
	_, err = tx.ExecContext(ctx, takeLease, holder, b.At(l.Until), name)
	return err
}

// RenewLease extends l until ttl from the database's now, while it is still
// l's generation (R8's way: a lease run out that nobody took is renewed).
// Errors: store.ErrLeaseLost, ErrUnavailable.
func (b *Backend) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error) {
	var n int64
	err := b.InTx(ctx, func(tx Tx) error {
		var now time.Time
		if err := tx.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&now}); err != nil {
			return err
		}
		l.Until = now.Add(ttl)
		res, err := tx.ExecContext(ctx, renewLease, b.At(l.Until), l.Name, l.Holder, l.Generation)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	switch {
	case err != nil:
		return store.Lease{}, b.Unavailable(err)
	case n != 1:
		return store.Lease{}, fmt.Errorf("%w: %s is no longer %s's generation %d", store.ErrLeaseLost, l.Name, l.Holder,
			l.Generation)
	}
	return l, nil
}

// ReleaseLease ends l now, if it is still l's generation, so that another
// holder may take it at once (a graceful stop). Errors: ErrUnavailable.
func (b *Backend) ReleaseLease(ctx context.Context, l store.Lease) error {
	err := b.InTx(ctx, func(tx Tx) error {
		_, err := tx.ExecContext(ctx, fmt.Sprintf(releaseLease, b.SQL.NowExpr), l.Name, l.Holder, l.Generation)
		return err
	})
	if err != nil {
		return b.Unavailable(err)
	}
	return nil
}

// Archive moves one batch of succeeded jobs past their retention, with
// their history and receipts, to the archive (R31), in one transaction:
// it locks its lease (held, not run out, on the database's clock), picks
// the oldest completions, locks them by primary key in ascending order
// (still succeeded), keeps their keys for ever (R30), copies and deletes.
// A transaction that fails changes nothing. Errors: *ValidationError,
// store.ErrLeaseLost (nothing moved), store.ErrWriteOutcomeUnknown (the
// COMMIT was cut off: the batch moved whole or not at all), ErrUnavailable,
// or the driver's error (a lock-wait timeout: the archiver shrinks its
// batch).
func (b *Backend) Archive(ctx context.Context, p store.ArchiveParams) (store.ArchiveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ArchiveResult{}, err
	}
	var res store.ArchiveResult
	err := b.InTx(ctx, func(tx Tx) error {
		var err error
		res, err = b.archiveTx(ctx, tx, p)
		return err
	})
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, store.ErrLeaseLost):
		return store.ArchiveResult{}, err
	case IsCommitUnknown(err):
		// Either all of the batch moved or none: the next batch sees which.
		return store.ArchiveResult{}, fmt.Errorf("%w: archive batch: %v", store.ErrWriteOutcomeUnknown, err)
	default:
		return store.ArchiveResult{}, b.Unavailable(err)
	}
}

func (b *Backend) archiveTx(ctx context.Context, tx Tx, p store.ArchiveParams) (store.ArchiveResult, error) {
	var now time.Time
	err := tx.QueryRowContext(ctx, fmt.Sprintf(lockHeldLease, b.SQL.NowExpr, b.Retention.ForUpdate), p.Lease.Name,
		p.Lease.Holder, p.Lease.Generation).Scan(Time{&now})
	if errors.Is(err, sql.ErrNoRows) {
		return store.ArchiveResult{}, fmt.Errorf("%w: %s is no longer %s's generation %d, or ran out", store.ErrLeaseLost,
			p.Lease.Name, p.Lease.Holder, p.Lease.Generation)
	}
	if err != nil {
		return store.ArchiveResult{}, err
	}
	cutoff := now.Add(-p.RetainSucceeded)
	scanID := func(r Scanner) (int64, error) {
		var id int64
		return id, r.Scan(&id)
	}
	ids, err := QueryAll(ctx, tx, scanID, b.Retention.ArchiveCandidates, b.At(cutoff), p.Limit)
	if err != nil {
		return store.ArchiveResult{}, err
	}
	if rest := p.Limit - len(ids); rest > 0 && p.RetainCancelled > 0 {
		cancelled, err := QueryAll(ctx, tx, scanID, b.Retention.CancelledCandidates, b.At(now.Add(-p.RetainCancelled)), rest)
		if err != nil {
			return store.ArchiveResult{}, err
		}
		ids = append(ids, cancelled...)
	}
	var res store.ArchiveResult
	res.More = len(ids) == p.Limit
	if len(ids) > 0 {
		if err := b.moveJobs(ctx, tx, ids, now, &res); err != nil {
			return store.ArchiveResult{}, err
		}
	}
	var oldestAt time.Time
	if err := tx.QueryRowContext(ctx, b.Retention.OldestSucceeded).Scan(Time{&oldestAt}); err != nil &&
		!errors.Is(err, sql.ErrNoRows) {
		return store.ArchiveResult{}, err
	}
	if !oldestAt.IsZero() && oldestAt.Before(cutoff) {
		res.Behind = cutoff.Sub(oldestAt)
	}
	return res, nil
}

// moveJobs locks the jobs ids that are still final, by primary key in
// ascending order, keeps their keys (R30) marked archived, and moves them,
// their history and their receipts to the archive at now.
func (b *Backend) moveJobs(ctx context.Context, tx Tx, ids []int64, now time.Time, res *store.ArchiveResult) error {
	type locked struct {
		id    int64
		key   string
		state store.State
	}
	rows, err := QueryAll(ctx, tx, func(r Scanner) (locked, error) {
		var l locked
		return l, r.Scan(&l.id, &l.key, &l.state)
	}, fmt.Sprintf(lockArchivable, Placeholders(len(ids)), b.Retention.ForUpdate), Int64Args(ids)...)
	if err != nil || len(rows) == 0 {
		return err
	}
	ids = ids[:0]
	keys := map[store.State][]any{}
	for _, r := range rows {
		ids = append(ids, r.id)
		keys[r.state] = append(keys[r.state], r.key)
	}
	in, args := Placeholders(len(ids)), Int64Args(ids)
	// R30: a job enqueued by an earlier release has no key row: it gets one
	// here, before its row leaves, in the same transaction.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(keepKeysOf, b.Retention.InsertIgnore, in), args...); err != nil {
		return err
	}
	for _, state := range []store.State{store.StateSucceeded, store.StateCancelled} {
		if ks := keys[state]; len(ks) > 0 {
			if _, err := tx.ExecContext(ctx, fmt.Sprintf(markKeysArchived, Placeholders(len(ks))),
				append([]any{state, b.At(now)}, ks...)...); err != nil {
				return err
			}
		}
	}
	moved, err := tx.ExecContext(ctx, fmt.Sprintf(archiveJobs, in), append([]any{b.At(now)}, args...)...)
	if err != nil {
		return err
	}
	events, err := tx.ExecContext(ctx, fmt.Sprintf(archiveEvents, in), args...)
	if err != nil {
		return err
	}
	obs, err := tx.ExecContext(ctx, fmt.Sprintf(archiveObservations, in), args...)
	if err != nil {
		return err
	}
	for _, q := range []string{deleteObservationsOf, deleteEventsOf, deleteJobs} {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(q, in), args...); err != nil {
			return err
		}
	}
	for _, c := range []struct {
		r sql.Result
		n *int
	}{{moved, &res.Jobs}, {events, &res.Events}, {obs, &res.Observations}} {
		n, err := c.r.RowsAffected()
		if err != nil {
			return err
		}
		*c.n = int(n)
	}
	return nil
}

// PurgeBacklog reads the database's purge backlog (InnoDB's history list
// length): 0 where the database has none. Errors: ErrUnavailable.
func (b *Backend) PurgeBacklog(ctx context.Context) (int64, error) {
	if b.Retention.PurgeBacklog == "" {
		return 0, nil
	}
	var n int64
	if err := b.DB.QueryRowContext(ctx, b.Retention.PurgeBacklog).Scan(&n); err != nil {
		return 0, b.Unavailable(err)
	}
	return n, nil
}

// The archive's export and drop (R31): for operators who ship archived rows
// to cold storage. Keys stay (R30); the ledger stays.
const (
	selectArchivedIDsBefore  = `SELECT id FROM refund_jobs_archive WHERE id > ? AND archived_at < ? ORDER BY id LIMIT ?`
	dropArchivedObservations = `DELETE FROM refund_observations_archive WHERE job_id IN (%s)`
	dropArchivedEvents       = `DELETE FROM refund_job_events_archive WHERE job_id IN (%s)`
	dropArchivedJobs         = `DELETE FROM refund_jobs_archive WHERE id IN (%s)`
)

// ArchivedBefore reads up to limit jobs that left the working tables
// before before, by id after after, each with its whole history, every
// receipt and its ledger row, as GetJob shows them. Errors: ErrUnavailable.
func (b *Backend) ArchivedBefore(ctx context.Context, before time.Time, after int64, limit int) ([]store.JobDetail, error) {
	ids, err := QueryAll(ctx, b.DB, func(r Scanner) (int64, error) {
		var id int64
		return id, r.Scan(&id)
	}, selectArchivedIDsBefore, after, b.At(before.UTC()), limit)
	if err != nil {
		return nil, b.Unavailable(err)
	}
	out := make([]store.JobDetail, 0, len(ids))
	for _, id := range ids {
		p := store.GetParams{JobRef: store.JobRef{ID: id}, ObservationsLimit: store.MaxObservationPage}
		d, err := b.Get(ctx, p)
		if err != nil {
			return nil, err
		}
		for next := d.NextObservationsToken; next != ""; {
			p.ObservationsPageToken = next
			more, err := b.Get(ctx, p)
			if err != nil {
				return nil, err
			}
			d.Observations = append(d.Observations, more.Observations...)
			next = more.NextObservationsToken
		}
		d.NextObservationsToken = ""
		out = append(out, d)
	}
	return out, nil
}

// DropArchived deletes the archived rows of jobs ids — job, history and
// receipts — in one transaction. Their keys stay, with their final state
// (R30): an enqueue of one still answers as R1 does. Errors: ErrUnavailable.
func (b *Backend) DropArchived(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	in, args := Placeholders(len(ids)), Int64Args(ids)
	err := b.InTx(ctx, func(tx Tx) error {
		for _, q := range []string{dropArchivedObservations, dropArchivedEvents, dropArchivedJobs} {
			if _, err := tx.ExecContext(ctx, fmt.Sprintf(q, in), args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return b.Unavailable(err)
	}
	return nil
}
