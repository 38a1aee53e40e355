package sqlbase_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// R35: a statement's span shows its kind and table, read off its text, and
// nothing else of it.
func TestSummarizeNamesOperationAndTableOnly_R35(t *testing.T) {
	for _, tc := range []struct{ q, op, table string }{
		{"SELECT id FROM refund_jobs FORCE INDEX (due) WHERE state = ?", "SELECT", "refund_jobs"},
		{"  select `id` from `refund_job_events` where job_id = 'x'", "SELECT", "refund_job_events"},
		{"SELECT NOW(6)", "SELECT", ""},
		{"SELECT n FROM (SELECT count(*) n FROM refund_jobs) t", "SELECT", "refund_jobs"},
		{"INSERT INTO refund_jobs (a, b) VALUES (?, ?)", "INSERT", "refund_jobs"},
		{"UPDATE refund_jobs SET state = CASE id WHEN ? THEN ? END WHERE id IN (?)", "UPDATE", "refund_jobs"},
		{"DELETE FROM refund_jobs WHERE id = ?", "DELETE", "refund_jobs"},
		{"START TRANSACTION", "BEGIN", ""},
		{"COMMIT", "COMMIT", ""},
		{"SELECT 'FROM secret_table' FROM refund_jobs", "SELECT", "refund_jobs"},
		{"", "UNKNOWN", ""},
	} {
		op, table := sqlbase.Summarize(tc.q)
		if op != tc.op || table != tc.table {
			t.Errorf("Summarize(%q) = %q, %q; want %q, %q", tc.q, op, table, tc.op, tc.table)
		}
	}
}

// R35: the statements of a transaction run under a recording span are its
// children, named and attributed by their summary, with no parameter, no
// SQL text and no error message in them; under no span nothing is traced.
func TestTransactionStatementsAreChildSpans_R35(t *testing.T) {
	ctx := context.Background()
	db := memoryDB(t)
	if _, err := db.ExecContext(ctx, "CREATE TABLE refund_jobs (id INTEGER PRIMARY KEY, operation_key TEXT UNIQUE)"); err != nil {
		t.Fatal(err)
	}
	b := &sqlbase.Backend{DB: db, Dialect: uniqueIsDuplicate{}, System: "sqlite"}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	const secret = "secret-param-4f1c"
	tctx, batch := tp.Tracer("t").Start(ctx, "jobfence.batch test")
	err := b.InTx(tctx, func(tx sqlbase.Tx) error {
		if _, err := tx.ExecContext(tctx, "INSERT INTO refund_jobs (id, operation_key) VALUES (?, ?)", 1, secret); err != nil {
			return err
		}
		var key string
		return tx.QueryRowContext(tctx, "SELECT operation_key FROM refund_jobs WHERE id = ?", 1).Scan(&key)
	})
	if err != nil {
		t.Fatal(err)
	}
	// A failing statement: named by its kind, not its message (which
	// quotes the value).
	err = b.InTx(tctx, func(tx sqlbase.Tx) error {
		_, err := tx.ExecContext(tctx, "INSERT INTO refund_jobs (id, operation_key) VALUES (?, ?)", 2, secret)
		return err
	})
	if err == nil {
		t.Fatal("duplicate key accepted")
	}
	batch.End()
	// Untraced: nothing.
	before := len(rec.Ended())
	if err := b.InTx(ctx, func(tx sqlbase.Tx) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM refund_jobs WHERE id = ?", 1)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Ended()) - before; n != 0 {
		t.Errorf("an untraced transaction made %d spans", n)
	}

	var names []string
	for _, s := range rec.Ended() {
		if s.Name() == "jobfence.batch test" {
			continue
		}
		names = append(names, s.Name())
		if s.Parent().SpanID() != batch.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the batch span", s.Name())
		}
		dump := fmt.Sprint(s.Name(), s.Attributes(), s.Events(), s.Status())
		if strings.Contains(dump, secret) || strings.Contains(dump, "VALUES") || strings.Contains(dump, "UNIQUE") {
			t.Errorf("span %s shows a parameter, SQL text or an error message: %s", s.Name(), dump)
		}
		if s.Name() == "INSERT refund_jobs" && s.Status().Code != 0 {
			if !strings.Contains(dump, `"error.type":"duplicate_key"`) {
				t.Errorf("failed INSERT: %s", dump)
			}
		}
	}
	want := "BEGIN,INSERT refund_jobs,SELECT refund_jobs,COMMIT,BEGIN,INSERT refund_jobs"
	if got := strings.Join(names, ","); got != want {
		t.Errorf("statement spans %s, want %s", got, want)
	}
	for _, s := range rec.Ended() {
		if s.Name() != "SELECT refund_jobs" {
			continue
		}
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		if attrs["db.system.name"] != "sqlite" || attrs["db.operation.name"] != "SELECT" ||
			attrs["db.collection.name"] != "refund_jobs" || attrs["db.query.summary"] != "SELECT refund_jobs" ||
			s.SpanKind().String() != "client" {
			t.Errorf("SELECT span: kind %s, attributes %v", s.SpanKind(), attrs)
		}
	}
}

// uniqueIsDuplicate is a Dialect for SQLite's UNIQUE failures in memory.
type uniqueIsDuplicate struct{ sqlbase.Dialect }

func (uniqueIsDuplicate) Duplicate(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE")
}
func (uniqueIsDuplicate) Retryable(error) bool     { return false }
func (uniqueIsDuplicate) CommitRefused(error) bool { return false }
func (uniqueIsDuplicate) Unavailable(err error) error {
	return errors.Join(err)
}
