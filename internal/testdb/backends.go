package testdb

import (
	"context"
	"testing"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/mysql"
	"github.com/jobfence/jobfence/store/sqlite"
)

// Backend opens a fresh store of one kind for a test.
type Backend struct {
	Name string
	Open func(t *testing.T) store.Store
}

// Backends lists every store backend, for tests that must hold on all of them.
func Backends() []Backend {
	return []Backend{
		{Name: "mysql", Open: func(t *testing.T) store.Store {
			s, err := mysql.Open(context.Background(), MySQL(t), mysql.Options{})
			return opened(t, s, err)
		}},
		{Name: "sqlite", Open: func(t *testing.T) store.Store {
			s, err := sqlite.Open(context.Background(), SQLitePath(t), sqlite.Options{})
			return opened(t, s, err)
		}},
	}
}

func opened(t *testing.T, s store.Store, err error) store.Store {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// MySQLBackend and SQLiteBackend are the backends by name, for tests that
// need one of them.
func MySQLBackend() Backend { return backendNamed("mysql") }

// SQLiteBackend: see MySQLBackend.
func SQLiteBackend() Backend { return backendNamed("sqlite") }

func backendNamed(name string) Backend {
	for _, b := range Backends() {
		if b.Name == name {
			return b
		}
	}
	panic("testdb: no backend " + name)
}
