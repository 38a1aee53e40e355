package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// walkthrough returns the commands of the README's grpcurl session: the first
// sh block after the walkthrough marker, continuation lines, multi-line quoted
// JSON and here-documents joined, comments dropped.
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
	heredoc := "" // the delimiter of the here-document being read
	for _, line := range strings.Split(block, "\n") {
		if cur.Len() == 0 && (strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#")) {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		switch {
		case heredoc != "":
			if line == heredoc {
				heredoc = ""
			}
		case strings.Contains(line, "<<"):
			_, heredoc, _ = strings.Cut(line, "<<")
			heredoc = strings.Trim(strings.TrimSpace(heredoc), `'"`)
		}
		if heredoc == "" && !strings.HasSuffix(line, "\\") && strings.Count(cur.String(), "'")%2 == 0 {
			cmds = append(cmds, cur.String())
			cur.Reset()
		}
	}
	return cmds
}

// session runs cmds in one sh, so that variables carry from one to the next
// as when a person pastes them, and returns each command's output (stdout
// and stderr) and whether it exited 0.
func session(t *testing.T, addr string, cmds []string) (outs []string, ok []bool) {
	t.Helper()
	var script strings.Builder
	for i, c := range cmds {
		fmt.Fprintf(&script, "echo '::step %d::'\n%s\necho \"::exit $?::\"\n", i, strings.ReplaceAll(c, "localhost:50051", addr))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script.String())
	cmd.Env = append(os.Environ(), "PATH="+bin.dir+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the session did not finish: %v\n%s", err, out)
	}
	for i := range cmds {
		_, rest, found := strings.Cut(string(out), fmt.Sprintf("::step %d::\n", i))
		section, code, ended := strings.Cut(rest, "::exit ")
		if !found || !ended {
			t.Fatalf("step %d left no output markers:\n%s", i+1, out)
		}
		outs = append(outs, section)
		ok = append(ok, strings.HasPrefix(code, "0::"))
	}
	return outs, ok
}

// TestReadmeWalkthrough runs the README's grpcurl session, word for word and
// twice on the same store (it must be rerunnable), against the coordinator
// binary on each store, and checks what each step must show.
func TestReadmeWalkthrough(t *testing.T) {
	cmds := walkthrough(t)
	want := []struct {
		ok       bool
		contains []string
	}{
		{true, []string{"jobfence.v1.Coordinator", "grpc.health.v1.Health"}},
		{true, nil}, // KEY=
		{true, []string{`"created": true`, "JOB_STATE_READY"}},
		{true, []string{`"attempt": "1"`, "NEXT_ACTION_REFUND", `"leaseToken": "`}},
		{true, nil}, // sleep past the 1s lease
		{true, []string{`"attempt": "2"`, `"takeover": true`, "NEXT_ACTION_RECONCILE", `"leaseToken": "`}},
		{true, []string{"JOB_STATE_SUCCEEDED", "re_0001"}},
		{false, []string{`"code": 9`, `"reason": "STALE_ATTEMPT"`, `"current_attempt": "2"`}},
		{false, []string{`"code": 9`, `"reason": "STALE_ATTEMPT"`, `"current_attempt": "2"`}},
		{true, []string{"OBSERVATION_OUTCOME_SUCCEEDED", `"reportedAttempt": "1"`, `"attemptVerified": true`}},
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
			for run := 1; run <= 2; run++ {
				if run == 2 {
					time.Sleep(time.Second) // a new second: a new operation key
				}
				outs, ok := session(t, p.addr, cmds)
				for i := range cmds {
					if ok[i] != want[i].ok {
						t.Fatalf("run %d, step %d: %s\nexit 0: %v, want %v\n%s", run, i+1, cmds[i], ok[i], want[i].ok, outs[i])
					}
					for _, s := range want[i].contains {
						if !strings.Contains(outs[i], s) {
							t.Fatalf("run %d, step %d: %s\noutput lacks %q:\n%s", run, i+1, cmds[i], s, outs[i])
						}
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

// TestReadmeConsoleQuickStart runs the README's console block: its commands
// make the tokens file in a fresh folder, and the coordinator command line
// (on a free port and the embedded store) serves a console that signs in
// the operator token they made.
func TestReadmeConsoleQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "<!-- console:")
	if !ok {
		t.Fatal("README has no console marker")
	}
	_, rest, _ = strings.Cut(rest, "```sh\n")
	block, _, _ := strings.Cut(rest, "```")
	lines := strings.Split(strings.TrimSpace(block), "\n")
	run, setup := lines[len(lines)-1], strings.Join(lines[:len(lines)-1], "\n")
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", setup)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's console set-up failed: %v\n%s", err, out)
	}
	args, ok := strings.CutPrefix(run, "go run ./cmd/coordinator ")
	if !ok {
		t.Fatalf("the block's last line does not run the coordinator: %s", run)
	}
	var argv []string
	for _, a := range strings.Fields(args) {
		switch {
		case a == "127.0.0.1:8080":
			a = "127.0.0.1:0"
		case strings.HasPrefix(a, "data/"):
			a = filepath.Join(dir, a)
		}
		argv = append(argv, a)
	}
	p := proctest.StartCoordinator(t, bin.coordinator, append(argv, "--sqlite", filepath.Join(dir, "data", "jobfence.db"))...)
	rec, ok := p.WaitRecord(10*time.Second, func(r map[string]any) bool { return r["msg"] == "console serving" })
	if !ok {
		t.Fatalf("no console:\n%s", p.Logs())
	}
	token, err := os.ReadFile(filepath.Join(dir, "data", "me.token"))
	if err != nil {
		t.Fatal(err)
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	web := "http://" + rec["listen"].(string)
	resp, err := hc.Get(web + "/signin")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(page)
	if m == nil {
		t.Fatalf("no sign-in form:\n%s", page)
	}
	req, _ := http.NewRequest(http.MethodPost, web+"/signin",
		strings.NewReader(url.Values{"csrf": {string(m[1])}, "token": {strings.TrimSpace(string(token))}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), `<span id="who">me</span>`) {
		t.Fatalf("signing in with data/me.token: %d\n%s", resp.StatusCode, page)
	}
}
