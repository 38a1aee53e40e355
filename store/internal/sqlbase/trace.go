package sqlbase

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// The statements of a transaction run under a recording span (a batch's,
// dispatch.Dispatcher's: R35) are its child spans, CLIENT, named by their
// summary ("SELECT refund_jobs", "UPDATE refund_jobs", "COMMIT") with the
// database semantic conventions' attributes: db.system.name,
// db.operation.name, db.collection.name and db.query.summary. Never the
// statement's text nor its parameters: the summary is a keyword and a table
// name read off the constant SQL, and a failure is named by its kind
// (error.type), never by its message, which may quote a value. A
// transaction run under no recording span is run as it is, at no cost.

// traceScope is the instrumentation scope of the statements' spans.
const traceScope = "github.com/jobfence/jobfence/store"

// tracedTx is a transaction whose statements are spans.
type tracedTx struct {
	Tx
	b      *Backend
	tracer trace.Tracer
}

// traced is tx with its statements traced when ctx's span records; tx
// itself otherwise.
func (b *Backend) traced(ctx context.Context, tx Tx) Tx {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return tx
	}
	return tracedTx{Tx: tx, b: b, tracer: span.TracerProvider().Tracer(traceScope)}
}

func (t tracedTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	ctx, span := t.b.startStatement(ctx, t.tracer, query)
	r, err := t.Tx.ExecContext(ctx, query, args...)
	t.b.endStatement(span, err)
	return r, err
}

// QueryContext's span ends when the query answers, before its rows are
// read.
func (t tracedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	ctx, span := t.b.startStatement(ctx, t.tracer, query)
	rows, err := t.Tx.QueryContext(ctx, query, args...)
	t.b.endStatement(span, err)
	return rows, err
}

func (t tracedTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	ctx, span := t.b.startStatement(ctx, t.tracer, query)
	row := t.Tx.QueryRowContext(ctx, query, args...)
	err := row.Err()
	if errors.Is(err, sql.ErrNoRows) {
		err = nil // an answer, not a failure
	}
	t.b.endStatement(span, err)
	return row
}

// traceStatement starts the span of a statement the transaction loop runs
// itself (BEGIN, COMMIT, ROLLBACK) when ctx's span records, and returns
// what ends it with the statement's error.
func (b *Backend) traceStatement(ctx context.Context, query string) func(error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return noStatement
	}
	_, s := b.startStatement(ctx, span.TracerProvider().Tracer(traceScope), query)
	return func(err error) { b.endStatement(s, err) }
}

func noStatement(error) {}

// traceRetry records on ctx's span that its transaction is run again after
// a rollback of kind err (R20).
func (b *Backend) traceRetry(ctx context.Context, try int, err error) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("transaction retried", trace.WithAttributes(attribute.Int("jobfence.tx.try", try+1),
			semconv.ErrorTypeKey.String(b.errorType(err))))
	}
}

func (b *Backend) startStatement(ctx context.Context, tracer trace.Tracer, query string) (context.Context, trace.Span) {
	op, table := Summarize(query)
	summary := op
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, semconv.DBSystemNameKey.String(b.system()), semconv.DBOperationNameKey.String(op))
	if table != "" {
		summary += " " + table
		attrs = append(attrs, semconv.DBCollectionNameKey.String(table))
	}
	attrs = append(attrs, semconv.DBQuerySummaryKey.String(summary))
	return tracer.Start(ctx, summary, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

func (b *Backend) endStatement(span trace.Span, err error) {
	if err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(b.errorType(err)))
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

// errorType names a statement's failure by its kind, never its message.
func (b *Backend) errorType(err error) string {
	switch {
	case b.Dialect != nil && b.Duplicate(err):
		return "duplicate_key"
	case b.Dialect != nil && b.Retryable(err):
		return "rolled_back" // a deadlock, a lock wait timeout, a busy database (R20)
	case IsCommitUnknown(err):
		return "commit_outcome_unknown"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return fmt.Sprintf("%T", err)
}

// system is db.system.name: the backend's System, or other_sql.
func (b *Backend) system() string {
	if b.System == "" {
		return "other_sql"
	}
	return b.System
}

// Summarize reads a statement's operation (its first keyword, upper case)
// and its first table (the one after UPDATE, INTO, or the first FROM that
// names one) from its text: what its span may show of it. Nothing else of
// the text is returned, so no value written into it can reach a span.
func Summarize(query string) (op, table string) {
	words := sqlWords(query)
	if len(words) == 0 {
		return "UNKNOWN", ""
	}
	op = strings.ToUpper(words[0])
	after := ""
	switch op {
	case "UPDATE":
		if len(words) > 1 {
			return op, identifier(words[1])
		}
		return op, ""
	case "INSERT", "REPLACE":
		after = "INTO"
	case "SELECT", "DELETE", "WITH":
		after = "FROM"
	case "START":
		return "BEGIN", ""
	default:
		return op, ""
	}
	for i := 1; i+1 < len(words); i++ {
		if strings.EqualFold(words[i], after) {
			if t := identifier(words[i+1]); t != "" {
				return op, t
			}
		}
	}
	return op, ""
}

// sqlWords splits a statement into its words: runs of letters, digits,
// underscores and backquotes; everything else separates, and a quoted
// string (a literal) is skipped whole.
func sqlWords(q string) []string {
	var words []string
	start := -1
	for i := 0; i < len(q); i++ {
		c := q[i]
		word := c == '_' || c == '`' || c == '.' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
		if word {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			words = append(words, q[start:i])
			start = -1
		}
		if c == '\'' || c == '"' {
			end := strings.IndexByte(q[i+1:], c)
			if end < 0 {
				return words
			}
			i += end + 1
		}
		if c == '(' {
			words = append(words, "(") // a subquery's FROM is not the statement's table
		}
	}
	if start >= 0 {
		words = append(words, q[start:])
	}
	return words
}

// identifier is w when it is a table name (letters, digits, underscores,
// dots, optionally backquoted, not starting with a digit); empty otherwise.
func identifier(w string) string {
	w = strings.Trim(w, "`")
	if w == "" || (w[0] >= '0' && w[0] <= '9') {
		return ""
	}
	for i := 0; i < len(w); i++ {
		c := w[i]
		if c != '_' && c != '.' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return ""
		}
	}
	return w
}
