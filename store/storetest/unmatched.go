package storetest

import (
	"strings"
	"testing"

	"github.com/jobfence/jobfence/store"
)

// keep files e in the unmatched log and requires it new.
func keep(t *testing.T, s store.Store, e store.UnmatchedEvent) store.UnmatchedEvent {
	t.Helper()
	kept, dup, err := s.KeepUnmatched(ctxFor(t), e)
	if err != nil || dup {
		t.Fatalf("KeepUnmatched(%s %s) = dup %v, %v", e.Provider, e.ProviderEventID, dup, err)
	}
	return kept
}

// unmatched reads the newest limit events of the log and its count.
func unmatched(t *testing.T, s store.Store, limit int) ([]store.UnmatchedEvent, int64) {
	t.Helper()
	events, total, err := s.Unmatched(ctxFor(t), limit)
	if err != nil {
		t.Fatalf("Unmatched(%d): %v", limit, err)
	}
	return events, total
}

// testUnmatchedKeptNeverDropped_R28: a verified event that names no job is
// kept as it came, every field at its limit intact, received at the
// database's time; the same provider and event id again is the event on
// file, nothing added, while event ids are byte-exact and belong to their
// provider.
func testUnmatchedKeptNeverDropped_R28(t *testing.T, s store.Store) {
	if events, total := unmatched(t, s, store.MaxOverviewLimit); len(events) != 0 || total != 0 {
		t.Fatalf("a fresh log holds %d of %d events", len(events), total)
	}
	from := dbNow(t, s)
	e := store.UnmatchedEvent{
		Provider:         strings.Repeat("p", store.MaxProviderLen),
		ProviderEventID:  "evt_" + strings.Repeat("é", (store.MaxRefIDLen-4)/2),
		EventType:        strings.Repeat("t", store.MaxEventTypeLen),
		ProviderRefundID: strings.Repeat("r", store.MaxRefIDLen),
		OperationKey:     strings.Repeat("k", store.MaxKeyLen),
		Outcome:          store.OutcomeFailed,
		Detail:           strings.Repeat("ü\n\t", store.MaxDetailLen/4),
	}
	kept := keep(t, s, e)
	to := dbNow(t, s)
	if kept.ID <= 0 || kept.ReceivedAt.Before(from) || kept.ReceivedAt.After(to) {
		t.Fatalf("kept id %d received %v, want an id and the database's time between %v and %v", kept.ID,
			kept.ReceivedAt, from, to)
	}
	want := e
	want.ID, want.ReceivedAt = kept.ID, kept.ReceivedAt
	if kept != want {
		t.Fatalf("kept %+v\nwant %+v", kept, want)
	}

	again := e
	again.Detail, again.Outcome, again.EventType = "redelivered", store.OutcomeSucceeded, "refund.failed"
	if got, dup, err := s.KeepUnmatched(ctxFor(t), again); err != nil || !dup || got != kept {
		t.Fatalf("redelivery = %+v dup %v, %v; want the event on file", got, dup, err)
	}
	other := e
	other.Provider = "adyen" // another provider's event of the same id
	keep(t, s, other)
	upper := e
	upper.ProviderEventID = strings.ToUpper(e.ProviderEventID) // byte-exact
	keep(t, s, upper)
	if events, total := unmatched(t, s, store.MaxOverviewLimit); len(events) != 3 || total != 3 || events[2] != kept {
		t.Fatalf("the log holds %d of %d events, oldest %+v; want 3, the first kept as it came", len(events), total,
			events[len(events)-1])
	}
}

// testUnmatchedNewestFirstBounded_R28: the log lists the newest events
// first, at most the limit, and counts them all; a bad limit or event is
// refused by its field and adds nothing.
func testUnmatchedNewestFirstBounded_R28(t *testing.T, s store.Store) {
	var ids []int64
	for i, o := range []store.Outcome{store.OutcomeSucceeded, store.OutcomePending, store.OutcomeNotFound, store.OutcomeFailed} {
		ids = append(ids, keep(t, s, store.UnmatchedEvent{Provider: "stripe", ProviderEventID: "evt_" + string(rune('a'+i)),
			EventType: "refund.updated", Outcome: o}).ID)
	}
	events, total := unmatched(t, s, 3)
	if total != 4 || len(events) != 3 || events[0].ID != ids[3] || events[1].ID != ids[2] || events[2].ID != ids[1] ||
		events[0].Outcome != store.OutcomeFailed {
		t.Fatalf("newest 3 of the log = %+v (%d in all), want %v newest first of 4", events, total, ids[1:])
	}
	if events, _ := unmatched(t, s, 1); len(events) != 1 || events[0].ID != ids[3] {
		t.Fatalf("newest 1 = %+v", events)
	}
	for _, limit := range []int{0, -1, store.MaxOverviewLimit + 1} {
		_, _, err := s.Unmatched(ctxFor(t), limit)
		wantViolation(t, err, "limit")
	}
	bad := store.UnmatchedEvent{Provider: "stripe", ProviderEventID: "evt_bad", EventType: "refund.updated", Outcome: "refunded"}
	_, _, err := s.KeepUnmatched(ctxFor(t), bad)
	wantViolation(t, err, "outcome")
	bad.Outcome, bad.ProviderEventID = store.OutcomeSucceeded, ""
	_, _, err = s.KeepUnmatched(ctxFor(t), bad)
	wantViolation(t, err, "provider_event_id")
	if _, total := unmatched(t, s, store.MaxOverviewLimit); total != 4 {
		t.Fatalf("%d events after refused ones, want 4", total)
	}
}
