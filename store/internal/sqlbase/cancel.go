package sqlbase

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jobfence/jobfence/store"
)

// People in control (R32-R34): cancel, the attention list, pausing a
// provider. None of it is on the claim or write-back path but the paused
// providers' filter (providerFilter) and the too-late completions
// (listTooLate), which cost nothing while there are none.
const (
	// updateJobRow writes a decision of the domain (store.CancelParams.Cancel,
	// store.AcknowledgeParams.Acknowledge) to a row the transaction holds
	// locked, by primary key, fenced by the attempt it read.
	updateJobRow = `UPDATE refund_jobs SET state = ?, attempt = ?, next_action = ?, next_attempt_at = ?, lease_until = ?,
  lease_token_hash = ?, last_reason = ?, cancel_requested_at = ?, attention_since = ?, attention_reason = ?, updated_at = ?
 WHERE id = ? AND attempt = ?`

	// setAttention puts a job on the attention list (R34), by primary key.
	setAttention = `UPDATE refund_jobs SET attention_since = ?, attention_reason = ? WHERE id = ?`

	// The newest entry of the kinds in %s of a job's history, on
	// (job_id, id).
	selectLastEventOf = `SELECT ` + EventColumns + ` FROM refund_job_events
 WHERE job_id = ? AND kind IN (%s) ORDER BY id DESC LIMIT 1`
	// Who enqueued a job: its first entry's worker_id.
	selectEnqueuedBy = `SELECT worker_id FROM refund_job_events WHERE job_id = ? AND kind = 'enqueued' ORDER BY id LIMIT 1`

	// R34: the attention list, longest listed first, on
	// ix_refund_jobs_attention; and its length.
	selectAttention = `SELECT ` + JobColumns + ` FROM refund_jobs WHERE attention_since IS NOT NULL
 ORDER BY attention_since, id LIMIT ?`
	countAttention = `SELECT COUNT(*) FROM refund_jobs WHERE attention_since IS NOT NULL`

	// R33: the pauses. %s: the database's now.
	insertPause      = `INSERT INTO provider_pauses (provider, paused_by, reason, paused_at) VALUES (?, ?, ?, %s)`
	selectPause      = `SELECT provider, paused_by, reason, paused_at FROM provider_pauses WHERE provider = ?`
	selectPauses     = `SELECT provider, paused_by, reason, paused_at FROM provider_pauses ORDER BY provider`
	deletePause      = `DELETE FROM provider_pauses WHERE provider = ?`
	insertPauseEvent = `INSERT INTO provider_pause_events (provider, action, actor, reason, created_at)
VALUES (?, ?, ?, ?, %s)`
	selectPauseEvents = `SELECT id, provider, action, actor, reason, created_at FROM provider_pause_events
 ORDER BY id DESC LIMIT ?`
)

// atOrNull is a time column's value, NULL for the zero time.
func (b *Backend) atOrNull(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return b.At(t)
}

// lockOne locks job id's row for a write and reads the database clock; an
// archived job is read from the archive (it is final, and never written).
func (b *Backend) lockOne(ctx context.Context, tx Tx, id int64) (store.Job, time.Time, error) {
	current, now, err := lockJobs(ctx, tx, b.SQL.LockForWrite, []int64{id})
	if err != nil {
		return store.Job{}, now, err
	}
	if err := withArchived(ctx, tx, []int64{id}, current); err != nil {
		return store.Job{}, now, err
	}
	job, ok := current[id]
	if !ok {
		return store.Job{}, now, store.ErrNotFound
	}
	return job, now, nil
}

// lastEventOf reads the newest entry of kinds in job id's history; nil when
// there is none.
func lastEventOf(ctx context.Context, tx Tx, id int64, kinds ...store.EventKind) (*store.Event, error) {
	args := []any{id}
	for _, k := range kinds {
		args = append(args, k)
	}
	e, err := ScanEvent(tx.QueryRowContext(ctx, fmt.Sprintf(selectLastEventOf, Placeholders(len(kinds))), args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// writeJobRow writes after, the domain's decision on before, to its locked
// row, and its history entry.
func (b *Backend) writeJobRow(ctx context.Context, tx Tx, before, after store.Job, e *store.Event) error {
	res, err := tx.ExecContext(ctx, updateJobRow, after.State, after.Attempt, after.NextAction, b.At(after.NextAttemptAt),
		b.atOrNull(after.LeaseUntil), after.Grant, after.LastReason, b.atOrNull(after.CancelRequestedAt),
		b.atOrNull(after.AttentionSince), after.AttentionReason, b.At(after.UpdatedAt), before.ID, before.Attempt)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("job %d: the locked row did not take its update (%d rows, %v)", before.ID, n, err)
	}
	return InsertHistory(ctx, tx, []store.Event{*e}, b.At)
}

// Cancel implements store.Store (R32): the job locked, the domain's
// decision (store.CancelParams.Cancel) written with its history entry, in
// one transaction. A cut-off COMMIT is settled by running the cancel again:
// it is fenced and idempotent.
func (b *Backend) Cancel(ctx context.Context, p store.CancelParams) (store.CancelResult, error) {
	if err := p.Validate(); err != nil {
		return store.CancelResult{}, err
	}
	var res store.CancelResult
	var err error
	for try := 1; try <= Tries; try++ {
		err = b.InTx(ctx, func(tx Tx) error {
			job, now, err := b.lockOne(ctx, tx, p.JobID)
			if err != nil {
				return err
			}
			if p.EnqueuedBy != "" {
				var by string
				err := tx.QueryRowContext(ctx, selectEnqueuedBy, job.ID).Scan(&by)
				if err != nil && !errors.Is(err, sql.ErrNoRows) {
					return err
				}
				if by != p.EnqueuedBy {
					return store.ErrNotEnqueuedByCaller
				}
			}
			last, err := lastEventOf(ctx, tx, job.ID, store.EventCancelled, store.EventCancelRequested)
			if err != nil {
				return err
			}
			r, e, err := p.Cancel(job, last, now)
			if err != nil || e == nil {
				res = r
				return err
			}
			res = r
			return b.writeJobRow(ctx, tx, job, r.Job, e)
		})
		if !IsCommitUnknown(err) {
			break
		}
	}
	return res, b.operatorErr(err)
}

// operatorErr passes the domain's answers through and classifies the rest.
func (b *Backend) operatorErr(err error) error {
	var fe *store.FenceError
	switch {
	case err == nil, errors.As(err, &fe), errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrNotEnqueuedByCaller):
		return err
	case IsCommitUnknown(err):
		return fmt.Errorf("%w: %v", store.ErrWriteOutcomeUnknown, err)
	default:
		return b.Unavailable(err)
	}
}

// Acknowledge implements store.Store (R34).
func (b *Backend) Acknowledge(ctx context.Context, p store.AcknowledgeParams) (store.Job, bool, error) {
	if err := p.Validate(); err != nil {
		return store.Job{}, false, err
	}
	var out store.Job
	var replayed bool
	var err error
	for try := 1; try <= Tries; try++ {
		err = b.InTx(ctx, func(tx Tx) error {
			job, now, err := b.lockOne(ctx, tx, p.JobID)
			if err != nil {
				return err
			}
			last, err := lastEventOf(ctx, tx, job.ID, store.EventAcknowledged)
			if err != nil {
				return err
			}
			after, e, again, err := p.Acknowledge(job, last, now)
			out, replayed = after, again
			if err != nil || e == nil {
				return err
			}
			if !job.ArchivedAt.IsZero() {
				return &store.FenceError{Err: store.ErrNotOnAttentionList, Current: job}
			}
			return b.writeJobRow(ctx, tx, job, after, e)
		})
		if !IsCommitUnknown(err) {
			break
		}
	}
	return out, replayed, b.operatorErr(err)
}

// raiseAttention puts obs's job on the attention list when the receipt
// says what its final state does not (store.ReceiptAttention, R32, R34),
// with a history entry; nothing else about the job changes. The
// job's row is locked (lockJobForReceipt) and read again here: its state
// as it stands, not as an earlier read saw it.
func (b *Backend) raiseAttention(ctx context.Context, tx Tx, obs store.Observation) (bool, error) {
	if obs.Outcome == store.OutcomeNotFound {
		return false, nil // "no record" moves nothing (R14)
	}
	job, err := JobByRef(ctx, tx, store.JobRef{ID: obs.JobID})
	if err != nil || !job.ArchivedAt.IsZero() {
		return false, err
	}
	why, ok := store.ReceiptAttention(job, obs)
	if !ok {
		return false, nil
	}
	job.AttentionSince, job.AttentionReason = obs.CreatedAt, why
	if _, err := tx.ExecContext(ctx, setAttention, b.At(job.AttentionSince), why, job.ID); err != nil {
		return false, err
	}
	return true, InsertHistory(ctx, tx, []store.Event{store.AttentionEvent(job, why)}, b.At)
}

// Attention implements store.Store: the newest of the attention list's
// head and its length (R34), read at one moment.
func (b *Backend) Attention(ctx context.Context, limit int) ([]store.Job, int64, error) {
	if err := store.ValidateOverviewLimit(limit); err != nil {
		return nil, 0, err
	}
	tx, err := b.DB.BeginTx(ctx, b.ReadTx)
	if err != nil {
		return nil, 0, b.Unavailable(err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	var n int64
	if err := tx.QueryRowContext(ctx, countAttention).Scan(&n); err != nil {
		return nil, 0, b.Unavailable(err)
	}
	jobs, err := QueryAll(ctx, tx, ScanJob, selectAttention, limit)
	return jobs, n, b.Unavailable(err)
}

func scanPause(row Scanner) (store.Pause, error) {
	var p store.Pause
	err := row.Scan(&p.Provider, &p.PausedBy, &p.Reason, Time{&p.PausedAt})
	return p, err
}

// PauseProvider implements store.Store (R33): the pause and its history
// entry in one transaction; a provider already paused keeps its first
// pause (changed false). This coordinator's claims leave the provider out
// at once; the others' within their next RefreshPauses.
func (b *Backend) PauseProvider(ctx context.Context, p store.PauseParams) (store.Pause, bool, error) {
	if err := p.Validate(); err != nil {
		return store.Pause{}, false, err
	}
	var out store.Pause
	var changed bool
	err := b.InTx(ctx, func(tx Tx) error {
		_, err := tx.ExecContext(ctx, fmt.Sprintf(insertPause, b.SQL.NowExpr), p.Provider, p.Actor, p.Reason)
		changed = err == nil
		if err != nil && !b.Duplicate(err) {
			return err
		}
		if out, err = scanPause(tx.QueryRowContext(ctx, selectPause, p.Provider)); err != nil || !changed {
			return err
		}
		_, err = tx.ExecContext(ctx, fmt.Sprintf(insertPauseEvent, b.SQL.NowExpr), p.Provider, store.PauseActionPaused,
			p.Actor, p.Reason)
		return err
	})
	if err != nil {
		return store.Pause{}, false, b.operatorErr(err)
	}
	b.updatePaused(func(ps []string) []string {
		if !slices.Contains(ps, p.Provider) {
			ps = append(ps, p.Provider)
		}
		return ps
	})
	return out, changed, nil
}

// ResumeProvider implements store.Store (R33).
func (b *Backend) ResumeProvider(ctx context.Context, p store.PauseParams) (bool, error) {
	if err := p.Validate(); err != nil {
		return false, err
	}
	var changed bool
	err := b.InTx(ctx, func(tx Tx) error {
		res, err := tx.ExecContext(ctx, deletePause, p.Provider)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if changed = n > 0; err != nil || !changed {
			return err
		}
		_, err = tx.ExecContext(ctx, fmt.Sprintf(insertPauseEvent, b.SQL.NowExpr), p.Provider, store.PauseActionResumed,
			p.Actor, p.Reason)
		return err
	})
	if err != nil {
		return false, b.operatorErr(err)
	}
	b.updatePaused(func(ps []string) []string {
		return slices.DeleteFunc(ps, func(s string) bool { return s == p.Provider })
	})
	return changed, nil
}

// RefreshPauses implements store.Store: the providers paused now, read
// from the database, which from then on are this store's claims' filter
// (R33).
func (b *Backend) RefreshPauses(ctx context.Context) ([]store.Pause, error) {
	pauses, err := QueryAll(ctx, b.DB, scanPause, selectPauses)
	if err != nil {
		return nil, b.Unavailable(err)
	}
	names := make([]string, len(pauses))
	for i, p := range pauses {
		names[i] = p.Provider
	}
	b.updatePaused(func([]string) []string { return names })
	return pauses, nil
}

// PauseEvents implements store.Store: the newest pauses and resumes, newest
// first.
func (b *Backend) PauseEvents(ctx context.Context, limit int) ([]store.PauseEvent, error) {
	if err := store.ValidateOverviewLimit(limit); err != nil {
		return nil, err
	}
	events, err := QueryAll(ctx, b.DB, func(row Scanner) (store.PauseEvent, error) {
		var e store.PauseEvent
		err := row.Scan(&e.ID, &e.Provider, &e.Action, &e.Actor, &e.Reason, Time{&e.CreatedAt})
		return e, err
	}, selectPauseEvents, limit)
	return events, b.Unavailable(err)
}

// updatePaused replaces the claims' paused providers with what change
// makes of a copy of them, sorted (one statement text per set).
func (b *Backend) updatePaused(change func([]string) []string) {
	b.pausedMu.Lock()
	defer b.pausedMu.Unlock()
	var cur []string
	if p := b.paused.Load(); p != nil {
		cur = slices.Clone(*p)
	}
	next := change(cur)
	slices.Sort(next)
	next = slices.Compact(next)
	b.paused.Store(&next)
}

// pausedFilter is the claims' condition leaving out the paused providers
// (R33), and its arguments; empty when none is paused.
func (b *Backend) pausedFilter() (string, []any) {
	p := b.paused.Load()
	if p == nil || len(*p) == 0 {
		return "", nil
	}
	return " AND provider NOT IN (" + Placeholders(len(*p)) + ")", strArgs(*p)
}
