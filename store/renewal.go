package store

import (
	"errors"
	"fmt"
	"time"
)

// Renewal limits (R27).
const (
	// MaxRenewBatch bounds the grants one RenewLeases call renews.
	MaxRenewBatch = 100
	// DefaultMaxGrantAge is how long one grant may be kept alive by
	// renewals when the coordinator is not told otherwise: as long as the
	// longest lease a claim may ask for, so renewal never lets a grant
	// outlive what a claim alone could have held.
	DefaultMaxGrantAge = MaxLease
	// MaxGrantAge bounds the configured age: a refund held by one worker
	// for longer than a day is held by a stuck one.
	MaxGrantAge = 24 * time.Hour
)

// ErrGrantTooOld: the grant has lived Renewal.MaxAge since its claim; no
// renewal extends it. Its lease runs out and the job is taken over as usual
// (R27); the holder may still write back until a takeover commits (R8).
var ErrGrantTooOld = errors.New("grant too old to renew")

// Renewal asks to extend the lease of one grant (R27): the job, the attempt
// Claim granted and its lease token, fenced like a write-back (R9, R25).
type Renewal struct {
	JobID      int64
	Attempt    int64
	LeaseToken LeaseToken
	// Lease is how long the lease runs from the database's now (R12).
	Lease time.Duration
	// MaxAge bounds the grant's life from its claim: the lease never ends
	// later than GrantExpiresAt. Zero means DefaultMaxGrantAge.
	MaxAge time.Duration
}

// RenewOutcome answers one renewal of a batch.
type RenewOutcome struct {
	// Job is the job as the renewal left it (its new LeaseUntil) or, when
	// refused with a *FenceError or ErrGrantTooOld, as it is. Zero when the
	// job was not found or the batch failed.
	Job Job
	// GrantExpiresAt is the end of the grant's life (R27), set when the job
	// runs under the renewal's grant.
	GrantExpiresAt time.Time
	// Err: *FenceError (ErrStaleAttempt: taken over, or not this grant;
	// ErrNotRunning: the grant already wrote its outcome), ErrGrantTooOld,
	// ErrNotFound, ErrWriteOutcomeUnknown, ErrUnavailable.
	Err error
}

// ReceiptDuringGrant is when the newest receipt of success or failure was
// filed for o's job during the renewed grant (R28), zero when none was.
func (o RenewOutcome) ReceiptDuringGrant() time.Time {
	j := o.Job
	if j.State != StateRunning || j.EvidenceAt.IsZero() || j.EvidenceAt.Before(j.UpdatedAt) {
		return time.Time{}
	}
	return j.EvidenceAt
}

// maxAge is r's grant life bound.
func (r Renewal) maxAge() time.Duration {
	if r.MaxAge == 0 {
		return DefaultMaxGrantAge
	}
	return r.MaxAge
}

// GrantExpiresAt is the end of the life of the grant job runs under: its
// claim's time (a running row's UpdatedAt, see Job.EvidenceAt) plus the
// bound.
func (r Renewal) GrantExpiresAt(job Job) time.Time {
	return job.UpdatedAt.Add(r.maxAge()).Truncate(time.Microsecond)
}

// Renew decides r against job, the row as it stands, locked, at the
// database's time now: the job with its new lease, or why not. The fence is
// a write-back's (state running, attempt and grant, R9, R25), and like a
// write-back's it does not look at lease_until: expiry only opens the
// competition; the takeover's COMMIT is the moment of loss (R8). The lease
// ends Lease from now, and never after the grant's life ends (R27). A
// renewal never bumps the attempt or mints a token.
func (r Renewal) Renew(job Job, now time.Time) (RenewOutcome, error) {
	switch ours := job.Attempt == r.Attempt && job.Grant == r.LeaseToken.Hash(); {
	case !ours:
		return RenewOutcome{Job: job}, &FenceError{Err: ErrStaleAttempt, Attempt: r.Attempt, NoToken: r.LeaseToken == "", Current: job}
	case job.State != StateRunning:
		return RenewOutcome{Job: job}, &FenceError{Err: ErrNotRunning, Attempt: r.Attempt, Current: job}
	}
	out := RenewOutcome{Job: job, GrantExpiresAt: r.GrantExpiresAt(job)}
	if !now.Before(out.GrantExpiresAt) {
		return out, fmt.Errorf("%w: job %d attempt %d granted at %s, which is %s ago (the most is %s)", ErrGrantTooOld,
			job.ID, r.Attempt, job.UpdatedAt.Format(time.RFC3339Nano), now.Sub(job.UpdatedAt).Round(time.Millisecond), r.maxAge())
	}
	out.Job.LeaseUntil = now.Add(r.Lease).Truncate(time.Microsecond)
	if out.Job.LeaseUntil.After(out.GrantExpiresAt) {
		out.Job.LeaseUntil = out.GrantExpiresAt
	}
	out.Job.NextAttemptAt = out.Job.LeaseUntil // see Job.NextAttemptAt
	return out, nil
}

// ValidateRenewals reports what is wrong with one call's renewals, each
// field named by its wire name (grants[i].job_id, lease_duration): 1 to
// MaxRenewBatch grants, each job once, one lease for all.
func ValidateRenewals(rs []Renewal) error {
	var v violations
	if len(rs) < 1 || len(rs) > MaxRenewBatch {
		v.add("grants", "must name 1 to %d grants, got %d", MaxRenewBatch, len(rs))
	}
	seen := make(map[int64]int, len(rs))
	for i, r := range rs {
		if first, dup := seen[r.JobID]; dup && r.JobID > 0 {
			v.add(fmt.Sprintf("grants[%d].job_id", i), "names job %d again (grants[%d]): renew each job once", r.JobID, first)
		}
		seen[r.JobID] = i
		r.check(fmt.Sprintf("grants[%d].", i), &v, i == 0)
		if i > 0 && r.Lease != rs[0].Lease {
			v.add("lease_duration", "must be the same for every grant of a call")
		}
	}
	return v.err()
}

// Validate reports what is wrong with one renewal.
func (r Renewal) Validate() error {
	var v violations
	r.check("", &v, true)
	return v.err()
}

// check adds r's violations to v, its grant's fields prefixed; the lease and
// the age bound, shared by a call's grants, only when shared.
func (r Renewal) check(prefix string, v *violations, shared bool) {
	if r.JobID <= 0 {
		v.add(prefix+"job_id", "must be greater than zero, got %d", r.JobID)
	}
	if r.Attempt <= 0 {
		v.add(prefix+"attempt", "must be the attempt granted by Claim (1 or more), got %d", r.Attempt)
	}
	v.token(prefix+"lease_token", r.LeaseToken)
	if !shared {
		return
	}
	if r.Lease < MinLease || r.Lease > MaxLease {
		v.add("lease_duration", "must be between %s and %s, got %s", MinLease, MaxLease, r.Lease)
	}
	if r.MaxAge < 0 || r.MaxAge > MaxGrantAge {
		v.add("max_grant_age", "must be between 0 (%s) and %s, got %s", DefaultMaxGrantAge, MaxGrantAge, r.MaxAge)
	}
}
