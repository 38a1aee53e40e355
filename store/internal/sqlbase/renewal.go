package sqlbase

import (
	"context"
	"fmt"

	"github.com/jobfence/jobfence/store"
)

// RenewMany implements store.Store: it renews rs in one transaction
// (renewTx). A renewal is safe to repeat, so a COMMIT whose outcome is
// unknown runs the whole batch again, at most Tries times: each renewal is
// decided afresh against its row as it then stands (a takeover committed
// meanwhile refuses it, R8, R27).
func (b *Backend) RenewMany(ctx context.Context, rs []store.Renewal) []store.RenewOutcome {
	out := make([]store.RenewOutcome, len(rs))
	var idx []int
	for i, r := range rs {
		if err := r.Validate(); err != nil {
			out[i].Err = err
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return out
	}
	var err error
	for try := 1; try <= Tries; try++ {
		err = b.InTx(ctx, func(tx Tx) error { return b.renewTx(ctx, tx, rs, idx, out) })
		if !IsCommitUnknown(err) {
			break
		}
	}
	if err != nil {
		for _, i := range idx {
			if IsCommitUnknown(err) {
				out[i] = store.RenewOutcome{Err: fmt.Errorf("%w: renew job %d attempt %d: %v",
					store.ErrWriteOutcomeUnknown, rs[i].JobID, rs[i].Attempt, err)}
			} else {
				out[i] = store.RenewOutcome{Err: b.Unavailable(err)}
			}
		}
	}
	return out
}

// renewTx decides the renewals rs[i], i in idx, against their rows, locked
// and read with the database clock (R12) as a write-back's are, answers each
// in out, and sets the new leases with one fenced UPDATE by primary key:
// attempt, lease token and state running, per row (RowUpdate, R9, R25).
// updated_at is left alone: a running row's is its grant's time, from which
// the grant's life is measured (R27).
func (b *Backend) renewTx(ctx context.Context, tx Tx, rs []store.Renewal, idx []int, out []store.RenewOutcome) error {
	ids := make([]int64, 0, len(idx))
	seen := make(map[int64]bool, len(idx))
	for _, i := range idx {
		if !seen[rs[i].JobID] {
			seen[rs[i].JobID] = true
			ids = append(ids, rs[i].JobID)
		}
	}
	rows, now, err := lockJobs(ctx, tx, b.SQL.LockForWrite, ids)
	if err != nil {
		return err
	}
	renewed := map[int64]int{} // job id: the renewal whose lease the job ends with
	for _, i := range idx {
		cur, ok := rows[rs[i].JobID]
		if !ok {
			out[i] = store.RenewOutcome{Err: store.ErrNotFound}
			continue
		}
		res, err := rs[i].Renew(cur, now)
		out[i] = res
		out[i].Err = err
		if err == nil {
			rows[cur.ID] = res.Job
			renewed[cur.ID] = i
		}
	}
	if len(renewed) == 0 {
		return nil
	}
	// next_attempt_at moves with the lease (store.Job.NextAttemptAt).
	u := RowUpdate{Table: b.SQL.UpdateTable, Where: "state = 'running'", Cols: []string{"lease_until", "next_attempt_at"}}
	for _, id := range ids {
		i, ok := renewed[id]
		if !ok {
			continue
		}
		u.IDs = append(u.IDs, id)
		u.Fences = append(u.Fences, rs[i].Attempt)
		u.Grants = append(u.Grants, rs[i].LeaseToken.Hash())
		u.Vals = append(u.Vals, []any{b.At(rows[id].LeaseUntil), b.At(rows[id].NextAttemptAt)})
	}
	// A job renewed twice in the batch answers both with the lease it ends
	// with.
	for _, i := range idx {
		if j, ok := renewed[rs[i].JobID]; ok && out[i].Err == nil && j != i {
			out[i].Job = rows[rs[i].JobID]
		}
	}
	return u.ExecAll(ctx, tx, "renewal")
}
