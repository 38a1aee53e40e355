package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPercentileIsNearestRank(t *testing.T) {
	var l latencies
	for i := 100; i >= 1; i-- {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.95, 95 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}} {
		if got := l.percentile(c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p*100, got, c.want)
		}
	}
	if got := (latencies{}).percentile(0.5); got != 0 {
		t.Errorf("empty: %v", got)
	}
}

func TestQuickDefaultsYieldToExplicitFlags(t *testing.T) {
	c, err := parseFlags([]string{"--mysql-dsn", "root@tcp(127.0.0.1:3306)/", "--quick", "--backlog", "777"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.backlog != 777 || c.candidateReps != 500 || c.historyStages[len(c.historyStages)-1] != 190000 {
		t.Errorf("quick config: backlog %d, reps %d, history %v", c.backlog, c.candidateReps, c.historyStages)
	}
	if _, err := parseFlags(nil, &strings.Builder{}); err == nil {
		t.Error("no --mysql-dsn: want an error")
	}
}

// TestBatchIsAList: scenario C drains once per --batch value, each within
// Claim's max_jobs and none twice (their backlogs are keyed by batch).
func TestBatchIsAList(t *testing.T) {
	dsn := []string{"--mysql-dsn", "root@tcp(127.0.0.1:3306)/"}
	c, err := parseFlags(dsn, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.batches, []int{10, 100}) {
		t.Errorf("default batches %v, want [10 100]", c.batches)
	}
	if c, err = parseFlags(append(dsn, "--batch", "25"), &strings.Builder{}); err != nil || !slices.Equal(c.batches, []int{25}) {
		t.Errorf("--batch 25: %v, %v", c.batches, err)
	}
	for _, bad := range []string{"0", "101", "10,10", "10,x", ""} {
		if _, err := parseFlags(append(dsn, "--batch", bad), &strings.Builder{}); err == nil || !strings.Contains(err.Error(), "--batch") {
			t.Errorf("--batch %q: error %v, want one naming --batch", bad, err)
		}
	}
}

// TestFindProcessPassesOverZombies: a database server restarted just before a
// run leaves its old process as a zombie until it is reaped; the bench must
// meter the live server, not the dead one whose CPU time stands still.
func TestFindProcessPassesOverZombies(t *testing.T) {
	dir := t.TempDir()
	// Command names are the executable's base name (at most 15 bytes):
	// unique per run, so no other process on the machine matches.
	name := fmt.Sprintf("jfz%d", time.Now().UnixNano()%1e9)
	bin := filepath.Join(dir, name)
	src, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	dead := exec.Command(bin, "0")
	if err := dead.Start(); err != nil {
		t.Fatal(err)
	}
	// Not waited for: once it exits it stays a zombie, named as before.
	for deadline := time.Now().Add(10 * time.Second); ; {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", dead.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(stat), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never became a zombie: %s", dead.Process.Pid, stat)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer dead.Wait()
	if pid := findProcess(name); pid != 0 {
		t.Fatalf("findProcess(%q) = %d, the zombie", name, pid)
	}
	live := exec.Command(bin, "30")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = live.Process.Kill(); _ = live.Wait() }()
	if pid := findProcess("no-such-process", name); pid != live.Process.Pid {
		t.Fatalf("findProcess(%q) = %d, want the live process %d (zombie %d)", name, pid, live.Process.Pid, dead.Process.Pid)
	}
}

// TestRenewCountsFromMetrics: scenario G reads renewals, their refusals,
// transactions and rows from the coordinator's /metrics text.
func TestRenewCountsFromMetrics(t *testing.T) {
	before, err := parseMetrics(strings.NewReader(`# HELP jobfence_lease_renewals_total Grants …
# TYPE jobfence_lease_renewals_total counter
jobfence_lease_renewals_total{result="renewed"} 10
jobfence_renew_batch_size_sum 10
jobfence_renew_batch_size_count 2
`))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseMetrics(strings.NewReader(`jobfence_lease_renewals_total{result="not_running"} 3
jobfence_lease_renewals_total{result="renewed"} 110
jobfence_renew_batch_size_bucket{le="+Inf"} 7
jobfence_renew_batch_size_sum 113
jobfence_renew_batch_size_count 7
jobfence_takeovers_total 1
`))
	if err != nil {
		t.Fatal(err)
	}
	c := renewCountsBetween(before, after, 4)
	if c.renewed != 100 || c.txs != 5 || c.rows != 103 || c.takeovers != 1 || c.calls != 4 {
		t.Errorf("counts %+v", c)
	}
	if got := c.refusedList(); got != "not_running:3" || c.refusedTotal() != 3 {
		t.Errorf("refused %q (%v)", got, c.refusedTotal())
	}
	if got := (renewCounts{}).refusedList(); got != "none" {
		t.Errorf("no refusals: %q", got)
	}
}

// TestHolderArgsRoundTrip: the worker process of scenario G parses the
// command line the bench gives it.
func TestHolderArgsRoundTrip(t *testing.T) {
	want := holderConfig{coordinator: "127.0.0.1:1", workerID: "w", provider: holdProvider, jobs: 20,
		lease: 5 * time.Second, renewInterval: time.Second, noRenewal: true, hold: time.Minute}
	args := want.args()
	if args[0] != holderCommand {
		t.Fatalf("args %q", args)
	}
	got, err := parseHolderFlags(args[1:], &strings.Builder{})
	if err != nil || got != want {
		t.Errorf("parsed %+v, %v; want %+v", got, err, want)
	}
}

// TestScenarioGIsNotDefault: scenario G takes minutes and kills processes;
// CI's --quick runs only the default set.
func TestScenarioGIsNotDefault(t *testing.T) {
	dsn := []string{"--mysql-dsn", "root@tcp(127.0.0.1:3306)/"}
	c, err := parseFlags(append(dsn, "--quick"), &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.runs('g') {
		t.Errorf("--quick runs scenario g (scenarios %q)", c.scenarios)
	}
	if c, err = parseFlags(append(dsn, "--scenarios", "g"), &strings.Builder{}); err != nil || !c.runs('g') {
		t.Errorf("--scenarios g: %v", err)
	}
	for _, bad := range [][]string{{"--takeover-kill-after", "40s"}, {"--renew-hold", "30s"},
		{"--renew-interval", "3s"}, {"--takeover-jobs", "101"}} {
		if _, err := parseFlags(append(append(dsn, "--scenarios", "g"), bad...), &strings.Builder{}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
