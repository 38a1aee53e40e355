package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// R32: a grant of a job whose cancel was requested never carries REFUND,
// whatever the row's next action, and records no first send.
func TestGrantOfACancelRequestNeverRefunds_R32(t *testing.T) {
	job := rulesWith(rulesReady(), func(j *store.Job) { j.CancelRequestedAt = rulesNow.Add(-time.Minute) })
	c, e := store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: time.Minute}.Grant(job, rulesNow)
	if c.Job.NextAction != store.ActionReconcile || e.NextAction != store.ActionReconcile || !c.Job.FirstSentAt.IsZero() {
		t.Fatalf("grant of a cancel-requested job: next action %s (event %s), first sent %v", c.Job.NextAction,
			e.NextAction, c.Job.FirstSentAt)
	}
}

// R32: what a cancel does, by where the job stands.
func TestCancelByState_R32(t *testing.T) {
	p := store.CancelParams{JobID: 1, Reason: "why", Actor: "alice"}
	sent := func(j *store.Job) { j.FirstSentAt = rulesNow.Add(-time.Hour) }
	for _, tc := range []struct {
		name      string
		job       store.Job
		cancelled bool
		state     store.State
		bump      bool
		err       error
	}{
		{"ready, never sent", rulesReady(), true, store.StateCancelled, false, nil},
		{"ready, sent", rulesWith(rulesReady(), sent), false, store.StateReady, false, nil},
		{"running", rulesHeld(), false, store.StateReady, true, nil},
		{"in review, never sent", rulesWith(rulesReady(), func(j *store.Job) { j.State = store.StateManualReview }), true, store.StateCancelled, false, nil},
		{"in review, sent", rulesWith(rulesReady(), func(j *store.Job) { sent(j); j.State = store.StateManualReview }), false, store.StateManualReview, false, nil},
		{"succeeded", rulesWith(rulesHeld(), func(j *store.Job) { j.State = store.StateSucceeded }), false, "", false, store.ErrNotCancellable},
		{"requested already", rulesWith(rulesReady(), func(j *store.Job) { sent(j); j.CancelRequestedAt = rulesNow }), false, "", false, store.ErrNotCancellable},
		{"archived", rulesWith(rulesReady(), func(j *store.Job) { j.State, j.ArchivedAt = store.StateCancelled, rulesNow }), false, "", false, store.ErrNotCancellable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := p
			q.Attempt = tc.job.Attempt
			res, e, err := q.Cancel(tc.job, nil, rulesNow)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if res.Cancelled != tc.cancelled || res.Job.State != tc.state || (res.Job.Attempt == tc.job.Attempt+1) != tc.bump {
				t.Fatalf("cancel = %+v", res)
			}
			if !tc.cancelled && (!res.Job.CancelRequested() || (tc.state != store.StateManualReview && res.Job.NextAction != store.ActionReconcile)) {
				t.Fatalf("a maybe-sent job's cancel request = %+v", res.Job)
			}
			if tc.bump && res.Job.Grant == tc.job.Grant {
				t.Fatal("the takeover kept the holder's grant")
			}
			if e == nil || e.WorkerID != "alice" || e.Reason != "why" || e.Attempt != res.Job.Attempt {
				t.Fatalf("history entry = %+v", e)
			}
		})
	}
	_, _, err := store.CancelParams{JobID: 1, Attempt: 7, Reason: "why"}.Cancel(rulesReady(), nil, rulesNow)
	if !errors.Is(err, store.ErrStaleAttempt) {
		t.Fatalf("a cancel with another attempt: %v, want ErrStaleAttempt", err)
	}
}
