package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// R28: only a receipt of success or failure moves a waiting job forward;
// pending says nothing new (R4) and not found proves nothing (R14).
func TestOnlySuccessOrFailureExpedites_R28(t *testing.T) {
	for o, want := range map[store.Outcome]bool{
		store.OutcomeSucceeded: true,
		store.OutcomeFailed:    true,
		store.OutcomePending:   false,
		store.OutcomeNotFound:  false,
		"":                     false,
		"SUCCEEDED":            false,
	} {
		if got := o.Expedites(); got != want {
			t.Errorf("%q.Expedites() = %v, want %v", o, got, want)
		}
	}
}

// R28, R3: the expedite's history entry is under the job's current attempt
// (as the row holds it after the move, not as the receipt's report names
// it), named after the receipt's source, from ready to ready with next
// action reconcile, at the database time of the move, and carries no grant.
func TestExpediteEventNamesTheReceipt_R28(t *testing.T) {
	moved := time.Date(2026, 5, 1, 10, 0, 0, 123456000, time.UTC)
	job := store.Job{ID: 42, State: store.StateReady, Attempt: 3, NextAction: store.ActionReconcile,
		NextAttemptAt: moved, UpdatedAt: moved, WorkerID: "worker-c",
		Grant: store.NewLeaseToken().Hash()} // the last grant's, which the event must not repeat
	obs := store.Observation{ID: 977, JobID: 42, ReportedAttempt: 2, JobAttempt: 2, Source: "webhook:stripe",
		Outcome: store.OutcomeFailed}
	got := obs.ExpediteEvent(job)
	want := store.Event{JobID: 42, Attempt: 3, Kind: store.EventExpedited, WorkerID: "webhook:stripe",
		FromState: store.StateReady, ToState: store.StateReady, NextAction: store.ActionReconcile,
		Reason: "receipt 977 from webhook:stripe: failed", CreatedAt: moved}
	if got != want {
		t.Fatalf("ExpediteEvent = %+v\nwant %+v", got, want)
	}
	long := obs
	long.Source = strings.Repeat("s", store.MaxKeyLen)
	long.Outcome = store.OutcomeSucceeded
	if r := long.ExpediteEvent(job).Reason; len(r) > store.MaxReasonLen {
		t.Fatalf("reason of %d bytes, over the column's %d", len(r), store.MaxReasonLen)
	}
}
