package sqlite

import (
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	// R12, Q1: one cutoff per claim, from the database's clock.
	now = `SELECT ` + nowExpr

	// R6, R23: expired leases, oldest first. INDEXED BY pins the partial
	// index of the claim (per provider with a provider filter): the planner
	// might otherwise pick a wider index and sort. No SKIP LOCKED in SQLite: the
	// claim's BEGIN IMMEDIATE holds the only write lock, so nothing read here
	// can be claimed by anyone else before this transaction commits (R13).
	// The arguments: the cutoff twice (next_attempt_at, the lease end, is
	// tested as in MySQL, where it is what the walk's index holds:
	// store.Job.NextAttemptAt), the filter's, the limit.
	expiredLeases = `SELECT ` + sqlbase.HasObservations + `, ` + jobColumns + ` FROM refund_jobs INDEXED BY %[2]s
 WHERE state = 'running' AND next_attempt_at <= ? AND lease_until <= ?%[1]s
 ORDER BY lease_until, id
 LIMIT ?`

	// Q1, Q2, R23: ready and due, oldest first, stable by id (Q4).
	dueJobs = `SELECT ` + sqlbase.HasObservations + `, ` + jobColumns + ` FROM refund_jobs INDEXED BY %[2]s
 WHERE state = 'ready' AND next_attempt_at <= ?%[1]s
 ORDER BY next_attempt_at, id
 LIMIT ?`
)

// anyWork is one look for idle long polls (HasWork): the first entry of each
// walk, outside any write transaction.
const anyWork = `SELECT EXISTS (SELECT 1 FROM refund_jobs INDEXED BY %[3]s
  WHERE state = 'ready' AND next_attempt_at <= ` + nowExpr + `%[1]s)
 OR EXISTS (SELECT 1 FROM refund_jobs INDEXED BY %[2]s
  WHERE state = 'running' AND lease_until <= ` + nowExpr + `%[1]s)`

// R19: provider budgets, shared by every coordinator on the database.
const (
	allBudgets = `SELECT provider, tokens, rate, burst, refilled_at FROM provider_budgets`
	budgets    = `SELECT provider, tokens, rate, burst, refilled_at FROM provider_budgets
 WHERE provider IN (%s) ORDER BY provider`
)

// statements are this backend's SQL. The claim (sqlbase.Backend.ClaimMany) is one short BEGIN IMMEDIATE
// transaction (R5, R11) that holds the database's only write lock, so the
// candidates it reads cannot be claimed by anyone else before it commits
// (R13). A busy write lock leaves nothing behind and is retried whole (R20).
var statements = sqlbase.Statements{
	Now:           now,
	NowExpr:       nowExpr,
	ExpiredLeases: expiredLeases,
	DueJobs:       dueJobs,
	AnyWork:       anyWork,
	ExpireLease:   expireLease,
	UpdateTable:   "refund_jobs",
	LockForWrite:  lockForWrite,
	AllBudgets:    allBudgets,
	Budgets:       budgets,
	// Partial indexes: a transition moves a job's entry from one to another,
	// which costs what rewriting it in one index would.
	Indexes: sqlbase.Indexes{Lease: "ix_refund_jobs_lease", Due: "ix_refund_jobs_due",
		ProviderLease: "ix_refund_jobs_provider_lease", ProviderDue: "ix_refund_jobs_provider_due"},
	MinuteSince: minuteSince,
}
