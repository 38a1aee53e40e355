-- A running job's next_attempt_at is its lease end (DESIGN.md, "One index
-- for due work and expired leases"): every grant and renewal now moves it
-- with lease_until, and claims find expired leases on ix_refund_jobs_due.
-- The jobs running now get theirs here; a coordinator of an earlier release
-- still running leaves next_attempt_at earlier than lease_until, which the
-- takeover walk passes over early, never misses.
UPDATE refund_jobs SET next_attempt_at = lease_until
 WHERE state = 'running' AND lease_until IS NOT NULL AND next_attempt_at < lease_until;
