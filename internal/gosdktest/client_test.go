package jobfence_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
)

func TestTypedErrorsFromErrorInfo_R24(t *testing.T) {
	c := startCoordinator(t)
	ctx := ctxFor(t)

	t.Run("key conflict R1", func(t *testing.T) {
		req := refund("acme")
		if _, _, err := c.client.EnqueueRefund(ctx, req); err != nil {
			t.Fatal(err)
		}
		job, created, err := c.client.EnqueueRefund(ctx, req)
		if err != nil || created || job.OperationKey != req.OperationKey {
			t.Fatalf("same enqueue again = %+v, created=%v, %v; want the existing job", job, created, err)
		}
		req.AmountMinor++
		_, _, err = c.client.EnqueueRefund(ctx, req)
		if !errors.Is(err, jobfence.ErrKeyConflict) {
			t.Fatalf("conflicting enqueue: %v, want ErrKeyConflict", err)
		}
		var e *jobfence.Error
		if !errors.As(err, &e) || e.Code != codes.AlreadyExists || e.Reason != jobfence.ReasonKeyConflict {
			t.Fatalf("errors.As *Error = %+v", e)
		}
		if status.Code(err) != codes.AlreadyExists {
			t.Fatalf("status.Code = %s, want AlreadyExists", status.Code(err))
		}
	})

	t.Run("invalid argument names fields", func(t *testing.T) {
		_, err := c.client.Claim(ctx, jobfence.ClaimRequest{WorkerID: "w", MaxJobs: 0})
		var ia *jobfence.InvalidArgumentError
		if !errors.As(err, &ia) || !errors.Is(err, jobfence.ErrInvalidArgument) {
			t.Fatalf("Claim(max_jobs=0): %v, want *InvalidArgumentError", err)
		}
		if _, ok := ia.Field("max_jobs"); !ok {
			t.Fatalf("violations %+v do not name max_jobs", ia.Violations)
		}
	})

	t.Run("not found", func(t *testing.T) {
		_, err := c.client.GetJob(ctx, 987654321)
		if !errors.Is(err, jobfence.ErrNotFound) || errors.Is(err, jobfence.ErrUnavailable) {
			t.Fatalf("GetJob(unknown): %v, want ErrNotFound only", err)
		}
	})

	t.Run("stale attempt R9", func(t *testing.T) {
		job := c.enqueue(t, "stale")
		a := c.claimOne(t, "A", job)
		c.expire(t, job.ID)
		b := c.claimOne(t, "B", job)
		if !b.Takeover || b.NextAction != jobfence.ActionReconcile || b.Attempt != a.Attempt+1 {
			t.Fatalf("takeover = %+v", b)
		}
		if _, err := c.client.Complete(ctx, jobfence.CompleteRequest{JobID: job.ID, Attempt: b.Attempt, LeaseToken: b.LeaseToken, ProviderRefundID: "re_1"}); err != nil {
			t.Fatal(err)
		}
		for name, write := range map[string]func() error{
			"complete": func() error {
				_, err := c.client.Complete(ctx, jobfence.CompleteRequest{JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken, ProviderRefundID: "re_1"})
				return err
			},
			"reschedule": func() error {
				_, err := c.client.Reschedule(ctx, jobfence.RescheduleRequest{JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Delay: time.Second, Reason: "timeout"})
				return err
			},
			"escalate": func() error {
				_, err := c.client.Escalate(ctx, jobfence.EscalateRequest{JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Reason: "late"})
				return err
			},
		} {
			err := write()
			var stale *jobfence.StaleAttemptError
			if !errors.As(err, &stale) || !errors.Is(err, jobfence.ErrStaleAttempt) || !errors.Is(err, jobfence.ErrFenced) {
				t.Fatalf("late %s: %v, want *StaleAttemptError", name, err)
			}
			if stale.JobID != job.ID || stale.Attempt != a.Attempt || stale.CurrentAttempt != b.Attempt ||
				stale.CurrentState != jobfence.StateSucceeded {
				t.Fatalf("late %s: %+v", name, stale.FenceError)
			}
			if errors.Is(err, jobfence.ErrJobNotRunning) || errors.Is(err, jobfence.ErrUnavailable) {
				t.Fatalf("late %s matches other sentinels: %v", name, err)
			}
		}
		// Repeated fenced writes were not retried: one call each.
		if n := c.callCount("Escalate"); n != 1 {
			t.Fatalf("Escalate served %d times, want 1 (a fenced write is never repeated)", n)
		}
	})

	t.Run("current attempt without its token R25", func(t *testing.T) {
		job := c.enqueue(t, "forged")
		a := c.claimOne(t, "A", job)
		c.expire(t, job.ID)
		b := c.claimOne(t, "B", job)
		_, err := c.client.Complete(ctx, jobfence.CompleteRequest{JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken,
			ProviderRefundID: "re_A"})
		var stale *jobfence.StaleAttemptError
		if !errors.As(err, &stale) || stale.CurrentAttempt != b.Attempt {
			t.Fatalf("A's complete: %v, want *StaleAttemptError naming attempt %d", err, b.Attempt)
		}
		// The easy mistake: "retry with the current attempt" from the error.
		for _, token := range []jobfence.LeaseToken{a.LeaseToken, ""} {
			_, err := c.client.Complete(ctx, jobfence.CompleteRequest{JobID: job.ID, Attempt: stale.CurrentAttempt,
				LeaseToken: token, ProviderRefundID: "re_forged"})
			if !errors.Is(err, jobfence.ErrStaleAttempt) {
				t.Fatalf("complete with the disclosed attempt: %v, want ErrStaleAttempt", err)
			}
		}
		d, err := c.client.GetJob(ctx, job.ID)
		if err != nil || d.Job.State != jobfence.StateRunning || d.Job.ProviderRefundID != "" || d.Job.Attempt != b.Attempt {
			t.Fatalf("job after forged writes = %+v, %v; want B's grant untouched", d.Job, err)
		}
	})

	t.Run("job not running R21", func(t *testing.T) {
		job := c.enqueue(t, "notrunning")
		a := c.claimOne(t, "A", job)
		if _, err := c.client.Complete(ctx, jobfence.CompleteRequest{JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken, ProviderRefundID: "re_2"}); err != nil {
			t.Fatal(err)
		}
		_, err := c.client.Escalate(ctx, jobfence.EscalateRequest{JobID: job.ID, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Reason: "second thoughts"})
		var nr *jobfence.JobNotRunningError
		if !errors.As(err, &nr) || !errors.Is(err, jobfence.ErrJobNotRunning) || !errors.Is(err, jobfence.ErrFenced) ||
			errors.Is(err, jobfence.ErrStaleAttempt) {
			t.Fatalf("different write, same attempt: %v, want *JobNotRunningError", err)
		}
		if nr.CurrentState != jobfence.StateSucceeded || nr.CurrentAttempt != a.Attempt {
			t.Fatalf("%+v", nr.FenceError)
		}
	})

	t.Run("unreachable coordinator", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := lis.Addr().String()
		lis.Close()
		dead, err := jobfence.Dial(addr, jobfence.WithRetry(2, time.Millisecond, time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer dead.Close()
		if _, err := dead.GetJob(ctx, 1); !errors.Is(err, jobfence.ErrUnavailable) {
			t.Fatalf("GetJob on a closed port: %v, want ErrUnavailable", err)
		}
	})
}

func TestWriteBackRetriedOnUnavailableIsReplayed_R21(t *testing.T) {
	c := startCoordinator(t)
	ctx := ctxFor(t)
	for _, tc := range []struct {
		method string
		write  func(j jobfence.ClaimedJob) (jobfence.WriteResult, error)
		state  jobfence.JobState
	}{
		{"Complete", func(j jobfence.ClaimedJob) (jobfence.WriteResult, error) {
			return c.client.Complete(ctx, jobfence.CompleteRequest{JobID: j.Job.ID, Attempt: j.Attempt, LeaseToken: j.LeaseToken, ProviderRefundID: "re_9"})
		}, jobfence.StateSucceeded},
		{"Reschedule", func(j jobfence.ClaimedJob) (jobfence.WriteResult, error) {
			return c.client.Reschedule(ctx, jobfence.RescheduleRequest{JobID: j.Job.ID, Attempt: j.Attempt, LeaseToken: j.LeaseToken, Delay: time.Hour, Reason: "pending"})
		}, jobfence.StateReady},
		{"Escalate", func(j jobfence.ClaimedJob) (jobfence.WriteResult, error) {
			return c.client.Escalate(ctx, jobfence.EscalateRequest{JobID: j.Job.ID, Attempt: j.Attempt, LeaseToken: j.LeaseToken, Reason: "a person must look"})
		}, jobfence.StateManualReview},
	} {
		t.Run(tc.method, func(t *testing.T) {
			job := c.enqueue(t, "acme")
			claimed := c.claimOne(t, "w", job)
			before := c.callCount(tc.method)
			c.dropAfterCommit(tc.method, 1)
			res, err := tc.write(claimed)
			if err != nil {
				t.Fatalf("%s after a lost reply: %v, want success", tc.method, err)
			}
			if !res.Replayed || res.Job.State != tc.state || res.Job.Attempt != claimed.Attempt {
				t.Fatalf("%s = %+v, want replayed in state %s", tc.method, res, tc.state)
			}
			if n := c.callCount(tc.method) - before; n != 2 {
				t.Fatalf("%s served %d times, want 2 (the lost one and its repeat)", tc.method, n)
			}
			// The history shows the first write only (R21).
			d := c.get(t, job.ID)
			if got := kinds(d); len(got) != 3 {
				t.Fatalf("history %v, want enqueued, claimed and one write", got)
			}
		})
	}

	t.Run("no retry configured", func(t *testing.T) {
		once, err := jobfence.Dial(c.addr, jobfence.WithRetry(1, 0, 0))
		if err != nil {
			t.Fatal(err)
		}
		defer once.Close()
		job := c.enqueue(t, "acme")
		claimed := c.claimOne(t, "w", job)
		c.dropAfterCommit("Complete", 1)
		_, err = once.Complete(ctx, jobfence.CompleteRequest{JobID: job.ID, Attempt: claimed.Attempt, LeaseToken: claimed.LeaseToken, ProviderRefundID: "re_3"})
		if !errors.Is(err, jobfence.ErrUnavailable) {
			t.Fatalf("Complete with one try after a lost reply: %v, want ErrUnavailable", err)
		}
	})
}

func TestClaimIsNeverRetried_R7(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	c.dropAfterCommit("Claim", 1)
	jobs, err := c.client.Claim(ctxFor(t), jobfence.ClaimRequest{WorkerID: "w", MaxJobs: 1})
	if !errors.Is(err, jobfence.ErrClaimOutcomeUnknown) || !errors.Is(err, jobfence.ErrUnavailable) || jobs != nil {
		t.Fatalf("Claim = %v, %v; want no jobs and ErrClaimOutcomeUnknown", jobs, err)
	}
	if n := c.callCount("Claim"); n != 1 {
		t.Fatalf("Claim served %d times, want 1", n)
	}
	// The grant did commit: the job is running under attempt 1, for nobody.
	if d := c.get(t, job.ID); d.Job.State != jobfence.StateRunning || d.Job.Attempt != 1 {
		t.Fatalf("job after the lost claim: %+v", d.Job)
	}
}

func TestObservationDeduplicatedAndRetried_R15(t *testing.T) {
	c := startCoordinator(t)
	ctx := ctxFor(t)
	job := c.enqueue(t, "acme")
	req := jobfence.ObservationRequest{OperationKey: job.OperationKey, Source: "webhook", Outcome: jobfence.OutcomeSucceeded,
		ProviderRefundID: "re_7", ProviderEventID: "evt_1", Detail: "refund.succeeded"}
	c.dropAfterCommit("ReportObservation", 1)
	obs, dup, err := c.client.ReportObservation(ctx, req)
	if err != nil || !dup || obs.JobID != job.ID || obs.Outcome != jobfence.OutcomeSucceeded {
		t.Fatalf("ReportObservation after a lost reply = %+v, dup=%v, %v; want the filed one, duplicate", obs, dup, err)
	}
	d := c.get(t, job.ID)
	if len(d.Observations) != 1 || d.Job.State != jobfence.StateReady {
		t.Fatalf("job %+v with %d observations; want it untouched with one", d.Job, len(d.Observations))
	}
}

func TestBearerTokenAndTLS(t *testing.T) {
	var calls atomic.Int32 // calls that reached the server
	auth := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		md, _ := metadata.FromIncomingContext(ctx)
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer s3cret" {
			return nil, status.Error(codes.Unauthenticated, "no token")
		}
		return h(ctx, req)
	})
	token := jobfence.WithBearerToken(func(context.Context) (string, error) { return "s3cret", nil })

	t.Run("plaintext refuses the token", func(t *testing.T) {
		c := startCoordinatorOn(t, testdb.SQLiteBackend(), []grpc.ServerOption{auth})
		cl, err := jobfence.Dial(c.addr, token)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		_, err = cl.GetJob(ctxFor(t), 1)
		if !errors.Is(err, jobfence.ErrUnauthenticated) || calls.Load() != 0 {
			t.Fatalf("token over plaintext: %v (%d calls reached the server), want UNAUTHENTICATED before sending", err, calls.Load())
		}
		cl2, err := jobfence.Dial(c.addr, token, jobfence.WithPlaintextTokens())
		if err != nil {
			t.Fatal(err)
		}
		defer cl2.Close()
		if _, err = cl2.GetJob(ctxFor(t), 1); !errors.Is(err, jobfence.ErrNotFound) {
			t.Fatalf("with WithPlaintextTokens: %v, want ErrNotFound (authorised)", err)
		}
	})

	t.Run("tls", func(t *testing.T) {
		cert, pool := selfSigned(t)
		creds := grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}}))
		c := startCoordinatorOn(t, testdb.SQLiteBackend(), []grpc.ServerOption{auth, creds},
			jobfence.WithTLS(&tls.Config{RootCAs: pool}), token)
		if _, err := c.client.GetJob(ctxFor(t), 1); !errors.Is(err, jobfence.ErrNotFound) {
			t.Fatalf("over TLS with a token: %v, want ErrNotFound (authorised)", err)
		}
	})
}

// selfSigned returns a certificate for 127.0.0.1 and a pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "coordinator"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// TestClaimReportsEmptyBudget_R19: due jobs held back by the provider's
// budget come back as a BudgetExhaustedError saying when to return.
func TestClaimReportsEmptyBudget_R19(t *testing.T) {
	c := startCoordinatorOn(t, testdb.SQLiteBackend(), nil)
	ctx := context.Background()
	if err := c.store.ConfigureBudgets(ctx, map[string]store.BudgetConfig{"acme": {Rate: 0.5, Burst: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"budget-1", "budget-2"} {
		if _, _, err := c.client.EnqueueRefund(ctx, jobfence.EnqueueRequest{OperationKey: key, OrderID: "o", PaymentID: "p-" + key,
			AmountMinor: 100, Currency: "EUR", Provider: "acme"}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := c.client.Claim(ctx, jobfence.ClaimRequest{WorkerID: "w", MaxJobs: 5}); err != nil || len(got) != 1 {
		t.Fatalf("first claim = %d jobs, %v; want the burst of 1", len(got), err)
	}
	_, err := c.client.Claim(ctx, jobfence.ClaimRequest{WorkerID: "w", MaxJobs: 5})
	var be *jobfence.BudgetExhaustedError
	if !errors.Is(err, jobfence.ErrBudgetExhausted) || !errors.As(err, &be) || be.RetryAfter <= 0 || be.RetryAfter > 2*time.Second {
		t.Fatalf("second claim: %v, want BudgetExhaustedError within 2s", err)
	}
}

// R25: the lease token never shows in what a worker prints or logs; its
// fingerprint names the grant instead.
func TestLeaseTokenPrintsRedacted_R25(t *testing.T) {
	c := startCoordinator(t)
	job := c.enqueue(t, "acme")
	claimed := c.claimOne(t, "A", job)
	token := string(claimed.LeaseToken)
	if len(token) < 22 {
		t.Fatalf("lease token %q is not a 128-bit token", token)
	}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("claimed", "job", claimed, "token", claimed.LeaseToken)
	dumped, err := json.Marshal(claimed)
	if err != nil {
		t.Fatal(err)
	}
	printed := fmt.Sprintf("%v %+v %#v %s", claimed, claimed, claimed, claimed.LeaseToken) + logged.String() + string(dumped)
	if strings.Contains(printed, token) {
		t.Fatalf("the token shows in formatted output:\n%s", printed)
	}
	fp := claimed.LeaseToken.Fingerprint()
	if want := store.LeaseToken(token).Hash().Fingerprint(); fp != want || len(fp) != 12 {
		t.Fatalf("fingerprint %q, want the coordinator's %q", fp, want)
	}
}
