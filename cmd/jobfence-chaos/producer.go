package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
)

// refundSpec is one refund the producer enqueues.
type refundSpec struct {
	Key, Order, Payment string
	AmountMinor         int64
	// NotBeforeIn dates the refund in the future: the producer enqueues it
	// with a not_before this long after its first enqueue (0: due at once).
	// Beyond: that is a year, past the campaign's end
	// (dateSomeInTheFuture).
	NotBeforeIn time.Duration
	Beyond      bool
}

// refundSpecs are the campaign's n refunds; keys carry the seed, so that
// two campaigns' records never mix.
func refundSpecs(seed uint64, n int) []refundSpec {
	out := make([]refundSpec, n)
	for i := range out {
		key := fmt.Sprintf("chaos-%d-%05d", seed, i+1)
		out[i] = refundSpec{Key: key, Order: "order-" + key, Payment: "pay-" + key,
			AmountMinor: 500 + int64(i*37%5000)}
	}
	return out
}

// production is what the producer achieved.
type production struct {
	mu      sync.Mutex
	acked   map[string]int64     // operation key → job id, for enqueues the coordinator confirmed
	ackedAt map[string]time.Time // operation key → when it was first confirmed
	failed  map[string]error     // keys never confirmed, with the last error
	retries int
	// notBefore is the not_before each future-dated refund was enqueued
	// with (by operation key), fixed at its first enqueue and sent again
	// with every repeat: the time no refund of it may be made before (R28).
	notBefore map[string]time.Time

	// After a database failover (--failover): the acknowledged enqueues
	// enqueued again, and those of them the new primary did not have
	// (answered created: true) — lost with the old primary.
	redriven       int
	lostInFailover []string
	redriveDone    bool

	// answers are what every enqueue and re-drive was answered, in order
	// (invariant 12).
	answers answerLog
}

// enqueueAnswer is one answer the producer had to an enqueue of an
// operation key (R1, R30): the job it names, or the error it ended with.
type enqueueAnswer struct {
	Key string
	// Why is the enqueue's reason: answerFirst, answerRedrive or
	// answerLate.
	Why     string
	JobID   int64
	Created bool
	// ArchivedAt is when the job the answer names was archived, as the
	// answer says (zero for a live job).
	ArchivedAt time.Time
	// OtherValues: sent with another amount than the refund's, which must
	// be answered OPERATION_KEY_CONFLICT (R1, R30).
	OtherValues bool
	// WasArchived: the key's job was in the archive when the re-enqueue
	// was sent (read just before it); DueForArchive: it had completed more
	// than the retention before, and was still in the working tables.
	WasArchived, DueForArchive bool
	// Conflict: answered OPERATION_KEY_CONFLICT; Err: not answered at all
	// (the repeats spent), with the last error.
	Conflict bool
	Err      string
	// At is when the answer came.
	At time.Time
}

// The reasons of an enqueue.
const (
	answerFirst   = "enqueue" // the producer's own, with its repeats after errors
	answerRedrive = "redrive" // the re-drive of an acknowledged enqueue after a failover
	answerLate    = "late"    // a re-enqueue of a key whose job completed more than the retention before
)

// produce registers each refund's payment with the provider (so that an
// over-refund shows in the oracle) and enqueues it, spreading the refunds
// evenly over spread so that faults find work in flight. An enqueue that
// fails is repeated, alternating replicas, until ctx ends: the operation key
// makes a repeat safe (R1). A future-dated refund due within the window is
// due by dueBy however late the producer is (a producer held up by the
// faults would else carry it past the window and stretch the settle), but
// never sooner than futureLeadMin after its enqueue. With a failover, once
// s.redrive is closed (the proxies point at the new primary), every enqueue
// acknowledged so far is made again, between two of the producer's own
// (redrive).
func (s *system) produce(ctx context.Context, specs []refundSpec, spread time.Duration, dueBy time.Time) *production {
	out := &production{acked: map[string]int64{}, ackedAt: map[string]time.Time{}, notBefore: map[string]time.Time{},
		failed: map[string]error{}}
	s.prod.Store(out)
	clients := make([]*jobfence.Client, len(s.replicas))
	for i, r := range s.replicas {
		c, err := jobfence.Dial(r.listen, jobfence.WithCallTimeout(3*time.Second))
		if err != nil {
			for _, sp := range specs {
				out.failed[sp.Key] = err
			}
			return out
		}
		defer c.Close()
		clients[i] = c
	}
	specByKey := map[string]refundSpec{}
	for _, sp := range specs {
		specByKey[sp.Key] = sp
	}
	redriveIfDue := func() {
		if s.redrive == nil || out.redriveDone {
			return
		}
		select {
		case <-s.redrive:
			s.redriveAcked(ctx, clients, specByKey, out)
		default:
		}
	}
	start := time.Now()
	for n, sp := range specs {
		due := start.Add(spread * time.Duration(n) / time.Duration(max(len(specs), 1)))
		for time.Now().Before(due) && ctx.Err() == nil {
			redriveIfDue()
			sleepCtx(ctx, min(time.Until(due), 50*time.Millisecond))
		}
		if ctx.Err() != nil {
			out.failed[sp.Key] = ctx.Err()
			continue
		}
		redriveIfDue()
		if sp.NotBeforeIn > 0 {
			now := time.Now()
			nb := now.Add(sp.NotBeforeIn)
			if !sp.Beyond && nb.After(dueBy) {
				nb = maxTime(dueBy, now.Add(futureLeadMin))
			}
			// The database keeps microseconds: the not_before sent is the
			// one stored, to the microsecond.
			out.mu.Lock()
			out.notBefore[sp.Key] = nb.Truncate(time.Microsecond)
			out.mu.Unlock()
		}
		job, created, err := s.enqueue(ctx, clients, n, sp, out)
		if ctx.Err() == nil {
			out.answers.record(enqueueAnswer{Key: sp.Key, Why: answerFirst}, job, created, err)
		}
		if err != nil {
			out.failed[sp.Key] = err
			continue
		}
		out.mu.Lock()
		out.acked[sp.Key] = job.ID
		out.ackedAt[sp.Key] = time.Now()
		out.mu.Unlock()
		s.feedCanceller(sp.Key, job.ID)
	}
	// A failover after the last enqueue still needs its re-drive.
	if s.redrive != nil && !out.redriveDone {
		select {
		case <-s.redrive:
			s.redriveAcked(ctx, clients, specByKey, out)
		case <-ctx.Done():
		}
	}
	return out
}

// enqueue enqueues sp until it is acknowledged or ctx ends, starting with
// replica n and alternating, with the not_before out holds for it (none:
// due at once). Errors: an operation key conflict (a bug, not a fault: the
// checks report it) or ctx's end.
func (s *system) enqueue(ctx context.Context, clients []*jobfence.Client, n int, sp refundSpec,
	out *production) (jobfence.Job, bool, error) {
	out.mu.Lock()
	notBefore := out.notBefore[sp.Key]
	out.mu.Unlock()
	var err error
	for try := 0; ctx.Err() == nil; try++ {
		err = s.pay.RegisterPayment(ctx, sp.Payment, sp.AmountMinor, "EUR")
		if err == nil {
			var job jobfence.Job
			var created bool
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			replica := (n + try) % len(clients)
			if notBefore.IsZero() {
				// A stream cut at an enqueue waits for one whose job is
				// granted at once; a future-dated one is granted nothing.
				s.enqueueCues.fire(replica, sp.Key)
			}
			job, created, err = clients[replica].EnqueueRefund(cctx, jobfence.EnqueueRequest{
				OperationKey: sp.Key, OrderID: sp.Order, PaymentID: sp.Payment,
				AmountMinor: sp.AmountMinor, Currency: "EUR", Provider: providerName, NotBefore: notBefore,
			})
			cancel()
			if err == nil || errors.Is(err, jobfence.ErrKeyConflict) {
				return job, created, err
			}
		}
		out.mu.Lock()
		out.retries++
		out.mu.Unlock()
		sleepCtx(ctx, 300*time.Millisecond)
	}
	if err == nil {
		err = ctx.Err()
	}
	return jobfence.Job{}, false, err
}

// redriveAcked is the operational step an async failover needs: every
// enqueue acknowledged so far is made again (idempotent by operation key,
// R1), because those the old primary committed last are gone with it. An
// answer created: true is such a lost enqueue; its job has a new id.
func (s *system) redriveAcked(ctx context.Context, clients []*jobfence.Client, specs map[string]refundSpec, out *production) {
	out.mu.Lock()
	keys := make([]string, 0, len(out.acked))
	for k := range out.acked {
		keys = append(keys, k)
	}
	out.redriveDone = true
	out.mu.Unlock()
	if !s.failoverApplied() {
		return // no promote, nothing lost
	}
	sort.Strings(keys)
	began := time.Now()
	for n, k := range keys {
		job, created, err := s.enqueue(ctx, clients, n, specs[k], out)
		if ctx.Err() == nil {
			out.answers.record(enqueueAnswer{Key: k, Why: answerRedrive}, job, created, err)
		}
		if err != nil {
			s.tl.printf("producer: re-drive of %s after the failover failed: %v", k, err)
			continue
		}
		out.mu.Lock()
		out.redriven++
		if created {
			out.lostInFailover = append(out.lostInFailover, k)
		}
		out.acked[k] = job.ID
		out.mu.Unlock()
	}
	out.mu.Lock()
	lost := len(out.lostInFailover)
	out.mu.Unlock()
	s.tl.printf("producer: re-drove %d acknowledged enqueues after the failover in %s; %d were lost with the old "+
		"primary (created again)", len(keys), time.Since(began).Round(10*time.Millisecond), lost)
}

// notBeforeOf is the not_before key was enqueued with, and whether the
// refund is future-dated and was enqueued (or is being) at all.
func (p *production) notBeforeOf(key string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.notBefore[key]
	return t, ok
}

// ackedCount is how many enqueues were confirmed so far.
func (p *production) ackedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

// ackedBefore reports whether key's enqueue was confirmed before t.
func (p *production) ackedBefore(key string, t time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.ackedAt[key]
	return ok && at.Before(t)
}
