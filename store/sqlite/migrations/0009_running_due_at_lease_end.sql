-- A running job's next_attempt_at is its lease end (DESIGN.md, "One index
-- for due work and expired leases"), as in MySQL: the jobs running now get
-- theirs here. SQLite keeps its partial lease indexes: a transition moves a
-- job's entry between two partial indexes, which costs what rewriting it in
-- one index would.
UPDATE refund_jobs SET next_attempt_at = lease_until
 WHERE state = 'running' AND lease_until IS NOT NULL AND next_attempt_at < lease_until;
