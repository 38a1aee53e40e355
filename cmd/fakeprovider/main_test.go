package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/proctest"
)

func TestFlagsFallBackToEnv(t *testing.T) {
	t.Setenv("FAKEPROVIDER_KEY_RETENTION", "2h")
	t.Setenv("FAKEPROVIDER_FAULTS", "pending=30,lookup_lag=5")
	t.Setenv("FAKEPROVIDER_LISTEN", "127.0.0.1:9999")
	c, err := parseFlags([]string{"--listen", "127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := fakeprovider.Faults{Pending: 30 * time.Second, LookupLag: 5 * time.Second}
	if c.keyRetention != 2*time.Hour || c.faults != want || c.listen != "127.0.0.1:0" {
		t.Fatalf("config = %+v; want env values, with the command line winning", c)
	}
}

func TestFlagsRejectBadValues(t *testing.T) {
	for _, args := range [][]string{
		{"--faults", "explode"},
		{"--key-retention", "0s"},
		{"--latency", "-1s"},
		{"--log-format", "xml"},
		{"extra"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	t.Setenv("FAKEPROVIDER_FAULTS", "pending=-1")
	if _, err := parseFlags(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "FAKEPROVIDER_FAULTS") {
		t.Errorf("bad env value: err = %v, want it named", err)
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err = %v", err)
	}
}

func TestRunServesAndShutsDown(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs, logw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--log-format", "json", "--faults", "pending=60"}, logw)
		logw.Close()
	}()

	lines := bufio.NewScanner(logs)
	var addr string
	for addr == "" && lines.Scan() {
		var rec struct{ Msg, Listen string }
		if json.Unmarshal(lines.Bytes(), &rec) == nil && rec.Msg == "fakeprovider serving" {
			addr = rec.Listen
		}
	}
	if addr == "" {
		t.Fatalf("no serving line; run returned %v", <-done)
	}
	go io.Copy(io.Discard, logs)

	c := fakeprovider.NewClient("http://"+addr, nil)
	r, err := c.CreateRefund(ctx, "op-1", fakeprovider.RefundParams{PaymentID: "pay_1", AmountMinor: 100, Currency: "EUR"})
	if err != nil || r.Status != fakeprovider.StatusPending {
		t.Fatalf("create: %+v, %v; want pending from --faults", r, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// An address in use fails the start naming --listen and what to do: a second
// `go run ./cmd/fakeprovider` beside a first.
func TestAddressInUseNamesListen(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	err = run(t.Context(), []string{"--listen", taken.Addr().String()}, io.Discard)
	if want := "--listen " + taken.Addr().String() + ": address already in use"; err == nil ||
		!strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "give --listen another address") {
		t.Fatalf("run on a taken port: %v; want %q and what to do", err, want)
	}
}

func writeSecret(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "webhook-secret")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The older one-line form of --webhook-secret-file: the first line is the
// secret alone.
func TestWebhookFlagsReadTheSecretsFirstLine(t *testing.T) {
	path := writeSecret(t, "whsec_first \nwhsec_second\n")
	t.Setenv("FAKEPROVIDER_WEBHOOK_URL", "http://127.0.0.1:8443/webhooks/acme")
	c, err := parseFlags([]string{"--webhook-secret-file", path, "--webhook-max-attempts", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	pc := c.providerConfig()
	if pc.WebhookURL != "http://127.0.0.1:8443/webhooks/acme" || pc.WebhookSecret != "whsec_first" || pc.WebhookMaxAttempts != 3 {
		t.Fatalf("provider config = %+v; want the env URL, the first line, 3 attempts", pc)
	}
	if _, err := parseFlags(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "--webhook-secret-file") {
		t.Fatalf("a URL without a secret: err = %v, want it to name --webhook-secret-file", err)
	}
}

// sharedSecrets is one secrets file in the coordinator's format: globex,
// and acme in the middle of a rotation (old, then new).
const sharedSecrets = `# provider scheme secret
globex stripe whsec_globex_0123456789
acme   stripe whsec_acme_old_0123456789
acme   stripe whsec_acme_new_0123456789
`

// --webhook-secret-file reads the coordinator's --webhook-secrets-file: the
// provider signs with the line of the provider its URL names, the new one of
// two while rotating; a URL of another shape is served from a file of one
// provider only, and a provider without a line is refused naming the line
// to add.
func TestWebhookSecretFileIsTheCoordinatorsFormat(t *testing.T) {
	shared := writeSecret(t, sharedSecrets)
	for _, c := range []struct {
		url, file, provider, secret string
	}{
		{"http://127.0.0.1:8443/webhooks/acme", shared, "acme", "whsec_acme_new_0123456789"},
		{"https://refunds.example.com/webhooks/globex", shared, "globex", "whsec_globex_0123456789"},
		{"http://127.0.0.1:8080/hooks", writeSecret(t, "acme stripe whsec_only_0123456789\n"), "acme", "whsec_only_0123456789"},
	} {
		cfg, err := parseFlags([]string{"--webhook-url", c.url, "--webhook-secret-file", c.file}, io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if cfg.webhookProvider != c.provider || cfg.providerConfig().WebhookSecret != c.secret {
			t.Errorf("%s: signs as %q with %q, want %q with %q", c.url, cfg.webhookProvider,
				cfg.providerConfig().WebhookSecret, c.provider, c.secret)
		}
	}
	for _, c := range []struct{ url, file, says string }{
		{"http://127.0.0.1:8443/webhooks/initech", shared, `has no line for initech, the provider --webhook-url names (it has acme, globex): add "initech stripe <secret>"`},
		{"http://127.0.0.1:8443/hooks", shared, "does not end in /webhooks/<provider>"},
		{"http://127.0.0.1:8443/webhooks/acme", writeSecret(t, "acme whsec_no_scheme_0123456789\n"), "want <provider> <scheme> <secret>"},
	} {
		if _, err := parseFlags([]string{"--webhook-url", c.url, "--webhook-secret-file", c.file}, io.Discard); err == nil ||
			!strings.Contains(err.Error(), c.says) {
			t.Errorf("%s with %s: err %v, want it to say %q", c.url, c.file, err, c.says)
		}
	}
}

func TestWebhookFlagsRejectBadValues(t *testing.T) {
	good, empty := writeSecret(t, "whsec_1\n"), writeSecret(t, "\nwhsec_on_line_2\n")
	for _, args := range [][]string{
		{"--webhook-url", "http://127.0.0.1:8443/webhooks/acme"},
		{"--webhook-secret-file", good},
		{"--webhook-url", "http://127.0.0.1:8443/webhooks/acme", "--webhook-secret-file", empty},
		{"--webhook-url", "http://127.0.0.1:8443/webhooks/acme", "--webhook-secret-file", good + ".missing"},
		{"--webhook-url", "127.0.0.1:8443/webhooks/acme", "--webhook-secret-file", good},
		{"--webhook-url", "http://127.0.0.1:8443/webhooks/acme", "--webhook-secret-file", good, "--webhook-max-attempts", "0"},
		{"--faults", "webhook_delay=-1"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

// binDir holds the command, built once for the tests that run it as a
// process.
var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var fakeproviderBin = sync.OnceValues(func() (string, error) {
	var err error
	if binDir, err = os.MkdirTemp("", "fakeprovider-bin-"); err != nil {
		return "", err
	}
	return proctest.Build(binDir, "fakeprovider", ".")
})

// stripeReceiver counts the deliveries whose Stripe signature verifies
// (its own HMAC code) and holds, while hold is set, every delivery until
// its client goes away.
type stripeReceiver struct {
	mu       sync.Mutex
	types    []string
	rejected int
	hold     bool
	held     chan struct{}
	gone     chan struct{}
}

func (rc *stripeReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var t int64
	var sig []byte
	for part := range strings.SplitSeq(r.Header.Get("Stripe-Signature"), ",") {
		k, v, _ := strings.Cut(part, "=")
		if k == "t" {
			t, _ = strconv.ParseInt(v, 10, 64)
		} else if k == "v1" {
			sig, _ = hex.DecodeString(v)
		}
	}
	mac := hmac.New(sha256.New, []byte("whsec_cmd"))
	mac.Write([]byte(strconv.FormatInt(t, 10) + "."))
	mac.Write(body)
	var ev struct{ Type string }
	rc.mu.Lock()
	hold := rc.hold
	if !hmac.Equal(sig, mac.Sum(nil)) || time.Since(time.Unix(t, 0)).Abs() > 5*time.Minute || json.Unmarshal(body, &ev) != nil {
		rc.rejected++
		rc.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if !hold {
		rc.types = append(rc.types, ev.Type)
	}
	rc.mu.Unlock()
	if hold {
		rc.held <- struct{}{}
		<-r.Context().Done()
		close(rc.gone)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func TestProcessSendsSignedWebhooksAndStopsOnSIGTERM(t *testing.T) {
	bin, err := fakeproviderBin()
	if err != nil {
		t.Fatal(err)
	}
	rc := &stripeReceiver{held: make(chan struct{}, 1), gone: make(chan struct{})}
	recv := httptest.NewServer(rc)
	defer recv.Close()
	p := proctest.Start(t, bin, proctest.Options{
		Args: []string{"--listen", "127.0.0.1:0", "--log-format", "json", "--webhook-url", recv.URL + "/webhooks/acme",
			"--webhook-secret-file", writeSecret(t, "whsec_cmd\n")},
		Ready: "fakeprovider serving",
	})
	c := fakeprovider.NewClient("http://"+p.Addr, nil)
	ctx := t.Context()
	if _, err := c.CreateRefund(ctx, "op-1", fakeprovider.RefundParams{PaymentID: "pay_1", AmountMinor: 100, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 10*time.Second, "both events of op-1", func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return len(rc.types) == 2
	})
	rc.mu.Lock()
	if strings.Join(rc.types, ",") != "refund.created,charge.refunded" || rc.rejected != 0 {
		t.Fatalf("received %q, %d rejected; want refund.created, charge.refunded, all verified", rc.types, rc.rejected)
	}
	rc.hold = true
	rc.mu.Unlock()

	// A delivery in flight at SIGTERM: the sender is stopped, and says what
	// it left undelivered.
	if _, err := c.CreateRefund(ctx, "op-2", fakeprovider.RefundParams{PaymentID: "pay_1", AmountMinor: 100, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rc.held:
	case <-time.After(10 * time.Second):
		t.Fatal("op-2's refund.created never arrived")
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(t, 15*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.Logs())
	}
	<-rc.gone
	rec, ok := p.WaitRecord(time.Second, func(r map[string]any) bool { return r["msg"] == "webhook sender stopped" })
	// op-1's 2 deliveries and the held one, cancelled and recorded before exit.
	if !ok || rec["events"] != 4.0 || rec["attempts"] != 3.0 || rec["pending"] != 2.0 {
		t.Fatalf("stop record = %v; want 4 events, 3 attempts, op-2's 2 events pending\n%s", rec, p.Logs())
	}
}

// TestOneSecretsFileForBothSides: the coordinator's --webhook-secrets-file
// and the provider's --webhook-secret-file are one file. The provider,
// pointed at the coordinator's /webhooks/acme, signs with acme's new secret
// (globex's comes first in the file), and the coordinator verifies and
// stores every event: each is answered 2xx at its first attempt.
func TestOneSecretsFileForBothSides(t *testing.T) {
	dir := t.TempDir()
	coordinatorBin, err := proctest.Build(dir, "coordinator", "github.com/jobfence/jobfence/cmd/coordinator")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := fakeproviderBin()
	if err != nil {
		t.Fatal(err)
	}
	secrets := writeSecret(t, sharedSecrets)
	coord := proctest.StartCoordinator(t, coordinatorBin, "--sqlite", filepath.Join(dir, "jobfence.db"),
		"--webhook-listen", "127.0.0.1:0", "--webhook-secrets-file", secrets)
	rec, ok := coord.WaitRecord(10*time.Second, func(r map[string]any) bool { return r["msg"] == "webhooks serving" })
	if !ok {
		t.Fatalf("no webhooks serving record:\n%s", coord.Logs())
	}
	p := proctest.Start(t, bin, proctest.Options{
		Args: []string{"--listen", "127.0.0.1:0", "--log-format", "json",
			"--webhook-url", "http://" + rec["listen"].(string) + "/webhooks/acme", "--webhook-secret-file", secrets},
		Ready: "fakeprovider serving",
	})
	c := fakeprovider.NewClient("http://"+p.Addr, nil)
	if _, err := c.CreateRefund(t.Context(), "op-shared-1", fakeprovider.RefundParams{PaymentID: "pay_1", AmountMinor: 100,
		Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	// One refund's events go one at a time: each answered before the next.
	for i := range 2 {
		var e fakeprovider.WebhookEvent
		proctest.WaitFor(t, 20*time.Second, fmt.Sprintf("event %d answered", i+1), func() bool {
			o, err := c.Oracle(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(o.Webhooks.Events) > i {
				e = o.Webhooks.Events[i]
			}
			return len(e.Attempts) > 0
		})
		if e.Attempts[0].Status != http.StatusOK {
			t.Fatalf("%s answered %d at its first attempt, want 200\ncoordinator:\n%s", e.Type, e.Attempts[0].Status,
				coord.Logs())
		}
	}
}
