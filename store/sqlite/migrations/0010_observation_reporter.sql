-- R28: who filed a receipt, from the caller's credential ('webhook:<provider>'
-- for a signed webhook, '' on a coordinator without credentials), never from
-- the free-text source the caller names. A job keeps room for each reporter
-- and for receipts carrying their grant's token, so that no one credential
-- can fill another's job.
ALTER TABLE refund_observations ADD COLUMN reporter TEXT NOT NULL DEFAULT '';
