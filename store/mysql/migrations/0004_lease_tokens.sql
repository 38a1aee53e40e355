-- R25: every grant mints a lease token; the row keeps its SHA-256 beside the
-- attempt, and every write-back of the grant must match both. Empty for a
-- grant made before tokens existed: such a grant is written back with its
-- attempt alone, until its next claim or takeover mints a token.
ALTER TABLE refund_jobs ADD COLUMN lease_token_hash VARBINARY(32) NOT NULL DEFAULT '';

-- The grant each claim or takeover made, and the one each holder's
-- write-back carried: the history tells two grants of one attempt apart
-- (R26: a lossy failover can grant an attempt number twice).
ALTER TABLE refund_job_events ADD COLUMN lease_token_hash VARBINARY(32) NOT NULL DEFAULT '';

-- R15: whether a receipt came with the lease token of the attempt it names.
ALTER TABLE refund_observations ADD COLUMN attempt_verified BOOLEAN NOT NULL DEFAULT FALSE;
