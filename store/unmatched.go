package store

import "time"

// MaxEventTypeLen bounds a provider event's type ("refund.updated"), as its
// column does.
const MaxEventTypeLen = 64

// UnmatchedEvent is a verified provider event that matched no job (R28):
// kept in the unmatched log, never dropped, for a person to look at.
type UnmatchedEvent struct {
	ID int64
	// Provider and ProviderEventID name the event; the same pair again is a
	// redelivery of it (KeepUnmatched answers the one on file).
	Provider, ProviderEventID string
	// EventType is the provider's name of the event ("refund.updated").
	EventType string
	// ProviderRefundID and OperationKey are what the event named, if
	// anything: neither matched a job.
	ProviderRefundID, OperationKey string
	Outcome                        Outcome
	Detail                         string
	// ReceivedAt is the database's time when it was kept (R12).
	ReceivedAt time.Time
}

// Validate reports what is wrong with an event to keep: each field within
// its column (lengths in bytes, UTF-8 without control characters; the detail
// may span lines), provider, provider event id and event type required, the
// outcome one of the four.
func (e UnmatchedEvent) Validate() error {
	var v violations
	v.text("provider", e.Provider, 1, MaxProviderLen)
	v.text("provider_event_id", e.ProviderEventID, 1, MaxRefIDLen)
	v.text("event_type", e.EventType, 1, MaxEventTypeLen)
	v.text("provider_refund_id", e.ProviderRefundID, 0, MaxRefIDLen)
	v.text("operation_key", e.OperationKey, 0, MaxKeyLen)
	v.outcome("outcome", e.Outcome)
	v.multiline("detail", e.Detail, MaxDetailLen)
	return v.err()
}
