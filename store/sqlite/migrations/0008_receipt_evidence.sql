-- R28: when the newest receipt of success or failure was filed for the job
-- (INTEGER microseconds, UTC, the database's clock). A holder that
-- rescheduled to reconcile after such a receipt arrived during its grant
-- finds the job due now, and the coordinator measures the time from the
-- receipt to the completion. NULL until a receipt of either comes.
ALTER TABLE refund_jobs ADD COLUMN evidence_at INTEGER;
