package dispatch

import (
	"context"

	"github.com/jobfence/jobfence/store"
)

// The four kinds of batched call of a Dispatcher (batchKind): what one
// shared transaction of each runs, and what becomes of an outcome whose
// caller left before it was answered.

// enqueueFlush runs a batch of enqueues with the hand-offs to idle long
// polls (Dispatcher.enqueueMany).
type enqueueFlush struct{ d *Dispatcher }

func (f enqueueFlush) flush(ctx context.Context, ps []store.EnqueueParams) []store.EnqueueOutcome {
	return f.d.enqueueMany(ctx, ps)
}

// abandon keeps the job: an enqueue is safe to repeat (R1), and its caller
// learns of it by repeating it.
func (enqueueFlush) abandon(store.EnqueueParams, store.EnqueueOutcome) {}

func (enqueueFlush) failed(o store.EnqueueOutcome) bool { return o.Err != nil }
func (enqueueFlush) name() string                       { return "enqueue" }

// claimFlush runs a batch of claims (Store.ClaimMany).
type claimFlush struct{ d *Dispatcher }

func (f claimFlush) flush(ctx context.Context, ps []store.ClaimParams) []store.ClaimOutcome {
	return f.d.store.ClaimMany(ctx, ps)
}

// abandon hands back the jobs granted to a caller that left (release).
func (f claimFlush) abandon(p store.ClaimParams, out store.ClaimOutcome) { f.d.release(p, out) }

func (claimFlush) failed(o store.ClaimOutcome) bool { return o.Err != nil }
func (claimFlush) name() string                     { return "claim" }

// writeFlush runs a batch of write-backs (Store.WriteMany).
type writeFlush struct{ st Store }

func (f writeFlush) flush(ctx context.Context, ws []store.Writeback) []store.WriteOutcome {
	return f.st.WriteMany(ctx, ws)
}

// abandon keeps the write: a write-back is safe to repeat (R21).
func (writeFlush) abandon(store.Writeback, store.WriteOutcome) {}

func (writeFlush) failed(o store.WriteOutcome) bool { return o.Err != nil }
func (writeFlush) name() string                     { return "write" }

// renewFlush runs a batch of lease renewals (Store.RenewMany).
type renewFlush struct{ st Store }

func (f renewFlush) flush(ctx context.Context, rs []store.Renewal) []store.RenewOutcome {
	return f.st.RenewMany(ctx, rs)
}

// abandon keeps the lease: a renewal is safe to repeat (R27).
func (renewFlush) abandon(store.Renewal, store.RenewOutcome) {}

func (renewFlush) failed(o store.RenewOutcome) bool { return o.Err != nil }
func (renewFlush) name() string                     { return "renew" }
