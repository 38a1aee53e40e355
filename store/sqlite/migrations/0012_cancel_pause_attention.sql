-- R32: a new final state, cancelled. SQLite cannot change a CHECK
-- constraint in place, so refund_jobs is rebuilt with it (SQLite's
-- "making other kinds of table schema changes" procedure), in the
-- migration's one transaction, with its new columns:
--   cancel_requested_at: when a cancel was requested of a job that may
--     have been sent (INTEGER microseconds, UTC); no grant of it carries
--     next action refund from then on. NULL when none was.
--   attention_since, attention_reason: R34, since when and why the job is
--     on the attention list; NULL once a person acknowledged it.
--   traceparent, tracestate: R35, the enqueue's W3C trace context.
-- Ids stay the jobs' own, and the AUTOINCREMENT sequence carries over, so
-- an id an archived job had is never handed out again (R31).
CREATE TABLE refund_jobs_new (
  id                  INTEGER PRIMARY KEY AUTOINCREMENT,
  operation_key       TEXT    NOT NULL,
  order_id            TEXT    NOT NULL,
  payment_id          TEXT    NOT NULL,
  amount_minor        INTEGER NOT NULL,
  currency            TEXT    NOT NULL,
  provider            TEXT    NOT NULL,
  state               TEXT    NOT NULL CHECK (state IN ('ready', 'running', 'succeeded', 'manual_review', 'cancelled')),
  attempt             INTEGER NOT NULL DEFAULT 0,
  next_action         TEXT    NOT NULL CHECK (next_action IN ('refund', 'reconcile')),
  next_attempt_at     INTEGER NOT NULL,
  lease_until         INTEGER,
  provider_refund_id  TEXT,
  worker_id           TEXT    NOT NULL DEFAULT '',
  last_reason         TEXT    NOT NULL DEFAULT '',
  first_sent_at       INTEGER,
  created_at          INTEGER NOT NULL,
  updated_at          INTEGER NOT NULL,
  lease_token_hash    BLOB    NOT NULL DEFAULT X'',
  evidence_at         INTEGER,
  cancel_requested_at INTEGER,
  attention_since     INTEGER,
  attention_reason    TEXT    NOT NULL DEFAULT '',
  traceparent         TEXT    NOT NULL DEFAULT '',
  tracestate          TEXT    NOT NULL DEFAULT ''
) STRICT;
INSERT INTO refund_jobs_new
  (id, operation_key, order_id, payment_id, amount_minor, currency, provider, state, attempt, next_action,
   next_attempt_at, lease_until, provider_refund_id, worker_id, last_reason, first_sent_at, created_at, updated_at,
   lease_token_hash, evidence_at)
SELECT id, operation_key, order_id, payment_id, amount_minor, currency, provider, state, attempt, next_action,
   next_attempt_at, lease_until, provider_refund_id, worker_id, last_reason, first_sent_at, created_at, updated_at,
   lease_token_hash, evidence_at
  FROM refund_jobs;
DELETE FROM sqlite_sequence WHERE name = 'refund_jobs_new';
INSERT INTO sqlite_sequence (name, seq) SELECT 'refund_jobs_new', seq FROM sqlite_sequence WHERE name = 'refund_jobs';
DROP TABLE refund_jobs;
ALTER TABLE refund_jobs_new RENAME TO refund_jobs;
CREATE UNIQUE INDEX uk_refund_jobs_operation_key ON refund_jobs (operation_key);
CREATE INDEX ix_refund_jobs_due ON refund_jobs (next_attempt_at, id) WHERE state = 'ready';
CREATE INDEX ix_refund_jobs_lease ON refund_jobs (lease_until, id) WHERE state = 'running';
CREATE INDEX ix_refund_jobs_order ON refund_jobs (order_id, created_at, id);
CREATE INDEX ix_refund_jobs_state ON refund_jobs (state, next_attempt_at, id);
CREATE INDEX ix_refund_jobs_provider ON refund_jobs (provider, id);
CREATE INDEX ix_refund_jobs_provider_due ON refund_jobs (provider, next_attempt_at, id) WHERE state = 'ready';
CREATE INDEX ix_refund_jobs_provider_lease ON refund_jobs (provider, lease_until, id) WHERE state = 'running';
CREATE INDEX ix_refund_jobs_payment ON refund_jobs (payment_id, created_at, id);
CREATE INDEX ix_refund_jobs_provider_refund ON refund_jobs (provider_refund_id);
CREATE INDEX ix_refund_jobs_succeeded ON refund_jobs (next_attempt_at, id) WHERE state = 'succeeded';
-- R34: the attention list, longest listed first: only jobs on it.
CREATE INDEX ix_refund_jobs_attention ON refund_jobs (attention_since, id) WHERE attention_since IS NOT NULL;
-- R31: cancelled jobs, oldest first, for the archive.
CREATE INDEX ix_refund_jobs_cancelled ON refund_jobs (next_attempt_at, id) WHERE state = 'cancelled';

ALTER TABLE refund_jobs_archive ADD COLUMN cancel_requested_at INTEGER;
ALTER TABLE refund_jobs_archive ADD COLUMN attention_since INTEGER;
ALTER TABLE refund_jobs_archive ADD COLUMN attention_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE refund_jobs_archive ADD COLUMN traceparent TEXT NOT NULL DEFAULT '';
ALTER TABLE refund_jobs_archive ADD COLUMN tracestate TEXT NOT NULL DEFAULT '';

-- R33: the providers paused now; a row per paused provider, deleted by its
-- resume.
CREATE TABLE IF NOT EXISTS provider_pauses (
  provider  TEXT    NOT NULL PRIMARY KEY,
  paused_by TEXT    NOT NULL,
  reason    TEXT    NOT NULL,
  paused_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- R33: who paused and resumed which provider, when and why: kept for good.
CREATE TABLE IF NOT EXISTS provider_pause_events (
  id         INTEGER PRIMARY KEY AUTOINCREMENT,
  provider   TEXT    NOT NULL,
  action     TEXT    NOT NULL,
  actor      TEXT    NOT NULL,
  reason     TEXT    NOT NULL,
  created_at INTEGER NOT NULL
) STRICT;
