-- R19: each provider's outbound budget, a token bucket. Refunds and
-- reconciles draw from it alike.
CREATE TABLE IF NOT EXISTS provider_budgets (
  provider    TEXT    NOT NULL PRIMARY KEY,
  tokens      REAL    NOT NULL,
  rate        REAL    NOT NULL,
  burst       REAL    NOT NULL,
  refilled_at INTEGER NOT NULL
) STRICT;
