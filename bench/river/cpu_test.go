package main

import (
	"io"
	"math"
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestParseProcStatReadsFieldsAfterTheLastParenthesis(t *testing.T) {
	// A command name may hold spaces and parentheses; the fields count from
	// the last ')'.
	line := "4242 (post (gres) x) S 2208 4242 4242 0 -1 4194560 1205 0 0 0 37 12 5 3 20 0 1 0 2500 225419264 4203 " +
		"18446744073709551615 1 1 0 0 0 0 4194304 19935367 0 0 0 17 1 0 0 0 0 0\n"
	s, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{comm: "post (gres) x", ppid: 2208, utime: 37, stime: 12, cutime: 5, cstime: 3}
	if s != want {
		t.Fatalf("parseProcStat = %+v, want %+v", s, want)
	}
	for _, bad := range []string{"", "4242 postgres S 1", "4242 (postgres) S 2208 4242 4242 0 -1 0 0 0 0 0 37"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q): no error", bad)
		}
	}
}

func TestReadProcStatOfThisProcess(t *testing.T) {
	s, err := readProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.ppid != os.Getppid() {
		t.Fatalf("ppid = %d, want %d", s.ppid, os.Getppid())
	}
}

// The postmaster waits for its backends: a child's CPU must still be counted
// once it has exited, through its parent's cutime and cstime. This process
// stands in for the postmaster.
func TestServerCPUKeepsTheCPUOfExitedChildren(t *testing.T) {
	before, err := serverCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	selfBefore := selfCPU()
	// Children that burn CPU until together they used enough to measure in
	// clock ticks.
	var used time.Duration
	for n := 0; used < 50*time.Millisecond; n++ {
		if n == 20 {
			t.Fatalf("20 children used only %s of CPU, too little to measure in clock ticks", used)
		}
		child := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
		child.Stdout, child.Stderr = io.Discard, io.Discard
		if err := child.Run(); err != nil {
			t.Fatalf("a shell to burn CPU in: %v", err)
		}
		used += child.ProcessState.UserTime() + child.ProcessState.SystemTime()
	}
	after, err := serverCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	got := after - before - (selfCPU() - selfBefore)
	// Two readings, each rounded down to a clock tick, per process counted.
	const slack = 3 * time.Second / clockTicks
	if got < used-slack {
		t.Fatalf("serverCPU grew by %s besides this process's own, want the child's %s", got, used)
	}
}

func TestCPUPerJob(t *testing.T) {
	before := cpuSample{server: time.Second, serverOK: true, client: 2 * time.Second}
	after := cpuSample{server: 3 * time.Second, serverOK: true, client: 3 * time.Second}
	pg, client, total := cpuPerJob(before, after, 1000)
	if pg != 2000 || client != 1000 || total != 3000 {
		t.Fatalf("cpuPerJob = %v, %v, %v; want 2000, 1000, 3000", pg, client, total)
	}
	after.serverOK = false
	if pg, client, total = cpuPerJob(before, after, 1000); !math.IsNaN(pg) || client != 1000 || !math.IsNaN(total) {
		t.Fatalf("without the server: cpuPerJob = %v, %v, %v; want NaN, 1000, NaN", pg, client, total)
	}
	if num(pg, 1) != "n/a" {
		t.Fatalf("num(NaN) = %q, want n/a", num(pg, 1))
	}
}
