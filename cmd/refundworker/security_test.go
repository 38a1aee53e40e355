package main_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jobfence "github.com/jobfence/jobfence/clients/go"
	"github.com/jobfence/jobfence/fakeprovider"
)

// TestSecuredCoordinator: the worker reaches a coordinator that serves TLS
// and requires a credential, with a bearer token or a client certificate;
// the job history names the credential.
func TestSecuredCoordinator(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCert(t, "test CA", nil, nil, true)
	srv, srvKey := newCert(t, "coordinator", ca, caKey, false)
	cli, cliKey := newCert(t, "worker-7", ca, caKey, false)
	const token = "tok-worker-eu-1"
	sum := sha256.Sum256([]byte(token))
	files := map[string][]byte{
		"ca.pem": pemOf("CERTIFICATE", ca.Raw), "srv.pem": pemOf("CERTIFICATE", srv.Raw), "srv.key": keyPEM(t, srvKey),
		"cli.pem": pemOf("CERTIFICATE", cli.Raw), "cli.key": keyPEM(t, cliKey),
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

// newCert makes a certificate for 127.0.0.1 signed by parent (self-signed
// when parent is nil).
func newCert(t *testing.T, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func pemOf(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func keyPEM(t *testing.T, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pemOf("EC PRIVATE KEY", der)
}
