package fakeprovider

import (
	"context"

	"github.com/jobfence/jobfence/clients/go/jobfence"
)

// Handlers are a worker's handlers against this provider, as tests drive
// it: a refund under the job's operation key (as Idempotency-Key and merchant
// reference, which the provider's webhooks echo), sent with faults (WithFault),
// and a reconcile that looks the key up (R14). cmd/refundworker's are the
// whole worker's.
func Handlers(pay *Client, faults string) jobfence.HandlerFuncs {
	result := func(r Refund) jobfence.Result {
		if r.Status == StatusSucceeded {
			return jobfence.Succeeded(r.ID)
		}
		return jobfence.Pending(r.ID, 0)
	}
	return jobfence.HandlerFuncs{
		RefundFunc: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
			r, err := pay.CreateRefund(WithFault(ctx, faults), j.Job.OperationKey, RefundParams{
				PaymentID: j.Job.PaymentID, AmountMinor: j.Job.AmountMinor, Currency: j.Job.Currency,
				MerchantReference: j.Job.OperationKey})
			if err != nil {
				return jobfence.Unknown(err) // made or not: reconcile (R14)
			}
			return result(r)
		},
		ReconcileFunc: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
			found, err := pay.FindByReference(ctx, j.Job.OperationKey)
			if err != nil {
				return jobfence.Unknown(err)
			}
			if len(found) == 0 {
				return jobfence.NoRecord()
			}
			return result(found[0])
		},
	}
}
