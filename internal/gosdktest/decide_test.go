package jobfence_test

import (
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/testdb"
)

// TestCoordinatorNowFollowsTheClaimNotTheWallClock_R12: the estimate starts
// at the database time of the claim and advances with the monotonic clock.
func TestCoordinatorNowFollowsTheClaimNotTheWallClock_R12(t *testing.T) {
	c := startCoordinatorOn(t, testdb.SQLiteBackend(), nil)
	job := c.enqueue(t, "acme")
	claimed := c.claimOne(t, "w", job)
	if claimed.ClaimedAt.IsZero() || !claimed.Job.FirstSentAt.Equal(claimed.ClaimedAt) || claimed.SendsAgain() {
		t.Fatalf("first claim: claimed at %v, first sent %v, SendsAgain %v", claimed.ClaimedAt, claimed.Job.FirstSentAt, claimed.SendsAgain())
	}
	time.Sleep(50 * time.Millisecond)
	got := claimed.CoordinatorNow().Sub(claimed.ClaimedAt)
	if got < 50*time.Millisecond || got > 5*time.Second {
		t.Fatalf("CoordinatorNow is %s after the claim's database time, want about 50ms", got)
	}
}
