package mysql

import (
	"context"
	"database/sql"

	"github.com/go-sql-driver/mysql"
)

// CandidatesSQL is the claim's candidate statement, for tests that hold its
// locks open.
var CandidatesSQL = candidates

// OpenKeeping opens a pool on dsn whose connections keep up to keep
// prepared statements each, with interpolateParams as Open forces it (the
// text path a statement falls back to), and nothing else of Open.
func OpenKeeping(dsn string, keep int) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.InterpolateParams = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(preparedConnector{Connector: conn, keep: keep}), nil
}

// OpenMigratedTo is Open with the migrations applied up to version upTo
// only: the schema an earlier release left.
func OpenMigratedTo(ctx context.Context, dsn string, upTo int) (*Store, error) {
	return open(ctx, dsn, Options{}, upTo)
}

// The claim's candidate queries, for tests that count the rows they touch.
var (
	DueJobsSQL       = dueJobs
	ExpiredLeasesSQL = expiredLeases
)
