package mysql_test

import (
	"context"
	"testing"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/mysql"
	"github.com/jobfence/jobfence/store/storetest"
)

func open(t *testing.T) store.Store {
	t.Helper()
	s, err := mysql.Open(context.Background(), testdb.MySQL(t), mysql.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, open) }
