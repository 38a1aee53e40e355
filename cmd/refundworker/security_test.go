package main_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/testcert"
)

// TestSecuredCoordinator: the worker reaches a coordinator that serves TLS
// and requires a credential, with a bearer token or a client certificate;
// the job history names the credential.
func TestSecuredCoordinator(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := testcert.New(t, "test CA", nil, nil, true)
	srv, srvKey := testcert.New(t, "coordinator", ca, caKey, false)
	cli, cliKey := testcert.New(t, "worker-7", ca, caKey, false)
	const token = "tok-worker-eu-1"
	sum := sha256.Sum256([]byte(token))
	files := map[string][]byte{
		"ca.pem": testcert.PEM("CERTIFICATE", ca.Raw), "srv.pem": testcert.PEM("CERTIFICATE", srv.Raw), "srv.key": testcert.KeyPEM(t, srvKey),
		"cli.pem": testcert.PEM("CERTIFICATE", cli.Raw), "cli.key": testcert.KeyPEM(t, cliKey),
		"tokens": []byte("worker-eu-1 producer,worker,reader sha256:" + hex.EncodeToString(sum[:]) + "\n"),
		"token":  []byte(token + "\n"), "wrong-token": []byte("guess\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := func(name string) string { return filepath.Join(dir, name) }
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	serveTLS := []string{"--tls-cert", path("srv.pem"), "--tls-key", path("srv.key")}

	t.Run("TLS and a bearer token", func(t *testing.T) {
		t.Parallel()
		e := setupWith(t, fakeprovider.Config{},
			[]jobfence.Option{jobfence.WithTLS(&tls.Config{RootCAs: roots}),
				jobfence.WithBearerToken(func(context.Context) (string, error) { return token, nil })},
			append(serveTLS, "--tokens-file", path("tokens"))...)
		out := e.runJobs(t, "--jobs", "2", "--key-prefix", "sec-tok-", "--tls-ca", path("ca.pem"), "--token-file", path("token"))
		requireSummary(t, out, "jobs=2 succeeded=2 manual_review=0 double_refunds=0 stale_rejected=0 observations=0")
		requireClaimedBy(t, e, "sec-tok-1", "worker-eu-1")

		bad := e.startJobs(t, "--jobs", "1", "--key-prefix", "sec-bad-", "--tls-ca", path("ca.pem"), "--token-file", path("wrong-token"))
		if err := bad.Wait(t, 60*time.Second); err == nil || !strings.Contains(bad.Logs(), "unknown bearer token") {
			t.Fatalf("wrong token: %v\n%s", err, bad.Logs())
		}
	})

	t.Run("mutual TLS", func(t *testing.T) {
		t.Parallel()
		cert := tls.Certificate{Certificate: [][]byte{cli.Raw}, PrivateKey: cliKey}
		e := setupWith(t, fakeprovider.Config{},
			[]jobfence.Option{jobfence.WithTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}})},
			append(serveTLS, "--tls-client-ca", path("ca.pem"))...)
		out := e.runJobs(t, "--jobs", "2", "--key-prefix", "sec-mtls-", "--tls-ca", path("ca.pem"),
			"--tls-cert", path("cli.pem"), "--tls-key", path("cli.key"))
		requireSummary(t, out, "jobs=2 succeeded=2 manual_review=0 double_refunds=0 stale_rejected=0 observations=0")
		requireClaimedBy(t, e, "sec-mtls-1", "worker-7")
	})
}

func requireClaimedBy(t *testing.T, e *env, key, who string) {
	t.Helper()
	d, err := e.client.GetJobByKey(ctxFor(t), key)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range d.Events {
		if ev.Kind == jobfence.EventClaimed && ev.WorkerID != who {
			t.Fatalf("history %v: claimed by %q, want the credential %q", history(d), ev.WorkerID, who)
		}
	}
}
