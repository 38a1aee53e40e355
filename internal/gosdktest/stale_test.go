package jobfence_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jobfence/jobfence/clients/go/jobfence"
)

// R25: a write-back without its lease token is a stale writer for the fence,
// but its error says what was wrong — the empty token — not a takeover that
// never happened; a zombie's write after a real takeover says taken over.
func TestStaleAttemptErrorSaysWhatWasWrong_R25(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	g := c.claimOne(t, "A", job)
	_, err := c.client.Complete(ctxFor(t), jobfence.CompleteRequest{JobID: g.Job.ID, Attempt: g.Job.Attempt,
		ProviderRefundID: "re_1"})
	var stale *jobfence.StaleAttemptError
	if !errors.As(err, &stale) || !strings.Contains(err.Error(), "lease_token is empty") ||
		strings.Contains(err.Error(), "taken over") {
		t.Fatalf("Complete without a token: %v; want a StaleAttemptError naming the empty lease_token", err)
	}
	c.expire(t, job.ID)
	c.claimOne(t, "B", job)
	_, err = c.client.Complete(ctxFor(t), jobfence.CompleteRequest{JobID: g.Job.ID, Attempt: g.Job.Attempt,
		LeaseToken: g.LeaseToken, ProviderRefundID: "re_1"})
	if !errors.As(err, &stale) || !strings.Contains(err.Error(), "taken over") {
		t.Fatalf("a zombie's Complete: %v; want a StaleAttemptError saying taken over", err)
	}
}
