package mariadbpair

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"time"
)

// Single is one private MariaDB server of the same make as a Pair's, for
// tests that need a server of their own (or any server, where none runs).
type Single struct {
	s       *server
	tempDir string

	closeOnce sync.Once
	closeErr  error
}

// StartSingle installs a datadir and starts one server on a free loopback
// port with root reachable over TCP without a password. o.SemiSync is
// ignored. The server dies with this process if Close is never called.
func StartSingle(ctx context.Context, o Options) (*Single, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	one := &Single{}
	if err := one.start(ctx, o); err != nil {
		one.Close()
		return nil, fmt.Errorf("mariadbpair: %w", err)
	}
	return one, nil
}

func (one *Single) start(ctx context.Context, o Options) error {
	began := time.Now()
	b, err := findBinaries(o.Dir, "mariadb-")
	if err != nil {
		return err
	}
	one.tempDir = b.tempDir
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	if one.s, err = newServer(b.parent, "server", ports[0]); err != nil {
		return err
	}
	if err := one.s.install(ctx, b.install); err != nil {
		return err
	}
	if err := startOnFreePort(ctx, one.s, b.server, []string{"--server-id=1"}); err != nil {
		return err
	}
	if err := prepareAccounts(ctx, one.s.admin); err != nil {
		return err
	}
	db, err := sql.Open("mysql", one.DSN(""))
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("root login over TCP at %s: %w", one.Addr(), err)
	}
	o.Logf("mariadbpair: a private server on %s (%v)", one.Addr(), since(began))
	return nil
}

// Addr is the server's "127.0.0.1:PORT".
func (one *Single) Addr() string { return one.s.addr() }

// DSN is a go-sql-driver/mysql DSN for root on the server, database db.
func (one *Single) DSN(db string) string { return rootDSN(one.Addr(), db) }

// Close stops the server and removes the temp dir StartSingle made. It is
// safe to call more than once.
func (one *Single) Close() error {
	one.closeOnce.Do(func() {
		if one.s != nil {
			one.s.kill()
		}
		if one.tempDir != "" {
			one.closeErr = os.RemoveAll(one.tempDir)
		}
	})
	return one.closeErr
}
