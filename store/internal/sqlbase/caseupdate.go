package sqlbase

import (
	"context"
	"fmt"
	"strings"

	"github.com/jobfence/jobfence/store"
)

// RowUpdate is one UPDATE of many rows by primary key, each row set to its
// own values and fenced by its own attempt (R9) and, for a grant holder's
// write-backs, its own grant's lease token (R25), built by SQL.
//
// It is a CASE on the primary key rather than a join to a derived table of
// the values: MariaDB materialises such a derived table into a temporary
// table for every statement, which costs the database more than the update
// itself (docs/BENCHMARKS.md has the measurement).
type RowUpdate struct {
	// Table is the UPDATE's target, with any index hint.
	Table string
	// Fixed are the SET clauses every row shares, with their arguments;
	// none when empty.
	Fixed     string
	FixedArgs []any
	// Cols are the columns set per row; Vals[i] holds row i's values for them.
	Cols []string
	IDs  []int64
	Vals [][]any
	// Fences are the attempts each row must still have (attempt = …).
	Fences []int64
	// Grants, when set, are the lease token hashes the writers carry, one per
	// row: a row changes only if it still has its writer's (R25), so the
	// writer holds the grant, not merely knows its attempt. The tokened ones
	// are tested as a set (lease_token_hash IN …): a hash names one grant
	// (128 random bits) and a batch writes each job at most once
	// (store.PlanBatch), so the only hash of the set a row can have is its
	// own writer's; and the database looks a value up in a list of constants
	// by binary search, where a CASE of a hundred rows costs a hundred
	// comparisons per row. A writer without a token (a grant from before
	// tokens) matches only its own row, and only while that row has none.
	Grants []store.TokenHash
	// Where, when set, is a further condition every row must meet.
	Where     string
	WhereArgs []any
}

// SQL returns the statement and its arguments.
func (u RowUpdate) SQL() (string, []any) {
	var b strings.Builder
	args := append([]any(nil), u.FixedArgs...)
	b.WriteString("UPDATE " + u.Table + " SET " + u.Fixed)
	for c, col := range u.Cols {
		if c > 0 || u.Fixed != "" {
			b.WriteString(", ")
		}
		b.WriteString(col + " = ")
		vals := make([]any, len(u.IDs))
		for i := range u.IDs {
			vals[i] = u.Vals[i][c]
		}
		args = byID(&b, u.IDs, vals, args)
	}
	b.WriteString(" WHERE id IN (" + Placeholders(len(u.IDs)) + ") AND attempt = ")
	args = append(args, Int64Args(u.IDs)...)
	args = byID(&b, u.IDs, Int64Args(u.Fences), args)
	if u.Grants != nil {
		args = u.grantFence(&b, args)
	}
	if u.Where != "" {
		b.WriteString(" AND (" + u.Where + ")")
		args = append(args, u.WhereArgs...)
	}
	return b.String(), args
}

// grantFence writes the condition on Grants and appends its arguments.
func (u RowUpdate) grantFence(b *strings.Builder, args []any) []any {
	var tokened, untokened []any
	for i, g := range u.Grants {
		if g.IsZero() {
			untokened = append(untokened, u.IDs[i])
		} else {
			tokened = append(tokened, g)
		}
	}
	var alts []string
	if len(tokened) > 0 {
		alts = append(alts, "lease_token_hash IN ("+Placeholders(len(tokened))+")")
		args = append(args, tokened...)
	}
	if len(untokened) > 0 {
		alts = append(alts, "(lease_token_hash = ? AND id IN ("+Placeholders(len(untokened))+"))")
		args = append(append(args, store.TokenHash{}), untokened...)
	}
	b.WriteString(" AND (" + strings.Join(alts, " OR ") + ")")
	return args
}

// maxCaseRows bounds the rows of one UPDATE that ExecAll sends: each row
// looks its values up in every CASE of the statement by walking it, so a
// statement of n rows costs the database n² comparisons per column, and a
// claim of 16 long polls of 100 jobs each spent more of its CPU there than
// on parsing the statement (docs/BENCHMARKS.md, run 15). Write-back batches
// are no longer than this (dispatch's MaxBatch default).
const maxCaseRows = 128

// ExecAll runs the update in tx, in statements of at most maxCaseRows rows,
// and requires it to change every row: the rows are locked by tx and were
// checked when read, so a row that no longer matches is a bug, not a race,
// and the caller must roll back (what names the update in the error).
func (u RowUpdate) ExecAll(ctx context.Context, tx Tx, what string) error {
	for start := 0; start < len(u.IDs); start += maxCaseRows {
		if err := u.rows(start, min(start+maxCaseRows, len(u.IDs))).execOne(ctx, tx, what); err != nil {
			return err
		}
	}
	return nil
}

// rows is u for its rows from to to (exclusive) only.
func (u RowUpdate) rows(from, to int) RowUpdate {
	if from == 0 && to == len(u.IDs) {
		return u
	}
	part := u
	part.IDs, part.Vals, part.Fences = u.IDs[from:to], u.Vals[from:to], u.Fences[from:to]
	if u.Grants != nil {
		part.Grants = u.Grants[from:to]
	}
	return part
}

func (u RowUpdate) execOne(ctx context.Context, tx Tx, what string) error {
	query, args := u.SQL()
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n != int64(len(u.IDs)) {
		return fmt.Errorf("%s: %d rows held and checked but %d matched", what, len(u.IDs), n)
	}
	return nil
}

// byID writes CASE id WHEN ? THEN ? … END and appends its arguments.
func byID(b *strings.Builder, ids []int64, vals []any, args []any) []any {
	b.WriteString("CASE id")
	for i, id := range ids {
		b.WriteString(" WHEN ? THEN ?")
		args = append(args, id, vals[i])
	}
	b.WriteString(" END")
	return args
}
