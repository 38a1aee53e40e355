package sqlbase

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jobfence/jobfence/store"
)

// The archive's reads (R30, R31): a job that left the working tables is in
// refund_jobs_archive with the same columns and the time it left, its history
// and receipts in the archive's tables of theirs; its key stays in
// refund_operation_keys for ever, with its final state, even once an operator
// exported and dropped its archived rows.
const (
	archivedJobColumns  = JobColumns + `, archived_at`
	selectArchivedByID  = `SELECT ` + archivedJobColumns + ` FROM refund_jobs_archive WHERE id = ?`
	selectArchivedByKey = `SELECT ` + archivedJobColumns + ` FROM refund_jobs_archive WHERE operation_key = ?`
	selectArchivedByIDs = `SELECT ` + archivedJobColumns + ` FROM refund_jobs_archive WHERE id IN (%s)`

	keyColumns     = `operation_key, job_id, order_id, payment_id, amount_minor, currency, provider, created_at, final_state, archived_at`
	selectKeyByKey = `SELECT ` + keyColumns + ` FROM refund_operation_keys WHERE operation_key = ?`
	selectKeysIn   = `SELECT ` + keyColumns + ` FROM refund_operation_keys WHERE operation_key IN (%s)`

	// %[1]s: the rows.
	insertKeys = `INSERT INTO refund_operation_keys
  (operation_key, job_id, order_id, payment_id, amount_minor, currency, provider, created_at) VALUES %[1]s`
	insertKeyRow = `(?, ?, ?, ?, ?, ?, ?, ?)`
	// %s: the new jobs' ids.
	deleteNewJobs = `DELETE FROM refund_jobs WHERE id IN (%s) AND attempt = 0`
)

// archived names a working table's archive.
func archived(query string, tables ...string) string {
	for _, t := range tables {
		query = strings.ReplaceAll(query, " "+t+" ", " "+t+"_archive ")
		query = strings.ReplaceAll(query, " "+t+"\n", " "+t+"_archive\n")
	}
	return query
}

// scanArchivedJob reads a row of archivedJobColumns.
func scanArchivedJob(row Scanner) (store.Job, error) {
	var at time.Time
	j, err := ScanJob(Prefixed{Row: row, Last: []any{Time{&at}}})
	j.ArchivedAt = at
	return j, err
}

// keyRow is a row of refund_operation_keys.
type keyRow struct {
	store.Job // ID, OperationKey, the refund's values, CreatedAt; State and ArchivedAt once archived
}

func scanKey(row Scanner) (keyRow, error) {
	var k keyRow
	var final sql.NullString
	err := row.Scan(&k.OperationKey, &k.ID, &k.OrderID, &k.PaymentID, &k.AmountMinor, &k.Currency, &k.Provider,
		Time{&k.CreatedAt}, &final, Time{&k.ArchivedAt})
	k.State = store.State(final.String)
	return k, err
}

// ArchivedJob reads a job that left the working tables (R31): from the
// archive, or, once its archived rows were exported and dropped, as its
// key's row tells it (its id, values, creation and final state; by key
// only). Errors: store.ErrNotFound, or the driver's error as it is.
func ArchivedJob(ctx context.Context, q Tx, ref store.JobRef) (store.Job, error) {
	var row *sql.Row
	if ref.ID != 0 {
		row = q.QueryRowContext(ctx, selectArchivedByID, ref.ID)
	} else {
		row = q.QueryRowContext(ctx, selectArchivedByKey, ref.OperationKey)
	}
	job, err := scanArchivedJob(row)
	if !errors.Is(err, sql.ErrNoRows) || ref.ID != 0 {
		if errors.Is(err, sql.ErrNoRows) {
			err = store.ErrNotFound
		}
		return job, err
	}
	k, err := scanKey(q.QueryRowContext(ctx, selectKeyByKey, ref.OperationKey))
	switch {
	case errors.Is(err, sql.ErrNoRows), err == nil && k.ArchivedAt.IsZero():
		// No key, or the key of a live job the caller did not see: none
		// archived.
		return store.Job{}, store.ErrNotFound
	case err != nil:
		return store.Job{}, err
	}
	return k.Job, nil
}

// archivedJobs reads the archived jobs of ids, by id; jobs not in the
// archive are absent.
func archivedJobs(ctx context.Context, q Querier, ids []int64) (map[int64]store.Job, error) {
	jobs, err := QueryAll(ctx, q, scanArchivedJob, fmt.Sprintf(selectArchivedByIDs, Placeholders(len(ids))), Int64Args(ids)...)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]store.Job, len(jobs))
	for _, j := range jobs {
		out[j.ID] = j
	}
	return out, nil
}

// recordKeys inserts the keys of the jobs just created (R30), in one
// statement. A key already on file belongs to a job that was archived (a
// live one's key would have failed the job's insert): its new job is
// deleted again in the same transaction, never committed, and the job the
// key names is returned, by key, for the enqueue to answer as R1 does.
func (b *Backend) recordKeys(ctx context.Context, tx Tx, created []store.Job) (map[string]store.Job, error) {
	err := b.insertKeys(ctx, tx, created)
	if !b.Duplicate(err) {
		return nil, err
	}
	keys := make([]any, len(created))
	for i, j := range created {
		keys[i] = j.OperationKey
	}
	onFile, err := QueryAll(ctx, tx, scanKey, fmt.Sprintf(selectKeysIn, Placeholders(len(keys))), keys...)
	if err != nil {
		return nil, err
	}
	taken := make(map[string]store.Job, len(onFile))
	for _, k := range onFile {
		job, err := ArchivedJob(ctx, tx, store.JobRef{OperationKey: k.OperationKey})
		if errors.Is(err, store.ErrNotFound) {
			job, err = k.Job, nil // its job's rows are gone without an archive: the key tells what it was
		}
		if err != nil {
			return nil, err
		}
		taken[k.OperationKey] = job
	}
	var undo []int64
	var rest []store.Job
	for _, j := range created {
		if _, ok := taken[j.OperationKey]; ok {
			undo = append(undo, j.ID)
		} else {
			rest = append(rest, j)
		}
	}
	if len(undo) == 0 {
		return nil, fmt.Errorf("enqueue: a key of %d was on file, and none of them is", len(created))
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(deleteNewJobs, Placeholders(len(undo))), Int64Args(undo)...); err != nil {
		return nil, err
	}
	return taken, b.insertKeys(ctx, tx, rest)
}

// insertKeys inserts the key rows of jobs in one statement.
func (b *Backend) insertKeys(ctx context.Context, tx Tx, jobs []store.Job) error {
	if len(jobs) == 0 {
		return nil
	}
	rows := make([]string, len(jobs))
	args := make([]any, 0, len(jobs)*8)
	for i, j := range jobs {
		rows[i] = insertKeyRow
		args = append(args, j.OperationKey, j.ID, j.OrderID, j.PaymentID, j.AmountMinor, j.Currency, j.Provider, b.At(j.CreatedAt))
	}
	_, err := tx.ExecContext(ctx, fmt.Sprintf(insertKeys, strings.Join(rows, ", ")), args...)
	return err
}
