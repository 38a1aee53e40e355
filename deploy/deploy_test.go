// Package deploy_test checks the docker-compose setup where no Docker engine
// runs: the compose file parses and hangs together, every command line in it
// is one the binaries accept, the demo tokens match deploy/tokens with the
// roles their services need, and the coordinator, the fake provider and the
// workers, started as real processes with the compose file's own arguments,
// the demo certificate and the demo tokens, work refunds end to end.
package deploy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
)

// bins are the three commands, built once for the test binary.
var bins = map[string]string{}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deploy-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, name := range []string{"coordinator", "fakeprovider", "refundworker"} {
		if bins[name], err = proctest.Build(dir, name, "github.com/jobfence/jobfence/cmd/"+name); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// compose is the part of docker-compose.yml these tests read.
type compose struct {
	Services map[string]service `json:"services"`
	Secrets  map[string]struct {
		File string `json:"file"`
	} `json:"secrets"`
	Volumes map[string]any `json:"volumes"`
}

type service struct {
	Image string `json:"image"`
	Build *struct {
		Context string `json:"context"`
		Target  string `json:"target"`
	} `json:"build"`
	Command     []string          `json:"command"`
	Environment map[string]string `json:"environment"`
	Volumes     []string          `json:"volumes"`
	Secrets     []string          `json:"secrets"`
	DependsOn   map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on"`
	Healthcheck *struct {
		Test []string `json:"test"`
	} `json:"healthcheck"`
}

// loadCompose parses docker-compose.yml with a real YAML parser (the
// yaml2json module next to this file) and decodes it strictly enough to
// notice a misspelt or misplaced key among those read here.
func loadCompose(t *testing.T) compose {
	t.Helper()
	in, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", ".")
	cmd.Dir = "yaml2json"
	cmd.Env = append(os.Environ(), "GOWORK=off") // its own module, not in the workspace of go.work
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("docker-compose.yml is not valid YAML: %v\n%s", err, stderr.String())
	}
	var c compose
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// flagValue returns the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func TestComposeFileHangsTogether(t *testing.T) {
	c := loadCompose(t)
	for _, name := range []string{"mysql", "certs", "coordinator", "fakeprovider", "refundworker", "demo"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("no service %q", name)
		}
	}
	dockerfile, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^FROM\s+\S+\s+AS\s+(\S+)\s*$`).FindAllStringSubmatch(string(dockerfile), -1) {
		targets[m[1]] = true
	}
	for name, s := range c.Services {
		if (s.Image == "") == (s.Build == nil) {
			t.Errorf("%s: wants exactly one of image and build", name)
		}
		if s.Build != nil && (s.Build.Context != "." || !targets[s.Build.Target]) {
			t.Errorf("%s: build %+v is not a target of the Dockerfile (%v)", name, *s.Build, targets)
		}
		for dep, d := range s.DependsOn {
			other, ok := c.Services[dep]
			switch {
			case !ok:
				t.Errorf("%s depends on unknown service %q", name, dep)
			case d.Condition == "service_healthy" && other.Healthcheck == nil:
				t.Errorf("%s waits for %s to be healthy, which has no health check", name, dep)
			case !slices.Contains([]string{"service_started", "service_healthy", "service_completed_successfully"}, d.Condition):
				t.Errorf("%s: depends_on %s: condition %q", name, dep, d.Condition)
			}
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, "./") {
				if _, err := os.Stat(filepath.Join("..", src)); err != nil {
					t.Errorf("%s: mounts %s: %v", name, src, err)
				}
			} else if _, ok := c.Volumes[src]; !ok {
				t.Errorf("%s: volume %q is not declared", name, src)
			}
		}
		for _, sec := range s.Secrets {
			if _, ok := c.Secrets[sec]; !ok {
				t.Errorf("%s: secret %q is not declared", name, sec)
			}
		}
	}
	for name, sec := range c.Secrets {
		if _, err := os.Stat(filepath.Join("..", sec.File)); err != nil {
			t.Errorf("secret %s: %v", name, err)
		}
	}

	// The certs service runs the build stage's Go image, which go.mod's
	// version must fit.
	goMod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(goMod)[1]
	if !bytes.Contains(dockerfile, []byte("ARG GO_VERSION="+string(goVersion)+"\n")) {
		t.Errorf("the Dockerfile's GO_VERSION is not go.mod's %s", goVersion)
	}
	if img := c.Services["certs"].Image; img != "golang:"+string(goVersion) {
		t.Errorf("certs runs %s, want the build stage's golang:%s", img, goVersion)
	}

	// The coordinator's DSN names the database and user the MySQL service
	// creates.
	db := c.Services["mysql"].Environment
	dsn, err := mysql.ParseDSN(c.Services["coordinator"].Environment["JOBFENCE_MYSQL_DSN"])
	if err != nil {
		t.Fatalf("JOBFENCE_MYSQL_DSN: %v", err)
	}
	if dsn.Addr != "mysql:3306" || dsn.DBName != db["MYSQL_DATABASE"] || dsn.User != db["MYSQL_USER"] ||
		dsn.Passwd != db["MYSQL_PASSWORD"] {
		t.Errorf("JOBFENCE_MYSQL_DSN %s@%s/%s does not match the mysql service %v", dsn.User, dsn.Addr, dsn.DBName, db)
	}
}

// TestComposeCommandsAreAccepted runs each command line of the compose file
// with -h appended: flag parsing stops there with status 0 when every flag
// before it exists and has a well-formed value.
func TestComposeCommandsAreAccepted(t *testing.T) {
	proctest.SkipShort(t, "each command of the compose file")
	c := loadCompose(t)
	for name, s := range c.Services {
		if s.Build == nil {
			continue
		}
		cmd := exec.Command(bins[s.Build.Target], append(slices.Clone(s.Command), "-h")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %s %q: %v\n%s", name, s.Build.Target, s.Command, err, out)
		}
	}
}

// tokenLine is one line of deploy/tokens.
type tokenLine struct {
	roles []string
	hash  string
}

func readTokensFile(t *testing.T) map[string]tokenLine {
	t.Helper()
	if _, err := server.LoadTokens("tokens"); err != nil {
		t.Fatalf("deploy/tokens: %v", err)
	}
	b, err := os.ReadFile("tokens")
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]tokenLine{}
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.IndexByte(l, '#'); i >= 0 {
			l = l[:i]
		}
		if f := strings.Fields(l); len(f) == 3 {
			lines[f[0]] = tokenLine{roles: strings.Split(f[1], ","), hash: strings.TrimPrefix(f[2], "sha256:")}
		}
	}
	return lines
}

func readToken(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b)) // as the worker's --token-file
}

func TestDemoTokensMatchTokensFile(t *testing.T) {
	lines := readTokensFile(t)
	need := map[string][]string{ // what each credential's user calls
		"refundworker": {"worker"},
		"demo":         {"producer", "worker", "reader"},
		"operator":     {"operator"},
	}
	files, err := filepath.Glob("demo-tokens/*.token")
	if err != nil || len(files) != len(need) {
		t.Fatalf("demo tokens %v, %v; want one per credential %v", files, err, need)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".token")
		line, ok := lines[name]
		if !ok {
			t.Errorf("%s: no line %q in deploy/tokens", f, name)
			continue
		}
		sum := sha256.Sum256([]byte(readToken(t, f)))
		if hex.EncodeToString(sum[:]) != line.hash {
			t.Errorf("%s: its SHA-256 is not the one deploy/tokens has for %s", f, name)
		}
		for _, r := range need[name] {
			if !slices.Contains(line.roles, r) {
				t.Errorf("%s has roles %v, needs %s", name, line.roles, r)
			}
		}
	}
	c := loadCompose(t)
	for svc, sec := range map[string]string{"refundworker": "refundworker_token", "demo": "demo_token"} {
		file, _ := flagValue(c.Services[svc].Command, "token-file")
		if file != "/run/secrets/"+sec || !slices.Contains(c.Services[svc].Secrets, sec) {
			t.Errorf("%s: --token-file %s, secrets %v; want /run/secrets/%s", svc, file, c.Services[svc].Secrets, sec)
		}
	}
}

// TestComposeSetupWorks starts the coordinator, the fake provider and both
// workers as processes with the compose file's own command lines, the paths
// inside the containers mapped to this machine and every listener on a free
// loopback port, on the demo certificate deploy/democerts.sh makes and the
// demo tokens; the coordinator's database is this machine's test MySQL.
func TestComposeSetupWorks(t *testing.T) {
	c := loadCompose(t)
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	if out, err := exec.Command("sh", "democerts.sh", certs).CombinedOutput(); err != nil {
		t.Fatalf("democerts.sh: %v\n%s", err, out)
	}
	caPEM, err := os.ReadFile(filepath.Join(certs, "cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	// The names the clients in the compose network verify.
	coordHost, _, _ := net.SplitHostPort(flag(t, c.Services["refundworker"].Command, "coordinator"))
	hc := c.Services["coordinator"].Healthcheck
	if hc == nil {
		t.Fatal("the coordinator has no health check")
	}
	probeName := ""
	for _, a := range hc.Test {
		if v, ok := strings.CutPrefix(a, "-tls-server-name="); ok {
			probeName = v
		}
	}
	for _, name := range []string{coordHost, probeName} {
		if err := cert.VerifyHostname(name); err != nil {
			t.Errorf("the demo certificate does not cover %q: %v", name, err)
		}
	}

	abs, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	mounts := map[string]string{"certs": certs} // named volumes
	var secrets []string
	for name, s := range c.Secrets {
		secrets = append(secrets, "/run/secrets/"+name, filepath.Join(abs, "..", s.File))
	}
	// local maps a container's arguments to this machine.
	local := func(svc string, args []string, hosts ...string) []string {
		pairs := append(slices.Clone(secrets), hosts...)
		for _, v := range c.Services[svc].Volumes {
			parts := strings.Split(v, ":")
			src := parts[0]
			if strings.HasPrefix(src, "./") {
				src = filepath.Join(abs, "..", src)
			} else {
				src = mounts[src]
			}
			pairs = append(pairs, parts[1], src)
		}
		r := strings.NewReplacer(pairs...)
		out := make([]string, len(args))
		for i, a := range args {
			if strings.HasPrefix(a, "--listen=0.0.0.0:") || strings.HasPrefix(a, "--metrics-listen=0.0.0.0:") {
				a = a[:strings.Index(a, "=")+1] + "127.0.0.1:0"
			}
			out[i] = r.Replace(a)
		}
		return out
	}

	provider := proctest.Start(t, bins["fakeprovider"], proctest.Options{
		Args: local("fakeprovider", c.Services["fakeprovider"].Command), Ready: "fakeprovider serving"})
	coord := proctest.Start(t, bins["coordinator"], proctest.Options{
		Args:  local("coordinator", c.Services["coordinator"].Command),
		Env:   []string{"JOBFENCE_MYSQL_DSN=" + testdb.MySQL(t)},
		Ready: "coordinator serving",
	})
	hosts := []string{"coordinator:50051", coord.Addr, "http://fakeprovider:8099", "http://" + provider.Addr}

	// Health needs no credential; TLS is verified as the probe does.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	conn, err := grpc.NewClient(coord.Addr, grpc.WithTransportCredentials(
		credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: probeName, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}

	// Each demo credential can do what its service needs and no more.
	client := pb.NewCoordinatorClient(conn)
	as := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	operator := readToken(t, "demo-tokens/operator.token")
	worker := readToken(t, "demo-tokens/refundworker.token")
	for _, call := range []struct {
		what string
		err  error
		want codes.Code
	}{
		{"ListJobs as operator", second(client.ListJobs(as(operator), &pb.ListJobsRequest{})), codes.OK},
		{"EnqueueRefund as operator", second(client.EnqueueRefund(as(operator), &pb.EnqueueRefundRequest{})), codes.PermissionDenied},
		{"Claim as refundworker", second(client.Claim(as(worker), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1, Provider: "nobody"})), codes.OK},
		{"ListJobs as refundworker", second(client.ListJobs(as(worker), &pb.ListJobsRequest{})), codes.PermissionDenied},
		{"Claim without a token", second(client.Claim(ctx, &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1})), codes.Unauthenticated},
	} {
		if got := status.Code(call.err); got != call.want {
			t.Errorf("%s: %v, want %s", call.what, call.err, call.want)
		}
	}

	// Metrics answer where --metrics-listen says.
	rec, ok := coord.WaitRecord(10*time.Second, func(r map[string]any) bool { return r["msg"] == "metrics serving" })
	if !ok {
		t.Fatal("no metrics listener")
	}
	resp, err := http.Get("http://" + rec["listen"].(string) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(body, []byte("jobfence_takeovers_total")) {
		t.Errorf("metrics lack jobfence_takeovers_total:\n%.500s", body)
	}

	// The long-running worker and the demo run, side by side as in compose.
	w := proctest.Start(t, bins["refundworker"], proctest.Options{
		Args: local("refundworker", c.Services["refundworker"].Command, hosts...), Ready: "refundworker started"})
	demo := proctest.Start(t, bins["refundworker"], proctest.Options{
		Args: local("demo", c.Services["demo"].Command, hosts...)})
	if err := demo.Wait(t, 2*time.Minute); err != nil {
		t.Fatalf("demo: %v\n%s", err, demo.Logs())
	}
	jobs := flag(t, c.Services["demo"].Command, "jobs")
	want := fmt.Sprintf("jobs=%s succeeded=%s manual_review=0 double_refunds=0 stale_rejected=0 observations=0", jobs, jobs)
	if got := strings.TrimSpace(demo.Stdout()); got != want {
		t.Errorf("demo printed %q, want %q", got, want)
	}
	if w.Exited() {
		t.Fatalf("refundworker exited:\n%s", w.Logs())
	}
	for _, bad := range []string{"Unauthenticated", "PermissionDenied"} {
		if strings.Contains(w.Logs()+demo.Logs(), bad) {
			t.Errorf("worker logs mention %s:\n%s\n%s", bad, w.Logs(), demo.Logs())
		}
	}
}

// flag is flagValue, failing t when the flag is missing.
func flag(t *testing.T, args []string, name string) string {
	t.Helper()
	v, ok := flagValue(args, name)
	if !ok {
		t.Fatalf("no --%s in %q", name, args)
	}
	return v
}

func second[T any](_ T, err error) error { return err }
