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
// and stderr) and whether it exited 0. The output goes to one file, as with
// `sh session > log 2>&1`: a command that reopened /dev/stderr would write
// over the start of that log, and the step markers would be lost.
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
	log, err := os.Create(filepath.Join(t.TempDir(), "session.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	err = cmd.Run()
	out, _ := os.ReadFile(log.Name())
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
		{true, nil}, // show()
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

// TestReadmeTestCommandInstallsWhatIsMissing: the README's quick start runs
// the tests with `make test`, which runs .ci/deps and then go test of the
// workspace's three modules (./..., ./gen/..., ./clients/go/...);
// .ci/run's test step is that same command. .ci/deps, run on a PATH without
// jq and Chromium and with apt-get, sudo and id standing in for the system's
// (recording what they are asked), installs exactly what is missing — as
// root directly, otherwise through sudo — and nothing when all is there; it
// fails saying what to do when it cannot install.
func TestReadmeTestCommandInstallsWhatIsMissing(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "<!-- quick start:")
	if !ok {
		t.Fatal("README has no quick start marker")
	}
	_, rest, _ = strings.Cut(rest, "```sh\n")
	block, _, _ := strings.Cut(rest, "```")
	if !regexp.MustCompile(`(?m)^make test +#`).MatchString(block) {
		t.Fatalf("the quick start's test command is not make test:\n%s", block)
	}
	out, err := exec.Command("make", "-s", "-n", "-C", "../..", "test").CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?s)^bash \.ci/deps\ngo test \./\.\.\. \./gen/\.\.\. \./clients/go/\.\.\.\n$`).Match(out) {
		t.Fatalf("make -n test: %v\n%s\nwant bash .ci/deps, then go test ./... ./gen/... ./clients/go/...", err, out)
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`step "tests \(the README's test command[^\n]*\nmake test\n`).Match(ci) {
		t.Fatal(".ci/run's test step does not run make test")
	}

	// The MariaDB server's programs are found in /usr/sbin and /usr/bin
	// whatever PATH says, as the tests find them; jq and chromium only on
	// PATH, which here holds the stand-ins alone.
	mariadbHere := true
	for _, name := range []string{"mariadbd", "mariadb-install-db"} {
		found := false
		for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
			if st, err := os.Stat(filepath.Join(dir, name)); err == nil && st.Mode()&0o111 != 0 {
				found = true
			}
		}
		mariadbHere = mariadbHere && found
	}
	wantInstall := "install -y -q chromium jq"
	if !mariadbHere {
		wantInstall = "install -y -q mariadb-server chromium jq"
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	envBin, err := exec.LookPath("env")
	if err != nil {
		t.Fatal(err)
	}
	chmod, err := exec.LookPath("chmod")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name             string
		uid              string
		noSudo, noApt    bool
		allThere         bool
		wantOK           bool
		wantCalls        string // the commands run, one a line
		wantSays         string // on stderr
		wantInstalledNow bool
	}{
		{name: "root installs what is missing", uid: "0", wantOK: true,
			wantCalls: "apt-get update -q\napt-get " + wantInstall + "\n", wantInstalledNow: true},
		{name: "not root: through sudo", uid: "1000", wantOK: true,
			wantCalls: "sudo\napt-get update -q\nsudo\napt-get " + wantInstall + "\n", wantInstalledNow: true},
		{name: "not root, no sudo", uid: "1000", noSudo: true, wantSays: "run this as root, or install them: apt-get install "},
		{name: "no apt-get", uid: "0", noApt: true, wantSays: "there is no apt-get here"},
		{name: "nothing missing", uid: "1000", allThere: true, wantOK: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			farm, calls := filepath.Join(dir, "bin"), filepath.Join(dir, "calls")
			if err := os.Mkdir(farm, 0o755); err != nil {
				t.Fatal(err)
			}
			script := func(name, body string) {
				t.Helper()
				if err := os.WriteFile(filepath.Join(farm, name), []byte("#!"+bash+"\n"+body), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink(envBin, filepath.Join(farm, "env")); err != nil {
				t.Fatal(err)
			}
			script("id", "echo "+tc.uid+"\n")
			if !tc.noSudo {
				script("sudo", `echo sudo >> "$CALLS"; exec "$@"`+"\n")
			}
			if !tc.noApt {
				// apt-get records its arguments and, on install, puts a
				// stand-in of each package's command on PATH.
				script("apt-get", `echo "apt-get $*" >> "$CALLS"
[ "$DEBIAN_FRONTEND" = noninteractive ] || { echo "apt-get: interactive" >&2; exit 1; }
if [ "$1" = install ]; then
  for p in "$@"; do case "$p" in jq|chromium) : > "$FARM/$p"; `+chmod+` +x "$FARM/$p";; esac; done
fi
`)
			}
			env := []string{"PATH=" + farm, "CALLS=" + calls, "FARM=" + farm, "HOME=" + dir}
			if tc.allThere {
				for _, name := range []string{"jq", "chromium-browser", "mariadbd", "mariadb-install-db"} {
					script(name, "")
				}
			}
			cmd := exec.Command(bash, "../../.ci/deps")
			cmd.Env = env
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			if (err == nil) != tc.wantOK {
				t.Fatalf(".ci/deps: %v, want success %v\n%s", err, tc.wantOK, stderr.String())
			}
			got, _ := os.ReadFile(calls)
			if string(got) != tc.wantCalls {
				t.Errorf(".ci/deps ran:\n%s\nwant:\n%s\nstderr:\n%s", got, tc.wantCalls, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantSays) {
				t.Errorf(".ci/deps said %q, want it to say %q", stderr.String(), tc.wantSays)
			}
			if _, err := os.Stat(filepath.Join(farm, "jq")); (err == nil) != (tc.wantInstalledNow || tc.allThere) {
				t.Errorf("jq on PATH afterwards: %v", err == nil)
			}
		})
	}
}
