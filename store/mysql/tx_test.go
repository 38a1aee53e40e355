package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
	"github.com/jobfence/jobfence/store/mysql"
)

// TestTransactionsEndOnTheirConnection_R10_R11: a transaction is begun with
// a statement on a connection of its own (sqlbase.Backend.Begin), so every
// way out of it must end it there: a failed step, a context ended before the
// COMMIT, a panic and a connection killed under it all leave nothing
// written, and no connection goes back to the pool inside a transaction
// (the next caller would run in it, and commit what it left).
func TestTransactionsEndOnTheirConnection_R10_R11(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := testdb.MySQL(t)
	s := openMySQL(t, dsn, mysql.Options{MaxOpenConns: 1}) // one connection: each try reuses the last one's
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, `CREATE TABLE tx_probe (id INT PRIMARY KEY, step VARCHAR(40) NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// insert writes a row for step in tx and returns the connection's id.
	insert := func(ctx context.Context, tx sqlbase.Tx, id int, step string) (int64, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO tx_probe (id, step) VALUES (?, ?)`, id, step); err != nil {
			return 0, err
		}
		var conn int64
		err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&conn)
		return conn, err
	}
	// openTx reports whether the server still holds a transaction of conn.
	openTx := func(conn int64) bool {
		var n int
		if err := admin.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?`,
			conn).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	// ended waits for the server to end conn's transaction: a discarded
	// connection's rollback happens when the server notices it closed.
	ended := func(step string, conn int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); openTx(conn); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: connection %d is still inside its transaction", step, conn)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	stepFailed := errors.New("step failed")
	steps := []struct {
		name string
		run  func(id int) (int64, error)
	}{
		{"failed step", func(id int) (conn int64, err error) {
			err = s.InTx(ctx, func(tx sqlbase.Tx) error {
				conn, err = insert(ctx, tx, id, "failed step")
				return errors.Join(err, stepFailed)
			})
			return conn, err
		}},
		{"context ended before COMMIT", func(id int) (conn int64, err error) {
			cctx, ccancel := context.WithCancel(ctx)
			err = s.InTx(cctx, func(tx sqlbase.Tx) error {
				conn, err = insert(cctx, tx, id, "context ended")
				ccancel()
				return err
			})
			return conn, err
		}},
		{"panic", func(id int) (conn int64, err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			err = s.InTx(ctx, func(tx sqlbase.Tx) error {
				if conn, err = insert(ctx, tx, id, "panic"); err != nil {
					return err
				}
				panic("in a transaction")
			})
			return conn, err
		}},
		{"connection killed", func(id int) (conn int64, err error) {
			err = s.InTx(ctx, func(tx sqlbase.Tx) error {
				if conn, err = insert(ctx, tx, id, "connection killed"); err != nil {
					return err
				}
				if _, err := admin.ExecContext(ctx, fmt.Sprintf("KILL %d", conn)); err != nil {
					return fmt.Errorf("kill: %w", err)
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO tx_probe (id, step) VALUES (?, 'after the kill')`, id+100)
				return err
			})
			return conn, err
		}},
	}
	for i, step := range steps {
		conn, err := step.run(i + 1)
		if err == nil {
			t.Fatalf("%s: the transaction committed", step.name)
		}
		if conn == 0 {
			t.Fatalf("%s: the transaction did not reach its insert: %v", step.name, err)
		}
		ended(step.name, conn)
	}
	var rows int
	if err := admin.QueryRowContext(ctx, `SELECT COUNT(*) FROM tx_probe`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d rows of transactions that did not commit were written", rows)
	}

	// The pool still serves, outside any transaction: a committed
	// transaction's row is there, and the connection is not left in one.
	var conn int64
	if err := s.InTx(ctx, func(tx sqlbase.Tx) (err error) {
		conn, err = insert(ctx, tx, 50, "committed")
		return err
	}); err != nil {
		t.Fatalf("a transaction after the failures: %v", err)
	}
	if openTx(conn) {
		t.Fatal("the connection went back to the pool inside its transaction after COMMIT")
	}
	if err := admin.QueryRowContext(ctx, `SELECT COUNT(*) FROM tx_probe WHERE id = 50`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("committed row: %d, %v", rows, err)
	}
}
