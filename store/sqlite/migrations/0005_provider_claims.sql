-- Q2 per provider: a claim with a provider filter walks that provider's due
-- jobs and expired leases in claim order, and touches none of another
-- provider's backlog. Partial, like the unfiltered ones: finished history is
-- not in them.
CREATE INDEX ix_refund_jobs_provider_due ON refund_jobs (provider, next_attempt_at, id) WHERE state = 'ready';
CREATE INDEX ix_refund_jobs_provider_lease ON refund_jobs (provider, lease_until, id) WHERE state = 'running';
