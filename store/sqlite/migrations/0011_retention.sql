-- R30: the key outlives the job. One row per operation key ever enqueued,
-- with the job it made and what R1 compares; never deleted, whatever happens
-- to the job's rows. An enqueue inserts it after the job's row, so a key
-- whose job was archived meets its row here and answers as R1 does. The
-- archive fills in the job's final state and when it left the working
-- tables. Times are INTEGER microseconds, UTC, from the database's clock.
CREATE TABLE IF NOT EXISTS refund_operation_keys (
  operation_key TEXT    NOT NULL PRIMARY KEY,
  job_id        INTEGER NOT NULL,
  order_id      TEXT    NOT NULL,
  payment_id    TEXT    NOT NULL,
  amount_minor  INTEGER NOT NULL,
  currency      TEXT    NOT NULL,
  provider      TEXT    NOT NULL,
  created_at    INTEGER NOT NULL,
  final_state   TEXT,
  archived_at   INTEGER
) STRICT, WITHOUT ROWID;

INSERT OR IGNORE INTO refund_operation_keys
  (operation_key, job_id, order_id, payment_id, amount_minor, currency, provider, created_at)
SELECT operation_key, id, order_id, payment_id, amount_minor, currency, provider, created_at FROM refund_jobs;

-- R31: the archiver's walk, oldest completion first: only succeeded jobs
-- are in it.
CREATE INDEX IF NOT EXISTS ix_refund_jobs_succeeded ON refund_jobs (next_attempt_at, id) WHERE state = 'succeeded';

-- R31: finished jobs leave the working tables for these, with the same
-- columns, their history and their receipts with them; ids stay the jobs'
-- own (AUTOINCREMENT never hands one out again).
CREATE TABLE IF NOT EXISTS refund_jobs_archive (
  id                 INTEGER PRIMARY KEY,
  operation_key      TEXT    NOT NULL,
  order_id           TEXT    NOT NULL,
  payment_id         TEXT    NOT NULL,
  amount_minor       INTEGER NOT NULL,
  currency           TEXT    NOT NULL,
  provider           TEXT    NOT NULL,
  state              TEXT    NOT NULL,
  attempt            INTEGER NOT NULL,
  next_action        TEXT    NOT NULL,
  next_attempt_at    INTEGER NOT NULL,
  lease_until        INTEGER,
  provider_refund_id TEXT,
  worker_id          TEXT    NOT NULL,
  last_reason        TEXT    NOT NULL,
  first_sent_at      INTEGER,
  created_at         INTEGER NOT NULL,
  updated_at         INTEGER NOT NULL,
  lease_token_hash   BLOB    NOT NULL,
  evidence_at        INTEGER,
  archived_at        INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX IF NOT EXISTS uk_refund_jobs_archive_operation_key ON refund_jobs_archive (operation_key);
CREATE INDEX IF NOT EXISTS ix_refund_jobs_archive_archived ON refund_jobs_archive (archived_at, id);

CREATE TABLE IF NOT EXISTS refund_job_events_archive (
  id                 INTEGER PRIMARY KEY,
  job_id             INTEGER NOT NULL,
  attempt            INTEGER NOT NULL,
  kind               TEXT    NOT NULL,
  worker_id          TEXT    NOT NULL,
  from_state         TEXT    NOT NULL,
  to_state           TEXT    NOT NULL,
  next_action        TEXT    NOT NULL,
  provider_refund_id TEXT    NOT NULL,
  reason             TEXT    NOT NULL,
  created_at         INTEGER NOT NULL,
  lease_token_hash   BLOB    NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS ix_refund_job_events_archive_job ON refund_job_events_archive (job_id, id);

CREATE TABLE IF NOT EXISTS refund_observations_archive (
  id                 INTEGER PRIMARY KEY,
  job_id             INTEGER NOT NULL,
  operation_key      TEXT    NOT NULL,
  reported_attempt   INTEGER NOT NULL,
  job_attempt        INTEGER NOT NULL,
  source             TEXT    NOT NULL,
  outcome            TEXT    NOT NULL,
  provider_refund_id TEXT    NOT NULL,
  provider_event_id  TEXT    NOT NULL,
  detail             TEXT    NOT NULL,
  dedupe_key         TEXT    NOT NULL,
  created_at         INTEGER NOT NULL,
  attempt_verified   INTEGER NOT NULL,
  reporter           TEXT    NOT NULL
) STRICT;
CREATE UNIQUE INDEX IF NOT EXISTS uk_refund_observations_archive_dedupe ON refund_observations_archive (dedupe_key);
CREATE INDEX IF NOT EXISTS ix_refund_observations_archive_job ON refund_observations_archive (job_id, id);

-- R31: named leases for work one process does at a time (the archiver),
-- fenced like grants by a generation bumped on every take.
CREATE TABLE IF NOT EXISTS jobfence_leases (
  name        TEXT    NOT NULL PRIMARY KEY,
  holder      TEXT    NOT NULL,
  generation  INTEGER NOT NULL,
  lease_until INTEGER NOT NULL
) STRICT;
