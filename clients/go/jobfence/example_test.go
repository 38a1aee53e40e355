package jobfence_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
)

// Failed takes the refund id first, then the provider's reason: a refund the
// provider made and then failed, and a refund it refused before making one.
// Either way a person decides: the job goes to manual review with the reason
// in its history.
func ExampleFailed() {
	claimed := jobfence.ClaimedJob{Attempt: 1, NextAction: jobfence.ActionRefund}
	for _, r := range []jobfence.Result{
		jobfence.Failed("re_123", "insufficient_funds"),
		jobfence.Failed("", "402 card_declined: the card was declined"),
	} {
		d := jobfence.Decide(r, claimed, jobfence.ProviderPolicy{})
		fmt.Printf("refund %q: %s, %q\n", r.ProviderRefundID, d.Kind, d.Reason)
	}
	// Output:
	// refund "re_123": escalate, "provider rejected the refund: insufficient_funds"
	// refund "": escalate, "provider rejected the refund: 402 card_declined: the card was declined"
}

// Pending is the provider's answer that it holds the refund, not finished:
// a reconcile later, never a success (R4). Unknown is no answer at all: a
// reconcile too, sooner, since the request may never have arrived.
func ExamplePending() {
	claimed := jobfence.ClaimedJob{Attempt: 1, NextAction: jobfence.ActionRefund}
	policy := jobfence.ProviderPolicy{PendingDelay: time.Minute, UnknownDelay: 5 * time.Second}
	for _, r := range []jobfence.Result{
		jobfence.Pending("re_123", 0),
		jobfence.Pending("re_123", 10*time.Minute),
		jobfence.Unknown(errors.New("read tcp: i/o timeout")),
	} {
		d := jobfence.Decide(r, claimed, policy)
		fmt.Printf("%s: %s, %s in %s\n", r.Kind, d.Kind, d.NextAction, d.Delay)
	}
	// Output:
	// pending: reschedule, reconcile in 1m0s
	// pending: reschedule, reconcile in 10m0s
	// unknown: reschedule, reconcile in 5s
}
