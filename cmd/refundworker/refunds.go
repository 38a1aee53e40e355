package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
)

// refunds is the worker's jobfence.Handler: it talks to the provider under
// the job's operation key, which is both the Idempotency-Key and the merchant
// reference (R1), and never anything derived from the attempt (R2).
type refunds struct {
	pay *fakeprovider.Client
}

// Refund sends the refund. A reply that never came leaves the outcome
// unknown: before giving up, it asks the provider once by reference (a
// reconcile under this same attempt, R14), so a late worker still learns —
// and, if it was taken over meanwhile, files — what really happened (R15).
//
// A grant lost before the request goes out sends nothing (R27); one lost
// while it is in flight still waits for its answer (jobfence.SendContext),
// which the Worker files as an observation (R15).
func (r *refunds) Refund(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
	if err := ctx.Err(); err != nil {
		return jobfence.Unknown(context.Cause(ctx))
	}
	ref, err := r.pay.CreateRefund(jobfence.SendContext(ctx), j.Job.OperationKey, fakeprovider.RefundParams{
		PaymentID: j.Job.PaymentID, AmountMinor: j.Job.AmountMinor, Currency: j.Job.Currency,
		MerchantReference: j.Job.OperationKey,
	})
	var se *fakeprovider.StatusError
	switch {
	case err == nil:
		return resultOf(ref)
	case errors.Is(err, fakeprovider.ErrIdempotencyConflict):
		// The key was used for a different refund: the binding of R1 broke
		// somewhere; a person must look.
		return jobfence.Escalate("provider: Idempotency-Key already used with different parameters (R1)")
	case errors.Is(err, fakeprovider.ErrNoReply):
		if ctx.Err() == nil {
			if res := r.Reconcile(ctx, j); res.Kind != jobfence.ResultNoRecord {
				return res
			}
		}
		// "No record" right after a lost reply proves nothing (R14).
		return jobfence.Unknown(err)
	case errors.As(err, &se) && se.StatusCode >= 400 && se.StatusCode < 500:
		// The provider refused the request as invalid and stored nothing
		// under the key.
		return jobfence.Failed("", fmt.Sprintf("%d %s: %s", se.StatusCode, se.Code, se.Message))
	default:
		// 503 and the rest: a real provider does not promise it did nothing.
		return jobfence.Unknown(err)
	}
}

// Reconcile asks the provider for the refunds under the operation key, and
// verifies the refund ids of receipts already filed for the job (R15).
func (r *refunds) Reconcile(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
	found, err := r.pay.FindByReference(ctx, j.Job.OperationKey)
	if err != nil {
		return jobfence.Unknown(err)
	}
	for _, o := range j.Observations {
		if o.ProviderRefundID == "" || slices.ContainsFunc(found, func(f fakeprovider.Refund) bool { return f.ID == o.ProviderRefundID }) {
			continue
		}
		ref, err := r.pay.GetRefund(ctx, o.ProviderRefundID)
		var se *fakeprovider.StatusError
		switch {
		case err == nil && ref.MerchantReference == j.Job.OperationKey:
			found = append(found, ref)
		case err == nil, errors.As(err, &se) && se.StatusCode == http.StatusNotFound:
			// Not this key's refund, or not visible (yet): no evidence.
		default:
			return jobfence.Unknown(err)
		}
	}
	var live []fakeprovider.Refund
	for _, f := range found {
		if f.Status != fakeprovider.StatusFailed {
			live = append(live, f)
		}
	}
	switch {
	case len(live) > 1:
		ids := make([]string, len(live))
		for i, f := range live {
			ids[i] = f.ID
		}
		return jobfence.Escalate(fmt.Sprintf("provider shows %d live refunds for this operation key: %v", len(live), ids))
	case len(live) == 1:
		return resultOf(live[0])
	case len(found) > 0:
		return resultOf(found[len(found)-1])
	}
	return jobfence.NoRecord()
}

// resultOf reads a provider refund.
func resultOf(ref fakeprovider.Refund) jobfence.Result {
	switch ref.Status {
	case fakeprovider.StatusSucceeded:
		return jobfence.Succeeded(ref.ID)
	case fakeprovider.StatusPending:
		return jobfence.Pending(ref.ID, 0) // R4: not a success
	case fakeprovider.StatusFailed:
		return jobfence.Failed(ref.ID, "provider: refund "+ref.FailureReason)
	}
	return jobfence.Unknown(fmt.Errorf("provider: refund %s in unknown status %q", ref.ID, ref.Status))
}
