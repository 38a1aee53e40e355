-- ListJobs by provider alone walks this instead of the whole table.
CREATE INDEX ix_refund_jobs_provider ON refund_jobs (provider, id);
