package sqlbase

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jobfence/jobfence/store"
)

// The listings of ListJobs walk one index each (store.ListOrder), keyset-paged
// (never OFFSET, Q4), and read one row more than the page to know whether
// another follows. The other filters apply on that walk.
const (
	// The candidates of a lookup by provider refund id: the jobs whose refund
	// has it, on ix_refund_jobs_provider_refund, and the jobs with a receipt
	// naming it, on ix_refund_observations_provider_refund; each below the
	// cursor's id, newest first.
	selectIDsByRefundID = `SELECT id FROM refund_jobs WHERE provider_refund_id = ? AND id < ?
 ORDER BY id DESC LIMIT ?`
	selectIDsByReceipt = `SELECT DISTINCT job_id FROM refund_observations WHERE provider_refund_id = ? AND job_id < ?
 ORDER BY job_id DESC LIMIT ?`
	// %s: the candidates' ids, then the other filters.
	selectJobsAmong = `SELECT ` + JobColumns + ` FROM refund_jobs WHERE id IN (%s)%s ORDER BY id DESC`

	// The receipts on file per job of a page (R15), on
	// ix_refund_observations_job (job_id, id); %s: the jobs' ids.
	countObservationsOf = `SELECT job_id, COUNT(*) FROM refund_observations WHERE job_id IN (%s) GROUP BY job_id`
)

// conds are the conditions of a WHERE clause and their arguments.
type conds struct {
	where []string
	args  []any
}

func (c *conds) add(cond string, args ...any) {
	c.where = append(c.where, cond)
	c.args = append(c.args, args...)
}

// walkFilters are p's filters that apply on the walk of its index: all but
// the lookup the index answers.
func walkFilters(p store.ListParams, at func(time.Time) any) conds {
	var c conds
	if p.State != "" {
		c.add("state = ?", p.State)
	}
	if p.Provider != "" {
		c.add("provider = ?", p.Provider)
	}
	if p.ReasonPrefix != "" {
		// Byte for byte on every backend: INSTR compares under the column's
		// binary collation (utf8mb4_bin, SQLite's BINARY) and knows no
		// wildcards, where SQLite's LIKE ignores ASCII case and an equality
		// of a SUBSTRING ignores trailing spaces under MySQL's PAD SPACE
		// collations.
		c.add("INSTR(last_reason, ?) = 1", p.ReasonPrefix)
	}
	from, to := p.CreatedRange()
	if !from.IsZero() {
		c.add("created_at >= ?", at(from))
	}
	if !to.IsZero() {
		c.add("created_at < ?", at(to))
	}
	return c
}

// ListQuery builds the keyset-paged listing of p for every order but
// store.ByRefundID (listByRefundID): one row more than the page, to know
// whether another follows; at converts a time to the backend's column value.
func ListQuery(p store.ListParams, at func(time.Time) any) (string, []any) {
	c := walkFilters(p, at)
	cursor, more, _ := p.Cursor() // validated by the caller
	byCreated := func() string {
		if more {
			c.add("(created_at < ? OR (created_at = ? AND id < ?))", at(cursor.At), at(cursor.At), cursor.ID)
		}
		return "created_at DESC, id DESC"
	}
	var order string
	switch p.Order() {
	case store.ByOrder: // Q7: all refunds of an order, newest first
		c.add("order_id = ?", p.OrderID)
		order = byCreated()
	case store.ByPayment: // all refunds of a payment, newest first, on (payment_id, created_at, id)
		c.add("payment_id = ?", p.PaymentID)
		order = byCreated()
	case store.ByAttention: // R34: longest listed first, on (attention_since, id)
		c.add("attention_since IS NOT NULL")
		order = "attention_since, id"
		if more {
			c.add("(attention_since > ? OR (attention_since = ? AND id > ?))", at(cursor.At), at(cursor.At), cursor.ID)
		}
	case store.ByState: // oldest due first, on the (state, next_attempt_at, id) index
		order = "next_attempt_at, id"
		if from, _ := p.CreatedRange(); p.State == store.StateManualReview && !from.IsZero() {
			// A job enters review after it was created, and its
			// next_attempt_at is that moment (the escalation sets it), so
			// created_at >= from implies next_attempt_at >= from: a range on
			// the index where the walk starts, instead of a filter on every
			// job in review before it.
			c.add("next_attempt_at >= ?", at(from))
		}
		if more {
			c.add("(next_attempt_at > ? OR (next_attempt_at = ? AND id > ?))", at(cursor.At), at(cursor.At), cursor.ID)
		}
	default:
		order = "id DESC"
		if more {
			c.add("id < ?", cursor.ID)
		}
	}
	q := "SELECT " + JobColumns + " FROM refund_jobs"
	if len(c.where) > 0 {
		q += " WHERE " + strings.Join(c.where, " AND ")
	}
	return q + " ORDER BY " + order + " LIMIT ?", append(c.args, p.Limit+1)
}

// List implements store.Store: p's listing, cut into a page, and the
// receipts on file per job of the page, read in one read-only transaction so
// that they show one moment.
func (b *Backend) List(ctx context.Context, p store.ListParams) (store.JobPage, error) {
	if err := p.Validate(); err != nil {
		return store.JobPage{}, err
	}
	tx, err := b.DB.BeginTx(ctx, b.ReadTx)
	if err != nil {
		return store.JobPage{}, b.Unavailable(err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	var jobs []store.Job
	if p.Order() == store.ByRefundID {
		jobs, err = listByRefundID(ctx, tx, p, b.At)
	} else {
		query, args := ListQuery(p, b.At)
		jobs, err = QueryAll(ctx, tx, ScanJob, query, args...)
	}
	if err != nil {
		return store.JobPage{}, b.Unavailable(err)
	}
	page := store.JobPage{Jobs: jobs}
	if len(jobs) > p.Limit {
		page.Jobs = jobs[:p.Limit]
		page.NextPageToken = p.NextToken(page.Jobs[p.Limit-1])
	}
	if page.ObservationCounts, err = observationCounts(ctx, tx, page.Jobs); err != nil {
		return store.JobPage{}, b.Unavailable(err)
	}
	return page, nil
}

// listByRefundID is the store.ByRefundID listing: the jobs whose refund has
// p's provider refund id merged with those that have a receipt naming it,
// newest id first. Each round walks both indexes below the cursor for a page
// and one, merges them (mergeNewest) and reads those jobs with the other
// filters; while the filters leave fewer than a page and one and the walks
// go on, the next round starts below the last candidate. Every round is
// bounded, and all of them by the rows that name the id: never the history.
// It returns at least a page and one of jobs when the listing has them, in
// order, and may return more.
func listByRefundID(ctx context.Context, tx Tx, p store.ListParams, at func(time.Time) any) ([]store.Job, error) {
	want := p.Limit + 1
	below := int64(math.MaxInt64)
	if cursor, more, _ := p.Cursor(); more { // validated by the caller
		below = cursor.ID
	}
	filters := walkFilters(p, at)
	filter := ""
	if len(filters.where) > 0 {
		filter = " AND " + strings.Join(filters.where, " AND ")
	}
	var out []store.Job
	for len(out) < want {
		own, err := QueryAll(ctx, tx, scanInt64, selectIDsByRefundID, p.ProviderRefundID, below, want)
		if err != nil {
			return nil, err
		}
		named, err := QueryAll(ctx, tx, scanInt64, selectIDsByReceipt, p.ProviderRefundID, below, want)
		if err != nil {
			return nil, err
		}
		ids, more := mergeNewest(own, named, want)
		if len(ids) == 0 {
			break
		}
		jobs, err := QueryAll(ctx, tx, ScanJob, fmt.Sprintf(selectJobsAmong, Placeholders(len(ids)), filter),
			append(Int64Args(ids), filters.args...)...)
		if err != nil {
			return nil, err
		}
		out = append(out, jobs...)
		if !more {
			break
		}
		below = ids[len(ids)-1]
	}
	return out, nil
}

// mergeNewest merges a and b, two walks of ids newest first that stopped at
// n ids each, into the newest n distinct ids of both, newest first. Every
// id it returns is in order with no id of either walk's unread rest between
// them: a walk that stopped at n ids holds n ids at or above its last, so
// the newest n of the merge are at or above it too. more reports that ids
// may follow the last one returned.
func mergeNewest(a, b []int64, n int) (ids []int64, more bool) {
	more = len(a) >= n || len(b) >= n
	for len(a) > 0 || len(b) > 0 {
		var next int64
		switch {
		case len(b) == 0 || len(a) > 0 && a[0] > b[0]:
			next, a = a[0], a[1:]
		case len(a) == 0 || b[0] > a[0]:
			next, b = b[0], b[1:]
		default: // the same job in both
			next, a, b = a[0], a[1:], b[1:]
		}
		if len(ids) == n {
			return ids, true
		}
		ids = append(ids, next)
	}
	return ids, more
}

func scanInt64(row Scanner) (int64, error) {
	var v int64
	err := row.Scan(&v)
	return v, err
}

// observationCounts counts the receipts on file per job of jobs; jobs
// without any are absent.
func observationCounts(ctx context.Context, tx Tx, jobs []store.Job) (map[int64]int64, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	ids := make([]int64, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	type count struct{ job, n int64 }
	counts, err := QueryAll(ctx, tx, func(row Scanner) (count, error) {
		var c count
		err := row.Scan(&c.job, &c.n)
		return c, err
	}, fmt.Sprintf(countObservationsOf, Placeholders(len(ids))), Int64Args(ids)...)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]int64, len(counts))
	for _, c := range counts {
		out[c.job] = c.n
	}
	return out, nil
}
