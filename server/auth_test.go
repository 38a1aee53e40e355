package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
)

func tokenLine(name, roles, token string) string {
	sum := sha256.Sum256([]byte(token))
	return fmt.Sprintf("%s %s sha256:%s\n", name, roles, hex.EncodeToString(sum[:]))
}

func writeTokens(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("# name roles hash\n"+strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func as(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func TestBearerTokensAndRoles(t *testing.T) {
	authn, err := server.LoadTokens(writeTokens(t,
		tokenLine("shop", "producer", "tok-shop"),
		tokenLine("worker-a", "worker", "tok-worker"),
		tokenLine("alice", "operator,reader", "tok-ops")))
	if err != nil {
		t.Fatal(err)
	}
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) { o.Auth = authn })
	ctx := ctxFor(t)

	_, err = c.client.EnqueueRefund(ctx, refundReq())
	errorInfo(t, err, codes.Unauthenticated, server.ReasonUnauthenticated)
	_, err = c.client.EnqueueRefund(as(ctx, "tok-guess"), refundReq())
	errorInfo(t, err, codes.Unauthenticated, server.ReasonUnauthenticated)
	_, err = c.client.EnqueueRefund(as(ctx, "tok-worker"), refundReq())
	errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)

	enq, err := c.client.EnqueueRefund(as(ctx, "tok-shop"), refundReq())
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.client.Claim(as(ctx, "tok-shop"), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1})
	errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
	// The history names the credential, not what the request claims to be.
	claimed, err := c.client.Claim(as(ctx, "tok-worker"), &pb.ClaimRequest{WorkerId: "someone-else", MaxJobs: 1})
	if err != nil || len(claimed.Jobs) != 1 || claimed.Jobs[0].Job.WorkerId != "worker-a" {
		t.Fatalf("Claim = %v, %v; want the job held by worker-a", claimed, err)
	}
	_, err = c.client.GetJob(as(ctx, "tok-worker"), &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: enq.Job.Id}})
	errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
	got, err := c.client.GetJob(as(ctx, "tok-ops"), &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: enq.Job.Id}})
	if err != nil || got.Events[1].WorkerId != "worker-a" {
		t.Fatalf("GetJob = %v, %v", got, err)
	}
	// An operator resolves under their own name; a worker may not.
	if _, err := c.client.Escalate(as(ctx, "tok-worker"), &pb.EscalateRequest{JobId: enq.Job.Id,
		Attempt: claimed.Jobs[0].Attempt, LeaseToken: claimed.Jobs[0].LeaseToken, Reason: "no record"}); err != nil {
		t.Fatal(err)
	}
	resolve := &pb.ResolveReviewRequest{JobId: enq.Job.Id, Attempt: claimed.Jobs[0].Attempt,
		Resolution: pb.ReviewResolution_REVIEW_RESOLUTION_REFUNDED, ProviderRefundId: "re_1", Note: "seen in dashboard"}
	_, err = c.client.ResolveReview(as(ctx, "tok-worker"), resolve)
	errorInfo(t, err, codes.PermissionDenied, server.ReasonPermissionDenied)
	if _, err := c.client.ResolveReview(as(ctx, "tok-ops"), resolve); err != nil {
		t.Fatal(err)
	}
	got, err = c.client.GetJob(as(ctx, "tok-ops"), &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: enq.Job.Id}})
	if err != nil || got.Events[len(got.Events)-1].WorkerId != "alice" {
		t.Fatalf("resolution recorded as %v, %v; want alice", got.Events[len(got.Events)-1], err)
	}
	// Health checks need no credential.
	if _, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}

func TestLoadTokensRejectsBadFiles(t *testing.T) {
	for name, content := range map[string]string{
		"unknown role": tokenLine("x", "admin", "t"),
		"plain token":  "x worker secret-token\n",
		"short hash":   "x worker sha256:abcd\n",
		"duplicate":    tokenLine("x", "worker", "t") + tokenLine("y", "reader", "t"),
		"empty":        "",
		// Anyone could send the empty token; a name is an identity, once,
		// and must fit the worker_id and history columns.
		"empty token hash": tokenLine("x", "worker", ""),
		"name twice":       tokenLine("x", "worker", "t1") + tokenLine("x", "reader", "t2"),
		"name too long":    tokenLine(strings.Repeat("n", store.MaxKeyLen+1), "worker", "t"),
	} {
		if _, err := server.LoadTokens(writeTokens(t, content)); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	if _, err := server.LoadTokens(writeTokens(t, tokenLine(strings.Repeat("n", store.MaxKeyLen), "worker", "t"))); err != nil {
		t.Errorf("a name of %d bytes: %v", store.MaxKeyLen, err)
	}
}
