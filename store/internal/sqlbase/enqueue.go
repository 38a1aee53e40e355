package sqlbase

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jobfence/jobfence/store"
)

const (
	selectJobsByKeys = `SELECT ` + JobColumns + ` FROM refund_jobs WHERE operation_key IN (%s)`

	// %[1]s: the rows; %[2]s in each row: the database's now (R12).
	insertJobs = `INSERT INTO refund_jobs
  (operation_key, order_id, payment_id, amount_minor, currency, provider,
   state, attempt, next_action, next_attempt_at, created_at, updated_at, traceparent, tracestate)
VALUES %s`
	insertJobRow = `(?, ?, ?, ?, ?, ?, 'ready', 0, 'refund', COALESCE(?, %[1]s), %[1]s, %[1]s, ?, ?)`
)

// Enqueue implements store.Store.
func (b *Backend) Enqueue(ctx context.Context, p store.EnqueueParams) (store.Job, bool, error) {
	out := b.EnqueueMany(ctx, []store.EnqueueParams{p})
	return out[0].Job, out[0].Created, out[0].Err
}

// EnqueueMany creates the jobs of ps in one transaction, each answered on its
// own: a new key is created; a key that exists (or comes earlier in the
// batch) with the same refund answers the existing job, created false, and
// with other values ErrKeyConflict (R1). A key inserted meanwhile by another
// transaction fails the insert as a whole, which is then retried.
func (b *Backend) EnqueueMany(ctx context.Context, ps []store.EnqueueParams) []store.EnqueueOutcome {
	out, _ := b.EnqueueAndClaim(ctx, ps, nil)
	return out
}

// EnqueueAndClaim implements store.Store: EnqueueMany, then the claims of cs
// in the same transaction as ClaimMany runs them, under the one COMMIT.
func (b *Backend) EnqueueAndClaim(ctx context.Context, ps []store.EnqueueParams,
	cs []store.ClaimParams) ([]store.EnqueueOutcome, []store.ClaimOutcome) {
	out := make([]store.EnqueueOutcome, len(ps))
	cout := make([]store.ClaimOutcome, len(cs))
	valid := store.Valid(ps, func(i int, err error) { out[i].Err = err })
	if len(valid) == 0 {
		return out, cout // no new work: the claims are answered empty
	}
	cvalid := store.Valid(cs, func(i int, err error) { cout[i].Err = err })
	var err error
	for try := 1; try <= Tries; try++ {
		err = b.InTx(ctx, func(tx Tx) error {
			return b.withHistory(ctx, tx, func(tx Tx) error {
				if err := b.enqueueTx(ctx, tx, ps, valid, out); err != nil || len(cvalid) == 0 {
					return err
				}
				return b.claimTx(ctx, tx, cs, cvalid, cout)
			})
		})
		if err == nil || !b.Duplicate(err) {
			break
		}
	}
	switch {
	case err == nil:
	case IsCommitUnknown(err):
		// Enqueuing again is safe: the key makes it idempotent.
		for _, i := range valid {
			out[i] = store.EnqueueOutcome{Err: fmt.Errorf("%w: enqueue %s: %v", store.ErrWriteOutcomeUnknown, ps[i].OperationKey, err)}
		}
	default:
		for _, i := range valid {
			out[i] = store.EnqueueOutcome{Err: b.Unavailable(err)}
		}
	}
	if err != nil {
		b.claimsFailed(err, cvalid, cout)
	}
	return out, cout
}

func (b *Backend) enqueueTx(ctx context.Context, tx Tx, ps []store.EnqueueParams, idx []int, out []store.EnqueueOutcome) error {
	for _, i := range idx {
		out[i] = store.EnqueueOutcome{} // nothing kept from a failed try
	}
	// The first occurrence of each key is inserted at once: new keys are the
	// usual case. Only when a key is stored already (the insert fails as a
	// whole, undoing only itself) are the stored ones looked up and left out.
	existing := map[string]store.Job{}
	var fresh []int
	for _, i := range idx {
		if _, ok := existing[ps[i].OperationKey]; !ok {
			existing[ps[i].OperationKey] = store.Job{} // filled in once inserted
			fresh = append(fresh, i)
		}
	}
	err := b.insertJobs(ctx, tx, ps, fresh)
	if b.Duplicate(err) {
		stored, lerr := b.jobsByKey(ctx, tx, ps, fresh)
		if lerr != nil {
			return lerr
		}
		fresh = slices.DeleteFunc(fresh, func(i int) bool {
			j, ok := stored[ps[i].OperationKey]
			if ok {
				existing[j.OperationKey] = j
			}
			return ok
		})
		err = b.insertJobs(ctx, tx, ps, fresh)
	}
	if err != nil {
		return err
	}
	if len(fresh) > 0 {
		created, err := b.jobsByKey(ctx, tx, ps, fresh)
		if err != nil {
			return err
		}
		jobs := make([]store.Job, 0, len(fresh))
		for _, i := range fresh {
			j, ok := created[ps[i].OperationKey]
			if !ok {
				return fmt.Errorf("enqueue: job %s not found after its insert", ps[i].OperationKey)
			}
			jobs = append(jobs, j)
		}
		// R30: a key whose job was archived is on file; its new job is
		// undone, and it answers below as a stored key does.
		archivedKeys, err := b.recordKeys(ctx, tx, jobs)
		if err != nil {
			return err
		}
		events := make([]store.Event, 0, len(fresh))
		fresh = slices.DeleteFunc(fresh, func(i int) bool {
			j, ok := archivedKeys[ps[i].OperationKey]
			if ok {
				existing[j.OperationKey] = j
				return true
			}
			j = created[ps[i].OperationKey]
			existing[j.OperationKey] = j
			out[i] = store.EnqueueOutcome{Job: j, Created: true}
			events = append(events, store.Event{JobID: j.ID, Attempt: 0, Kind: store.EventEnqueued, ToState: j.State,
				NextAction: j.NextAction, CreatedAt: j.CreatedAt, WorkerID: ps[i].Producer})
			return false
		})
		if err := InsertHistory(ctx, tx, events, b.At); err != nil {
			return err
		}
	}
	isFresh := map[int]bool{}
	for _, i := range fresh {
		isFresh[i] = true
	}
	for _, i := range idx {
		if isFresh[i] {
			continue
		}
		j := existing[ps[i].OperationKey] // stored before, or created earlier in this batch
		if store.SameRefund(j, ps[i]) {
			out[i] = store.EnqueueOutcome{Job: j}
		} else {
			out[i] = store.EnqueueOutcome{Job: j, Err: fmt.Errorf("%w: %s", store.ErrKeyConflict, ps[i].OperationKey)}
		}
	}
	return nil
}

// jobsByKey reads the stored jobs of the operation keys of ps[i], i in idx.
func (b *Backend) jobsByKey(ctx context.Context, tx Tx, ps []store.EnqueueParams, idx []int) (map[string]store.Job, error) {
	keys := make([]any, len(idx))
	for n, i := range idx {
		keys[n] = ps[i].OperationKey
	}
	jobs, err := QueryAll(ctx, tx, ScanJob, fmt.Sprintf(selectJobsByKeys, Placeholders(len(keys))), keys...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]store.Job, len(jobs))
	for _, j := range jobs {
		out[j.OperationKey] = j
	}
	return out, nil
}

// insertJobs inserts the jobs of ps[i], i in idx, in one statement.
func (b *Backend) insertJobs(ctx context.Context, tx Tx, ps []store.EnqueueParams, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	rows := make([]string, len(idx))
	args := make([]any, 0, len(idx)*9)
	for n, i := range idx {
		p := ps[i]
		rows[n] = fmt.Sprintf(insertJobRow, b.SQL.NowExpr)
		var notBefore any
		if !p.NotBefore.IsZero() {
			notBefore = b.At(p.NotBefore.UTC())
		}
		parent, state := p.TraceContext()
		args = append(args, p.OperationKey, p.OrderID, p.PaymentID, p.AmountMinor, p.Currency, p.Provider, notBefore,
			parent, state)
	}
	_, err := tx.ExecContext(ctx, fmt.Sprintf(insertJobs, strings.Join(rows, ", ")), args...)
	return err
}
