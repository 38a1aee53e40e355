package jobfence

import "sync/atomic"

// WorkerEventKind names what a Worker did.
type WorkerEventKind string

// The worker events.
const (
	WorkerClaimed       WorkerEventKind = "claimed"           // a job was granted
	WorkerClaimFailed   WorkerEventKind = "claim_failed"      // a claim failed; nothing acted on (R7)
	WorkerHandled       WorkerEventKind = "handled"           // a handler returned (Result set)
	WorkerDeadline      WorkerEventKind = "provider_deadline" // a handler outlived its deadline and grace
	WorkerWritten       WorkerEventKind = "written"           // the write-back was accepted (Replayed set)
	WorkerStale         WorkerEventKind = "stale"             // the fence rejected the write-back (Err set)
	WorkerWriteFailed   WorkerEventKind = "write_failed"      // the write-back failed otherwise (Err set)
	WorkerObserved      WorkerEventKind = "observed"          // an observation was filed (Duplicate set)
	WorkerObserveFailed WorkerEventKind = "observe_failed"    // filing an observation failed and it was not spooled (Err set)
	WorkerSpooled       WorkerEventKind = "spooled"           // an observation not filed was spooled (Err set, R28)
	WorkerRefiled       WorkerEventKind = "refiled"           // a spooled receipt was filed (Duplicate set; Job has only ids)
	WorkerResendRefused WorkerEventKind = "resend_refused"    // a resend was refused before calling the provider
	WorkerGrantLost     WorkerEventKind = "grant_lost"        // a renewal found the grant gone; the handler was cancelled (Err set, R27)
	WorkerRenewFailed   WorkerEventKind = "renew_failed"      // a renewal call failed; tried again soon (Err set)
)

// WorkerEvent reports one thing a Worker did, for metrics and tests (M1).
type WorkerEvent struct {
	Kind      WorkerEventKind
	Job       ClaimedJob // zero for WorkerClaimFailed
	Result    Result     // WorkerHandled, WorkerStale, WorkerObserved…
	Decision  Decision   // WorkerWritten, WorkerStale, WorkerWriteFailed
	Replayed  bool       // WorkerWritten
	Duplicate bool       // WorkerObserved
	Err       error
}

// WorkerStats counts what a Worker did since it was made.
type WorkerStats struct {
	Claimed       int64 // jobs granted
	Takeovers     int64 // of which taken over from an expired lease (M1)
	ClaimFailures int64
	Completed     int64
	Rescheduled   int64
	Escalated     int64
	Replayed      int64 // write-backs answered replayed=true (R21)
	StaleRejected int64 // write-backs rejected by the fence (M1)
	WriteFailures int64
	Observations  int64 // observations filed (duplicates not counted), spooled ones included once filed
	LateAnswers   int64 // handlers that outlived their deadline and grace
	Spooled       int64 // receipts written to the receipt spool (R28)
	Refiled       int64 // spooled receipts the coordinator took, duplicates included
	Renewals      int64 // leases renewed (R27)
	RenewFailures int64 // renewal calls that failed (each tried again)
	GrantsLost    int64 // grants a renewal found gone: handlers cancelled (R27)
}

// Stats returns the worker's counters.
func (w *Worker) Stats() WorkerStats {
	s := &w.stats
	return WorkerStats{
		Claimed: s.claimed.Load(), Takeovers: s.takeovers.Load(), ClaimFailures: s.claimFailures.Load(),
		Completed: s.completed.Load(), Rescheduled: s.rescheduled.Load(), Escalated: s.escalated.Load(),
		Replayed: s.replayed.Load(), StaleRejected: s.stale.Load(), WriteFailures: s.writeFailures.Load(),
		Observations: s.observations.Load(), LateAnswers: s.late.Load(), Spooled: s.spooled.Load(),
		Refiled: s.refiled.Load(), Renewals: s.renewals.Load(), RenewFailures: s.renewFailures.Load(),
		GrantsLost: s.grantsLost.Load(),
	}
}

func (w *Worker) emit(e WorkerEvent) {
	if w.o.OnEvent != nil {
		w.o.OnEvent(e)
	}
}

// counters are a Worker's counts, read by Stats.
type counters struct {
	claimed, takeovers, claimFailures, completed, rescheduled, escalated, replayed,
	stale, writeFailures, observations, late, spooled, refiled, renewals, renewFailures, grantsLost atomic.Int64
}
