-- Q2 per provider: a claim with a provider filter walks that provider's due
-- jobs and expired leases in claim order, and touches none of another
-- provider's backlog (Q3's reasoning: its cost must not grow with rows it
-- does not return).
CREATE INDEX ix_refund_jobs_provider_due ON refund_jobs (state, provider, next_attempt_at, id);
CREATE INDEX ix_refund_jobs_provider_lease ON refund_jobs (state, provider, lease_until, id);
