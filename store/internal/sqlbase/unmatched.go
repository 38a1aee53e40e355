package sqlbase

import (
	"context"
	"fmt"

	"github.com/jobfence/jobfence/store"
)

// The unmatched log (R28): verified provider events that named no job, one
// row per provider and provider event id (uk_refund_unmatched_events_event),
// newest last by id. The table is small by nature: counting it all is cheap.
const (
	// %s: the database's now.
	insertUnmatched = `INSERT INTO refund_unmatched_events
  (provider, provider_event_id, event_type, provider_refund_id, operation_key, outcome, detail, received_at)
VALUES (?, ?, ?, ?, ?, ?, ?, %s)`
	selectUnmatchedByID    = `SELECT ` + UnmatchedColumns + ` FROM refund_unmatched_events WHERE id = ?`
	selectUnmatchedByEvent = `SELECT ` + UnmatchedColumns + ` FROM refund_unmatched_events
 WHERE provider = ? AND provider_event_id = ?`
	selectNewestUnmatched = `SELECT ` + UnmatchedColumns + ` FROM refund_unmatched_events ORDER BY id DESC LIMIT ?`
	countUnmatched        = `SELECT COUNT(*) FROM refund_unmatched_events`
)

// KeepUnmatched implements store.Store: one insert, or, for an event on file,
// the one on file.
func (b *Backend) KeepUnmatched(ctx context.Context, e store.UnmatchedEvent) (store.UnmatchedEvent, bool, error) {
	if err := e.Validate(); err != nil {
		return store.UnmatchedEvent{}, false, err
	}
	var kept store.UnmatchedEvent
	var duplicate bool
	err := b.InTx(ctx, func(tx Tx) error {
		var err error
		kept, duplicate, err = b.keepUnmatchedTx(ctx, tx, e)
		return err
	})
	switch {
	case err == nil:
		return kept, duplicate, nil
	case IsCommitUnknown(err):
		return store.UnmatchedEvent{}, false, fmt.Errorf("%w: keep unmatched event %s %s: %v",
			store.ErrWriteOutcomeUnknown, e.Provider, e.ProviderEventID, err)
	default:
		return store.UnmatchedEvent{}, false, b.Unavailable(err)
	}
}

// Unmatched implements store.Store: the newest events and the count, read
// in one read-only transaction, so that they show one moment.
func (b *Backend) Unmatched(ctx context.Context, limit int) ([]store.UnmatchedEvent, int64, error) {
	if err := store.ValidateOverviewLimit(limit); err != nil {
		return nil, 0, err
	}
	tx, err := b.DB.BeginTx(ctx, b.ReadTx)
	if err != nil {
		return nil, 0, b.Unavailable(err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	events, err := QueryAll(ctx, tx, ScanUnmatched, selectNewestUnmatched, limit)
	if err != nil {
		return nil, 0, b.Unavailable(err)
	}
	var total int64
	if err := tx.QueryRowContext(ctx, countUnmatched).Scan(&total); err != nil {
		return nil, 0, b.Unavailable(err)
	}
	return events, total, nil
}

// keepUnmatchedTx files e in tx, or reads the event on file under its
// provider and event id (duplicate).
func (b *Backend) keepUnmatchedTx(ctx context.Context, tx Tx, e store.UnmatchedEvent) (store.UnmatchedEvent, bool, error) {
	res, err := tx.ExecContext(ctx, fmt.Sprintf(insertUnmatched, b.SQL.NowExpr), e.Provider, e.ProviderEventID,
		e.EventType, e.ProviderRefundID, e.OperationKey, e.Outcome, e.Detail)
	if b.Duplicate(err) {
		// A redelivery: the failed statement undoes only itself, and the
		// transaction reads the event on file.
		kept, err := ScanUnmatched(tx.QueryRowContext(ctx, selectUnmatchedByEvent, e.Provider, e.ProviderEventID))
		return kept, true, err
	}
	if err != nil {
		return store.UnmatchedEvent{}, false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return store.UnmatchedEvent{}, false, err
	}
	kept, err := ScanUnmatched(tx.QueryRowContext(ctx, selectUnmatchedByID, id))
	return kept, false, err
}
