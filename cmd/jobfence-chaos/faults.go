package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// faultResult is what became of one scheduled fault.
type faultResult struct {
	fault
	Started time.Duration // since the start of the fault window
	Skipped string        // why it was not applied, when it was not
	Err     error
}

// runFaults applies the plan from the start of the fault window (start)
// until ctx ends, lane by lane: the faults on one target run one after
// another, targets in parallel. A fault still active when ctx ends is
// reverted at once. It returns what became of each fault, in plan order.
func (s *system) runFaults(ctx context.Context, start time.Time, faults []fault) []faultResult {
	out := make([]faultResult, len(faults))
	lanes := map[string][]int{}
	var order []string
	for i, f := range faults {
		if lanes[f.Target] == nil {
			order = append(order, f.Target)
		}
		lanes[f.Target] = append(lanes[f.Target], i)
	}
	var wg sync.WaitGroup
	for _, target := range order {
		wg.Go(func() {
			for _, i := range lanes[target] {
				f := faults[i]
				out[i].fault = f
				if !sleepCtx(ctx, time.Until(start.Add(f.At))) {
					out[i].Skipped = "fault window over"
					continue
				}
				out[i].Started = time.Since(start)
				skipped, err := s.apply(ctx, f)
				out[i].Skipped, out[i].Err = skipped, err
				switch {
				case err != nil:
					s.tl.printf("fault #%d %s: error: %v", f.N, f.Target, err)
				case skipped != "":
					s.tl.printf("fault #%d %s %s: skipped: %s", f.N, f.Target, f.Kind, skipped)
				}
			}
		})
	}
	wg.Wait()
	return out
}

// apply runs one fault to its end (or until ctx ends) and reverts it. It
// returns why it was skipped, if it was.
func (s *system) apply(ctx context.Context, f fault) (string, error) {
	switch f.Kind {
	case faultWorkerStop, faultWorkerStopInJob, faultWorkerKill, faultWorkerZombie:
		w := s.workers[f.Slot]
		if !w.busy.TryLock() {
			return "the worker is held frozen by the db-failover", nil
		}
		defer w.busy.Unlock()
		if f.Kind == faultWorkerZombie {
			return s.applyZombie(ctx, f)
		}
		return s.applyWorker(ctx, f)
	case faultDBFailover:
		// Every worker's renewals may fail while the database fails over
		// (invariant 10).
		o := s.noteOutage(outage{What: string(f.Kind), N: f.N, From: time.Now()})
		defer s.endOutage(o)
		return s.applyFailover(ctx, f)
	case faultCoordinatorKill:
		if s.failingOver.Load() {
			// The coordinators that live through a failover are the proof
			// that they reconnect without a restart (R26).
			return "a database failover is under way", nil
		}
		r := s.replicas[f.Slot]
		p := r.current()
		if p == nil || p.exited() {
			return "coordinator not running", nil
		}
		holder := ""
		if s.cfg.retainSucceeded > 0 {
			// R31: the archive's lease holder is killed in the middle of a
			// batch when it has one: the batch is undone whole, and its lease
			// runs out before another coordinator archives.
			if held, gen := s.archiveLeaseHolder(ctx, p.pid()); held {
				holder = fmt.Sprintf(" (the archive's lease holder, generation %d; %s)", gen, s.awaitArchiveBatch(ctx))
			}
		}
		p.kill()
		s.tl.printf("fault #%d %s%s", f.N, f, holder)
		sleepCtx(ctx, f.For)
		if ctx.Err() != nil {
			return "", nil // heal restarts it
		}
		if err := s.restartReplica(ctx, r); err != nil {
			return "", nil // heal restarts it
		}
		s.tl.printf("fault #%d end: %s restarted", f.N, r.name)
		return "", nil
	case faultCoordinatorStreamCut:
		return s.applyStreamCut(ctx, f)
	case faultDBReset, faultDBLatency, faultDBDown, faultDBBlackhole, faultDBCommitCut:
		return s.applyDB(ctx, f)
	case faultWebhookDelay, faultWebhookDuplicate, faultWebhookReorder, faultWebhookBadSignature,
		faultWebhookOldTimestamp, faultWebhookDrop:
		return s.applyWebhook(ctx, f)
	case faultProviderSlow:
		return s.applySlow(ctx, f)
	default:
		return s.applyProvider(ctx, f)
	}
}

func (s *system) applyWorker(ctx context.Context, f fault) (string, error) {
	w := s.workers[f.Slot]
	p := w.current()
	if p == nil || p.exited() {
		return "worker not running", nil
	}
	switch f.Kind {
	case faultWorkerKill:
		s.tl.printf("fault #%d %s (%s)", f.N, f, p.name)
		p.kill()
		sleepCtx(ctx, f.For)
		if ctx.Err() != nil {
			return "", nil // heal starts a replacement
		}
		if err := s.startWorker(w); err != nil {
			return "", fmt.Errorf("start a replacement: %w", err)
		}
		s.tl.printf("fault #%d end: %s replaced by %s", f.N, p.name, w.current().name)
		return "", nil
	case faultWorkerStopInJob:
		// Freeze it right after its next claim, or as the provider makes
		// that claim's refund: the provider call or the write-back is then
		// in flight while the lease runs out.
		var rec map[string]any
		if f.AfterRefund {
			var skip string
			if _, rec, skip = s.claimedRefund(ctx, []*proc{p}); skip != "" {
				return skip, nil
			}
		} else {
			wait := min(5*time.Second, time.Until(deadlineOf(ctx)))
			var err error
			if rec, err = p.waitRecord(wait, p.recordCount(), msgIs("job claimed")); err != nil {
				return "no claim to freeze in: " + err.Error(), nil
			}
			time.Sleep(f.Delay)
		}
		if err := p.signal(syscall.SIGSTOP); err != nil {
			return err.Error(), nil
		}
		s.tl.printf("fault #%d %s (%s, job %v attempt %v)", f.N, f, p.name, rec["job_id"], rec["attempt"])
	default:
		if err := p.signal(syscall.SIGSTOP); err != nil {
			return err.Error(), nil
		}
		s.tl.printf("fault #%d %s (%s)", f.N, f, p.name)
	}
	sleepCtx(ctx, f.For)
	_ = p.signal(syscall.SIGCONT)
	return "", nil
}

// claimedRefund waits (up to 5 s, within the window) for the next claim of
// a job to refund by one of ps and for the provider to log that job's
// refund, and returns the claiming process and its claim's record.
func (s *system) claimedRefund(ctx context.Context, ps []*proc) (*proc, map[string]any, string) {
	wait := min(5*time.Second, time.Until(deadlineOf(ctx)))
	refunds := s.provider.recordCount()
	p, rec, err := waitAny(ps, wait, func(r map[string]any) bool {
		action, _ := r["next_action"].(string)
		return r["msg"] == "job claimed" && strings.EqualFold(action, "refund")
	})
	if err != nil {
		names := make([]string, len(ps))
		for i, p := range ps {
			names[i] = p.name
		}
		return nil, nil, fmt.Sprintf("no claim of a refund to act on: %s: %v", strings.Join(names, ", "), err)
	}
	key, _ := rec["operation_key"].(string)
	if _, err := s.provider.waitRecord(time.Second, refunds, func(r map[string]any) bool {
		return r["msg"] == "refund created" && r["idempotency_key"] == key
	}); err != nil {
		return nil, nil, fmt.Sprintf("the provider made no refund for %s within 1s", key)
	}
	return p, rec, ""
}

// applyZombie plays T1 with processes: the worker is frozen with the
// provider's success in hand; once another worker has taken the job over,
// that one is frozen and the zombie continues, so its write-back under the
// old attempt meets the job running under the new one — the fence must
// reject it (R8, R9) and the success must be filed (R15). Then the new
// holder continues.
func (s *system) applyZombie(ctx context.Context, f fault) (string, error) {
	w := s.workers[f.Slot]
	zombie := w.current()
	if zombie == nil || zombie.exited() {
		return "worker not running", nil
	}
	_, rec, skip := s.claimedRefund(ctx, []*proc{zombie})
	if skip != "" {
		return skip, nil
	}
	job, attempt := num(rec["job_id"]), num(rec["attempt"])
	if err := zombie.signal(syscall.SIGSTOP); err != nil {
		return err.Error(), nil
	}
	defer zombie.signal(syscall.SIGCONT) //nolint:errcheck // gone is fine
	s.tl.printf("fault #%d %s (%s, job %d attempt %d)", f.N, f, zombie.name, job, attempt)
	var others []*proc
	for _, o := range s.workers {
		if p := o.current(); o != w && p != nil && !p.exited() {
			others = append(others, p)
		}
	}
	wait := min(f.For, time.Until(deadlineOf(ctx)))
	holder, trec, err := waitAny(others, wait, func(r map[string]any) bool {
		msg, _ := r["msg"].(string)
		return (msg == "job claimed" || msg == "job taken over") && num(r["job_id"]) == job && num(r["attempt"]) > attempt
	})
	if err != nil {
		s.tl.printf("fault #%d end: nobody took job %d over (%v); %s continues", f.N, job, err, zombie.name)
		return "", nil
	}
	_ = holder.signal(syscall.SIGSTOP)
	_ = zombie.signal(syscall.SIGCONT)
	s.tl.printf("fault #%d: %s took job %d over (attempt %d) and is frozen; %s continues", f.N, holder.name, job,
		num(trec["attempt"]), zombie.name)
	sleepCtx(ctx, f.Hold)
	_ = holder.signal(syscall.SIGCONT)
	return "", nil
}

func (s *system) applyDB(ctx context.Context, f fault) (string, error) {
	px := s.replicas[f.Slot].proxy
	name := fmt.Sprintf("fault-%d", f.N)
	from := time.Now()
	var err error
	switch f.Kind {
	case faultDBReset:
		err = px.addToxic(name, "reset_peer", f.Stream, map[string]any{"timeout": 0})
	case faultDBLatency:
		err = px.addToxic(name, "latency", "downstream",
			map[string]any{"latency": f.Latency.Milliseconds(), "jitter": f.Jitter.Milliseconds()})
	case faultDBBlackhole:
		err = px.addToxic(name, "timeout", f.Stream, map[string]any{"timeout": 0})
	case faultDBCommitCut:
		err = px.addToxic(name, commitCutType, "upstream", map[string]any{"deliver": f.Deliver, "count": f.Count})
	case faultDBDown:
		px.Down()
	}
	if err != nil {
		return "", err
	}
	if f.Kind != faultDBCommitCut {
		// The replica's renewals may fail or crawl until the fault ends
		// (invariant 10). A commit-cut is not such a fault: it cuts at most
		// four COMMITs and a failed renewal is repeated at once.
		o := s.noteOutage(outage{What: string(f.Kind), N: f.N, Replica: s.replicas[f.Slot].name, From: from})
		defer s.endOutage(o)
	}
	s.tl.printf("fault #%d %s", f.N, f)
	sleepCtx(ctx, f.For)
	if f.Kind == faultDBDown {
		return "", px.Up()
	}
	if f.Kind == faultDBCommitCut {
		n := px.cuts(name)
		if f.Deliver {
			s.cutsDelivered.Add(n)
		} else {
			s.cutsDropped.Add(n)
		}
		s.tl.printf("fault #%d end: %d COMMIT(s) cut", f.N, n)
	}
	px.removeToxic(name)
	return "", nil
}

func (s *system) applyProvider(ctx context.Context, f fault) (string, error) {
	var fs fakeprovider.Faults
	switch f.Kind {
	case faultProviderHangBefore:
		fs.HangBefore = f.Amount
	case faultProviderHangAfter:
		fs.HangAfter = f.Amount
	case faultProviderCutReply:
		fs.CutReply, fs.Times = true, f.Count
	case faultProviderPending:
		fs.Pending = f.Amount
	case faultProviderLookupLag:
		fs.LookupLag = f.Amount
	case faultProviderErrors:
		fs.ErrorBurst = f.Count
	case faultProviderFail:
		fs.Fail, fs.Times = true, 1
	}
	fs.LookupLag = max(fs.LookupLag, f.Lag)
	// The admin API is never subject to faults; its own context is not the
	// window's, so that a fault set at the window's end is still cleared.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.setAPIFaults(actx, fs); err != nil {
		return "", fmt.Errorf("set provider faults: %w", err)
	}
	s.tl.printf("fault #%d %s", f.N, f)
	sleepCtx(ctx, f.For)
	cctx, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel2()
	if err := s.setAPIFaults(cctx, fakeprovider.Faults{}); err != nil {
		return "", fmt.Errorf("clear provider faults: %w", err)
	}
	return "", nil
}

// applySlow runs one provider-slow fault: every create takes f.Amount, more
// than the lease, before or after acting, while it lasts. A hang of the
// provider lane at the same time gives way to the longer of the two.
func (s *system) applySlow(ctx context.Context, f fault) (string, error) {
	var hangs fakeprovider.Faults
	if f.Before {
		hangs.HangBefore = f.Amount
	} else {
		hangs.HangAfter = f.Amount
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.setSlowFaults(actx, hangs); err != nil {
		return "", fmt.Errorf("set provider-slow faults: %w", err)
	}
	s.tl.printf("fault #%d %s", f.N, f)
	sleepCtx(ctx, f.For)
	cctx, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel2()
	if err := s.setSlowFaults(cctx, fakeprovider.Faults{}); err != nil {
		return "", fmt.Errorf("clear provider-slow faults: %w", err)
	}
	return "", nil
}

// deadlineOf is ctx's deadline, or an hour from now when it has none.
func deadlineOf(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(time.Hour)
}
