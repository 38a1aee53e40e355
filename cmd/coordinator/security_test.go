package main_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testcert"
)

// TestOpenOnlyOnLoopback: without credentials the coordinator serves on
// loopback, warning loudly, and refuses any other address.
func TestOpenOnlyOnLoopback(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", ":0", "192.0.2.1:50051"} {
		out, err := runBinary(t, nil, "--listen", listen, "--sqlite", filepath.Join(t.TempDir(), "x.db"))
		if err == nil || !strings.Contains(out, "--tokens-file") {
			t.Errorf("--listen %s without credentials: err %v, output %q; want a refusal", listen, err, out)
		}
	}
	p := startCoordinator(t, "--sqlite", filepath.Join(t.TempDir(), "open.db"))
	if !strings.Contains(p.Logs(), "NO AUTHENTICATION") {
		t.Fatalf("open start-up is not loud:\n%s", p.Logs())
	}
}

// TestMutualTLS: with --tls-client-ca the coordinator accepts only clients
// whose certificate the CA signed, and the history names the certificate.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := testcert.New(t, "jobfence test CA", nil, nil, true)
	srvCert, srvKey := testcert.New(t, "coordinator", ca, caKey, false)
	cliCert, cliKey := testcert.New(t, "worker-7", ca, caKey, false)
	files := map[string][]byte{"ca.pem": testcert.PEM("CERTIFICATE", ca.Raw), "srv.pem": testcert.PEM("CERTIFICATE", srvCert.Raw),
		"srv.key": testcert.KeyPEM(t, srvKey)}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := startCoordinator(t, "--sqlite", filepath.Join(dir, "tls.db"), "--tls-cert", filepath.Join(dir, "srv.pem"),
		"--tls-key", filepath.Join(dir, "srv.key"), "--tls-client-ca", filepath.Join(dir, "ca.pem"))
	if strings.Contains(p.Logs(), "NO AUTHENTICATION") {
		t.Fatalf("mutual TLS start-up claims to be open:\n%s", p.Logs())
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	dial := func(certs []tls.Certificate) pb.CoordinatorClient {
		conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: roots, ServerName: "127.0.0.1", Certificates: certs})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return pb.NewCoordinatorClient(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := dial(nil).Claim(ctx, &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1}); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	c := dial([]tls.Certificate{{Certificate: [][]byte{cliCert.Raw}, PrivateKey: cliKey}})
	if _, err := c.EnqueueRefund(ctx, &pb.EnqueueRefundRequest{OperationKey: "k-tls", OrderId: "o", PaymentId: "p",
		AmountMinor: 1, Currency: "EUR", Provider: "acme"}); err != nil {
		t.Fatal(err)
	}
	claimed, err := c.Claim(ctx, &pb.ClaimRequest{WorkerId: "not-me", MaxJobs: 1})
	if err != nil || len(claimed.Jobs) != 1 || claimed.Jobs[0].Job.WorkerId != "worker-7" {
		t.Fatalf("Claim over mutual TLS = %v, %v; want the job held by worker-7", claimed, err)
	}
}

// TestMissingTokenSaysHowToSendOne: a call without a bearer token to a
// coordinator with a tokens file is refused with what to send and where
// each client sends it from.
func TestMissingTokenSaysHowToSendOne(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("w worker sha256:"+strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startCoordinator(t, "--sqlite", filepath.Join(t.TempDir(), "tok.db"), "--tokens-file", tokens)
	out, err := p.grpcurl(t, "-d", `{"worker_id":"w","max_jobs":1}`, "ADDR", "jobfence.v1.Coordinator/Claim")
	for _, want := range []string{"Unauthenticated", `authorization: Bearer <token>`, "--token-file", "WithBearerToken"} {
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("a call without a token: err %v, output\n%s\nwant %q", err, out, want)
		}
	}
}
