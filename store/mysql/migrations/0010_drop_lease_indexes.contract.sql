-- Contract: the two lease indexes, which no query of this release walks
-- (0009). Coordinators of earlier releases name them in their claims, so on
-- a database a fleet runs on this is applied only when asked, once every
-- coordinator runs this release (coordinator --migrate-contract; DEPLOY.md).
-- A claim and a completion then rewrite two of the job's index entries
-- fewer (docs/BENCHMARKS.md, scenario W).
DROP INDEX ix_refund_jobs_lease ON refund_jobs;
DROP INDEX ix_refund_jobs_provider_lease ON refund_jobs;
