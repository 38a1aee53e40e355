-- R30: the keys of jobs that coordinators of an earlier release enqueued
-- while this release rolled out (they write no key row). Applied once every
-- coordinator runs this release (--migrate-contract): from then on every
-- enqueue writes its key, and the archiver, which waits for this migration,
-- may move jobs out of refund_jobs without an earlier release enqueueing
-- their keys again.
INSERT IGNORE INTO refund_operation_keys
  (operation_key, job_id, order_id, payment_id, amount_minor, currency, provider, created_at)
SELECT operation_key, id, order_id, payment_id, amount_minor, currency, provider, created_at FROM refund_jobs;
