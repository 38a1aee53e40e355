-- A running job's next_attempt_at is now its lease's end (when a takeover may
-- next attempt it), so (state, next_attempt_at, id) finds due jobs and
-- expired leases alike (Q2) and the lease index goes: one secondary index
-- fewer to maintain on every claim and write-back.
UPDATE refund_jobs SET next_attempt_at = lease_until WHERE state = 'running' AND lease_until IS NOT NULL;
ALTER TABLE refund_jobs DROP INDEX ix_refund_jobs_lease;
