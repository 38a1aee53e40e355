-- A running job's next_attempt_at is its lease's end (when a takeover may
-- next attempt it), as the claim now sets it.
UPDATE refund_jobs SET next_attempt_at = lease_until WHERE state = 'running' AND lease_until IS NOT NULL;
