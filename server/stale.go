package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jobfence/jobfence/store"
)

// staleRejectionsKept is how many of its newest stale rejections a
// coordinator keeps for GetOverview.
const staleRejectionsKept = 100

// staleRejection is one write-back this coordinator refused as STALE_ATTEMPT
// (R9, R25). A refused write leaves nothing in the database, so each
// coordinator keeps its own, in memory (M1).
type staleRejection struct {
	at             time.Time // this coordinator's clock: when for a person, never for a lease (R12)
	jobID          int64
	attempt        int64 // the attempt the writer carried
	currentAttempt int64 // the job's when it was refused
	rpc            string
	caller         string // the writer's credential; empty on an open coordinator
}

// staleLog keeps the newest staleRejectionsKept stale rejections and counts
// them all since the coordinator started. Safe for concurrent use.
type staleLog struct {
	started time.Time

	mu    sync.Mutex
	ring  [staleRejectionsKept]staleRejection
	total int64 // ring[total % staleRejectionsKept] is where the next goes
}

// add records the refusal of w with err (an ErrStaleAttempt) for the caller
// of ctx.
func (l *staleLog) add(ctx context.Context, w store.Writeback, err error) {
	r := staleRejection{at: time.Now(), jobID: w.JobID, attempt: w.Attempt, rpc: rpcOf(w.Kind)}
	var fe *store.FenceError
	if errors.As(err, &fe) {
		r.currentAttempt = fe.Current.Attempt
	}
	if id, ok := IdentityFrom(ctx); ok {
		r.caller = id.Name
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.total%staleRejectionsKept] = r
	l.total++
}

// recent returns up to n of the newest rejections, newest first, and how
// many there were since the coordinator started.
func (l *staleLog) recent(n int) ([]staleRejection, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := int(min(l.total, staleRejectionsKept))
	out := make([]staleRejection, 0, min(n, kept))
	for i := int64(1); i <= int64(min(n, kept)); i++ {
		out = append(out, l.ring[(l.total-i)%staleRejectionsKept])
	}
	return out, l.total
}
