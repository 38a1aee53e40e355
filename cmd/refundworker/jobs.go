package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
)

// summary is the one line --jobs prints.
type summary struct {
	jobs, succeeded, manualReview, doubleRefunds int
	staleRejected                                int64
	// observations counts the receipts on file for the jobs (R15, R28),
	// whoever filed them: bySource splits them by the source's kind
	// (webhook, worker, other), for the log.
	observations int
	bySource     map[string]int
}

func (s summary) String() string {
	return fmt.Sprintf("jobs=%d succeeded=%d manual_review=%d double_refunds=%d stale_rejected=%d observations=%d",
		s.jobs, s.succeeded, s.manualReview, s.doubleRefunds, s.staleRejected, s.observations)
}

// runJobs enqueues c.jobs fresh refunds, works them with w until every one
// is final, and prints the summary. The worker drains before the summary is
// taken, so late receipts are counted.
func runJobs(ctx context.Context, c config, client *jobfence.Client, pay *fakeprovider.Client, w *jobfence.Worker,
	stdout io.Writer, log *slog.Logger) error {
	ids := make([]int64, 0, c.jobs)
	keys := make([]string, 0, c.jobs)
	payments := make([]string, 0, c.jobs)
	for n := 1; n <= c.jobs; n++ {
		key := c.keyPrefix + strconv.Itoa(n)
		payment := "pay-" + key
		// Registered so the oracle flags refunds beyond the payment.
		if err := pay.RegisterPayment(ctx, payment, c.amountMinor, c.currency); err != nil {
			return fmt.Errorf("register payment %s with the provider: %w", payment, err)
		}
		job, _, err := client.EnqueueRefund(ctx, jobfence.EnqueueRequest{
			OperationKey: key, OrderID: "order-" + key, PaymentID: payment,
			AmountMinor: c.amountMinor, Currency: c.currency, Provider: c.providerName,
		})
		if err != nil {
			return fmt.Errorf("enqueue %s: %w", key, err)
		}
		ids, keys, payments = append(ids, job.ID), append(keys, key), append(payments, payment)
	}
	log.Info("refunds enqueued", "jobs", c.jobs, "key_prefix", c.keyPrefix)

	wctx, stopWorker := context.WithCancel(ctx)
	defer stopWorker()
	ran := make(chan error, 1)
	go func() { ran <- w.Run(wctx) }()

	waitErr := waitFinal(ctx, c, client, ids, log)
	stopWorker()
	if err := <-ran; err != nil && waitErr == nil {
		waitErr = err
	}

	// A fresh context: the summary is taken even after a SIGTERM.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	s := summary{jobs: c.jobs, staleRejected: w.Stats().StaleRejected, bySource: map[string]int{}}
	for _, id := range ids {
		d, err := client.GetJob(sctx, id)
		if err != nil {
			return errors.Join(waitErr, fmt.Errorf("summary: job %d: %w", id, err))
		}
		switch d.Job.State {
		case jobfence.StateSucceeded:
			s.succeeded++
		case jobfence.StateManualReview:
			s.manualReview++
		}
		s.observations += len(d.Observations)
		for _, o := range d.Observations {
			kind, _, found := strings.Cut(o.Source, ":")
			if !found || (kind != "webhook" && kind != "worker") {
				kind = "other"
			}
			s.bySource[kind]++
		}
	}
	oracle, err := pay.Oracle(sctx)
	if err != nil {
		return errors.Join(waitErr, fmt.Errorf("summary: provider oracle: %w", err))
	}
	s.doubleRefunds = doubleRefunds(oracle, keys, payments)
	log.Info("summary", "observations", s.observations, "observations_from_webhooks", s.bySource["webhook"],
		"observations_from_workers", s.bySource["worker"], "observations_from_others", s.bySource["other"])
	fmt.Fprintln(stdout, s)
	return waitErr
}

// waitFinal polls the jobs until each is succeeded or in manual review.
func waitFinal(ctx context.Context, c config, client *jobfence.Client, ids []int64, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, c.jobsTimeout)
	defer cancel()
	pending := slices.Clone(ids)
	for {
		for i := 0; i < len(pending); {
			d, err := client.GetJob(ctx, pending[i])
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				log.Warn("GetJob failed; will ask again", "job_id", pending[i], "error", err)
				i++
				continue
			}
			if d.Job.State.Final() {
				pending = slices.Delete(pending, i, i+1)
				continue
			}
			i++
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d jobs not final: %w", len(pending), len(ids), context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// doubleRefunds counts, by the provider's own records, the operations of
// this run with more than one live refund and its payments refunded beyond
// their amount — the oracle's double_refunds, limited to this run.
func doubleRefunds(o fakeprovider.OracleReport, keys, payments []string) int {
	n := 0
	seen := map[string]bool{} // one operation may hold several of our keys
	for _, k := range keys {
		op, ok := o.Operation(k)
		if ok && op.Duplicate && !seen[op.MerchantReference] {
			seen[op.MerchantReference] = true
			n++
		}
	}
	for _, p := range payments {
		if pt, ok := o.Payment(p); ok && pt.OverRefunded {
			n++
		}
	}
	return n
}
