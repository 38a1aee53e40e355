-- R32: when a cancel was requested of a job that may have been sent. No
-- grant of it carries next action refund from then on. NULL when none was.
ALTER TABLE refund_jobs ADD COLUMN cancel_requested_at DATETIME(6) NULL;
-- R34: since when, and why, the job is on the attention list (a receipt of
-- failure or of another refund id after it succeeded, a cancel that came too
-- late); NULL once a person acknowledged it.
ALTER TABLE refund_jobs ADD COLUMN attention_since DATETIME(6) NULL;
ALTER TABLE refund_jobs ADD COLUMN attention_reason VARCHAR(1024) NOT NULL DEFAULT '';
-- R35: the enqueue's W3C trace context, handed to every grant.
ALTER TABLE refund_jobs ADD COLUMN traceparent VARCHAR(55) NOT NULL DEFAULT '';
ALTER TABLE refund_jobs ADD COLUMN tracestate VARCHAR(512) NOT NULL DEFAULT '';
-- R34: the attention list, longest listed first; jobs not on it are not in
-- the index's range that matters (NULLs sort first and are skipped by
-- attention_since IS NOT NULL).
CREATE INDEX ix_refund_jobs_attention ON refund_jobs (attention_since, id);

ALTER TABLE refund_jobs_archive ADD COLUMN cancel_requested_at DATETIME(6) NULL;
ALTER TABLE refund_jobs_archive ADD COLUMN attention_since DATETIME(6) NULL;
ALTER TABLE refund_jobs_archive ADD COLUMN attention_reason VARCHAR(1024) NOT NULL DEFAULT '';
ALTER TABLE refund_jobs_archive ADD COLUMN traceparent VARCHAR(55) NOT NULL DEFAULT '';
ALTER TABLE refund_jobs_archive ADD COLUMN tracestate VARCHAR(512) NOT NULL DEFAULT '';

-- R33: the providers paused now, read by every coordinator each poll
-- interval; a row per paused provider, deleted by its resume.
CREATE TABLE IF NOT EXISTS provider_pauses (
  provider  VARCHAR(64)   NOT NULL,
  paused_by VARCHAR(128)  NOT NULL,
  reason    VARCHAR(1024) NOT NULL,
  paused_at DATETIME(6)   NOT NULL,
  PRIMARY KEY (provider)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- R33: who paused and resumed which provider, when and why: kept for good.
CREATE TABLE IF NOT EXISTS provider_pause_events (
  id         BIGINT        NOT NULL AUTO_INCREMENT,
  provider   VARCHAR(64)   NOT NULL,
  action     VARCHAR(16)   NOT NULL,
  actor      VARCHAR(128)  NOT NULL,
  reason     VARCHAR(1024) NOT NULL,
  created_at DATETIME(6)   NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
