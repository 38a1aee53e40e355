package main_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// The archive's flags refuse what cannot work, naming the flag and an
// example.
func TestArchiveFlagMistakesSayWhatToDo(t *testing.T) {
	sqlite := filepath.Join(t.TempDir(), "x.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--retain-succeeded", "-1h"}, "--retain-succeeded must be at least 1s, or 0 to never archive"},
		{[]string{"--retain-succeeded", "10ms"}, "e.g. --retain-succeeded=168h"},
		{[]string{"--retain-succeeded", "7"}, `--retain-succeeded "7": a duration needs a unit`},
		{[]string{"--archive-batch", "0"}, "--archive-batch must be between 1 and 1000"},
		{[]string{"--archive-interval", "10ms"}, "--archive-interval must be between 1s and 1h"},
		{[]string{"--archive-pause", "-1s"}, "--archive-pause must be between 0 and 1m"},
		{[]string{"--archive-max-purge-backlog", "0"}, "--archive-max-purge-backlog must be positive"},
		{[]string{"--archive-once", "--retain-succeeded", "0"}, "--archive-once needs a retention"},
		{[]string{"--max-reads", "0"}, "--max-reads must be positive"},
		{[]string{"--max-streams-per-credential", "-2"}, "--max-streams-per-credential must be positive"},
	} {
		out, err := runBinary(t, nil, append(c.args, "--sqlite", sqlite)...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%q: err %v, output\n%s\nwant %q", c.args, err, out, c.want)
		}
	}
}

// R30, R31 through the binary: a coordinator with a retention of a second
// archives a succeeded job by itself; GetJob answers it archived, with its
// history; an enqueue of its key answers it (created false), never a second
// job; --archive-once on the database finds nothing left to do.
func TestCoordinatorArchivesFinishedJobs_R30_R31(t *testing.T) {
	dsn := testdb.MySQL(t)
	c := startCoordinator(t, "--mysql-dsn", dsn, "--retain-succeeded", "1s", "--archive-interval", "1s")
	client := dial(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := &pb.EnqueueRefundRequest{OperationKey: "archived-1", OrderId: "o-1", PaymentId: "p-1", AmountMinor: 990,
		Currency: "EUR", Provider: "acme"}
	enq, err := client.EnqueueRefund(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := client.Claim(ctx, &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1})
	if err != nil || len(claimed.Jobs) != 1 {
		t.Fatalf("Claim = %v, %v", claimed, err)
	}
	g := claimed.Jobs[0]
	if _, err := client.Complete(ctx, &pb.CompleteRequest{JobId: g.Job.Id, Attempt: g.Attempt, LeaseToken: g.LeaseToken,
		ProviderRefundId: "re_1"}); err != nil {
		t.Fatal(err)
	}
	var d *pb.GetJobResponse
	proctest.WaitFor(t, 30*time.Second, "the job archived", func() bool {
		d, err = client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: enq.Job.Id}})
		return err == nil && d.Job.ArchivedAt != nil
	})
	if d.Job.State != pb.JobState_JOB_STATE_SUCCEEDED || len(d.Events) != 3 || d.Ledger.GetProviderRefundId() != "re_1" {
		t.Fatalf("the archived job = %v", d)
	}
	again, err := client.EnqueueRefund(ctx, req)
	if err != nil || again.Created || again.Job.Id != enq.Job.Id || again.Job.ArchivedAt == nil {
		t.Fatalf("the archived key enqueued again = %v, %v; want the archived job (R30)", again, err)
	}
	if !strings.Contains(c.Logs(), "archive run") {
		t.Fatalf("no progress line for the archive run:\n%s", c.Logs())
	}
	c.stop(t, syscall.SIGTERM)
	out, err := runBinary(t, []string{"JOBFENCE_MYSQL_DSN=" + dsn}, "--archive-once", "--retain-succeeded", "1s")
	if err != nil || !strings.Contains(out, "archive done") || !strings.Contains(out, "jobs=0") {
		t.Fatalf("--archive-once: %v\n%s", err, out)
	}

	// Exported to cold storage and dropped: the job's line holds its history
	// and ledger; its key still answers as R1 does, with the final state.
	export := filepath.Join(t.TempDir(), "archive.jsonl")
	// --archive-export-before may not be in the future: a whole second past
	// the archive, now.
	proctest.WaitFor(t, 10*time.Second, "a second past the archive", func() bool {
		return time.Now().After(d.Job.ArchivedAt.AsTime().Add(time.Second))
	})
	before := time.Now().UTC().Truncate(time.Second)
	out, err = runBinary(t, []string{"JOBFENCE_MYSQL_DSN=" + dsn}, "--archive-export", export,
		"--archive-export-before", before.Format(time.RFC3339))
	if err != nil || !strings.Contains(out, "archive export done") {
		t.Fatalf("--archive-export: %v\n%s", err, out)
	}
	lines, err := os.ReadFile(export)
	if err != nil || strings.Count(string(lines), "\n") != 1 || !strings.Contains(string(lines), `"operation_key":"archived-1"`) ||
		!strings.Contains(string(lines), `"events":[`) || !strings.Contains(string(lines), `"provider_refund_id":"re_1"`) {
		t.Fatalf("export file (%v):\n%s", err, lines)
	}
	c = startCoordinator(t, "--mysql-dsn", dsn)
	client = dial(t, c)
	if _, err := client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: enq.Job.Id}}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetJob by id after the export: %v, want NOT_FOUND", err)
	}
	again, err = client.EnqueueRefund(ctx, req)
	if err != nil || again.Created || again.Job.Id != enq.Job.Id || again.Job.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("the exported key enqueued again = %v, %v; want the job as its key keeps it (R30)", again, err)
	}
	req.AmountMinor++
	if _, err := client.EnqueueRefund(ctx, req); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("the exported key with another amount: %v, want ALREADY_EXISTS (R30)", err)
	}
}
