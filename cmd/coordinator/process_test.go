package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/proctest"
)

// Binaries built once for the package: the coordinator and the pinned grpcurl.
var bin struct{ dir, coordinator, grpcurl string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jobfence-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin.dir = dir
	bin.coordinator = filepath.Join(dir, "coordinator")
	bin.grpcurl = filepath.Join(dir, "grpcurl")
	builds := [][]string{
		{"go", "build", "-o", bin.coordinator, "."},
		{"go", "build", "-modfile=../../tools/grpcurl/go.mod", "-o", bin.grpcurl, "github.com/fullstorydev/grpcurl/cmd/grpcurl"},
	}
	if proctest.Short() {
		builds = nil // -short: no test runs them
	}
	for _, b := range builds {
		cmd := exec.Command(b[0], b[1:]...)
		if strings.HasPrefix(b[2], "-modfile=") {
			// grpcurl's own module, outside the workspace: the go command
			// refuses -modfile in workspace mode.
			cmd.Env = append(os.Environ(), "GOWORK=off")
		}
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "%v: %v\n", b, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// process is a coordinator started from its binary.
type process struct {
	*proctest.Process
	addr string
}

// startCoordinator runs the binary with args plus a loopback listener on a free
// port and waits until it serves.
func startCoordinator(t *testing.T, args ...string) *process {
	t.Helper()
	p := proctest.StartCoordinator(t, bin.coordinator, args...)
	return &process{Process: p, addr: p.Addr}
}

// stop sends sig and waits for the exit; SIGTERM must end it cleanly.
func (p *process) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(t, 30*time.Second); sig == syscall.SIGTERM && err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.Logs())
	}
}

// grpcurl runs the pinned grpcurl in plaintext; the argument "ADDR" stands for
// the coordinator's address.
func (p *process) grpcurl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	full := []string{"-plaintext"}
	for _, a := range args {
		if a == "ADDR" {
			a = p.addr
		}
		full = append(full, a)
	}
	out, err := exec.CommandContext(ctx, bin.grpcurl, full...).CombinedOutput()
	return string(out), err
}

// runBinary runs the coordinator to completion with extra environment.
func runBinary(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	proctest.SkipShort(t, "coordinator")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.coordinator, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	return string(out), err
}
