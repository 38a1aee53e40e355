package mysql_test

import (
	"context"
	"testing"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/mysql"
	"github.com/jobfence/jobfence/store/storetest"
)

func open(t *testing.T) store.Store { return openMySQL(t, testdb.MySQL(t), mysql.Options{}) }

// openMySQL opens the store on dsn, closed when the test ends.
func openMySQL(t *testing.T, dsn string, opts mysql.Options) *mysql.Store {
	t.Helper()
	s, err := mysql.Open(context.Background(), dsn, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, open) }
