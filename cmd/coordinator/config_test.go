package main_test

import (
	"database/sql"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// A mistake in the flags is one line naming the flag, the value and what
// would do; never the whole usage, never a password.
func TestFlagMistakesSayWhatToDo(t *testing.T) {
	sqlite := filepath.Join(t.TempDir(), "x.db")
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("w worker sha256:"+strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--lease", "30"}, `--lease "30": a duration needs a unit, e.g. 30s`},
		{[]string{"--listen", "localhost"}, `--listen "localhost" has no port: want host:port, e.g. localhost:50051`},
		{[]string{"--listen", "50361"}, `--listen "50361" has no host: want host:port, e.g. 127.0.0.1:50361`},
		{[]string{"--tokens-file", tokens, "--listen", "0.0.0.0:0"}, "bearer tokens would cross the network in clear"},
		{[]string{"--pprof-listen", "0.0.0.0:0"}, "pprof has no authentication"},
		{[]string{"--coalesce-window", "1s"}, "--coalesce-window must be between 0 and 100ms, got 1s"},
		{[]string{"--mysql-dsn", "root:hunter2@127.0.0.1:3306/jobfence"}, "the format is user:password@tcp(host:3306)/database"},
		{[]string{"--mysql-dsn", "mysql://root:hunter2@db:3306/jobfence"}, "not a URL"},
		{[]string{"--mysql-dsn", "root:hunter2@tcp(127.0.0.1:3306)/"}, "names no database"},
		{[]string{"--mysql-dsn", "x", "--mysql-dsn-file", tokens}, "one or the other"},
	} {
		out, err := runBinary(t, nil, append(c.args, "--sqlite", sqlite)...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%q: err %v, output\n%s\nwant %q", c.args, err, out, c.want)
		}
		if lines := strings.Count(strings.TrimSpace(out), "\n") + 1; lines > 2 {
			t.Errorf("%q: %d lines of output, want the one that says what is wrong:\n%s", c.args, lines, out)
		}
		if strings.Contains(out, "hunter2") {
			t.Errorf("%q: the password is echoed:\n%s", c.args, out)
		}
	}
}

// --allow-plaintext is the explicit way past the TLS refusal, and warns;
// pprof serves no command line (it would show a DSN's password); the DSN can
// come from a file; a password on the command line is warned about.
func TestExposureIsExplicit(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("w worker sha256:"+strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := proctest.Start(t, bin.coordinator, proctest.Options{
		Args: []string{"--listen", "0.0.0.0:0", "--tokens-file", tokens, "--allow-plaintext", "--log-format", "json",
			"--sqlite", filepath.Join(dir, "plain.db"), "--pprof-listen", "127.0.0.1:0"},
		Ready: "coordinator serving",
	})
	if !strings.Contains(p.Logs(), "PLAINTEXT TOKENS") {
		t.Errorf("--allow-plaintext does not warn:\n%s", p.Logs())
	}
	rec, ok := p.WaitRecord(10*time.Second, func(r map[string]any) bool { return r["msg"] == "pprof serving" })
	if !ok {
		t.Fatalf("no pprof listener logged:\n%s", p.Logs())
	}
	for path, want := range map[string]int{"/debug/pprof/": http.StatusOK, "/debug/pprof/cmdline": http.StatusNotFound} {
		resp, err := http.Get("http://" + rec["listen"].(string) + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || strings.Contains(string(body), "--tokens-file") {
			t.Errorf("GET %s = %d, want %d and no command line:\n%.300s", path, resp.StatusCode, want, body)
		}
	}

	dsn := testdb.MySQL(t)
	dsnFile := filepath.Join(dir, "dsn")
	if err := os.WriteFile(dsnFile, []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile := proctest.StartCoordinator(t, bin.coordinator, "--mysql-dsn-file", dsnFile)
	if strings.Contains(fromFile.Logs(), "password is on the command line") {
		t.Errorf("a DSN from a file is warned about:\n%s", fromFile.Logs())
	}
	// A user with a password, given on the command line: served, and warned.
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	user := "jfpw_" + strings.TrimPrefix(cfg.DBName, "jftest_")
	for _, q := range []string{"CREATE USER " + user + "@'%' IDENTIFIED BY 'pw-on-argv'",
		"GRANT ALL ON " + cfg.DBName + ".* TO " + user + "@'%'"} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { admin.Exec("DROP USER " + user + "@'%'") }) //nolint:errcheck
	cfg.User, cfg.Passwd = user, "pw-on-argv"
	onArgv := proctest.StartCoordinator(t, bin.coordinator, "--mysql-dsn", cfg.FormatDSN())
	if !strings.Contains(onArgv.Logs(), "password is on the command line") {
		t.Errorf("a password on the command line is not warned about:\n%s", onArgv.Logs())
	}
}

// An address in use fails the start naming the flag that set it, for each
// of the coordinator's listeners: every one is bound before the coordinator
// serves, so the process exits at once instead of logging the error of a
// listener bound later and serving on without it.
func TestAddressInUseNamesTheFlag(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	secrets := filepath.Join(dir, "webhook-secrets")
	if err := os.WriteFile(tokens, []byte("w worker sha256:"+strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secrets, []byte("acme stripe whsec_0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flag  string
		extra []string
	}{
		{"listen", nil},
		{"console-listen", []string{"--tokens-file", tokens}},
		{"webhook-listen", []string{"--webhook-secrets-file", secrets}},
		{"metrics-listen", nil},
		{"pprof-listen", nil},
	} {
		args := []string{"--sqlite", filepath.Join(t.TempDir(), "x.db")}
		if c.flag != "listen" {
			args = append(args, "--listen", "127.0.0.1:0")
		}
		args = append(append(args, "--"+c.flag, addr), c.extra...)
		out, err := runBinary(t, nil, args...)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !exit.Exited() {
			t.Errorf("--%s on a taken port: the start did not fail (%v); output\n%s", c.flag, err, out)
			continue
		}
		want := "--" + c.flag + " " + addr + ": address already in use"
		if !strings.Contains(out, want) || !strings.Contains(out, "give --"+c.flag+" another address") {
			t.Errorf("--%s on a taken port: output\n%s\nwant %q and what to do", c.flag, out, want)
		}
	}
}

// A DSN naming a database the server does not have says how to make it: the
// coordinator creates its tables, not its database.
func TestUnknownDatabaseSaysCreateDatabase(t *testing.T) {
	cfg, err := gomysql.ParseDSN(testdb.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName += "_absent"
	out, err := runBinary(t, nil, "--mysql-dsn", cfg.FormatDSN())
	if want := "CREATE DATABASE " + cfg.DBName; err == nil || !strings.Contains(out, want) {
		t.Fatalf("a DSN naming no existing database: err %v, output\n%s\nwant %q", err, out, want)
	}
}
