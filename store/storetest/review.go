package storetest

import (
	"testing"

	"github.com/jobfence/jobfence/store"
)

func resolve(id, attempt int64, r store.Resolution, refundID string) store.Writeback {
	return store.Writeback{Kind: store.EventResolved, JobID: id, Attempt: attempt, Resolution: r,
		ProviderRefundID: refundID, Reason: "checked the provider dashboard", Actor: "alice"}
}

// escalated returns a job in manual_review and the attempt it was escalated
// under.
func escalated(t *testing.T, s store.Store) (store.Job, int64) {
	t.Helper()
	job := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", job.ID)
	write(t, s, escalate(of(c)))
	return job, c.Job.Attempt
}

// testResolveReview: an operator closes a manual review with the attempt they
// looked at, fenced like every other write; recorded with their identity.
func testResolveReview(t *testing.T, s store.Store) {
	job, attempt := escalated(t, s)
	res := write(t, s, resolve(job.ID, attempt, store.ResolutionRefunded, "re_ops"))
	if res.Job.State != store.StateSucceeded || res.Job.ProviderRefundID != "re_ops" || res.Replayed {
		t.Fatalf("resolved = %+v", res)
	}
	d := get(t, s, job.ID)
	if d.Job != res.Job {
		t.Fatalf("Resolve answered\n %+v\nbut the row is\n %+v", res.Job, d.Job)
	}
	ev := d.Events[len(d.Events)-1]
	if ev.Kind != store.EventResolved || ev.WorkerID != "alice" || ev.FromState != store.StateManualReview ||
		ev.ToState != store.StateSucceeded || ev.Reason != "checked the provider dashboard" || ev.Attempt != attempt {
		t.Fatalf("resolution event = %+v", ev)
	}
	if again := write(t, s, resolve(job.ID, attempt, store.ResolutionRefunded, "re_ops")); !again.Replayed {
		t.Fatalf("repeated resolution = %+v, want replayed", again)
	}
	_, err := s.Write(ctxFor(t), resolve(job.ID, attempt, store.ResolutionReconcile, ""))
	wantFence(t, err, store.ErrNotInReview, attempt, store.StateSucceeded)

	// Back to reconcile: due now, claimed again as a fresh generation; the
	// operator's old view is then stale.
	job2, attempt2 := escalated(t, s)
	res = write(t, s, resolve(job2.ID, attempt2, store.ResolutionReconcile, ""))
	if res.Job.State != store.StateReady || res.Job.NextAction != store.ActionReconcile || !res.Job.NextAttemptAt.Equal(res.Job.UpdatedAt) {
		t.Fatalf("sent back to reconcile = %+v", res.Job)
	}
	c := claimOne(t, s, "B", job2.ID)
	if c.Job.Attempt != attempt2+1 || c.Takeover || c.Job.NextAction != store.ActionReconcile {
		t.Fatalf("claim after review = %+v takeover %v", c.Job, c.Takeover)
	}
	_, err = s.Write(ctxFor(t), resolve(job2.ID, attempt2, store.ResolutionRefunded, "re_x"))
	wantFence(t, err, store.ErrStaleAttempt, c.Job.Attempt, store.StateRunning)

	// A job that is not in review cannot be resolved, and bad input is refused.
	running := enqueue(t, s, refund(t))
	rc := claimOne(t, s, "A", running.ID)
	_, err = s.Write(ctxFor(t), resolve(running.ID, rc.Job.Attempt, store.ResolutionRefunded, "re_y"))
	wantFence(t, err, store.ErrNotInReview, rc.Job.Attempt, store.StateRunning)
	for field, w := range map[string]store.Writeback{
		"provider_refund_id": resolve(job2.ID, 1, store.ResolutionRefunded, ""),
		"resolution":         resolve(job2.ID, 1, "undo", ""),
		"note":               {Kind: store.EventResolved, JobID: job2.ID, Attempt: 1, Resolution: store.ResolutionReconcile, Actor: "a"},
		"actor":              {Kind: store.EventResolved, JobID: job2.ID, Attempt: 1, Resolution: store.ResolutionReconcile, Reason: "n"},
	} {
		_, err := s.Write(ctxFor(t), w)
		wantViolation(t, err, field)
	}
}
