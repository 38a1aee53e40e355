// Package mariadbpair starts a real MariaDB primary and a real GTID replica on
// loopback, each with its own datadir, port and socket, so that a test or a
// chaos campaign can make a database failover happen for real: hold the
// replica back, let commits land on the primary only, kill -9 the primary and
// promote the replica.
//
// An async pair loses on failover whatever the replica never received; a
// semi-sync pair (AFTER_SYNC, never falling back to async) loses nothing,
// because every acknowledged commit is in the replica's relay log and
// Promote applies the relay log before opening the replica to writes.
//
// The MariaDB server must be installed (mariadbd and mariadb-install-db);
// Start fails, with that message, when it is not.
package mariadbpair

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Options configure Start.
type Options struct {
	// SemiSync makes the pair lossless: semi-sync replication acknowledged
	// AFTER_SYNC, with a timeout so long that the primary never silently
	// falls back to async. When false, replication is plain async.
	SemiSync bool
	// Dir is the parent folder of both servers' folders (datadir, socket,
	// error log). When empty, a fresh temp dir is used and Close removes
	// it; a given Dir is left in place with the servers' logs.
	Dir string
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// Pair is a running primary and replica. Its methods may be called from
// several goroutines, but the failover steps (HoldBack, KillPrimary,
// Promote) are meant to run in that order from one.
type Pair struct {
	opts    Options
	primary *server
	replica *server
	tempDir string // removed by Close; empty when the caller gave Dir

	closeOnce sync.Once
	closeErr  error
}

// Start installs two datadirs, starts a primary (server_id 1, binlog, GTID)
// and a replica (server_id 2, read_only), creates a replication user,
// connects the replica with CHANGE MASTER TO ... MASTER_USE_GTID=slave_pos
// and waits until the replica is running and caught up. ctx bounds the whole
// start; the servers outlive it and stop at Close. On error, whatever was
// started is stopped and a temp dir removed; a given Dir keeps the servers'
// folders and logs, so the next Start needs another Dir.
func Start(ctx context.Context, o Options) (*Pair, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	p := &Pair{opts: o}
	if err := p.start(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("mariadbpair: %w", err)
	}
	return p, nil
}

func (p *Pair) start(ctx context.Context) error {
	began := time.Now()
	b, err := findBinaries(p.opts.Dir, "mariadbpair-")
	if err != nil {
		return err
	}
	installBin, serverBin, parent := b.install, b.server, b.parent
	p.tempDir = b.tempDir
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	if p.primary, err = newServer(parent, "primary", ports[0]); err != nil {
		return err
	}
	if p.replica, err = newServer(parent, "replica", ports[1]); err != nil {
		return err
	}

	if err := p.both(func(s *server) error { return s.install(ctx, installBin) }); err != nil {
		return err
	}
	p.opts.Logf("mariadbpair: datadirs installed in %s (%v)", parent, since(began))

	if err := p.both(func(s *server) error { return startOnFreePort(ctx, s, serverBin, p.roleFlags(s)) }); err != nil {
		return err
	}
	p.opts.Logf("mariadbpair: primary on %s, replica on %s, semi-sync %v (%v)", p.PrimaryAddr(), p.ReplicaAddr(), p.opts.SemiSync, since(began))

	if err := p.both(func(s *server) error { return prepareAccounts(ctx, s.admin) }); err != nil {
		return err
	}
	if err := p.both(p.checkTCPLogin(ctx)); err != nil {
		return err
	}
	if err := connectReplica(ctx, p.replica.admin, p.primary.port); err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	if err := waitReplicating(ctx, p.replica.admin); err != nil {
		return fmt.Errorf("replica never started replicating: %w; %s", err, p.replica.logTail())
	}
	if p.opts.SemiSync {
		if err := waitSemiSyncOn(ctx, p.primary.admin); err != nil {
			return fmt.Errorf("primary never saw a semi-sync replica: %w; %s", err, p.primary.logTail())
		}
	}
	if err := p.WaitCaughtUp(ctx); err != nil {
		return err
	}
	p.opts.Logf("mariadbpair: replica replicating and caught up (%v)", since(began))
	return nil
}

// roleFlags are what makes s the primary or the replica.
func (p *Pair) roleFlags(s *server) []string {
	if s == p.primary {
		flags := []string{"--server-id=1"}
		if p.opts.SemiSync {
			flags = append(flags,
				"--rpl-semi-sync-master-enabled=ON",
				// AFTER_SYNC: the commit is acknowledged by the replica
				// before it is visible to anyone on the primary, so no
				// client can see (or be told about) a commit the replica
				// lacks.
				"--rpl-semi-sync-master-wait-point=AFTER_SYNC",
				"--rpl-semi-sync-master-timeout="+strconv.Itoa(semiSyncTimeoutMs),
				// Keep waiting even while no replica is connected, rather
				// than degrading to async.
				"--rpl-semi-sync-master-wait-no-slave=ON",
			)
		}
		return flags
	}
	// The replica must not be a semi-sync master itself: once promoted it
	// would wait a day on every commit for a replica it does not have.
	flags := []string{"--server-id=2", "--read-only=1"}
	if p.opts.SemiSync {
		flags = append(flags, "--rpl-semi-sync-slave-enabled=ON")
	}
	return flags
}

// checkTCPLogin proves the account DSN names works over TCP, so a caller
// gets this clear error instead of a login failure later.
func (p *Pair) checkTCPLogin(ctx context.Context) func(*server) error {
	return func(s *server) error {
		db, err := sql.Open("mysql", p.DSN(s.addr(), ""))
		if err != nil {
			return err
		}
		defer db.Close()
		if err := db.PingContext(ctx); err != nil {
			return fmt.Errorf("%s: root login over TCP at %s: %w", s.name, s.addr(), err)
		}
		return nil
	}
}

// both runs f on the primary and the replica at once (installs and starts
// are mostly waiting on disk and on the other core) and joins their errors.
func (p *Pair) both(f func(*server) error) error {
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, s := range []*server{p.primary, p.replica} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(s)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// PrimaryAddr is the primary's "127.0.0.1:PORT". The address names the
// server, not the role: after Promote the new primary is at ReplicaAddr.
func (p *Pair) PrimaryAddr() string { return p.primary.addr() }

// ReplicaAddr is the replica's "127.0.0.1:PORT".
func (p *Pair) ReplicaAddr() string { return p.replica.addr() }

// DSN is a go-sql-driver/mysql DSN for addr with database db (db may be
// ""), for root, which may create databases, tables and users. Root has
// SUPER, so it bypasses read_only: check writability as another user.
func (p *Pair) DSN(addr, db string) string { return rootDSN(addr, db) }

// rootDSN is root's DSN on the server at addr, database db.
func rootDSN(addr, db string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", addr, db
	return cfg.FormatDSN()
}

// HoldBack makes the replica fall behind from now on. Async: STOP SLAVE
// IO_THREAD, so new events never reach it and a failover loses them.
// Semi-sync: STOP SLAVE SQL_THREAD, so events are still received and
// acknowledged into the relay log (commits go on) but not yet applied.
func (p *Pair) HoldBack(ctx context.Context) error {
	stmt := "STOP SLAVE IO_THREAD"
	if p.opts.SemiSync {
		stmt = "STOP SLAVE SQL_THREAD"
	}
	if _, err := p.replica.admin.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("mariadbpair: hold back: %s: %w", stmt, err)
	}
	p.opts.Logf("mariadbpair: replica held back (%s)", stmt)
	return nil
}

// KillPrimary sends SIGKILL to the primary and waits for it to exit. It
// fails when the primary is not running.
func (p *Pair) KillPrimary() error {
	if !p.primary.running() {
		return errors.New("mariadbpair: kill primary: it is not running")
	}
	p.primary.kill()
	p.opts.Logf("mariadbpair: primary killed (%v)", p.primary.waitErr)
	return nil
}

// Promote makes the replica the primary as failover tooling does. It first
// applies everything already received into the relay log (START SLAVE
// SQL_THREAD, then wait until the applied position reaches Gtid_IO_Pos); on
// a semi-sync pair that is every acknowledged commit. Then STOP SLAVE; RESET
// SLAVE ALL; SET GLOBAL read_only=0. An async pair loses what never reached
// the replica: that is the point. It refuses a replica whose IO and SQL
// threads are both stopped (not the state HoldBack leaves), because starting
// one would make MariaDB discard the relay log.
func (p *Pair) Promote(ctx context.Context) error {
	db := p.replica.admin
	st, err := slaveStatus(ctx, db)
	if err != nil {
		return fmt.Errorf("mariadbpair: promote: %w", err)
	}
	// MariaDB in GTID mode discards the relay log when a slave thread starts
	// while both are stopped, and refetches from the (dead) primary: the
	// received events this step must apply would be gone without an error.
	// So the IO thread is left as it is (after the primary died it only
	// retries its connection), and a replica whose two threads were both
	// stopped by someone else is refused rather than silently emptied.
	if st["Slave_IO_Running"] == "No" && st["Slave_SQL_Running"] == "No" {
		return fmt.Errorf("mariadbpair: promote: both replication threads are stopped; starting one would discard the relay log (%s)", describeSlave(st))
	}
	// Read before the SQL thread starts: should the relay log still be
	// lost, waiting for this position fails instead of passing at once.
	received := st["Gtid_IO_Pos"]
	if _, err := db.ExecContext(ctx, "START SLAVE SQL_THREAD"); err != nil {
		return fmt.Errorf("mariadbpair: promote: START SLAVE SQL_THREAD: %w", err)
	}
	if err := waitApplied(ctx, db, received); err != nil {
		return fmt.Errorf("mariadbpair: promote: relay log not applied: %w", err)
	}
	if err := execAll(ctx, db, "STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only=0"); err != nil {
		return fmt.Errorf("mariadbpair: promote: %w", err)
	}
	p.opts.Logf("mariadbpair: replica promoted at %s after applying received position %q", p.ReplicaAddr(), received)
	return nil
}

// PrimaryGTID is the primary's @@gtid_binlog_pos: every transaction it has
// committed, for a report written just before KillPrimary.
func (p *Pair) PrimaryGTID(ctx context.Context) (string, error) {
	return p.primary.gtid(ctx, "@@gtid_binlog_pos")
}

// ReplicaGTID is the replica's @@gtid_current_pos: every transaction it has
// applied or, once promoted, committed itself.
func (p *Pair) ReplicaGTID(ctx context.Context) (string, error) {
	return p.replica.gtid(ctx, "@@gtid_current_pos")
}

// WaitCaughtUp waits until the replica has applied everything the primary
// has committed so far (MASTER_GTID_WAIT on the primary's binlog position).
func (p *Pair) WaitCaughtUp(ctx context.Context) error {
	pos, err := p.PrimaryGTID(ctx)
	if err != nil {
		return err
	}
	if err := waitApplied(ctx, p.replica.admin, pos); err != nil {
		return fmt.Errorf("mariadbpair: replica not caught up: %w", err)
	}
	return nil
}

func (s *server) gtid(ctx context.Context, variable string) (string, error) {
	if !s.running() {
		return "", fmt.Errorf("mariadbpair: %s is not running", s.name)
	}
	var pos string
	if err := s.admin.QueryRowContext(ctx, "SELECT "+variable).Scan(&pos); err != nil {
		return "", fmt.Errorf("mariadbpair: %s %s: %w", s.name, variable, err)
	}
	return pos, nil
}

// Close kills both servers (those still running) and removes the temp dir
// Start created. It is safe to call more than once, and after a failed or
// partial Start.
func (p *Pair) Close() error {
	p.closeOnce.Do(func() {
		for _, s := range []*server{p.primary, p.replica} {
			if s != nil {
				s.kill()
			}
		}
		if p.tempDir != "" {
			p.closeErr = os.RemoveAll(p.tempDir)
		}
	})
	return p.closeErr
}

// binaries are the programs a start runs and the folder it puts the
// servers in.
type binaries struct {
	install, server string
	parent, tempDir string // tempDir: the parent when made here, for Close to remove
}

// findBinaries finds the programs and makes dir (a fresh temp dir named
// prefix… when empty) the servers' parent folder.
func findBinaries(dir, prefix string) (binaries, error) {
	var b binaries
	var err error
	if b.install, err = findBinary("mariadb-install-db"); err != nil {
		return b, err
	}
	if b.server, err = findBinary("mariadbd"); err != nil {
		return b, err
	}
	b.parent = dir
	if b.parent == "" {
		// A short temp path keeps the socket path within the kernel's limit.
		if b.parent, err = os.MkdirTemp("", prefix); err != nil {
			return b, err
		}
		b.tempDir = b.parent
	}
	return b, nil
}

// startOnFreePort starts s, picking another port when the chosen one was
// taken between freePorts closing it and mariadbd binding it.
func startOnFreePort(ctx context.Context, s *server, bin string, role []string) error {
	for attempt := 1; ; attempt++ {
		err := s.start(ctx, bin, role)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "Address already in use") {
			return err
		}
		ports, perr := freePorts(1)
		if perr != nil {
			return errors.Join(err, perr)
		}
		s.port = ports[0]
	}
}

// freePorts asks the kernel for n free loopback ports. All listeners are
// held until every port is chosen, so the n ports differ.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(10 * time.Millisecond) }
