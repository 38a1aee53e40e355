-- ListJobs: by state (any state, not only the partial indexes' ready and
-- running) and by provider alone. The claim queries name their partial
-- indexes with INDEXED BY, so these never lure the planner away from them.
CREATE INDEX IF NOT EXISTS ix_refund_jobs_state ON refund_jobs (state, next_attempt_at, id);
CREATE INDEX IF NOT EXISTS ix_refund_jobs_provider ON refund_jobs (provider, id);
