-- R30: the key outlives the job. One row per operation key ever enqueued,
-- with the job it made and what R1 compares; never deleted, whatever happens
-- to the job's rows. An enqueue inserts it in its own transaction after the
-- job's row, so a key whose job was archived meets its row here and answers
-- as R1 does (the insert, not a read, finds it: under READ COMMITTED a
-- locking read of a missing row locks nothing). The archive fills in the
-- job's final state and when it left the working tables.
CREATE TABLE IF NOT EXISTS refund_operation_keys (
  operation_key VARCHAR(128) NOT NULL,
  job_id        BIGINT       NOT NULL,
  order_id      VARCHAR(128) NOT NULL,
  payment_id    VARCHAR(128) NOT NULL,
  amount_minor  BIGINT       NOT NULL,
  currency      CHAR(3)      NOT NULL,
  provider      VARCHAR(64)  NOT NULL,
  created_at    DATETIME(6)  NOT NULL,
  final_state   VARCHAR(16)  NULL,
  archived_at   DATETIME(6)  NULL,
  PRIMARY KEY (operation_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The keys of the jobs enqueued so far. A coordinator of an earlier release
-- enqueues without one; the contract migration 0013 adds those, and the
-- archiver adds a job's own in the transaction that archives it.
INSERT IGNORE INTO refund_operation_keys
  (operation_key, job_id, order_id, payment_id, amount_minor, currency, provider, created_at)
SELECT operation_key, id, order_id, payment_id, amount_minor, currency, provider, created_at FROM refund_jobs;

-- R31: finished jobs leave the working tables for these, with the same
-- columns, their history and their receipts with them. Ids stay the jobs'
-- own: an archived job keeps its id, and auto-increment never hands it out
-- again.
CREATE TABLE IF NOT EXISTS refund_jobs_archive (
  id                 BIGINT        NOT NULL,
  operation_key      VARCHAR(128)  NOT NULL,
  order_id           VARCHAR(128)  NOT NULL,
  payment_id         VARCHAR(128)  NOT NULL,
  amount_minor       BIGINT        NOT NULL,
  currency           CHAR(3)       NOT NULL,
  provider           VARCHAR(64)   NOT NULL,
  state              VARCHAR(16)   NOT NULL,
  attempt            BIGINT        NOT NULL,
  next_action        VARCHAR(16)   NOT NULL,
  next_attempt_at    DATETIME(6)   NOT NULL,
  lease_until        DATETIME(6)   NULL,
  provider_refund_id VARCHAR(255)  NULL,
  worker_id          VARCHAR(128)  NOT NULL,
  last_reason        VARCHAR(1024) NOT NULL,
  first_sent_at      DATETIME(6)   NULL,
  created_at         DATETIME(6)   NOT NULL,
  updated_at         DATETIME(6)   NOT NULL,
  lease_token_hash   VARBINARY(32) NOT NULL,
  evidence_at        DATETIME(6)   NULL,
  archived_at        DATETIME(6)   NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_refund_jobs_archive_operation_key (operation_key),
  KEY ix_refund_jobs_archive_archived (archived_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS refund_job_events_archive (
  id                 BIGINT        NOT NULL,
  job_id             BIGINT        NOT NULL,
  attempt            BIGINT        NOT NULL,
  kind               VARCHAR(16)   NOT NULL,
  worker_id          VARCHAR(128)  NOT NULL,
  from_state         VARCHAR(16)   NOT NULL,
  to_state           VARCHAR(16)   NOT NULL,
  next_action        VARCHAR(16)   NOT NULL,
  provider_refund_id VARCHAR(255)  NOT NULL,
  reason             VARCHAR(1024) NOT NULL,
  created_at         DATETIME(6)   NOT NULL,
  lease_token_hash   VARBINARY(32) NOT NULL,
  PRIMARY KEY (id),
  KEY ix_refund_job_events_archive_job (job_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS refund_observations_archive (
  id                 BIGINT        NOT NULL,
  job_id             BIGINT        NOT NULL,
  operation_key      VARCHAR(128)  NOT NULL,
  reported_attempt   BIGINT        NOT NULL,
  job_attempt        BIGINT        NOT NULL,
  source             VARCHAR(128)  NOT NULL,
  outcome            VARCHAR(16)   NOT NULL,
  provider_refund_id VARCHAR(255)  NOT NULL,
  provider_event_id  VARCHAR(255)  NOT NULL,
  detail             TEXT          NOT NULL,
  dedupe_key         CHAR(64)      NOT NULL,
  created_at         DATETIME(6)   NOT NULL,
  attempt_verified   BOOLEAN       NOT NULL,
  reporter           VARCHAR(128)  NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_refund_observations_archive_dedupe (dedupe_key),
  KEY ix_refund_observations_archive_job (job_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- R31: named leases for work one coordinator does at a time (the archiver),
-- fenced like grants: taking the lease bumps its generation, and every batch
-- of its holder locks the row and checks the generation and the lease on the
-- database's clock (R12) before it deletes anything.
CREATE TABLE IF NOT EXISTS jobfence_leases (
  name        VARCHAR(64)  NOT NULL,
  holder      VARCHAR(128) NOT NULL,
  generation  BIGINT       NOT NULL,
  lease_until DATETIME(6)  NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
