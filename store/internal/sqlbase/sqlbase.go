// Package sqlbase is the one implementation of store.Store for SQL databases
// (Backend), shared by store/mysql and store/sqlite: the transaction loop and
// its reading of COMMIT failures (R7, R20), enqueues, claims, write-backs,
// renewals, receipts, reads, budgets and the archive. The SQL that is the
// same in both databases lives here, as named constants next to the Go that
// runs it, and the fenced UPDATEs are built by RowUpdate; what differs (the
// clock, the candidate queries with their index hints and row locks, the
// locking reads, the archive's walk) each backend gives in its Statements
// and RetentionStatements, whose fields its constants are named after, and
// its reading of its driver in its Dialect.
package sqlbase

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobfence/jobfence/store"
)

// Tries bounds the retries of a transaction the database rolled back as a
// whole (deadlock, lock-wait timeout, busy lock): retrying those is safe (R20).
const Tries = 4

// Dialect is a backend's reading of its driver: its errors and its time
// columns. mysql and sqlite each implement it with one type of their own.
type Dialect interface {
	// Retryable reports an error after which the database had rolled the
	// whole transaction back, so running it again is safe (R20).
	Retryable(err error) bool
	// CommitRefused reports a failed COMMIT that certainly did not commit.
	// Any other COMMIT failure leaves the outcome unknown.
	CommitRefused(err error) bool
	// Unavailable classifies the errors a caller may repeat after (nothing
	// was changed) as store.ErrUnavailable and returns others unchanged.
	Unavailable(err error) error
	// Duplicate reports a unique-key violation.
	Duplicate(err error) bool
	// At converts a time to the value of a time column.
	At(t time.Time) any
}

// Backend is a database handle with its backend's Dialect and Statements.
// It implements every method of store.Store but Close.
type Backend struct {
	DB *sql.DB
	Dialect
	// SQL is the backend's SQL; Retention its SQL of the archive.
	SQL       Statements
	Retention RetentionStatements
	// Begin, when set, is the statement that begins a transaction, run on a
	// connection taken from DB (see connTx); when empty, transactions are
	// *sql.Tx.
	Begin string
	// LockedRead re-reads the jobs in %s, waiting for any transaction
	// holding them.
	LockedRead string
	// ReadTx are the options of a read that must show one moment (Get).
	ReadTx *sql.TxOptions
	// System is the database's db.system.name on the spans of the
	// statements of a traced transaction (trace.go): mysql, sqlite.
	System string

	budgeted atomic.Bool   // any provider budget configured (R19)
	retries  atomic.Uint64 // transactions run again after a rollback (Stats.TxRetries)
	// paused are the providers whose jobs claims leave out (R33), sorted;
	// pausedMu serialises their updates.
	paused   atomic.Pointer[[]string]
	pausedMu sync.Mutex
}

// CommitUnknownError wraps a COMMIT whose outcome is unknown: the connection
// broke during or after it, or an I/O error hit it (R7, R20).
type CommitUnknownError struct{ Err error }

func (e *CommitUnknownError) Error() string { return "commit outcome unknown: " + e.Err.Error() }
func (e *CommitUnknownError) Unwrap() error { return e.Err }

// IsCommitUnknown reports whether err is a *CommitUnknownError.
func IsCommitUnknown(err error) bool {
	var ce *CommitUnknownError
	return errors.As(err, &ce)
}

// Tx runs the statements of a transaction: a *sql.Tx, or a connTx.
type Tx interface {
	Querier
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// InTx runs fn in one transaction on one connection and commits it, retrying
// the whole transaction while the database reports it rolled back (R20). fn
// must keep nothing from a failed try and use only tx (R10, R11). Retries
// wait a random moment, growing with each try, so that two transactions that
// deadlocked do not meet again at once.
func (b *Backend) InTx(ctx context.Context, fn func(Tx) error) error {
	for try := 1; ; try++ {
		err := b.txOnce(ctx, fn)
		if err == nil || !b.Retryable(err) || try == Tries || ctx.Err() != nil {
			return err
		}
		b.retries.Add(1)
		b.traceRetry(ctx, try, err)
		t := time.NewTimer(rand.N(time.Duration(try) * retryPause))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// retryPause is the upper bound of the first retry's random pause.
const retryPause = 2 * time.Millisecond

func (b *Backend) txOnce(ctx context.Context, fn func(Tx) error) error {
	if b.Begin != "" {
		return b.connTxOnce(ctx, fn)
	}
	began := b.traceStatement(ctx, "BEGIN")
	tx, err := b.DB.BeginTx(ctx, nil)
	began(err)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := fn(b.traced(ctx, tx)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err // not committed: the deferred Rollback undoes everything
	}
	committed := b.traceStatement(ctx, "COMMIT")
	err = tx.Commit()
	committed(err)
	if err != nil {
		if b.CommitRefused(err) || errors.Is(err, sql.ErrTxDone) {
			return err
		}
		return &CommitUnknownError{Err: err}
	}
	return nil
}

// connTx is a transaction begun with Backend.Begin on a connection of its
// own. Its statements run under the caller's context without its
// cancellation: a *sql.Tx hands every statement a cancellable context, and
// go-sql-driver watches one with a goroutine it wakes twice per statement,
// which on a busy machine costs more CPU than a short statement's own
// round trip. The context is checked before each statement instead, and a
// statement in flight is bounded by the connection's read and write
// timeouts.
type connTx struct{ conn *sql.Conn }

// uncancelled is ctx without its cancellation, or ctx itself once it is
// done, so that the driver refuses the statement at once.
func uncancelled(ctx context.Context) context.Context {
	if ctx.Err() != nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

func (t connTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.conn.ExecContext(uncancelled(ctx), query, args...)
}

func (t connTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.conn.QueryContext(uncancelled(ctx), query, args...)
}

func (t connTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return t.conn.QueryRowContext(uncancelled(ctx), query, args...)
}

// end returns the connection to the pool after a COMMIT or ROLLBACK the
// server answered with success, and discards it otherwise: a connection that
// may still be inside the transaction must never serve another caller.
func (t connTx) end(settled bool) {
	if !settled {
		t.conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck // discards the connection
	}
	t.conn.Close()
}

// connTxOnce is txOnce on a connTx.
func (b *Backend) connTxOnce(ctx context.Context, fn func(Tx) error) error {
	conn, err := b.DB.Conn(ctx)
	if err != nil {
		return err
	}
	tx := connTx{conn: conn}
	settled := false // ended by a COMMIT or ROLLBACK the server answered with success
	defer func() { tx.end(settled) }()
	began := b.traceStatement(ctx, "BEGIN")
	_, err = tx.ExecContext(ctx, b.Begin)
	began(err)
	if err != nil {
		return err
	}
	err = fn(b.traced(ctx, tx))
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		rolledBack := b.traceStatement(ctx, "ROLLBACK")
		_, rbErr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		rolledBack(rbErr)
		settled = rbErr == nil
		return err // not committed
	}
	// Once sent, the COMMIT runs to its answer whatever happens to ctx.
	committed := b.traceStatement(ctx, "COMMIT")
	_, err = conn.ExecContext(context.WithoutCancel(ctx), "COMMIT")
	committed(err)
	settled = err == nil
	if err != nil && !b.CommitRefused(err) {
		return &CommitUnknownError{Err: err}
	}
	return err
}

// Claim implements store.Store.
func (b *Backend) Claim(ctx context.Context, p store.ClaimParams) ([]store.ClaimedJob, error) {
	out := b.ClaimMany(ctx, []store.ClaimParams{p})
	return out[0].Jobs, out[0].Err
}

// ClaimMany implements store.Store: one transaction with one COMMIT, the
// claims answered in order as if one by one. Consecutive claims with the same
// provider filter share one walk of the candidates and one grant, each taking
// up to its MaxJobs; with budgets configured the claims run one after another,
// each seeing the jobs granted before it as taken. Only a successful COMMIT
// grants anything; if its outcome is unknown every claim of the batch is told
// so and nothing is retried (R7).
func (b *Backend) ClaimMany(ctx context.Context, ps []store.ClaimParams) []store.ClaimOutcome {
	out := make([]store.ClaimOutcome, len(ps))
	valid := store.Valid(ps, func(i int, err error) { out[i].Err = err })
	if len(valid) == 0 {
		return out
	}
	err := b.InTx(ctx, func(tx Tx) error {
		return b.withHistory(ctx, tx, func(tx Tx) error { return b.claimTx(ctx, tx, ps, valid, out) })
	})
	if err != nil {
		b.claimsFailed(err, valid, out)
	}
	return out
}

// claimsFailed answers the valid claims of a transaction that failed with err:
// an unknown COMMIT outcome is ErrClaimOutcomeUnknown, never retried (R7).
func (b *Backend) claimsFailed(err error, valid []int, out []store.ClaimOutcome) {
	if IsCommitUnknown(err) {
		err = fmt.Errorf("%w: %v", store.ErrClaimOutcomeUnknown, err)
	} else {
		err = b.Unavailable(err)
	}
	for _, i := range valid {
		out[i] = store.ClaimOutcome{Err: err}
	}
}

// claimTx runs the valid claims of ps in tx, answering each in out. Consecutive
// claims with the same provider filter share one candidate walk and one grant,
// taken in order as if one by one; with budgets configured (R19) the claims
// run one after another. An exhausted budget answers its claim; other errors
// fail the transaction.
func (b *Backend) claimTx(ctx context.Context, tx Tx, ps []store.ClaimParams, valid []int, out []store.ClaimOutcome) error {
	if !b.budgeted.Load() {
		// Consecutive claims with the same provider filter share one
		// candidate walk and one grant; taken in order, as if one by one.
		for start := 0; start < len(valid); {
			end := start + 1
			for end < len(valid) && ps[valid[end]].Provider == ps[valid[start]].Provider {
				end++
			}
			run := make([]store.ClaimParams, end-start)
			for n, i := range valid[start:end] {
				run[n] = ps[i]
			}
			claimed, err := b.claimGroupTx(ctx, tx, run)
			if err != nil {
				return err
			}
			for n, i := range valid[start:end] {
				out[i] = store.ClaimOutcome{Jobs: claimed[n]}
			}
			start = end
		}
		return nil
	}
	for _, i := range valid {
		jobs, err := b.claimBudgetedTx(ctx, tx, ps[i])
		var budget *store.BudgetExhaustedError
		switch {
		case errors.As(err, &budget):
			out[i] = store.ClaimOutcome{Err: err} // this claim wrote nothing
		case err != nil:
			return err
		default:
			out[i] = store.ClaimOutcome{Jobs: jobs}
		}
	}
	return nil
}

// selectGrantOf reads the lease token hash of the claim or takeover that
// granted a job's attempt (R25).
const selectGrantOf = `SELECT lease_token_hash FROM refund_job_events
 WHERE job_id = ? AND attempt = ? AND kind IN ('claimed', 'taken_over') ORDER BY id DESC LIMIT 1`

// HeldGrant reports whether token is the lease token of the grant that gave
// job jobID its attempt (R25), by the history: whether a reporter naming that
// attempt really held it. An empty token proves nothing.
func HeldGrant(ctx context.Context, tx Tx, jobID, attempt int64, token store.LeaseToken) (bool, error) {
	if token == "" || attempt == 0 {
		return false, nil
	}
	var grant store.TokenHash
	err := tx.QueryRowContext(ctx, selectGrantOf, jobID, attempt).Scan(&grant)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil && grant == token.Hash(), err
}

const insertEvents = `INSERT INTO refund_job_events
  (job_id, attempt, kind, worker_id, from_state, to_state, next_action, provider_refund_id, reason, created_at,
   lease_token_hash)
VALUES %s`

// InsertHistory appends events to the append-only history in one statement
// (R3); created converts a time to the backend's column value. In a
// historyTx they wait for its one statement instead.
func InsertHistory(ctx context.Context, tx Tx, events []store.Event, created func(time.Time) any) error {
	if h, ok := tx.(*historyTx); ok {
		h.events = append(h.events, events...)
		return nil
	}
	if len(events) == 0 {
		return nil
	}
	values := make([]string, len(events))
	args := make([]any, 0, len(events)*11)
	for i, e := range events {
		values[i] = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
		args = append(args, e.JobID, e.Attempt, e.Kind, e.WorkerID, e.FromState, e.ToState, e.NextAction,
			e.ProviderRefundID, e.Reason, created(e.CreatedAt), e.Grant)
	}
	_, err := tx.ExecContext(ctx, fmt.Sprintf(insertEvents, strings.Join(values, ", ")), args...)
	return err
}

// historyTx is a Tx whose history rows (InsertHistory) wait to be appended
// together, in their order, by withHistory: a transaction of several steps
// (enqueues and the hand-off of their jobs, the claims of several provider
// filters) sends one INSERT for them all instead of one per step, a round
// trip less per step. Only for transactions that do not read the history
// they write.
type historyTx struct {
	Tx
	events []store.Event
}

// withHistory runs fn on a historyTx over tx, then appends the history it
// recorded in one statement, before the caller's COMMIT: a failure to
// append fails the transaction as the step's own INSERT would have.
func (b *Backend) withHistory(ctx context.Context, tx Tx, fn func(Tx) error) error {
	h := &historyTx{Tx: tx}
	if err := fn(h); err != nil {
		return err
	}
	return InsertHistory(ctx, tx, h.events, b.At)
}

// Scanner is a row to scan: *sql.Row or *sql.Rows.
type Scanner interface{ Scan(dest ...any) error }

// Querier runs a query: *sql.DB, *sql.Tx or *sql.Conn.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// QueryAll runs query and scans every row with scan.
func QueryAll[T any](ctx context.Context, q Querier, scan func(Scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Prefixed scans leading extra columns into First, trailing ones into Last
// and the rest into the destinations of the wrapped scan.
type Prefixed struct {
	Row   Scanner
	First []any
	Last  []any
}

// Scan implements Scanner.
func (p Prefixed) Scan(dest ...any) error {
	return p.Row.Scan(append(append(append([]any(nil), p.First...), dest...), p.Last...)...)
}

// Placeholders returns "?, ?, …" for n values.
func Placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// Int64Args returns ids as query arguments.
func Int64Args(ids []int64) []any {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return args
}
