package main_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/testdb"
)

// walkthrough returns the commands of the README's grpcurl session: the first
// sh block after the walkthrough marker, continuation lines and multi-line
// quoted JSON joined, comments dropped.
func walkthrough(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "<!-- walkthrough:")
	if !ok {
		t.Fatal("README has no walkthrough marker")
	}
	_, rest, _ = strings.Cut(rest, "```sh\n")
	block, _, _ := strings.Cut(rest, "```")
	var cmds []string
	var cur strings.Builder
	for _, line := range strings.Split(block, "\n") {
		if cur.Len() == 0 && (strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#")) {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if !strings.HasSuffix(line, "\\") && strings.Count(cur.String(), "'")%2 == 0 {
			cmds = append(cmds, cur.String())
			cur.Reset()
		}
	}
	return cmds
}

// TestReadmeWalkthrough runs the README's grpcurl session, word for word,
// against the coordinator binary on each store, and checks what each step must
// show.
func TestReadmeWalkthrough(t *testing.T) {
	cmds := walkthrough(t)
	want := []struct {
		ok       bool
		contains []string
	}{
		{true, []string{"jobfence.v1.Coordinator", "grpc.health.v1.Health"}},
		{true, []string{`"created": true`, "JOB_STATE_READY"}},
		{true, []string{`"attempt": "1"`, "NEXT_ACTION_REFUND"}},
		{true, nil}, // sleep past the 1s lease
		{true, []string{`"attempt": "2"`, `"takeover": true`, "NEXT_ACTION_RECONCILE"}},
		{true, []string{"JOB_STATE_SUCCEEDED", "re_0001"}},
		{false, []string{`"code": 9`, `"reason": "STALE_ATTEMPT"`, `"current_attempt": "2"`}},
		{true, []string{"OBSERVATION_OUTCOME_SUCCEEDED", `"reportedAttempt": "1"`}},
		{true, []string{"JOB_STATE_SUCCEEDED", `"kind": "taken_over"`, `"kind": "completed"`, "worker:worker-a"}},
	}
	if len(cmds) != len(want) {
		t.Fatalf("README walkthrough has %d commands, the test knows %d:\n%s", len(cmds), len(want), strings.Join(cmds, "---\n"))
	}
	stores := map[string]func(t *testing.T) []string{
		"sqlite": func(t *testing.T) []string { return []string{"--sqlite", testdb.SQLitePath(t)} },
		"mysql":  func(t *testing.T) []string { return []string{"--mysql-dsn", testdb.MySQL(t)} },
	}
	for name, args := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := startCoordinator(t, args(t)...)
			for i, c := range cmds {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				cmd := exec.CommandContext(ctx, "sh", "-c", strings.ReplaceAll(c, "localhost:50051", p.addr))
				cmd.Env = append(os.Environ(), "PATH="+bin.dir+":"+os.Getenv("PATH"))
				out, err := cmd.CombinedOutput()
				cancel()
				if (err == nil) != want[i].ok {
					t.Fatalf("step %d: %s\nexit: %v\n%s", i+1, c, err, out)
				}
				for _, s := range want[i].contains {
					if !strings.Contains(string(out), s) {
						t.Fatalf("step %d: %s\noutput lacks %q:\n%s", i+1, c, s, out)
					}
				}
			}
		})
	}
}

// TestReadmeDocumentsEveryFlag: every flag -h lists has a row in the README's
// flags table, and the table names no flag the binary lacks.
func TestReadmeDocumentsEveryFlag(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(readme), "## Flags")
	table, _, _ = strings.Cut(table, "\n## ")
	out, err := runBinary(t, nil, "-h")
	if err != nil {
		t.Fatal(err)
	}
	var flags []string
	for _, line := range strings.Split(out, "\n") {
		if f, ok := strings.CutPrefix(line, "  -"); ok {
			flags = append(flags, strings.Fields(f)[0])
		}
	}
	if len(flags) < 10 {
		t.Fatalf("found only %d flags in -h output:\n%s", len(flags), out)
	}
	for _, f := range flags {
		if !strings.Contains(table, "`--"+f+"`") {
			t.Errorf("README's flags table lacks --%s", f)
		}
	}
	for _, row := range strings.Split(table, "\n") {
		for _, part := range strings.Split(row, "`--")[1:] {
			name, _, _ := strings.Cut(part, "`")
			found := false
			for _, f := range flags {
				found = found || f == name
			}
			if !found {
				t.Errorf("README documents --%s, which the coordinator does not have", name)
			}
		}
	}
}
