package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	jobfence "github.com/jobfence/jobfence/clients/go"
)

// refundSpec is one refund the producer enqueues.
type refundSpec struct {
	Key, Order, Payment string
	AmountMinor         int64
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
	acked   map[string]int64 // operation key → job id, for enqueues the coordinator confirmed
	failed  map[string]error // keys never confirmed, with the last error
	retries int
}

// produce registers each refund's payment with the provider (so that an
// over-refund shows in the oracle) and enqueues it, spreading the refunds
// evenly over spread so that faults find work in flight. An enqueue that
// fails is repeated, alternating replicas, until ctx ends: the operation key
// makes a repeat safe (R1).
func (s *system) produce(ctx context.Context, specs []refundSpec, spread time.Duration) *production {
	out := &production{acked: map[string]int64{}, failed: map[string]error{}}
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
	start := time.Now()
	for n, sp := range specs {
		due := start.Add(spread * time.Duration(n) / time.Duration(max(len(specs), 1)))
		if !sleepCtx(ctx, time.Until(due)) {
			out.failed[sp.Key] = ctx.Err()
			continue
		}
		var err error
		acked := false
		for try := 0; ctx.Err() == nil && !acked; try++ {
			err = s.pay.RegisterPayment(ctx, sp.Payment, sp.AmountMinor, "EUR")
			if err == nil {
				var job jobfence.Job
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				job, _, err = clients[(n+try)%len(clients)].EnqueueRefund(cctx, jobfence.EnqueueRequest{
					OperationKey: sp.Key, OrderID: sp.Order, PaymentID: sp.Payment,
					AmountMinor: sp.AmountMinor, Currency: "EUR", Provider: providerName,
				})
				cancel()
				if err == nil {
					out.mu.Lock()
					out.acked[sp.Key] = job.ID
					out.mu.Unlock()
					acked = true
					continue
				}
				if errors.Is(err, jobfence.ErrKeyConflict) {
					break // a bug, not a fault: reported by the checks
				}
			}
			out.mu.Lock()
			out.retries++
			out.mu.Unlock()
			sleepCtx(ctx, 300*time.Millisecond)
		}
		if !acked {
			if err == nil {
				err = ctx.Err()
			}
			out.failed[sp.Key] = err
		}
	}
	return out
}

// ackedCount is how many enqueues were confirmed so far.
func (p *production) ackedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}
