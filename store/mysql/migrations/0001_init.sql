-- refund_jobs: one row per refund (DESIGN.md, Columns). utf8mb4_bin keeps keys
-- byte-exact: "ABC" and "abc" are different operation keys.
CREATE TABLE IF NOT EXISTS refund_jobs (
  id                 BIGINT        NOT NULL AUTO_INCREMENT,
  operation_key      VARCHAR(128)  NOT NULL,
  order_id           VARCHAR(128)  NOT NULL,
  payment_id         VARCHAR(128)  NOT NULL,
  amount_minor       BIGINT        NOT NULL,
  currency           CHAR(3)       NOT NULL,
  provider           VARCHAR(64)   NOT NULL,
  state              VARCHAR(16)   NOT NULL,
  attempt            BIGINT        NOT NULL DEFAULT 0,
  next_action        VARCHAR(16)   NOT NULL,
  next_attempt_at    DATETIME(6)   NOT NULL,
  lease_until        DATETIME(6)   NULL,
  provider_refund_id VARCHAR(255)  NULL,
  worker_id          VARCHAR(128)  NOT NULL DEFAULT '',
  last_reason        VARCHAR(1024) NOT NULL DEFAULT '',
  first_sent_at      DATETIME(6)   NULL,
  created_at         DATETIME(6)   NOT NULL,
  updated_at         DATETIME(6)   NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_refund_jobs_operation_key (operation_key),
  -- Q2: the candidate query's index; its cost does not grow with history (Q3).
  KEY ix_refund_jobs_due (state, next_attempt_at, id),
  -- R6: expired leases, oldest first (R23).
  KEY ix_refund_jobs_lease (state, lease_until, id),
  -- Q7: customer-service reads, all refunds of an order newest first.
  KEY ix_refund_jobs_order (order_id, created_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Append-only transition history (R3): who claimed, took over or wrote, under
-- which attempt, at which database time.
CREATE TABLE IF NOT EXISTS refund_job_events (
  id                 BIGINT        NOT NULL AUTO_INCREMENT,
  job_id             BIGINT        NOT NULL,
  attempt            BIGINT        NOT NULL,
  kind               VARCHAR(16)   NOT NULL,
  worker_id          VARCHAR(128)  NOT NULL DEFAULT '',
  from_state         VARCHAR(16)   NOT NULL DEFAULT '',
  to_state           VARCHAR(16)   NOT NULL,
  next_action        VARCHAR(16)   NOT NULL,
  provider_refund_id VARCHAR(255)  NOT NULL DEFAULT '',
  reason             VARCHAR(1024) NOT NULL DEFAULT '',
  created_at         DATETIME(6)   NOT NULL,
  PRIMARY KEY (id),
  KEY ix_refund_job_events_job (job_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- R15: receipts from stale workers, webhooks and reconcilers. Never changes a job.
CREATE TABLE IF NOT EXISTS refund_observations (
  id                 BIGINT        NOT NULL AUTO_INCREMENT,
  job_id             BIGINT        NOT NULL,
  operation_key      VARCHAR(128)  NOT NULL,
  reported_attempt   BIGINT        NOT NULL,
  job_attempt        BIGINT        NOT NULL,
  source             VARCHAR(128)  NOT NULL,
  outcome            VARCHAR(16)   NOT NULL,
  provider_refund_id VARCHAR(255)  NOT NULL DEFAULT '',
  provider_event_id  VARCHAR(255)  NOT NULL DEFAULT '',
  detail             TEXT          NOT NULL,
  dedupe_key         CHAR(64)      NOT NULL,
  created_at         DATETIME(6)   NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_refund_observations_dedupe (dedupe_key),
  KEY ix_refund_observations_job (job_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- R10: our own record of the refund, written in the same transaction as the
-- fenced completion. One row per job; a second completion cannot sneak in.
CREATE TABLE IF NOT EXISTS refund_ledger (
  job_id             BIGINT        NOT NULL,
  operation_key      VARCHAR(128)  NOT NULL,
  provider           VARCHAR(64)   NOT NULL,
  provider_refund_id VARCHAR(255)  NOT NULL,
  amount_minor       BIGINT        NOT NULL,
  currency           CHAR(3)       NOT NULL,
  attempt            BIGINT        NOT NULL,
  recorded_at        DATETIME(6)   NOT NULL,
  PRIMARY KEY (job_id),
  UNIQUE KEY uk_refund_ledger_operation_key (operation_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
