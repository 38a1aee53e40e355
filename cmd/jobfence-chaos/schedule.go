package main

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// faultKind names one kind of fault.
type faultKind string

// The fault kinds, by what they hit.
const (
	// Workers: frozen across their lease's expiry (the zombie of T1), frozen
	// right after a claim while the job is in flight, killed and replaced.
	faultWorkerStop      faultKind = "worker-stop"
	faultWorkerStopInJob faultKind = "worker-stop-in-job"
	faultWorkerKill      faultKind = "worker-kill"
	// The zombie of T1 on cue: frozen with the provider's answer in hand,
	// woken the moment another worker has taken its job over, while that
	// worker is held frozen in turn, so the zombie's write-back meets a job
	// still running under the newer attempt.
	faultWorkerZombie faultKind = "worker-zombie"
	// Coordinators: killed and restarted with the same flags; or left
	// running while every connection of its workers is cut (their worker
	// streams and unary calls, mid-flight: a grant being sent, a
	// write-back between its COMMIT and its reply), new ones refused for a
	// moment, as a load balancer or a NAT in front of it that drops its
	// connections would.
	faultCoordinatorKill      faultKind = "coordinator-kill"
	faultCoordinatorStreamCut faultKind = "coordinator-stream-cut"
	// One replica's database connections: cut when data next flows (a reply
	// or a request lost, COMMITs included), delayed, refused, blackholed,
	// or cut exactly at a COMMIT.
	faultDBReset     faultKind = "db-reset"
	faultDBLatency   faultKind = "db-latency"
	faultDBDown      faultKind = "db-down"
	faultDBBlackhole faultKind = "db-blackhole"
	faultDBCommitCut faultKind = "db-commit-cut"
	// The database itself, with --failover only: the replica is held back,
	// grants land on the primary only, the primary is killed and the replica
	// promoted; every proxy is repointed at it (R26).
	faultDBFailover faultKind = "db-failover"
	// The provider: hangs before or after acting, replies cut after the
	// refund (T3), pending refunds (R4), lookups that miss fresh refunds
	// (R14), 503 bursts, declined refunds.
	faultProviderHangBefore faultKind = "provider-hang-before"
	faultProviderHangAfter  faultKind = "provider-hang-after"
	faultProviderCutReply   faultKind = "provider-cut-reply"
	faultProviderPending    faultKind = "provider-pending"
	faultProviderLookupLag  faultKind = "provider-lookup-lag"
	faultProviderErrors     faultKind = "provider-error-burst"
	faultProviderFail       faultKind = "provider-fail"
	// Provider calls longer than the lease: every create takes 1.5 to 3
	// leases, before or after acting. A patient worker waits it out and
	// renews its lease meanwhile, so nobody takes the job over (R27); the
	// others give up at their deadline, outcome unknown (R14).
	faultProviderSlow faultKind = "provider-slow"
	// The provider's webhooks (R28), on the events of the refunds it makes
	// while the fault lasts: held back before their first delivery,
	// delivered twice, delivered newest first, first delivery signed with a
	// wrong secret or a stale timestamp (the provider delivers again), or
	// never sent at all (webhook-drop: only when named, see optInKinds).
	faultWebhookDelay        faultKind = "webhook-delay"
	faultWebhookDuplicate    faultKind = "webhook-duplicate"
	faultWebhookReorder      faultKind = "webhook-reorder"
	faultWebhookBadSignature faultKind = "webhook-bad-signature"
	faultWebhookOldTimestamp faultKind = "webhook-old-timestamp"
	faultWebhookDrop         faultKind = "webhook-drop"
)

// faultGroups maps the group names of --faults to their kinds.
var faultGroups = map[string][]faultKind{
	"worker":      {faultWorkerStop, faultWorkerStopInJob, faultWorkerZombie, faultWorkerKill},
	"coordinator": {faultCoordinatorKill, faultCoordinatorStreamCut},
	"db":          {faultDBReset, faultDBLatency, faultDBDown, faultDBBlackhole, faultDBCommitCut},
	"provider": {faultProviderHangBefore, faultProviderHangAfter, faultProviderCutReply, faultProviderPending,
		faultProviderLookupLag, faultProviderErrors, faultProviderFail, faultProviderSlow},
	"webhook": {faultWebhookDelay, faultWebhookDuplicate, faultWebhookReorder, faultWebhookBadSignature,
		faultWebhookOldTimestamp},
}

// optInKinds are kinds that neither "all" nor a group draws: a campaign has
// them only when --faults names them. A dropped webhook is a receipt the
// provider never sends, so the check of R28's receipts must leave its
// refund out (known from the provider's own record); by default every
// refund's receipt is owed.
var optInKinds = []faultKind{faultWebhookDrop}

// allFaultKinds lists every kind --faults may name, in a stable order.
// db-failover is not one of them: --failover plans it.
func allFaultKinds() []faultKind {
	var out []faultKind
	for _, g := range []string{"worker", "coordinator", "db", "provider", "webhook"} {
		out = append(out, faultGroups[g]...)
	}
	return append(out, optInKinds...)
}

// parseFaultKinds reads --faults: "all", or a comma-separated list of kinds
// and group names. Errors: an unknown name.
func parseFaultKinds(s string) (map[faultKind]bool, error) {
	out := map[faultKind]bool{}
	known := map[faultKind]bool{}
	for _, k := range allFaultKinds() {
		known[k] = true
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		switch {
		case part == "":
		case part == "all":
			for k := range known {
				if !slices.Contains(optInKinds, k) {
					out[k] = true
				}
			}
		case faultGroups[part] != nil:
			for _, k := range faultGroups[part] {
				out[k] = true
			}
		case known[faultKind(part)]:
			out[faultKind(part)] = true
		default:
			return nil, fmt.Errorf("unknown fault kind or group %q", part)
		}
	}
	return out, nil
}

// fault is one scheduled fault. Which fields matter depends on Kind.
type fault struct {
	N      int           // its number in the campaign, from 1, in order of At
	At     time.Duration // when it starts, from the start of the fault window
	Kind   faultKind
	Target string // worker-N, replica-X, replica-X-workers, replica-X-db, provider, provider-slow, provider-webhooks or database
	Slot   int    // worker slot or replica index
	For    time.Duration

	Latency, Jitter time.Duration // db-latency
	Count           int           // db-commit-cut, provider-cut-reply, provider-error-burst
	Deliver         bool          // db-commit-cut: COMMIT reaches the server before the cut
	Stream          string        // db-reset, db-blackhole: "downstream" (replies) or "upstream" (requests)
	Amount          time.Duration // provider hang, pending time or lookup lag; webhook-delay's hold
	Delay           time.Duration // worker-stop-in-job: from the claim's log record to SIGSTOP; coordinator-stream-cut: from its cue to the cut
	AfterRefund     bool          // worker-stop-in-job: SIGSTOP when the provider logs the claimed job's refund; coordinator-stream-cut: cut then
	AtEnqueue       bool          // coordinator-stream-cut: cut Delay after the producer sends an enqueue through the replica
	Hold            time.Duration // worker-zombie: how long the new holder stays frozen after the zombie wakes
	Lag             time.Duration // provider-cut-reply, provider-hang-after: lookup lag of the refunds made
	Mode            string        // db-failover: async or semi-sync
	Before          bool          // provider-slow: the create waits before acting (else after)
	Pause           time.Duration // db-failover: the workers' pause before the hold-back
}

// webhookModes are the fake provider's webhook faults of a webhook-* fault
// (for the events of the refunds made while it lasts); zero for any other.
func (f fault) webhookModes() fakeprovider.Faults {
	var m fakeprovider.Faults
	switch f.Kind {
	case faultWebhookDelay:
		m.WebhookDelay = f.Amount
	case faultWebhookDuplicate:
		m.WebhookDuplicate = true
	case faultWebhookReorder:
		m.WebhookReorder = true
	case faultWebhookBadSignature:
		m.WebhookBadSignature = true
	case faultWebhookOldTimestamp:
		m.WebhookOldTimestamp = true
	case faultWebhookDrop:
		m.WebhookDrop = true
	}
	return m
}

// String describes the fault for the timeline.
func (f fault) String() string {
	s := fmt.Sprintf("%s %s", f.Target, f.Kind)
	switch f.Kind {
	case faultWorkerStop:
		s += fmt.Sprintf(" SIGSTOP for %s", round(f.For))
	case faultWorkerStopInJob:
		if f.AfterRefund {
			s += fmt.Sprintf(" SIGSTOP as the provider makes a claimed job's refund, for %s", round(f.For))
		} else {
			s += fmt.Sprintf(" SIGSTOP %s after a claim, for %s", round(f.Delay), round(f.For))
		}
	case faultWorkerZombie:
		s += fmt.Sprintf(" SIGSTOP as the provider makes a claimed job's refund, SIGCONT once another worker took the job "+
			"over (that one held for %s)", round(f.Hold))
	case faultWorkerKill:
		s += fmt.Sprintf(" SIGKILL, replacement after %s", round(f.For))
	case faultCoordinatorKill:
		s += fmt.Sprintf(" SIGKILL, restart after %s", round(f.For))
	case faultCoordinatorStreamCut:
		s += fmt.Sprintf(" %s's worker connections cut (streams and calls)", replicaName(f.Slot))
		switch {
		case f.AfterRefund:
			s += fmt.Sprintf(" %s after the provider makes the refund of a job one of them claimed (its write-back in flight)",
				round(f.Delay))
		case f.AtEnqueue:
			s += fmt.Sprintf(" %s after the producer sends an enqueue through it (its job's grant in flight)", round(f.Delay))
		}
		s += fmt.Sprintf(", new ones refused for %s", round(f.For))
	case faultDBReset:
		s += fmt.Sprintf(" reset_peer %s for %s", f.Stream, round(f.For))
	case faultDBLatency:
		s += fmt.Sprintf(" latency %s±%s for %s", round(f.Latency), round(f.Jitter), round(f.For))
	case faultDBDown:
		s += fmt.Sprintf(" proxy down for %s", round(f.For))
	case faultDBBlackhole:
		s += fmt.Sprintf(" blackhole %s for %s, then cut", f.Stream, round(f.For))
	case faultDBCommitCut:
		where := "before"
		if f.Deliver {
			where = "after"
		}
		s += fmt.Sprintf(" cut the next %d COMMIT(s) %s they reach the server, for up to %s", f.Count, where, round(f.For))
	case faultProviderHangBefore, faultProviderHangAfter:
		s += fmt.Sprintf(" %s per create, for %s", round(f.Amount), round(f.For))
	case faultProviderCutReply:
		s += fmt.Sprintf(" next %d create replies, for up to %s", f.Count, round(f.For))
	case faultProviderPending:
		s += fmt.Sprintf(" refunds pending %s, for %s", round(f.Amount), round(f.For))
	case faultProviderLookupLag:
		s += fmt.Sprintf(" lookups miss refunds younger than %s, for %s", round(f.Amount), round(f.For))
	case faultProviderErrors:
		s += fmt.Sprintf(" next %d requests answer 503", f.Count)
	case faultProviderFail:
		s += " next create is declined"
	case faultProviderSlow:
		where := "after"
		if f.Before {
			where = "before"
		}
		s += fmt.Sprintf(" every create takes %s %s acting, for %s", round(f.Amount), where, round(f.For))
	case faultWebhookDelay:
		s += fmt.Sprintf(" events of new refunds held %s before their first delivery, for %s", round(f.Amount), round(f.For))
	case faultWebhookDuplicate:
		s += fmt.Sprintf(" events of new refunds delivered twice, for %s", round(f.For))
	case faultWebhookReorder:
		s += fmt.Sprintf(" events of new refunds held until the last one, then delivered newest first, for %s", round(f.For))
	case faultWebhookBadSignature:
		s += fmt.Sprintf(" first delivery of each new event signed with a wrong secret, for %s", round(f.For))
	case faultWebhookOldTimestamp:
		s += fmt.Sprintf(" first delivery of each new event signed 10 minutes in the past, for %s", round(f.For))
	case faultWebhookDrop:
		s += fmt.Sprintf(" events of new refunds never sent, for %s", round(f.For))
	case faultDBFailover:
		where, zombie := "on the primary only", "a zombie of a lost grant writes after its re-grant"
		if f.Mode == failoverSemiSync {
			where, zombie = "the replica receives but does not apply", "a zombie of one of them writes after its takeover"
		}
		s += fmt.Sprintf(" (%s): pause the workers %s, hold the replica back, wait for 3 grants %s (at most %s), "+
			"kill -9 the primary, promote the replica after %s, repoint every proxy; %s (whose holder is held %s)",
			f.Mode, round(f.Pause), where, round(f.For), round(f.Delay), zombie, round(f.Hold))
	}
	if f.Lag > 0 {
		s += fmt.Sprintf("; those refunds stay out of lookups for %s", round(f.Lag))
	}
	return s
}

func round(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// planParams are what a fault plan depends on; the same params and seed give
// the same plan.
type planParams struct {
	Window   time.Duration // the fault window
	Workers  int
	Replicas int
	Lease    time.Duration
	Kinds    map[faultKind]bool
	// Rate scales how often faults come: the pauses between two faults on
	// one target are divided by it (0 means 1).
	Rate float64
	// Failover, when set (async or semi-sync), adds one db-failover.
	Failover string
	// Webhooks: the provider sends webhooks (--webhooks), so the webhook
	// lane is planned.
	Webhooks bool
}

// lane is a sequence of faults on one target; a lane's faults never overlap.
type lane struct {
	target string
	slot   int
	gap    [2]time.Duration // pause between two faults, drawn uniformly
	kinds  []weighted
}

type weighted struct {
	kind   faultKind
	weight int
}

// plan draws the campaign's faults from seed: one lane per worker slot, per
// replica (process), per replica's worker front, per replica's database
// proxy and one for the provider, each with its own random stream (seeded
// by the seed and the target's name), so that the plan of one lane does not
// change when another target is added. Faults are numbered in order of At.
func plan(seed uint64, p planParams) []fault {
	var lanes []lane
	for i := range p.Workers {
		lanes = append(lanes, lane{target: fmt.Sprintf("worker-%d", i+1), slot: i,
			gap:   [2]time.Duration{3 * time.Second, 10 * time.Second},
			kinds: []weighted{{faultWorkerStop, 2}, {faultWorkerStopInJob, 3}, {faultWorkerZombie, 3}, {faultWorkerKill, 2}}})
	}
	for i := range p.Replicas {
		lanes = append(lanes, lane{target: replicaName(i), slot: i,
			gap:   [2]time.Duration{8 * time.Second, 20 * time.Second},
			kinds: []weighted{{faultCoordinatorKill, 1}}})
	}
	for i := range p.Replicas {
		// A lane of its own, so that the coordinator lane's plan is what it
		// was before the worker streams.
		lanes = append(lanes, lane{target: replicaName(i) + workersTargetSuffix, slot: i,
			gap:   [2]time.Duration{8 * time.Second, 20 * time.Second},
			kinds: []weighted{{faultCoordinatorStreamCut, 1}}})
	}
	for i := range p.Replicas {
		lanes = append(lanes, lane{target: replicaName(i) + "-db", slot: i,
			gap: [2]time.Duration{2 * time.Second, 8 * time.Second},
			kinds: []weighted{{faultDBReset, 3}, {faultDBLatency, 2}, {faultDBDown, 1}, {faultDBBlackhole, 1},
				{faultDBCommitCut, 4}}})
	}
	lanes = append(lanes, lane{target: "provider", gap: [2]time.Duration{1 * time.Second, 5 * time.Second},
		kinds: []weighted{{faultProviderHangBefore, 2}, {faultProviderHangAfter, 3}, {faultProviderCutReply, 3},
			{faultProviderPending, 2}, {faultProviderLookupLag, 2}, {faultProviderErrors, 2}, {faultProviderFail, 1}}})
	// A lane of its own, every 6–12 s, so that every campaign has its slow
	// calls and the provider lane's plan is what it was before them; the
	// two lanes' faults are merged at the provider (system.setSlowFaults).
	lanes = append(lanes, lane{target: slowTarget, gap: [2]time.Duration{6 * time.Second, 12 * time.Second},
		kinds: []weighted{{faultProviderSlow, 1}}})
	if p.Webhooks {
		// A lane of its own, so that the provider lane's plan is the same
		// with webhooks or without; the two lanes' faults are merged at the
		// provider (system.setProviderFaults).
		lanes = append(lanes, lane{target: webhookTarget, gap: [2]time.Duration{1 * time.Second, 4 * time.Second},
			kinds: []weighted{{faultWebhookDelay, 3}, {faultWebhookDuplicate, 3}, {faultWebhookReorder, 2},
				{faultWebhookBadSignature, 2}, {faultWebhookOldTimestamp, 2}, {faultWebhookDrop, 1}}})
	}

	var out []fault
	for _, l := range lanes {
		var kinds []weighted
		total := 0
		for _, k := range l.kinds {
			if p.Kinds[k.kind] {
				kinds = append(kinds, k)
				total += k.weight
			}
		}
		if total == 0 {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(l.target))
		rng := rand.New(rand.NewPCG(seed, h.Sum64()))
		uniform := func(lo, hi time.Duration) time.Duration {
			return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
		}
		rate := p.Rate
		if rate <= 0 {
			rate = 1
		}
		gap := [2]time.Duration{time.Duration(float64(l.gap[0]) / rate), time.Duration(float64(l.gap[1]) / rate)}
		at := uniform(gap[0]/2, gap[1])
		for at < p.Window {
			pick := rng.IntN(total)
			var kind faultKind
			for _, k := range kinds {
				if pick < k.weight {
					kind = k.kind
					break
				}
				pick -= k.weight
			}
			f := draw(kind, rng, uniform, p.Lease)
			f.At, f.Target, f.Slot = at, l.target, l.slot
			out = append(out, f)
			at += f.For + uniform(gap[0], gap[1])
		}
	}
	if p.Failover != "" {
		out = append(out, planFailover(seed, p))
	}
	slices.SortStableFunc(out, func(a, b fault) int { return cmp.Compare(a.At, b.At) })
	for i := range out {
		out[i].N = i + 1
	}
	return out
}

// draw sets the parameters of one fault of kind.
func draw(kind faultKind, rng *rand.Rand, uniform func(lo, hi time.Duration) time.Duration, lease time.Duration) fault {
	f := fault{Kind: kind}
	stream := func() string {
		if rng.IntN(3) == 0 {
			return "upstream"
		}
		return "downstream"
	}
	switch kind {
	case faultWorkerStop:
		// Across lease expiry: another worker may take the job over while
		// this one is frozen (R6, R8, T1); now and then a short freeze that
		// ends before the lease does (T2's side).
		if rng.IntN(4) == 0 {
			f.For = uniform(300*time.Millisecond, lease/2)
		} else {
			f.For = lease + uniform(500*time.Millisecond, 3*time.Second)
		}
	case faultWorkerStopInJob:
		// Half of them a few milliseconds after the claim: before the
		// provider call, in it, after its answer or in the write-back
		// (loopback calls take about a millisecond). The other half the
		// moment the provider has made the refund: the worker wakes with
		// the provider's success in hand, often after a takeover (T3, R15).
		f.AfterRefund = rng.IntN(2) == 0
		if !f.AfterRefund {
			f.Delay = uniform(0, 6*time.Millisecond)
		}
		f.For = lease + uniform(500*time.Millisecond, 3*time.Second)
	case faultWorkerZombie:
		// For bounds the wait for a takeover; the zombie wakes as soon as
		// there is one.
		f.For = lease + 6*time.Second
		f.Hold = uniform(300*time.Millisecond, 1500*time.Millisecond)
	case faultWorkerKill:
		f.For = uniform(300*time.Millisecond, 2*time.Second)
	case faultCoordinatorKill:
		f.For = uniform(300*time.Millisecond, 3*time.Second)
	case faultCoordinatorStreamCut:
		// A third of them a few milliseconds after the provider made the
		// refund of a job a worker of the replica claimed: its Complete
		// before, in or after its COMMIT, or its reply on the way back
		// (R10, R21). A third as the producer enqueues through the
		// replica, which may hand the new job to a waiting stream in the
		// enqueue's own transaction: the grant committed and cut on its
		// way (handed back, or lost with the stream: R6, R7). A third take
		// new connections again almost at once (the workers reconnect
		// through their backoff); the others refuse them for 0.5–2 s,
		// their renewals failing meanwhile (R27).
		switch rng.IntN(3) {
		case 1:
			f.AfterRefund, f.Delay = true, uniform(0, 5*time.Millisecond)
		case 2:
			f.AtEnqueue, f.Delay = true, uniform(0, 10*time.Millisecond)
		}
		if rng.IntN(3) == 0 {
			f.For = uniform(20*time.Millisecond, 100*time.Millisecond)
		} else {
			f.For = uniform(500*time.Millisecond, 2*time.Second)
		}
	case faultDBReset:
		f.Stream = stream()
		f.For = uniform(100*time.Millisecond, 1500*time.Millisecond)
	case faultDBLatency:
		f.Latency = uniform(30*time.Millisecond, 600*time.Millisecond)
		f.Jitter = f.Latency / 3
		f.For = uniform(2*time.Second, 6*time.Second)
	case faultDBDown:
		f.For = uniform(500*time.Millisecond, 3*time.Second)
	case faultDBBlackhole:
		f.Stream = stream()
		f.For = uniform(500*time.Millisecond, 3*time.Second)
	case faultDBCommitCut:
		f.Count = 1 + rng.IntN(4)
		f.Deliver = rng.IntN(4) != 0
		f.For = uniform(2*time.Second, 6*time.Second)
	case faultProviderHangBefore:
		f.Amount = uniform(lease/2, lease+2*time.Second)
		f.For = uniform(1*time.Second, 5*time.Second)
	case faultProviderHangAfter:
		f.Amount = uniform(lease/2, lease+2*time.Second)
		f.For = uniform(1*time.Second, 5*time.Second)
		if rng.IntN(2) == 0 {
			f.Lag = uniform(time.Second, 4*time.Second)
		}
	case faultProviderCutReply:
		f.Count = 1 + rng.IntN(5)
		f.For = uniform(2*time.Second, 6*time.Second)
		// Half the time the refunds made under a cut reply also stay out of
		// lookups for a while: the reconcile finds no record and the job is
		// resent under the same key, which the provider must answer from
		// its idempotency store (R14).
		if rng.IntN(2) == 0 {
			f.Lag = uniform(time.Second, 4*time.Second)
		}
	case faultProviderPending:
		f.Amount = uniform(500*time.Millisecond, 5*time.Second)
		f.For = uniform(1*time.Second, 5*time.Second)
	case faultProviderLookupLag:
		f.Amount = uniform(500*time.Millisecond, 4*time.Second)
		f.For = uniform(1*time.Second, 5*time.Second)
	case faultProviderErrors:
		f.Count = 3 + rng.IntN(18)
		f.For = time.Second
	case faultProviderFail:
		f.For = uniform(500*time.Millisecond, 3*time.Second)
	case faultProviderSlow:
		// Longer than the lease, shorter than the patient workers'
		// deadline: only a renewed lease keeps the job from a takeover
		// while its holder waits (R27).
		f.Amount = uniform(lease*3/2, lease*slowCallMax)
		f.Before = rng.IntN(2) == 0
		f.For = uniform(1*time.Second, 4*time.Second)
	case faultWebhookDelay:
		// Some land while the job waits a second to reconcile (the receipt
		// makes it due now, R28), some after it completed (a late receipt
		// that must change nothing).
		f.Amount = uniform(300*time.Millisecond, 6*time.Second)
		f.For = uniform(2*time.Second, 8*time.Second)
	case faultWebhookDuplicate, faultWebhookReorder, faultWebhookBadSignature, faultWebhookOldTimestamp, faultWebhookDrop:
		f.For = uniform(2*time.Second, 8*time.Second)
	}
	return f
}

// slowCallMax is the longest provider-slow call, in leases; the shortest
// is 1.5 leases.
const slowCallMax = 3

// slowTarget is the lane of the provider-slow faults.
const slowTarget = "provider-slow"

// webhookTarget is the lane of the webhook faults.
const webhookTarget = "provider-webhooks"

// workersTargetSuffix names the lane of a replica's worker front
// (coordinator-stream-cut): replica-a-workers.
const workersTargetSuffix = "-workers"

// failoverTarget is the lane of the db-failover fault.
const failoverTarget = "database"

// planFailover draws the one db-failover of a campaign from its own stream
// (the seed and failoverTarget), so that it moves no other lane's faults: it
// starts between 35 and 50 % of the window; Pause is how long the workers
// are frozen before the hold-back (jobs wait, replicated, to be claimed on
// the primary only), For bounds the wait for grants on the primary only (2
// leases), Delay is the failure detection before the promote, Hold how long
// the re-grant's holder stays frozen while the zombie of the lost grant
// writes.
func planFailover(seed uint64, p planParams) fault {
	h := fnv.New64a()
	h.Write([]byte(failoverTarget))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	uniform := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	return fault{
		Kind: faultDBFailover, Target: failoverTarget, Mode: p.Failover,
		At:    uniform(p.Window*35/100, p.Window*50/100),
		For:   2 * p.Lease,
		Pause: uniform(800*time.Millisecond, 1500*time.Millisecond),
		Delay: uniform(400*time.Millisecond, 800*time.Millisecond),
		Hold:  uniform(300*time.Millisecond, 1500*time.Millisecond),
	}
}

// replicaName names replica i: replica-a, replica-b…
func replicaName(i int) string { return "replica-" + string(rune('a'+i)) }
