-- R28: verified provider events (webhooks) that named no job: kept, never
-- dropped, for a person to look at. A redelivery, the same provider and
-- event id, is the event on file. utf8mb4_bin keeps ids byte-exact.
CREATE TABLE IF NOT EXISTS refund_unmatched_events (
  id                 BIGINT        NOT NULL AUTO_INCREMENT,
  provider           VARCHAR(64)   NOT NULL,
  provider_event_id  VARCHAR(255)  NOT NULL,
  event_type         VARCHAR(64)   NOT NULL,
  provider_refund_id VARCHAR(255)  NOT NULL DEFAULT '',
  operation_key      VARCHAR(128)  NOT NULL DEFAULT '',
  outcome            VARCHAR(16)   NOT NULL,
  detail             TEXT          NOT NULL,
  received_at        DATETIME(6)   NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_refund_unmatched_events_event (provider, provider_event_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
