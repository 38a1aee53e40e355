-- refund_jobs: one row per refund (DESIGN.md, Columns). Times are INTEGER
-- microseconds since the Unix epoch, UTC, from the database's clock (R12); they
-- compare as integers. Text compares with SQLite's BINARY collation, so keys
-- are byte-exact: "ABC" and "abc" are different operation keys. STRICT tables
-- refuse a value of the wrong type instead of storing it. AUTOINCREMENT: an id
-- is never handed out again, so a late write can never reach another job.
CREATE TABLE refund_jobs (
  id                 INTEGER PRIMARY KEY AUTOINCREMENT,
  operation_key      TEXT    NOT NULL,
  order_id           TEXT    NOT NULL,
  payment_id         TEXT    NOT NULL,
  amount_minor       INTEGER NOT NULL,
  currency           TEXT    NOT NULL,
  provider           TEXT    NOT NULL,
  state              TEXT    NOT NULL CHECK (state IN ('ready', 'running', 'succeeded', 'manual_review')),
  attempt            INTEGER NOT NULL DEFAULT 0,
  next_action        TEXT    NOT NULL CHECK (next_action IN ('refund', 'reconcile')),
  next_attempt_at    INTEGER NOT NULL,
  lease_until        INTEGER,
  provider_refund_id TEXT,
  worker_id          TEXT    NOT NULL DEFAULT '',
  last_reason        TEXT    NOT NULL DEFAULT '',
  first_sent_at      INTEGER,
  created_at         INTEGER NOT NULL,
  updated_at         INTEGER NOT NULL
) STRICT;

-- R1: one job per operation key.
CREATE UNIQUE INDEX uk_refund_jobs_operation_key ON refund_jobs (operation_key);

-- Q2: the candidate query's index. Partial: finished history is not in it at
-- all, so its cost does not grow with history (Q3); (next_attempt_at, id) is
-- the claim order (Q1, Q4).
CREATE INDEX ix_refund_jobs_due ON refund_jobs (next_attempt_at, id) WHERE state = 'ready';

-- R6: expired leases, oldest first (R23). Only running jobs are in it.
CREATE INDEX ix_refund_jobs_lease ON refund_jobs (lease_until, id) WHERE state = 'running';

-- Q7: customer-service reads, all refunds of an order newest first.
CREATE INDEX ix_refund_jobs_order ON refund_jobs (order_id, created_at, id);

-- Append-only transition history (R3): who claimed, took over or wrote, under
-- which attempt, at which database time.
CREATE TABLE refund_job_events (
  id                 INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id             INTEGER NOT NULL,
  attempt            INTEGER NOT NULL,
  kind               TEXT    NOT NULL,
  worker_id          TEXT    NOT NULL DEFAULT '',
  from_state         TEXT    NOT NULL DEFAULT '',
  to_state           TEXT    NOT NULL,
  next_action        TEXT    NOT NULL,
  provider_refund_id TEXT    NOT NULL DEFAULT '',
  reason             TEXT    NOT NULL DEFAULT '',
  created_at         INTEGER NOT NULL
) STRICT;

CREATE INDEX ix_refund_job_events_job ON refund_job_events (job_id, id);

-- R15: receipts from stale workers, webhooks and reconcilers. Never changes a job.
CREATE TABLE refund_observations (
  id                 INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id             INTEGER NOT NULL,
  operation_key      TEXT    NOT NULL,
  reported_attempt   INTEGER NOT NULL,
  job_attempt        INTEGER NOT NULL,
  source             TEXT    NOT NULL,
  outcome            TEXT    NOT NULL,
  provider_refund_id TEXT    NOT NULL DEFAULT '',
  provider_event_id  TEXT    NOT NULL DEFAULT '',
  detail             TEXT    NOT NULL,
  dedupe_key         TEXT    NOT NULL,
  created_at         INTEGER NOT NULL
) STRICT;

CREATE UNIQUE INDEX uk_refund_observations_dedupe ON refund_observations (dedupe_key);

CREATE INDEX ix_refund_observations_job ON refund_observations (job_id, id);

-- R10: our own record of the refund, written in the same transaction as the
-- fenced completion. One row per job; a second completion cannot sneak in.
CREATE TABLE refund_ledger (
  job_id             INTEGER PRIMARY KEY,
  operation_key      TEXT    NOT NULL,
  provider           TEXT    NOT NULL,
  provider_refund_id TEXT    NOT NULL,
  amount_minor       INTEGER NOT NULL,
  currency           TEXT    NOT NULL,
  attempt            INTEGER NOT NULL,
  recorded_at        INTEGER NOT NULL
) STRICT;

CREATE UNIQUE INDEX uk_refund_ledger_operation_key ON refund_ledger (operation_key);
