package main

import (
	"context"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// The coordinator binary, built once for the end-to-end tests.
var coordBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if coordBin.dir != "" {
		os.RemoveAll(coordBin.dir)
	}
	os.Exit(code)
}

func coordinatorBin(t *testing.T) string {
	t.Helper()
	coordBin.once.Do(func() {
		if coordBin.dir, coordBin.err = os.MkdirTemp("", "jobfence-soak-test-"); coordBin.err == nil {
			coordBin.path, coordBin.err = proctest.Build(coordBin.dir, "coordinator", "github.com/jobfence/jobfence/cmd/coordinator")
		}
	})
	if coordBin.err != nil {
		t.Fatal(coordBin.err)
	}
	return coordBin.path
}

// soakRun runs the command in this process with args after --mysql-dsn and
// --coordinator-bin, and returns its stdout, stderr and error.
func soakRun(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: runs the soak, with coordinator processes")
	}
	// testdb checks that the server the tests use answers (MySQL is
	// mandatory); the soak makes a database of its own on it.
	dsn := testdb.MySQL(t)
	var stdout, stderr proctest.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := run(ctx, append([]string{"--mysql-dsn", dsn, "--coordinator-bin", coordinatorBin(t)}, args...), &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// tableRow is a window row of the printed table.
var tableRow = regexp.MustCompile(`(?m)^\| \d+ \|`)

// TestSoakPassesAcrossARestart: a short soak with retention, restarted in
// the middle, loses no job, archives them all, keeps the working set
// bounded, and marks the warm-up's and the restart's windows. It does not
// hold the run to its latency, RSS and goroutine verdicts: go test runs
// packages side by side on the machine's cores, and a third of this run is
// one two-second window, which another package's burst can fill; the
// verdict's own tests hold those rules. A lease of 5 s bounds the wait for
// a grant the stopping coordinator could not hand back (its job is taken
// over once the lease ran out), which the settle would otherwise wait 30 s
// for.
func TestSoakPassesAcrossARestart(t *testing.T) {
	t.Parallel()
	out, log, err := soakRun(t, "--duration", "24s", "--rate", "50", "--sample", "2s", "--retain-succeeded", "1s",
		"--archive-interval", "1s", "--latency-slack", "1m", "--coordinator-flags", "--lease 5s")
	if err != nil {
		for _, reason := range strings.Split(strings.TrimPrefix(err.Error(), "verdict fail: "), "; ") {
			if !strings.HasPrefix(reason, "enqueue→completed p99 grew") && !strings.HasPrefix(reason, "coordinator RSS grew") &&
				!strings.HasPrefix(reason, "coordinator goroutines grew") {
				t.Fatalf("soak failed: %v\nstdout:\n%s\nstderr:\n%s", err, out, log)
			}
			t.Logf("not judged here: %s", reason)
		}
	}
	for _, want := range []string{"jobs=1200 answered=1200 completed=1200 archived=1200 left_working=0 lost=0",
		"keys_two_jobs=0 functional_failures=0", "restarts=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s\nstderr:\n%s", want, out, log)
		}
	}
	if n := len(tableRow.FindAllString(out, -1)); n != 12 {
		t.Errorf("%d window rows, want 12:\n%s", n, out)
	}
	// The SIGTERM goes at 13 s, in window 7; window 1 holds the warm-up (3 s).
	if !strings.Contains(out, "| 7 | 14 | no: restart |") || !strings.Contains(out, "| 1 | 2 | no: warm-up |") ||
		!strings.Contains(out, "| 3 | 6 | first third |") {
		t.Errorf("the warm-up's and the restart's windows are not marked:\n%s", out)
	}
	if !strings.Contains(log, "restart 1: SIGTERM") {
		t.Errorf("no restart in the progress:\n%s", log)
	}
}

// TestSoakFailsWithTheArchiveOff: with --retain-succeeded 0 nothing leaves
// the working tables, and the verdict fails naming the working set.
func TestSoakFailsWithTheArchiveOff(t *testing.T) {
	t.Parallel()
	out, log, err := soakRun(t, "--duration", "12s", "--rate", "50", "--sample", "2s", "--retain-succeeded", "0",
		"--restarts", "0", "--latency-slack", "1s")
	if err == nil {
		t.Fatalf("the soak passed with the archive off:\n%s\nstderr:\n%s", out, log)
	}
	if !strings.Contains(err.Error(), "working set refund_jobs grew") || strings.Contains(err.Error(), "functional failure") {
		t.Errorf("error %q, want the working set named and no functional failure", err)
	}
	if !strings.Contains(out, "verdict=fail") || !strings.Contains(out, "lost=0") || !strings.Contains(out, "archived=0") {
		t.Errorf("summary:\n%s", out)
	}
}

func TestFlags(t *testing.T) {
	dsn := []string{"--mysql-dsn", "root@tcp(127.0.0.1:3306)/"}
	c, err := parseFlags(dsn, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.duration != 2*time.Minute || c.rate != 200 || c.sample != 10*time.Second || c.restarts != 1 ||
		c.retain != 5*time.Second || c.archiveInterval != time.Second || c.windows() != 12 || c.jobs() != 24000 {
		t.Errorf("defaults %+v", c)
	}
	if _, err := parseFlags(nil, &strings.Builder{}); err == nil || !strings.Contains(err.Error(), "--mysql-dsn") {
		t.Errorf("no --mysql-dsn: %v", err)
	}
	for _, bad := range [][]string{
		{"--duration", "25s", "--sample", "10s"}, {"--duration", "20s"}, {"--sample", "500ms"}, {"--rate", "0"},
		{"--restarts", "5"}, {"--retain-succeeded", "500ms"}, {"--archive-interval", "0s"}, {"--slots", "101"},
		{"--growth-ratio", "1"}, {"--workers", "0"},
	} {
		name := strings.TrimPrefix(bad[0], "--")
		if _, err := parseFlags(append(dsn, bad...), &strings.Builder{}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%q: error %v, want one naming --%s", bad, err, name)
		}
	}
	if got := c.restartAt(1); got != 65*time.Second {
		t.Errorf("the restart of a 2-minute run at %s, want 65s (the middle of window 7)", got)
	}
	if c, err := parseFlags(append(dsn, "--restarts", "2", "--duration", "1m"), &strings.Builder{}); err != nil ||
		c.restartAt(1) != 25*time.Second || c.restartAt(2) != 45*time.Second {
		t.Errorf("two restarts in a minute: %v and %v, %v; want 25s and 45s", c.restartAt(1), c.restartAt(2), err)
	}
	if c, err := parseFlags(append(dsn, "--retain-succeeded", "0", "--restarts", "0"), &strings.Builder{}); err != nil ||
		c.retain != 0 || c.restarts != 0 {
		t.Errorf("archive off, no restart: %+v, %v", c, err)
	}
}
