-- R28: verified provider events (webhooks) that named no job: kept, never
-- dropped, for a person to look at. A redelivery, the same provider and
-- event id, is the event on file. Times are INTEGER microseconds, UTC, from
-- the database's clock (R12); text compares byte for byte.
CREATE TABLE IF NOT EXISTS refund_unmatched_events (
  id                 INTEGER PRIMARY KEY AUTOINCREMENT,
  provider           TEXT    NOT NULL,
  provider_event_id  TEXT    NOT NULL,
  event_type         TEXT    NOT NULL,
  provider_refund_id TEXT    NOT NULL DEFAULT '',
  operation_key      TEXT    NOT NULL DEFAULT '',
  outcome            TEXT    NOT NULL,
  detail             TEXT    NOT NULL,
  received_at        INTEGER NOT NULL
) STRICT;

CREATE UNIQUE INDEX IF NOT EXISTS uk_refund_unmatched_events_event
  ON refund_unmatched_events (provider, provider_event_id);
