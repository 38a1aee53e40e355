-- ListJobs by payment: all refunds of one payment, newest first, as Q7's
-- order index does for an order.
CREATE INDEX IF NOT EXISTS ix_refund_jobs_payment ON refund_jobs (payment_id, created_at, id);

-- ListJobs by provider refund id: the job whose refund has it, and the jobs
-- with a receipt naming it (R15). Both end in the job's id (the rowid), the
-- listing's order.
CREATE INDEX IF NOT EXISTS ix_refund_jobs_provider_refund ON refund_jobs (provider_refund_id);
CREATE INDEX IF NOT EXISTS ix_refund_observations_provider_refund ON refund_observations (provider_refund_id, job_id);

-- From this version on an escalation sets next_attempt_at to when the job
-- entered review, so the reviews by state list the longest waiting first. A
-- job already in review was last changed by its escalation: its updated_at
-- is that moment.
UPDATE refund_jobs SET next_attempt_at = updated_at WHERE state = 'manual_review';
