package sqlbase

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/jobfence/jobfence/store"
)

// Statements is a backend's SQL, the part of its dialect the shared code
// runs (the rest is Dialect). Claim candidate queries take, in order, the
// cutoff (ExpiredLeases: twice, for next_attempt_at and lease_until), the
// filter's arguments and a limit; %[1]s is where the filter goes and %[2]s
// the index they walk (ExpiredLeases: Indexes.Lease, DueJobs: Indexes.Due;
// see filter).
type Statements struct {
	// Now reads the database clock (R12); NowExpr is that clock as an
	// expression inside a statement.
	Now, NowExpr string
	// ExpiredLeases and DueJobs lock (or, under a database-wide write lock,
	// select) candidates, oldest first (R6, Q1, R23). Their rows are
	// HasObservations then the job's columns.
	ExpiredLeases, DueJobs string
	// LockTakeovers, when set, is how expired leases are locked: ExpiredLeases
	// and Candidates only read them, and this locks by primary key those of
	// the jobs in %s still expired at the cutoff (its one argument after the
	// ids), skipping locked rows, with the rows of ExpiredLeases.
	LockTakeovers string
	// Candidates, when the backend has it, reads the clock and both groups of
	// candidates in one statement (one round trip instead of three). Its rows
	// are the database time, 1 for an expired lease, HasObservations, the
	// job's columns; %[1]s takes the filter (in both groups), %[2]s the lease
	// index and %[3]s the due index; the arguments are the filter's and a
	// limit, twice. Used when no budget is configured.
	Candidates string
	// ExpireLease ends a running job's lease (its one argument) a moment ago
	// by the database clock (Backend.ExpireLease, a seam for tests).
	ExpireLease string
	// AnyWork reads whether there is a due job or an expired lease, without
	// locking: %[1]s takes the filter (twice: its arguments come twice),
	// %[2]s the lease index, %[3]s the due index.
	AnyWork string
	// UpdateTable is the target of the grant's and the write-backs' UPDATEs,
	// with any index hint that keeps them on the primary key: with few
	// running rows MySQL's optimizer may otherwise walk ix_refund_jobs_due on
	// state and lock every entry it passes, which deadlocked with concurrent
	// claims.
	UpdateTable string
	// LockForWrite locks the jobs in %s for a batch of write-backs, in id
	// order (two batches never wait on each other in a cycle), with the
	// database's clock as its first column (R12).
	LockForWrite string
	// AllBudgets reads every budget without locking it; Budgets locks the
	// budgets of the providers in %s in provider order.
	AllBudgets, Budgets string
	// Indexes are the indexes the candidate queries walk.
	Indexes Indexes
	// MinuteSince is the whole minutes from its one argument, a time, to a
	// row's created_at, as an expression: the minute an activity read
	// counts the row in (Backend.Activity).
	MinuteSince string
}

// Indexes name the indexes of the claim's two walks (Q1, Q2, R6), without
// and with a provider filter. Lease and Due may be one index: a running
// job's next_attempt_at is its lease end (store.Job.NextAttemptAt).
type Indexes struct {
	Lease, Due, ProviderLease, ProviderDue string
}

const (
	// anyDue finds one due or expired job of the providers in %[1]s: whether
	// an exhausted budget is what keeps a claim empty.
	anyDue = `SELECT 1 FROM refund_jobs WHERE state = 'ready' AND next_attempt_at <= ? AND provider IN (%[1]s)
UNION ALL
SELECT 1 FROM refund_jobs WHERE state = 'running' AND next_attempt_at <= ? AND lease_until <= ? AND provider IN (%[1]s)
LIMIT 1`

	saveBudget   = `UPDATE provider_budgets SET tokens = ?, refilled_at = ? WHERE provider = ?`
	insertBudget = `INSERT INTO provider_budgets (provider, tokens, rate, burst, refilled_at) VALUES (?, ?, ?, ?, ?)`
	updateBudget = `UPDATE provider_budgets SET rate = ?, burst = ?, tokens = ? WHERE provider = ?`
	deleteBudget = `DELETE FROM provider_budgets WHERE provider = ?`
)

// HasObservations is the column every candidate query starts with: whether
// receipts are on file for the job (R15), so that only those are read.
const HasObservations = `EXISTS (SELECT 1 FROM refund_observations o WHERE o.job_id = refund_jobs.id)`

// candidate is a job a claim holds, before the budget and the grant.
type candidate struct {
	store.Job
	takeover bool
	hasObs   bool
}

// claimBudgetedTx is one claim when provider budgets are configured (R19):
// read the clock, leave out providers whose budget is empty, lock expired
// leases then due jobs, cap each provider at what its budget allows and take
// the tokens, then grant the rest. When due work waits only on empty budgets
// it returns *store.BudgetExhaustedError, having written nothing.
func (b *Backend) claimBudgetedTx(ctx context.Context, tx Tx, p store.ClaimParams) ([]store.ClaimedJob, error) {
	f := b.providerFilter(p.Provider)
	var now time.Time
	if err := tx.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&now}); err != nil {
		return nil, err
	}
	budgets, err := b.readBudgets(ctx, tx, nil)
	if err != nil {
		return nil, err
	}
	var exhausted []string
	for name, budget := range budgets {
		if budget.Available(now) < 1 && (p.Provider == "" || p.Provider == name) {
			exhausted = append(exhausted, name)
		}
	}
	slices.Sort(exhausted)
	if len(exhausted) > 0 {
		f.where += " AND provider NOT IN (" + Placeholders(len(exhausted)) + ")"
		f.args = append(f.args, strArgs(exhausted)...)
	}
	locked, err := b.lockSeparately(ctx, tx, now, f, p.MaxJobs)
	if err != nil {
		return nil, err
	}
	if locked, err = b.spendBudgets(ctx, tx, locked, now); err != nil {
		return nil, err
	}
	if len(locked) == 0 {
		return nil, b.budgetWait(ctx, tx, budgets, exhausted, now)
	}
	claimed, err := b.grant(ctx, tx, now, []store.ClaimParams{p}, [][]candidate{locked})
	if err != nil {
		return nil, err
	}
	return claimed[0], nil
}

// claimGroupTx claims for ps, which share one provider filter, with one walk
// of the candidates for all of them: each takes, in order, up to its MaxJobs
// of them (R23: takeovers first, oldest first), and one grant bumps them all.
// No budget is configured.
func (b *Backend) claimGroupTx(ctx context.Context, tx Tx, ps []store.ClaimParams) ([][]store.ClaimedJob, error) {
	f := b.providerFilter(ps[0].Provider)
	total := 0
	for _, p := range ps {
		total += p.MaxJobs
	}
	var now time.Time
	var locked []candidate
	var err error
	if b.SQL.Candidates != "" {
		now, locked, err = b.lockCandidates(ctx, tx, f, total)
	} else {
		if err = tx.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&now}); err == nil {
			locked, err = b.lockSeparately(ctx, tx, now, f, total)
		}
	}
	if err != nil {
		return nil, err
	}
	shares := make([][]candidate, len(ps))
	for i, p := range ps {
		n := min(p.MaxJobs, len(locked))
		shares[i], locked = locked[:n], locked[n:]
	}
	return b.grant(ctx, tx, now, ps, shares)
}

// filter is a claim's provider filter and the indexes its candidate queries
// walk. Each walk is a range of one index in claim order (Q1, Q2): without a
// filter one of (state, next_attempt_at, id); with one the same per
// provider, so that a claim for an idle provider touches none of another's
// backlog (Q3's reasoning, per provider).
type filter struct {
	where      string // " AND …", after the walk's own conditions
	args       []any
	lease, due string // index names (Statements.Indexes)
}

func (b *Backend) providerFilter(provider string) filter {
	ix := b.SQL.Indexes
	f := filter{lease: ix.Lease, due: ix.Due}
	if provider != "" {
		f = filter{where: " AND provider = ?", args: []any{provider}, lease: ix.ProviderLease, due: ix.ProviderDue}
	}
	// R33: a paused provider's jobs are granted to nobody, takeovers
	// included. The walk passes over its due jobs: a long pause of a
	// provider with a large backlog costs claims without a provider filter
	// a filter of that backlog's index entries (docs/DEPLOY.md).
	if where, args := b.pausedFilter(); where != "" {
		f.where += where
		f.args = append(f.args, args...)
	}
	return f
}

// lockSeparately locks up to limit candidates with the two candidate
// queries: expired leases first, then due jobs (R23).
func (b *Backend) lockSeparately(ctx context.Context, tx Tx, now time.Time, f filter, limit int) ([]candidate, error) {
	lock := func(query, index string, cutoffs []any, limit int, takeover bool) ([]candidate, error) {
		args := append(append(cutoffs, f.args...), limit)
		return QueryAll(ctx, tx, scanCandidate(takeover), fmt.Sprintf(query, f.where, index), args...)
	}
	locked, err := lock(b.SQL.ExpiredLeases, f.lease, []any{b.At(now), b.At(now)}, limit, true)
	if err == nil {
		locked, err = b.lockTakeovers(ctx, tx, now, locked)
	}
	if err != nil {
		return nil, err
	}
	if rest := limit - len(locked); rest > 0 {
		due, err := lock(b.SQL.DueJobs, f.due, []any{b.At(now)}, rest, false)
		if err != nil {
			return nil, err
		}
		locked = append(locked, due...)
	}
	return locked, nil
}

// grant bumps shares[i] for ps[i] in one statement (R5, R6), records the
// history and attaches the receipts on file (R15, read before COMMIT so that
// a failure grants nothing rather than jobs the caller never hears of).
func (b *Backend) grant(ctx context.Context, tx Tx, now time.Time, ps []store.ClaimParams,
	shares [][]candidate) ([][]store.ClaimedJob, error) {
	out := make([][]store.ClaimedJob, len(ps))
	// R5, R6: bump each job to the values of store.ClaimParams.Grant, which
	// answers the caller without a read-back and mints the grant's lease
	// token (R25), only where the attempt is still the one read and the
	// claim's conditions still hold: a row that moved is not granted.
	u := RowUpdate{
		Table:     b.SQL.UpdateTable,
		Fixed:     "state = 'running', attempt = attempt + 1, updated_at = ?",
		FixedArgs: []any{b.At(now)},
		Cols:      []string{"first_sent_at", "next_action", "lease_until", "next_attempt_at", "worker_id", "lease_token_hash"},
		Where:     "(state = 'ready' AND next_attempt_at <= ?) OR (state = 'running' AND lease_until <= ?)",
		WhereArgs: []any{b.At(now), b.At(now)},
	}
	var events []store.Event
	type ref struct{ share, i int }
	var withObs []ref
	for s, p := range ps {
		out[s] = make([]store.ClaimedJob, len(shares[s]))
		for i, cur := range shares[s] {
			c, e := p.Grant(cur.Job, now)
			out[s][i] = c
			events = append(events, e)
			var firstSent any
			if !c.Job.FirstSentAt.IsZero() {
				firstSent = b.At(c.Job.FirstSentAt)
			}
			u.IDs = append(u.IDs, c.Job.ID)
			u.Fences = append(u.Fences, cur.Attempt)
			u.Vals = append(u.Vals, []any{firstSent, c.Job.NextAction, b.At(c.Job.LeaseUntil), b.At(c.Job.NextAttemptAt),
				c.Job.WorkerID, c.Job.Grant})
			if cur.hasObs {
				withObs = append(withObs, ref{s, i})
			}
		}
	}
	if len(u.IDs) == 0 {
		return out, nil
	}
	// A row failing the re-check grants nothing rather than a guess which.
	if err := u.ExecAll(ctx, tx, "claim"); err != nil {
		return nil, err
	}
	if err := InsertHistory(ctx, tx, events, b.At); err != nil {
		return nil, err
	}
	for s := range ps {
		var idx []int
		for _, r := range withObs {
			if r.share == s {
				idx = append(idx, r.i)
			}
		}
		if err := attachObservations(ctx, tx, out[s], idx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// spendBudgets locks the budgets of the candidates' providers, keeps of each
// provider's candidates (in claim order) only as many as its tokens allow,
// and takes those tokens (R19). Candidates left out stay untouched.
func (b *Backend) spendBudgets(ctx context.Context, tx Tx, locked []candidate, now time.Time) ([]candidate, error) {
	var providers []string
	for _, j := range locked {
		if !slices.Contains(providers, j.Provider) {
			providers = append(providers, j.Provider)
		}
	}
	if len(providers) == 0 {
		return locked, nil
	}
	slices.Sort(providers)
	budgets, err := b.readBudgets(ctx, tx, providers)
	if err != nil {
		return nil, err
	}
	left := make(map[string]int, len(budgets))
	for name, budget := range budgets {
		left[name] = int(budget.Available(now))
	}
	kept := locked[:0:0]
	for _, j := range locked {
		if n, limited := left[j.Provider]; limited {
			if n == 0 {
				continue
			}
			left[j.Provider] = n - 1
		}
		kept = append(kept, j)
	}
	for _, name := range providers {
		budget, ok := budgets[name]
		if !ok {
			continue
		}
		spent := int(budget.Available(now)) - left[name]
		if spent == 0 {
			continue
		}
		if _, err := tx.ExecContext(ctx, saveBudget, budget.Available(now)-float64(spent), b.At(now), name); err != nil {
			return nil, err
		}
	}
	return kept, nil
}

// budgetWait explains an empty claim: if due work of an exhausted provider is
// waiting, a *store.BudgetExhaustedError with the shortest wait; else nil.
func (b *Backend) budgetWait(ctx context.Context, tx Tx, budgets map[string]store.Budget, exhausted []string,
	now time.Time) error {
	if len(exhausted) == 0 {
		return nil
	}
	args := append(append(append([]any{b.At(now)}, strArgs(exhausted)...), b.At(now), b.At(now)), strArgs(exhausted)...)
	var one int
	err := tx.QueryRowContext(ctx, fmt.Sprintf(anyDue, Placeholders(len(exhausted))), args...).Scan(&one)
	if err == sql.ErrNoRows {
		return nil
	}
	if err != nil {
		return err
	}
	wait := time.Duration(-1)
	for _, name := range exhausted {
		if w := budgets[name].Wait(now); wait < 0 || w < wait {
			wait = w
		}
	}
	return &store.BudgetExhaustedError{RetryAfter: wait}
}

// lockCandidates runs the one-statement candidate query: the database clock,
// then expired leases before due jobs, at most limit in all (R23). Due jobs
// locked beyond that stay untouched and are released at COMMIT.
func (b *Backend) lockCandidates(ctx context.Context, tx Tx, f filter, limit int) (time.Time, []candidate, error) {
	args := append(append([]any(nil), f.args...), limit)
	args = append(append(args, f.args...), limit)
	var now time.Time
	rows, err := QueryAll(ctx, tx, func(row Scanner) (candidate, error) {
		var c candidate
		var err error
		c.Job, err = ScanJob(Prefixed{Row: row, First: []any{Time{&now}, &c.takeover, &c.hasObs}})
		return c, err
	}, fmt.Sprintf(b.SQL.Candidates, f.where, f.lease, f.due), args...)
	if err != nil {
		return now, nil, err
	}
	var takeovers, due []candidate
	for _, c := range rows {
		if c.takeover {
			takeovers = append(takeovers, c)
		} else {
			due = append(due, c)
		}
	}
	if takeovers, err = b.lockTakeovers(ctx, tx, now, takeovers); err != nil {
		return now, nil, err
	}
	return now, append(takeovers, due[:min(len(due), max(0, limit-len(takeovers)))]...), nil
}

// lockTakeovers locks the expired leases read, when the backend reads them
// without locking (Statements.LockTakeovers), and returns them as locked: those
// taken over, finished or held by another claim since the read are gone.
func (b *Backend) lockTakeovers(ctx context.Context, tx Tx, now time.Time, read []candidate) ([]candidate, error) {
	if b.SQL.LockTakeovers == "" || len(read) == 0 {
		return read, nil
	}
	ids := make([]int64, len(read))
	for i, c := range read {
		ids[i] = c.ID
	}
	return QueryAll(ctx, tx, scanCandidate(true), fmt.Sprintf(b.SQL.LockTakeovers, Placeholders(len(ids))),
		append(Int64Args(ids), b.At(now))...)
}

// scanCandidate reads a row of ExpiredLeases, DueJobs or LockTakeovers.
func scanCandidate(takeover bool) func(Scanner) (candidate, error) {
	return func(row Scanner) (candidate, error) {
		c := candidate{takeover: takeover}
		var err error
		c.Job, err = ScanJob(Prefixed{Row: row, First: []any{&c.hasObs}})
		return c, err
	}
}

// readBudgets reads the budgets of providers (every budget when nil); the
// backend's query locks them when it is a locking read.
func (b *Backend) readBudgets(ctx context.Context, tx Tx, providers []string) (map[string]store.Budget, error) {
	query, args := b.SQL.AllBudgets, []any(nil)
	if providers != nil {
		query, args = fmt.Sprintf(b.SQL.Budgets, Placeholders(len(providers))), strArgs(providers)
	}
	list, err := QueryAll(ctx, tx, func(row Scanner) (store.Budget, error) {
		var b store.Budget
		err := row.Scan(&b.Provider, &b.Tokens, &b.Rate, &b.Burst, Time{&b.RefilledAt})
		return b, err
	}, query, args...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]store.Budget, len(list))
	for _, b := range list {
		out[b.Provider] = b
	}
	return out, nil
}

func strArgs(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Time scans a DATETIME (time.Time) or INTEGER microseconds since the epoch
// into T, in UTC.
type Time struct{ T *time.Time }

// Scan implements sql.Scanner.
func (t Time) Scan(src any) error {
	switch v := src.(type) {
	case time.Time:
		*t.T = v.UTC()
	case int64:
		*t.T = time.UnixMicro(v).UTC()
	case nil:
		*t.T = time.Time{}
	default:
		return fmt.Errorf("cannot scan %T as a time", src)
	}
	return nil
}

// ConfigureBudgets makes the stored budgets those of cfg (R19): new providers
// start with a full bucket, changed ones keep their tokens up to the new
// burst, providers not in cfg lose their budget. Every coordinator on the
// database should be started with the same budgets.
func (b *Backend) ConfigureBudgets(ctx context.Context, cfg map[string]store.BudgetConfig) error {
	for name, c := range cfg {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("provider %s: %w", name, err)
		}
	}
	err := b.InTx(ctx, func(tx Tx) error {
		var now time.Time
		if err := tx.QueryRowContext(ctx, b.SQL.Now).Scan(Time{&now}); err != nil {
			return err
		}
		stored, err := b.readBudgets(ctx, tx, nil)
		if err != nil {
			return err
		}
		for name := range stored {
			if _, ok := cfg[name]; !ok {
				if _, err := tx.ExecContext(ctx, deleteBudget, name); err != nil {
					return err
				}
			}
		}
		for name, c := range cfg {
			if old, ok := stored[name]; ok {
				_, err = tx.ExecContext(ctx, updateBudget, c.Rate, c.Burst, min(old.Tokens, c.Burst), name)
			} else {
				_, err = tx.ExecContext(ctx, insertBudget, name, c.Burst, c.Rate, c.Burst, b.At(now))
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return b.Unavailable(err)
	}
	b.budgeted.Store(len(cfg) > 0)
	return nil
}

// HasWork implements store.Store.
func (b *Backend) HasWork(ctx context.Context, provider string) (bool, error) {
	f := b.providerFilter(provider)
	var work bool
	err := b.DB.QueryRowContext(ctx, fmt.Sprintf(b.SQL.AnyWork, f.where, f.lease, f.due),
		append(append([]any(nil), f.args...), f.args...)...).Scan(&work)
	return work, b.Unavailable(err)
}
