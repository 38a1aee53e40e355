-- R19: each provider's outbound budget, a token bucket shared by every
-- coordinator on this database. Refunds and reconciles draw from it alike.
CREATE TABLE IF NOT EXISTS provider_budgets (
  provider    VARCHAR(64) NOT NULL,
  tokens      DOUBLE      NOT NULL,
  rate        DOUBLE      NOT NULL,
  burst       DOUBLE      NOT NULL,
  refilled_at DATETIME(6) NOT NULL,
  PRIMARY KEY (provider)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
