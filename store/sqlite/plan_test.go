package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// The candidate queries walk their partial indexes in claim order: no table
// scan, no sort, nothing of the finished history (Q1, Q2, Q3, Q5).
func TestCandidateQueriesUseTheirIndexes_Q2(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "plan.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cases := []struct {
		query, filter, index string
		args                 []any
	}{
		{dueJobs, "", "ix_refund_jobs_due", []any{1, 10}},
		{dueJobs, " AND provider = ?", "ix_refund_jobs_provider_due", []any{1, "acme", 10}},
		{expiredLeases, "", "ix_refund_jobs_lease", []any{1, 1, 10}},
		{expiredLeases, " AND provider = ?", "ix_refund_jobs_provider_lease", []any{1, 1, "acme", 10}},
	}
	for _, c := range cases {
		query := fmt.Sprintf(c.query, c.filter, c.index)
		plans, err := sqlbase.QueryAll(ctx, s.db, func(row sqlbase.Scanner) (string, error) {
			var id, parent, unused int
			var detail string
			err := row.Scan(&id, &parent, &unused, &detail)
			return detail, err
		}, "EXPLAIN QUERY PLAN "+query, c.args...)
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(plans, "\n")
		if !strings.Contains(plan, "USING COVERING INDEX "+c.index) && !strings.Contains(plan, "USING INDEX "+c.index) ||
			strings.Contains(plan, "TEMP B-TREE") || strings.Contains(plan, "SCAN refund_jobs") {
			t.Errorf("plan for\n%s\n=\n%s\nwant a search of %s in order", query, plan, c.index)
		}
	}
}

// The listings by payment and by state walk their indexes in the listing's
// order, with the review filters applied on the walk: no table scan, no sort.
func TestListingsWalkTheirIndexes_Q7(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "plan.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		p     store.ListParams
		index string
	}{
		{store.ListParams{PaymentID: "pay-1", State: store.StateReady, ReasonPrefix: "x", CreatedAfter: at, Limit: 5},
			"ix_refund_jobs_payment"},
		{store.ListParams{State: store.StateManualReview, ReasonPrefix: "no record", CreatedBefore: at, Limit: 5},
			"ix_refund_jobs_state"},
	}
	for _, c := range cases {
		for _, token := range []bool{false, true} {
			p := c.p
			if token {
				p.PageToken = p.NextToken(store.Job{ID: 9, CreatedAt: at, NextAttemptAt: at})
			}
			query, args := sqlbase.ListQuery(p, dialect{}.At)
			plans, err := sqlbase.QueryAll(ctx, s.db, func(row sqlbase.Scanner) (string, error) {
				var id, parent, unused int
				var detail string
				err := row.Scan(&id, &parent, &unused, &detail)
				return detail, err
			}, "EXPLAIN QUERY PLAN "+query, args...)
			if err != nil {
				t.Fatal(err)
			}
			plan := strings.Join(plans, "\n")
			if !strings.Contains(plan, "USING INDEX "+c.index) || strings.Contains(plan, "TEMP B-TREE") ||
				strings.Contains(plan, "SCAN refund_jobs") {
				t.Errorf("plan for\n%s\n=\n%s\nwant a search of %s in order", query, plan, c.index)
			}
		}
	}
}
