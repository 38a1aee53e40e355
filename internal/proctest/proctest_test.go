package proctest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// childEnv marks the run of this test binary in which TestStartedCommand
// starts its command.
const childEnv = "PROCTEST_STARTED_COMMAND"

// TestStartSkipsOnlyUnderShort: go test -short (make test-fast) leaves out
// the tests that run commands as processes, by Start skipping them before
// anything runs; a full run (make test, CI) runs the command. It runs
// TestStartedCommand in a child of this test binary, with and without -short.
func TestStartSkipsOnlyUnderShort(t *testing.T) {
	for _, short := range []bool{false, true} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStartedCommand$", "-test.v", "-test.short="+strconv.FormatBool(short))
		cmd.Env = append(os.Environ(), childEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("-short=%v: %v\n%s", short, err, out)
		}
		want, not := "--- PASS: TestStartedCommand", "--- SKIP"
		if short {
			want, not = "--- SKIP: TestStartedCommand", "--- PASS"
		}
		if !strings.Contains(string(out), want) || strings.Contains(string(out), not) {
			t.Errorf("-short=%v: want %q and no %q:\n%s", short, want, not, out)
		}
		if short && !strings.Contains(string(out), "-short: runs sh as a process") {
			t.Errorf("-short: the skip does not say what it left out:\n%s", out)
		}
	}
}

// TestStartedCommand starts a command through Start; only
// TestStartSkipsOnlyUnderShort runs it.
func TestStartedCommand(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestStartSkipsOnlyUnderShort")
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	p := Start(t, sh, Options{Args: []string{"-c", "echo started"}})
	if err := p.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("sh: %v\n%s", err, p.Logs())
	}
	if got := p.Stdout(); got != "started\n" {
		t.Fatalf("stdout %q, want %q", got, "started\n")
	}
}
