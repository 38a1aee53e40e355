package store_test

import (
	"strings"
	"testing"

	"github.com/jobfence/jobfence/store"
)

// R28: an event for the unmatched log is checked against its columns, each
// violation named by its wire field: lengths in bytes, UTF-8 without control
// characters (the detail may span lines), provider, event id and type
// required, the outcome one of the four. At its limits every field is kept.
func TestValidateUnmatchedEvent_R28(t *testing.T) {
	ok := store.UnmatchedEvent{Provider: "stripe", ProviderEventID: "evt_1", EventType: "refund.updated",
		Outcome: store.OutcomeSucceeded}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a minimal event refused: %v", err)
	}
	full := store.UnmatchedEvent{
		Provider:         strings.Repeat("p", store.MaxProviderLen),
		ProviderEventID:  strings.Repeat("e", store.MaxRefIDLen),
		EventType:        strings.Repeat("t", store.MaxEventTypeLen),
		ProviderRefundID: strings.Repeat("r", store.MaxRefIDLen),
		OperationKey:     strings.Repeat("k", store.MaxKeyLen),
		Outcome:          store.OutcomeNotFound,
		Detail:           strings.Repeat("d\n", store.MaxDetailLen/2),
	}
	if err := full.Validate(); err != nil {
		t.Fatalf("an event at every limit refused: %v", err)
	}
	cases := []struct {
		field  string
		change func(*store.UnmatchedEvent)
	}{
		{"provider", func(e *store.UnmatchedEvent) { e.Provider = "" }},
		{"provider", func(e *store.UnmatchedEvent) { e.Provider = strings.Repeat("p", store.MaxProviderLen+1) }},
		{"provider", func(e *store.UnmatchedEvent) { e.Provider = "str\x00ipe" }},
		{"provider_event_id", func(e *store.UnmatchedEvent) { e.ProviderEventID = "" }},
		{"provider_event_id", func(e *store.UnmatchedEvent) { e.ProviderEventID = strings.Repeat("e", store.MaxRefIDLen+1) }},
		{"provider_event_id", func(e *store.UnmatchedEvent) { e.ProviderEventID = "evt_\xff" }},
		{"event_type", func(e *store.UnmatchedEvent) { e.EventType = "" }},
		{"event_type", func(e *store.UnmatchedEvent) { e.EventType = strings.Repeat("t", store.MaxEventTypeLen+1) }},
		{"event_type", func(e *store.UnmatchedEvent) { e.EventType = "refund\nupdated" }},
		{"provider_refund_id", func(e *store.UnmatchedEvent) { e.ProviderRefundID = strings.Repeat("r", store.MaxRefIDLen+1) }},
		{"provider_refund_id", func(e *store.UnmatchedEvent) { e.ProviderRefundID = "re_\x7f" }},
		{"operation_key", func(e *store.UnmatchedEvent) { e.OperationKey = strings.Repeat("k", store.MaxKeyLen+1) }},
		{"operation_key", func(e *store.UnmatchedEvent) { e.OperationKey = "op\xc3" }},
		{"outcome", func(e *store.UnmatchedEvent) { e.Outcome = "" }},
		{"outcome", func(e *store.UnmatchedEvent) { e.Outcome = "refunded" }},
		{"detail", func(e *store.UnmatchedEvent) { e.Detail = strings.Repeat("d", store.MaxDetailLen+1) }},
		{"detail", func(e *store.UnmatchedEvent) { e.Detail = "bell \a" }},
		{"detail", func(e *store.UnmatchedEvent) { e.Detail = "\xfe" }},
	}
	for _, c := range cases {
		e := ok
		c.change(&e)
		rulesOnlyField(t, e.Validate(), c.field)
	}
	// A multibyte detail at the limit counts bytes, as the column bounds.
	e := ok
	e.Detail = strings.Repeat("é", store.MaxDetailLen/2)
	if err := e.Validate(); err != nil {
		t.Fatalf("a detail of %d bytes refused: %v", len(e.Detail), err)
	}
	e.Detail += "x"
	rulesOnlyField(t, e.Validate(), "detail")
}
