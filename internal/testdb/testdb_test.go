package testdb

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"
)

// Where nothing answers at 127.0.0.1:3306, the tests run on a private
// MariaDB of their own process: it starts from the installed package and
// takes the schema's databases as the shared one does.
func TestPrivateServerServes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a MariaDB server of its own")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	one, dir, err := startPrivate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	defer one.Close()
	db, err := sql.Open("mysql", one.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{"CREATE DATABASE jftest_private", "CREATE TABLE jftest_private.t (id INT PRIMARY KEY)",
		"INSERT INTO jftest_private.t VALUES (1)"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
