package store

import (
	"errors"
	"time"
)

// Retention (R30, R31): finished jobs leave the working tables for the
// archive after an age; their keys stay known for ever.

// ArchiverLease is the name of the lease one archiver at a time holds.
const ArchiverLease = "archiver"

// Lease is a named lease held by one process at a time (R31), fenced like
// a grant: every take bumps Generation, and work done under the lease
// checks holder and generation on the database's clock before it deletes
// anything.
type Lease struct {
	Name, Holder string
	Generation   int64
	// Until is when it runs out, by the database's clock (R12).
	Until time.Time
}

// Errors of leases and the archive.
var (
	// ErrLeaseHeld: another holder's lease has not run out.
	ErrLeaseHeld = errors.New("lease held by another")
	// ErrLeaseLost: the lease was taken by another, or ran out: the work
	// under it did nothing.
	ErrLeaseLost = errors.New("lease lost")
)

// Bounds of an archive batch.
const (
	// MaxArchiveBatch bounds the jobs one archive transaction moves.
	MaxArchiveBatch = 1000
	// MinRetention is the shortest age a final job is kept in the working
	// tables (for tests and demos; production keeps days).
	MinRetention = time.Second
)

// ArchiveParams is one batch of the archive (R31): the succeeded jobs that
// completed more than RetainSucceeded ago, oldest first, at most Limit, under
// Lease.
type ArchiveParams struct {
	Lease           Lease
	RetainSucceeded time.Duration
	// RetainCancelled is how long a cancelled job stays after it was
	// cancelled (R32); zero leaves cancelled jobs in the working tables.
	// The batch takes succeeded jobs first, then cancelled ones, Limit in
	// all.
	RetainCancelled time.Duration
	Limit           int
}

// Validate reports what is wrong with an archive batch.
func (p ArchiveParams) Validate() error {
	var v violations
	if p.RetainSucceeded < MinRetention {
		v.add("retain_succeeded", "must be at least %s, got %s", MinRetention, p.RetainSucceeded)
	}
	if p.RetainCancelled != 0 && p.RetainCancelled < MinRetention {
		v.add("retain_cancelled", "must be 0 (never) or at least %s, got %s", MinRetention, p.RetainCancelled)
	}
	if p.Limit < 1 || p.Limit > MaxArchiveBatch {
		v.add("limit", "must be 1..%d, got %d", MaxArchiveBatch, p.Limit)
	}
	if p.Lease.Name == "" || p.Lease.Holder == "" || p.Lease.Generation < 1 {
		v.add("lease", "must name a lease held (name, holder, generation)")
	}
	return v.err()
}

// ArchiveResult is what one batch moved.
type ArchiveResult struct {
	// Jobs, Events and Observations count the rows moved to the archive.
	Jobs, Events, Observations int
	// More is true when the batch was full: more jobs may be due.
	More bool
	// Behind is how far past its retention the oldest job the batch left
	// in the working tables is: zero when none is due.
	Behind time.Duration
}
