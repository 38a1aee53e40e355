package sqlite

import (
	"context"
	"fmt"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
	"strings"
	"testing"

	"path/filepath"
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
		{selectDueJobs, "", "ix_refund_jobs_due", []any{1, 10}},
		{selectDueJobs, " AND provider = ?", "ix_refund_jobs_provider_due", []any{1, "acme", 10}},
		{selectExpiredLeases, "", "ix_refund_jobs_lease", []any{1, 10}},
		{selectExpiredLeases, " AND provider = ?", "ix_refund_jobs_provider_lease", []any{1, "acme", 10}},
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
