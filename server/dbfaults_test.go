package server_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/jobfence/jobfence/archiver"
	"github.com/jobfence/jobfence/clients/go/jobfence"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/mariadbpair"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/mysql"
)

// privateServer is a MariaDB of this test's own (global settings, privileges
// and kills touch nobody else) with the coordinator's schema in database jf,
// and a root handle on it.
type privateServer struct {
	server *mariadbpair.Single
	root   *sql.DB
}

func startPrivate(t *testing.T) *privateServer {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts a MariaDB server of its own")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	one, err := mariadbpair.StartSingle(ctx, mariadbpair.Options{Logf: t.Logf})
	if err != nil {
		t.Fatalf("a private MariaDB: %v", err)
	}
	t.Cleanup(func() { one.Close() })
	root, err := sql.Open("mysql", one.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	p := &privateServer{server: one, root: root}
	p.exec(t, "CREATE DATABASE jf")
	schema, err := mysql.Open(ctx, one.DSN("jf"), mysql.Options{})
	if err != nil {
		t.Fatal(err)
	}
	schema.Close()
	return p
}

func (p *privateServer) exec(t *testing.T, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := p.root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// leastPrivileged creates the user a production coordinator runs as: row
// privileges on each table and nothing else (no SUPER, so read_only holds
// for it; table grants, so a REVOKE holds at its next statement), and
// returns a backend opening the store as that user.
func (p *privateServer) leastPrivileged(t *testing.T) testdb.Backend {
	t.Helper()
	p.exec(t, "CREATE USER coord@'127.0.0.1' IDENTIFIED BY 'secret'")
	for _, table := range []string{"refund_jobs", "refund_job_events", "refund_observations", "refund_ledger",
		"provider_budgets", "jobfence_schema_migrations", "refund_operation_keys", "refund_jobs_archive",
		"refund_job_events_archive", "refund_observations_archive", "jobfence_leases"} {
		p.exec(t, "GRANT SELECT, INSERT, UPDATE, DELETE ON jf."+table+" TO coord@'127.0.0.1'")
	}
	dsn := "coord:secret@tcp(" + p.server.Addr() + ")/jf"
	return testdb.Backend{Name: "private", Open: func(t *testing.T) store.Store {
		s, err := mysql.Open(context.Background(), dsn, mysql.Options{})
		if err != nil {
			t.Fatalf("open as the least-privileged user: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}}
}

// Issue: with read_only=1 (a demoted primary), full tables or a missing
// privilege, calls answered INTERNAL and workers gave up on their receipts
// (R15). Nothing was changed in any of them, so they answer UNAVAILABLE with
// a reason naming the cause, and the SDK's repeats file the receipt once the
// database takes writes again. A least-privileged user can start the
// coordinator on an up-to-date schema. Health follows the database.
func TestDatabaseRefusalsAreRetryable_R20(t *testing.T) {
	p := startPrivate(t)
	c := start(t, p.leastPrivileged(t))
	ctx := ctxFor(t)
	job := c.enqueue(t)
	claimed := c.claimOne(t, "w", job.Id)
	sdk, err := jobfence.Dial(c.addr, jobfence.WithRetry(40, 50*time.Millisecond, 250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Close()
	observe := func(source string) error {
		_, _, err := sdk.ReportObservation(ctx, jobfence.ObservationRequest{JobID: job.Id, Attempt: claimed.Attempt,
			LeaseToken: jobfence.LeaseToken(claimed.LeaseToken), Source: source, Outcome: jobfence.OutcomeSucceeded,
			ProviderRefundID: "re_1"})
		return err
	}

	t.Run("read-only", func(t *testing.T) {
		p.exec(t, "SET GLOBAL read_only = 1")
		_, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: claimed.Attempt,
			LeaseToken: claimed.LeaseToken, ProviderRefundId: "re_1"})
		errorInfo(t, err, codes.Unavailable, server.ReasonDatabaseUnavailable)
		_, err = c.client.EnqueueRefund(ctx, refundReq())
		errorInfo(t, err, codes.Unavailable, server.ReasonDatabaseUnavailable)
		filed := make(chan error, 1)
		go func() { filed <- observe("worker:read-only") }()
		time.Sleep(time.Second) // the SDK repeats meanwhile
		p.exec(t, "SET GLOBAL read_only = 0")
		if err := <-filed; err != nil {
			t.Fatalf("the receipt was not filed once the database took writes again: %v", err)
		}
	})

	t.Run("access denied", func(t *testing.T) {
		p.exec(t, "REVOKE INSERT ON jf.refund_observations FROM coord@'127.0.0.1'")
		_, err := c.client.ReportObservation(ctx, &pb.ReportObservationRequest{
			Job: &pb.ReportObservationRequest_JobId{JobId: job.Id}, Source: "worker:denied",
			Outcome: pb.ObservationOutcome_OBSERVATION_OUTCOME_PENDING})
		errorInfo(t, err, codes.Unavailable, server.ReasonDatabaseDenied)
		filed := make(chan error, 1)
		go func() { filed <- observe("worker:denied-then-granted") }()
		time.Sleep(time.Second)
		p.exec(t, "GRANT INSERT ON jf.refund_observations TO coord@'127.0.0.1'")
		if err := <-filed; err != nil {
			t.Fatalf("the receipt was not filed once the privilege was back: %v", err)
		}
	})

	t.Run("health follows the database", func(t *testing.T) {
		hs := health.NewServer() // as NewGRPCServer leaves it: serving
		hs.SetServingStatus(pb.Coordinator_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go c.server.WatchDatabase(wctx, hs, 100*time.Millisecond)
		status := func() healthpb.HealthCheckResponse_ServingStatus {
			resp, err := hs.Check(ctx, &healthpb.HealthCheckRequest{Service: pb.Coordinator_ServiceDesc.ServiceName})
			if err != nil {
				t.Fatal(err)
			}
			return resp.Status
		}
		time.Sleep(300 * time.Millisecond)
		if s := status(); s != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health = %s with the database up, want SERVING", s)
		}
		if err := p.server.Close(); err != nil { // kills the server
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for status() != healthpb.HealthCheckResponse_NOT_SERVING {
			if time.Now().After(deadline) {
				t.Fatal("health still SERVING 10s after the database died")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// R31: a database that goes read-only while the archive runs (a demoted
// primary): taking the lease fails and the run stops, moving nothing (Run
// starts the next an interval later); with the lease held, its batches fail
// whole, it waits, counts the waits and moves nothing; once the database
// takes writes again, it resumes.
func TestArchiverWaitsOutAReadOnlyDatabase_R31(t *testing.T) {
	p := startPrivate(t)
	st := p.leastPrivileged(t).Open(t)
	ctx := ctxFor(t)
	reg := prometheus.NewRegistry()
	a, err := archiver.New(st.(archiver.Store), archiver.Options{RetainSucceeded: time.Second, Pause: time.Millisecond,
		Metrics: archiver.NewMetrics(reg), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	p.exec(t, "SET GLOBAL read_only = 1")
	if tot, err := a.Once(ctx); !errors.Is(err, store.ErrUnavailable) || tot.Jobs != 0 {
		t.Fatalf("Once on a read-only database = %+v, %v; want ErrUnavailable, nothing moved", tot, err)
	}
	p.exec(t, "SET GLOBAL read_only = 0")
	if _, err := a.Once(ctx); err != nil { // takes the lease: nothing is due yet
		t.Fatal(err)
	}
	var last store.Job
	for i := range 5 {
		if _, _, err := st.Enqueue(ctx, store.EnqueueParams{OperationKey: fmt.Sprintf("ro-%d", i), OrderID: "o",
			PaymentID: "p", AmountMinor: 100, Currency: "EUR", Provider: "acme"}); err != nil {
			t.Fatal(err)
		}
		c, err := st.Claim(ctx, store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: time.Minute})
		if err != nil || len(c) != 1 {
			t.Fatalf("claim: %v %v", c, err)
		}
		res, err := st.Write(ctx, store.Writeback{Kind: store.EventCompleted, JobID: c[0].Job.ID,
			Attempt: c[0].Job.Attempt, LeaseToken: c[0].LeaseToken, ProviderRefundID: "re"})
		if err != nil {
			t.Fatal(err)
		}
		last = res.Job
	}
	proctest.WaitFor(t, 10*time.Second, "the jobs past a second's retention", func() bool {
		s, err := st.Stats(ctx)
		return err == nil && s.Now.After(last.NextAttemptAt.Add(store.MinRetention))
	})
	p.exec(t, "SET GLOBAL read_only = 1")
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if tot, err := a.Once(short); err == nil || tot.Jobs != 0 {
		t.Fatalf("Once on a read-only database, lease held = %+v, %v; want it to wait, moving nothing", tot, err)
	}
	waits := 0.0
	if mfs, err := reg.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() == "jobfence_archive_backoffs_total" {
				for _, m := range mf.GetMetric() {
					waits += m.GetCounter().GetValue()
				}
			}
		}
	}
	if waits == 0 {
		t.Fatal("no back-off counted while the database refused writes")
	}
	p.exec(t, "SET GLOBAL read_only = 0")
	if tot, err := a.Once(ctx); err != nil || tot.Jobs != 5 {
		t.Fatalf("Once once the database takes writes = %+v, %v; want the 5 jobs", tot, err)
	}
}
