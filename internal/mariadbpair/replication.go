package mariadbpair

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Replication credentials. The account only exists on loopback servers that
// live for one test, so a fixed password is fine.
const (
	replUser     = "repl"
	replPassword = "repl"
)

// semiSyncTimeoutMs is how long a semi-sync primary waits for the replica's
// acknowledgement before it silently degrades to async. A day is "never" for
// a test or a campaign; the variable's maximum is not used because the wait
// converts it to nanoseconds, where a value that large could overflow.
const semiSyncTimeoutMs = 24 * 60 * 60 * 1000

// defaultWait bounds a replication wait when the context has no deadline.
const defaultWait = 60 * time.Second

// prepareAccounts creates, without writing them to the binlog, the accounts
// the pair needs on a server: root over TCP (install-db makes one today;
// IF NOT EXISTS keeps that an assumption we do not depend on) and the
// replication user. Both servers get both, so a promoted replica can serve
// the same logins. Not binlogging them keeps the replica from replaying them
// and, on a semi-sync primary, keeps these commits from waiting for an
// acknowledgement no replica can give yet.
func prepareAccounts(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return execAll(ctx, conn,
		"SET SESSION sql_log_bin=0",
		"CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'",
		"GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION",
		fmt.Sprintf("CREATE USER IF NOT EXISTS '%s'@'127.0.0.1' IDENTIFIED BY '%s'", replUser, replPassword),
		fmt.Sprintf("GRANT REPLICATION SLAVE ON *.* TO '%s'@'127.0.0.1'", replUser),
	)
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func execAll(ctx context.Context, db execer, stmts ...string) error {
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// connectReplica points the replica at the primary by GTID. slave_pos starts
// from the replica's applied position (empty: the primary's first binlog),
// and MASTER_CONNECT_RETRY=1 keeps the IO thread's reconnects quick.
func connectReplica(ctx context.Context, replica *sql.DB, primaryPort int) error {
	return execAll(ctx, replica,
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%d, MASTER_USER='%s', MASTER_PASSWORD='%s', "+
			"MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1", primaryPort, replUser, replPassword),
		"START SLAVE",
	)
}

// slaveStatus is SHOW SLAVE STATUS as column name → value; empty when the
// server has no replication configured.
func slaveStatus(ctx context.Context, db *sql.DB) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, "SHOW SLAVE STATUS")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	status := map[string]string{}
	if rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		for i, c := range cols {
			status[c] = vals[i].String
		}
	}
	return status, rows.Err()
}

// describeSlave is a one-line summary of the replica's threads for errors.
func describeSlave(st map[string]string) string {
	return fmt.Sprintf("IO=%s SQL=%s Gtid_IO_Pos=%q Last_IO_Error=%q Last_SQL_Error=%q",
		st["Slave_IO_Running"], st["Slave_SQL_Running"], st["Gtid_IO_Pos"], st["Last_IO_Error"], st["Last_SQL_Error"])
}

// waitReplicating polls until both replication threads run. An IO thread
// that keeps failing (wrong credentials, unreachable primary) stays
// "Connecting": the deadline then fails with its last error.
func waitReplicating(ctx context.Context, replica *sql.DB) error {
	return poll(ctx, func() (bool, string, error) {
		st, err := slaveStatus(ctx, replica)
		if err != nil {
			return false, "", err
		}
		return st["Slave_IO_Running"] == "Yes" && st["Slave_SQL_Running"] == "Yes", describeSlave(st), nil
	})
}

// waitSemiSyncOn polls the primary until a semi-sync replica is registered
// and semi-sync is on: only then does a commit wait for an acknowledgement.
func waitSemiSyncOn(ctx context.Context, primary *sql.DB) error {
	return poll(ctx, func() (bool, string, error) {
		clients, err := globalStatus(ctx, primary, "Rpl_semi_sync_master_clients")
		if err != nil {
			return false, "", err
		}
		on, err := globalStatus(ctx, primary, "Rpl_semi_sync_master_status")
		if err != nil {
			return false, "", err
		}
		n, _ := strconv.Atoi(clients)
		return n >= 1 && on == "ON", fmt.Sprintf("Rpl_semi_sync_master_clients=%s Rpl_semi_sync_master_status=%s", clients, on), nil
	})
}

func globalStatus(ctx context.Context, db *sql.DB, name string) (string, error) {
	// SHOW STATUS LIKE takes no placeholder; the information_schema view does.
	var v string
	err := db.QueryRowContext(ctx, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?", name).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("status variable %s does not exist", name)
	}
	return v, err
}

// poll calls check every 50ms until it reports done or fails, or the
// context (bounded by defaultWait) ends; the last state it described goes in
// the timeout error. The servers are up by then, so an error is not retried.
func poll(ctx context.Context, check func() (done bool, state string, err error)) error {
	ctx, cancel := withDefaultDeadline(ctx)
	defer cancel()
	for {
		done, state, err := check()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last state: %s)", ctx.Err(), state)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func withDefaultDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultWait)
}

// waitApplied blocks until the replica has applied every GTID in pos. The
// timeout is passed to MASTER_GTID_WAIT itself so the server gives up by the
// context's deadline too, rather than holding a thread after the client left.
func waitApplied(ctx context.Context, replica *sql.DB, pos string) error {
	ctx, cancel := withDefaultDeadline(ctx)
	defer cancel()
	deadline, _ := ctx.Deadline()
	secs := math.Max(time.Until(deadline).Seconds()-0.5, 0.1)
	var res sql.NullInt64
	if err := replica.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, ?)", pos, secs).Scan(&res); err != nil {
		return fmt.Errorf("MASTER_GTID_WAIT(%q): %w", pos, err)
	}
	if res.Valid && res.Int64 == 0 {
		return nil
	}
	st, _ := slaveStatus(ctx, replica)
	var applied string
	_ = replica.QueryRowContext(ctx, "SELECT @@gtid_slave_pos").Scan(&applied)
	return fmt.Errorf("replica did not apply %q within %.1fs (applied %q; %s)", pos, secs, applied, describeSlave(st))
}
