package mariadbpair

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// startTimeout bounds one server's wait for readiness when the caller's
// context has no earlier deadline: a small instance is up in about a second,
// so a minute means it is stuck (the log tail then says why).
const startTimeout = 60 * time.Second

// maxSocketPath keeps the unix socket path under the kernel's sun_path limit
// (108 bytes including the terminating NUL).
const maxSocketPath = 100

// smallInstance keeps each server light on a 2-core machine and fast to
// start. The same sizes go to mariadb-install-db (it passes unknown options
// on to its bootstrap mariadbd) so the first real start does not resize the
// redo log.
var smallInstance = []string{
	"--innodb-buffer-pool-size=32M",
	"--innodb-log-file-size=16M",
	"--innodb-log-buffer-size=4M",
	"--max-connections=64",
}

// server is one mariadbd process with its own folder: datadir, socket,
// pid file and error log never shared with another instance (a second
// mariadbd on the same datadir hangs silently on the Aria control file lock).
type server struct {
	name    string // "primary" or "replica", for messages
	dir     string
	datadir string
	socket  string
	errLog  string
	tmpdir  string
	port    int

	cmd     *exec.Cmd
	logFile *os.File
	exited  chan struct{} // closed once the process has exited
	waitErr error         // cmd.Wait's result, set before exited closes
	admin   *sql.DB       // root@localhost over the unix socket
}

func newServer(parent, name string, port int) (*server, error) {
	dir := filepath.Join(parent, name)
	s := &server{
		name:    name,
		dir:     dir,
		datadir: filepath.Join(dir, "data"),
		socket:  filepath.Join(dir, "mariadbd.sock"),
		errLog:  filepath.Join(dir, "error.log"),
		tmpdir:  filepath.Join(dir, "tmp"),
		port:    port,
	}
	if len(s.socket) > maxSocketPath {
		return nil, fmt.Errorf("%s: socket path %s is longer than %d bytes: use a shorter Options.Dir", name, s.socket, maxSocketPath)
	}
	if _, err := os.Stat(dir); err == nil {
		return nil, fmt.Errorf("%s: %s already exists: Options.Dir must not hold a previous pair", name, dir)
	}
	if err := os.MkdirAll(s.tmpdir, 0o755); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// ownTmpdir gives each instance a tmpdir of its own. Two bootstraps sharing
// one tmpdir crash now and then (signal 11 dropping an Aria temporary
// table), and the pair must not share one with other servers either.
func (s *server) ownTmpdir() string { return "--tmpdir=" + s.tmpdir }

// userFlags lets mariadbd run as root, which it refuses without an explicit
// --user=root. Dropping to the mysql account instead would need the datadir
// chowned and every parent folder traversable by mysql, which a test's 0700
// temp dir is not. A non-root caller runs it as itself and needs no flag.
func userFlags() []string {
	if os.Geteuid() == 0 {
		return []string{"--user=root"}
	}
	return nil
}

// install creates the datadir with the system tables. The root account gets
// no password ("normal"), so it can log in over the socket and, as
// root@127.0.0.1, over TCP. --force only skips the script's lookup of this
// machine's hostname, which nothing here needs.
func (s *server) install(ctx context.Context, bin string) error {
	args := []string{"--no-defaults", "--datadir=" + s.datadir, s.ownTmpdir()}
	args = append(args, userFlags()...)
	args = append(args, "--auth-root-authentication-method=normal", "--skip-test-db", "--force")
	args = append(args, smallInstance...)
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		// The cause is at the top; the end is advice on bug reports.
		return fmt.Errorf("%s: mariadb-install-db: %w\n%s", s.name, err, firstLines(string(out), 30))
	}
	return nil
}

// serverFlags are the options every instance of the pair runs with; role
// flags (server id, read_only, semi-sync) come from the caller.
func (s *server) serverFlags() []string {
	// --no-defaults must come first: mariadbd only honours it there, and it
	// keeps the system option files (and the port, socket and datadir they
	// name) out of the pair.
	args := []string{"--no-defaults"}
	args = append(args, userFlags()...)
	args = append(args,
		"--datadir="+s.datadir,
		s.ownTmpdir(),
		"--socket="+s.socket,
		"--pid-file="+filepath.Join(s.dir, "mariadbd.pid"),
		"--log-error="+s.errLog,
		"--port="+strconv.Itoa(s.port),
		"--bind-address=127.0.0.1",
		"--skip-networking=0",
		"--skip-name-resolve",
		// Both servers write a binlog and log what they replicate, so the
		// replica is a real failover candidate whose GTID position counts.
		"--log-bin=binlog",
		"--relay-log=relay-bin",
		"--log-slave-updates",
		"--binlog-format=ROW",
		// A commit is in the binlog on disk before it is acknowledged, as on
		// a production primary.
		"--sync-binlog=1",
		"--gtid-strict-mode=1",
		// Replication is configured by Start, never resumed on its own.
		"--skip-slave-start",
	)
	return append(args, smallInstance...)
}

// start launches mariadbd with the role flags and waits until it answers on
// its socket. A start that fails includes the tail of the error log.
func (s *server) start(ctx context.Context, bin string, role []string) error {
	// Only this attempt's lines belong in an error message.
	if err := os.Remove(s.errLog); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// mariadbd reopens --log-error itself, but messages printed before it
	// does (bad options, for one) go to stderr: send both to the same file.
	logFile, err := os.OpenFile(s.errLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, append(s.serverFlags(), role...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("%s: start mariadbd: %w", s.name, err)
	}
	s.cmd, s.logFile, s.exited = cmd, logFile, make(chan struct{})
	go func() {
		s.waitErr = cmd.Wait()
		logFile.Close()
		close(s.exited)
	}()
	if err := s.waitReady(ctx); err != nil {
		s.kill()
		return err
	}
	return nil
}

// waitReady pings over the unix socket until the server answers, it exits,
// or the deadline passes; the last two fail with the error log's tail.
func (s *server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "unix", s.socket
	cfg.Timeout = time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		pingCtx, pingCancel := context.WithTimeout(ctx, 2*time.Second)
		err = db.PingContext(pingCtx)
		pingCancel()
		if err == nil {
			s.admin = db
			return nil
		}
		select {
		case <-s.exited:
			db.Close()
			return fmt.Errorf("%s: mariadbd exited before it was ready (%v); %s", s.name, s.waitErr, s.logTail())
		case <-ctx.Done():
			db.Close()
			return fmt.Errorf("%s: mariadbd not ready on %s: %v (last ping: %v); %s", s.name, s.socket, ctx.Err(), err, s.logTail())
		case <-tick.C:
		}
	}
}

// running reports whether the process was started and has not exited.
func (s *server) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits for the exit: the pair's data is throwaway,
// and a crash is exactly what a failover test wants from the primary.
func (s *server) kill() {
	if s.admin != nil {
		s.admin.Close()
	}
	if !s.running() {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// logTail is the end of the server's error log, for error messages.
func (s *server) logTail() string {
	f, err := os.Open(s.errLog)
	if err != nil {
		return fmt.Sprintf("no error log (%v)", err)
	}
	defer f.Close()
	const window = 16 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		_, _ = f.Seek(st.Size()-window, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return fmt.Sprintf("last lines of %s:\n%s", s.errLog, lastLines(string(b), 20))
}

func firstLines(text string, n int) string {
	lines := strings.SplitN(text, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

func lastLines(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// findBinary looks a MariaDB program up on PATH, then where Debian installs
// it: the server is in sbin, which a non-login root shell may not have.
func findBinary(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH, in /usr/sbin or /usr/bin: the MariaDB server must be installed (Debian: apt-get install mariadb-server)", name)
}
