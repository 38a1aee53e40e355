package mysql

import (
	"fmt"

	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

const (
	// R12: one cutoff per claim, from the database's clock.
	now = `SELECT UTC_TIMESTAMP(6)`

	// R6, R23: expired leases, oldest first, read without locking:
	// takeovers are then locked by primary key (lockTakeovers). They are
	// found on the due index: a running job's next_attempt_at is its lease
	// end (store.Job.NextAttemptAt), and lease_until is tested as well, for
	// rows an earlier release wrote. A locking walk would also lock the entry
	// that ends the range, the running job with the earliest live lease, and
	// deadlock with that job's own write-back, which must change the entry.
	// The arguments: the cutoff twice, the filter's, the limit.
	expiredLeases = `SELECT ` + sqlbase.HasObservations + `, ` + jobColumns + ` FROM refund_jobs FORCE INDEX (%[2]s)
 WHERE state = 'running' AND next_attempt_at <= ? AND lease_until <= ?%[1]s
 ORDER BY next_attempt_at, id
 LIMIT ?`

	// Locks, by primary key only, the jobs of %s whose lease is still expired
	// at the cutoff, re-read as they are now: a row another claim holds or
	// has taken over meanwhile is left out (R13).
	lockTakeovers = `SELECT ` + sqlbase.HasObservations + `, ` + jobColumns + ` FROM refund_jobs FORCE INDEX (PRIMARY)
 WHERE id IN (%s) AND state = 'running' AND lease_until <= ?
 ORDER BY next_attempt_at, id
 FOR UPDATE SKIP LOCKED`

	// Q1, Q2, R23: ready and due, oldest first, stable by id (Q4). FORCE
	// INDEX keeps the walk on the claim's index, (state, next_attempt_at, id)
	// or, with a provider filter, (state, provider, next_attempt_at, id): the
	// optimizer might otherwise pick one that means a sort.
	dueJobs = selectDueJobs + `
 FOR UPDATE SKIP LOCKED`
	selectDueJobs = `SELECT ` + sqlbase.HasObservations + `, ` + jobColumns + ` FROM refund_jobs FORCE INDEX (%[2]s)
 WHERE state = 'ready' AND next_attempt_at <= ?%[1]s
 ORDER BY next_attempt_at, id
 LIMIT ?`

	// The two candidate groups and the clock in one round trip: UTC_TIMESTAMP
	// is one value for the whole statement, the cutoff of both groups (R12,
	// Q1). Expired leases are read, not locked, as in expiredLeases;
	// both groups walk the due index (%[2]s and %[3]s are the same).
	candidates = `(SELECT UTC_TIMESTAMP(6), 1, ` + sqlbase.HasObservations + `, ` + jobColumns + `
   FROM refund_jobs FORCE INDEX (%[2]s)
  WHERE state = 'running' AND next_attempt_at <= UTC_TIMESTAMP(6) AND lease_until <= UTC_TIMESTAMP(6)%[1]s
  ORDER BY next_attempt_at, id
  LIMIT ?)
UNION ALL
(SELECT UTC_TIMESTAMP(6), 0, ` + sqlbase.HasObservations + `, ` + jobColumns + `
   FROM refund_jobs FORCE INDEX (%[3]s)
  WHERE state = 'ready' AND next_attempt_at <= UTC_TIMESTAMP(6)%[1]s
  ORDER BY next_attempt_at, id
  LIMIT ?
  FOR UPDATE SKIP LOCKED)`
)

// anyWork is one look for idle long polls (HasWork): the first entry of each
// walk, no lock, no transaction.
const anyWork = `SELECT EXISTS (SELECT 1 FROM refund_jobs FORCE INDEX (%[3]s)
  WHERE state = 'ready' AND next_attempt_at <= UTC_TIMESTAMP(6)%[1]s)
 OR EXISTS (SELECT 1 FROM refund_jobs FORCE INDEX (%[2]s)
  WHERE state = 'running' AND next_attempt_at <= UTC_TIMESTAMP(6) AND lease_until <= UTC_TIMESTAMP(6)%[1]s)`

// R19: provider budgets, shared by every coordinator on the database.
const (
	allBudgets = `SELECT provider, tokens, rate, burst, refilled_at FROM provider_budgets`
	budgets    = `SELECT provider, tokens, rate, burst, refilled_at FROM provider_budgets
 WHERE provider IN (%s) ORDER BY provider FOR UPDATE`
)

// statements are this backend's SQL. The claim (sqlbase.Backend.ClaimMany) is one short transaction on one
// connection (R5, R11) that reads the database clock, locks expired leases (by
// primary key) and due jobs with SKIP LOCKED so concurrent claimers pass each other (R13),
// bumps them and records the history. Deadlocks and lock-wait timeouts roll
// everything back and are retried whole (R20).
var statements = sqlbase.Statements{
	Now:           now,
	NowExpr:       `UTC_TIMESTAMP(6)`,
	ExpiredLeases: expiredLeases,
	LockTakeovers: lockTakeovers,
	DueJobs:       dueJobs,
	Candidates:    candidates,
	AnyWork:       anyWork,
	ExpireLease:   expireLease,
	UpdateTable:   "refund_jobs FORCE INDEX (PRIMARY)",
	LockForWrite:  lockForWrite,
	AllBudgets:    allBudgets,
	Budgets:       budgets,
	// One index for due work and expired leases (store.Job.NextAttemptAt).
	Indexes: sqlbase.Indexes{Lease: "ix_refund_jobs_due", Due: "ix_refund_jobs_due",
		ProviderLease: "ix_refund_jobs_provider_due", ProviderDue: "ix_refund_jobs_provider_due"},
	MinuteSince: minuteSince,
}

// DueCandidatesQuery is the claim's candidate query for due jobs (Q1) with
// no provider filter and without its FOR UPDATE SKIP LOCKED: the statement
// the benchmark repeats and explains without taking locks. Its arguments are
// the cutoff and the limit.
func DueCandidatesQuery() string { return fmt.Sprintf(selectDueJobs, "", "ix_refund_jobs_due") }
