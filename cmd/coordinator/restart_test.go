package main_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
)

func dial(t *testing.T, p *process) pb.CoordinatorClient {
	t.Helper()
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewCoordinatorClient(conn)
}

// TestRestartKeepsJobsAndFence: enqueue and claim on the embedded store, stop
// the coordinator (SIGTERM, and SIGKILL as a crash), start it again on the same
// file: the job, its attempt and history are intact, and a write with the
// pre-restart attempt still lands because nobody took over (R8).
func TestRestartKeepsJobsAndFence(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			path := filepath.Join(t.TempDir(), "fresh", "folder", "jobfence.db")

			first := startCoordinator(t, "--sqlite", path)
			if !strings.Contains(first.Logs(), "single-node") {
				t.Fatalf("start-up log does not say the embedded store is single-node:\n%s", first.Logs())
			}
			c := dial(t, first)
			enq, err := c.EnqueueRefund(ctx, &pb.EnqueueRefundRequest{OperationKey: "refund-restart", OrderId: "o-1",
				PaymentId: "p-1", AmountMinor: 500, Currency: "GBP", Provider: "acme"})
			if err != nil {
				t.Fatal(err)
			}
			claimed, err := c.Claim(ctx, &pb.ClaimRequest{WorkerId: "A", MaxJobs: 1, LeaseDuration: durationpb.New(10 * time.Minute)})
			if err != nil || len(claimed.Jobs) != 1 {
				t.Fatalf("Claim = %v, %v", claimed, err)
			}
			held := claimed.Jobs[0]
			first.stop(t, sig)
			if sig == syscall.SIGTERM && !strings.Contains(first.Logs(), "shutting down") {
				t.Fatalf("no graceful shutdown logged:\n%s", first.Logs())
			}
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("database file: %v", err)
			}

			second := startCoordinator(t, "--sqlite", path)
			c = dial(t, second)
			got, err := c.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: enq.Job.Id}})
			if err != nil {
				t.Fatal(err)
			}
			if got.Job.State != pb.JobState_JOB_STATE_RUNNING || got.Job.Attempt != held.Attempt ||
				got.Job.WorkerId != "A" || len(got.Events) != 2 || !got.Job.LeaseUntil.AsTime().Equal(held.LeaseUntil.AsTime()) {
				t.Fatalf("after restart: %v (%d events), want running attempt %d held by A", got.Job, len(got.Events), held.Attempt)
			}
			// The lease is still live: nothing to take over.
			if again, err := c.Claim(ctx, &pb.ClaimRequest{WorkerId: "B", MaxJobs: 5}); err != nil || len(again.Jobs) != 0 {
				t.Fatalf("Claim after restart = %v, %v", again, err)
			}
			done, err := c.Complete(ctx, &pb.CompleteRequest{JobId: enq.Job.Id, Attempt: held.Attempt, LeaseToken: held.LeaseToken, ProviderRefundId: "re_9"})
			if err != nil || done.Replayed || done.Job.State != pb.JobState_JOB_STATE_SUCCEEDED {
				t.Fatalf("Complete with the pre-restart attempt = %v, %v", done, err)
			}
			second.stop(t, syscall.SIGTERM)
		})
	}
}

// TestFlagsAndEnvironment: a bad flag value fails the start with a message
// naming it; an environment variable stands in for a flag.
func TestFlagsAndEnvironment(t *testing.T) {
	for _, args := range [][]string{
		{"--lease", "200ms"},
		{"--lease", "16m"},
		{"--provider-key-retention", "acme"},
		{"--log-format", "xml"},
		{"--provider-budget", "acme=0"},
		{"--provider-budget", "acme=5:0.5"},
	} {
		out, err := runBinary(t, nil, args...)
		if err == nil || !strings.Contains(out, args[0]) {
			t.Errorf("%v: err %v, output %q; want a failure naming %s", args, err, out, args[0])
		}
	}
	out, err := runBinary(t, []string{"JOBFENCE_LEASE=1ms"})
	if err == nil || !strings.Contains(out, "--lease") {
		t.Errorf("JOBFENCE_LEASE=1ms: err %v, output %q", err, out)
	}
	out, err = runBinary(t, nil, "-h")
	if err != nil || !strings.Contains(out, "JOBFENCE_") || !strings.Contains(out, "-mysql-dsn") {
		t.Errorf("-h: err %v, output %q", err, out)
	}
}

// TestMetricsEndpoint: --metrics-listen serves the M1 metrics, the gRPC and
// database pool metrics in Prometheus text format.
func TestMetricsEndpoint(t *testing.T) {
	p := startCoordinator(t, "--sqlite", filepath.Join(t.TempDir(), "m.db"), "--metrics-listen", "127.0.0.1:0")
	// The metrics listener logs on its own goroutine, possibly after the
	// gRPC ready record: wait for it rather than reading the logs once.
	rec, ok := p.WaitRecord(10*time.Second, func(r map[string]any) bool { return r["msg"] == "metrics serving" })
	if !ok {
		t.Fatalf("no metrics listener logged:\n%s", p.Logs())
	}
	addr, _ := rec["listen"].(string)
	if _, err := p.grpcurl(t, "-d", `{"worker_id":"w","max_jobs":1}`, "ADDR", "jobfence.v1.Coordinator/Claim"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, name := range []string{"jobfence_takeovers_total", "jobfence_stale_attempt_rejections_total",
		"jobfence_oldest_unfinished_job_age_seconds", "jobfence_granted_jobs_total", "jobfence_jobs{",
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Claim"`, "go_sql_open_connections", "process_cpu_seconds_total"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestGCTarget: the coordinator runs the collector at its own GOGC target
// and soft memory limit unless the environment sets them, and says which at
// start.
func TestGCTarget(t *testing.T) {
	for _, tc := range []struct{ env, gogc, limit, limitBytes string }{
		{"GOGC= GOMEMLIMIT=", "400", "512MiB", "5.36870912e+08"},
		{"GOGC=150 GOMEMLIMIT=1GiB", "150", "1GiB", "1.073741824e+09"},
	} {
		p := proctest.Start(t, bin.coordinator, proctest.Options{
			Args: []string{"--listen", "127.0.0.1:0", "--log-format", "json", "--sqlite",
				filepath.Join(t.TempDir(), "gc.db"), "--metrics-listen", "127.0.0.1:0"},
			Ready: "coordinator serving",
			Env:   strings.Fields(tc.env),
		})
		if rec, ok := p.WaitRecord(10*time.Second, func(r map[string]any) bool { return r["msg"] == "coordinator serving" }); !ok ||
			rec["gogc"] != tc.gogc || rec["gomemlimit"] != tc.limit {
			t.Errorf("%s: start record %v, want gogc=%s gomemlimit=%s", tc.env, rec, tc.gogc, tc.limit)
		}
		rec, ok := p.WaitRecord(10*time.Second, func(r map[string]any) bool { return r["msg"] == "metrics serving" })
		if !ok {
			t.Fatalf("no metrics listener logged:\n%s", p.Logs())
		}
		resp, err := http.Get("http://" + rec["listen"].(string) + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "\ngo_gc_gogc_percent "+tc.gogc+"\n") {
			t.Errorf("%s: the runtime's target is not %s", tc.env, tc.gogc)
		}
		if !strings.Contains(string(body), "\ngo_gc_gomemlimit_bytes "+tc.limitBytes+"\n") {
			t.Errorf("%s: the runtime's memory limit is not %s", tc.env, tc.limit)
		}
	}
}
