package server_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
)

// tooMany requires err to be RESOURCE_EXHAUSTED, TOO_MANY_CALLS of scope,
// with a RetryInfo.
func tooMany(t *testing.T, err error, scope string) {
	t.Helper()
	meta := errorInfo(t, err, codes.ResourceExhausted, server.ReasonTooManyCalls)
	if meta["scope"] != scope {
		t.Fatalf("refused for scope %q (%v), want %q", meta["scope"], err, scope)
	}
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok && r.RetryDelay.AsDuration() > 0 {
			return
		}
	}
	t.Fatalf("%v carries no RetryInfo", err)
}

// Expensive reads are bounded per credential and per coordinator: with
// two reads of one credential in flight its third is refused
// RESOURCE_EXHAUSTED (TOO_MANY_CALLS, scope credential) with a retry hint,
// another credential still reads until the coordinator's four are taken,
// then everyone is refused (scope coordinator); once the reads end, reads
// go through again. Nothing else waits on them: a claim and its completion
// go through while every read place is taken.
func TestExpensiveReadsBounded(t *testing.T) {
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) {
		o.Auth = operatorTokens(t)
		o.MaxReads, o.MaxReadsPerCredential = 4, 2
	})
	ctx := ctxFor(t)
	gate := make(chan struct{})
	c.watched.listGate.Store(&gate)
	list := func(ctx context.Context, token string) error {
		_, err := c.client.ListJobs(as(ctx, token), &pb.ListJobsRequest{State: pb.JobState_JOB_STATE_MANUAL_REVIEW,
			ReasonPrefix: "no reason starts so"})
		return err
	}
	var wg sync.WaitGroup
	held := func(token string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := list(ctx, token); err != nil {
				t.Errorf("a held read of %s: %v", token, err)
			}
		}()
	}
	held("tok-rita")
	held("tok-rita")
	proctest.WaitFor(t, 10*time.Second, "two reads held", func() bool { return c.watched.listing.Load() == 2 })
	tooMany(t, list(ctx, "tok-rita"), "credential")
	held("tok-alice")
	held("tok-alice")
	proctest.WaitFor(t, 10*time.Second, "four reads held", func() bool { return c.watched.listing.Load() == 4 })
	tooMany(t, list(ctx, "tok-bob"), "coordinator")
	if _, err := c.client.GetOverview(as(ctx, "tok-rita"), &pb.GetOverviewRequest{}); err == nil {
		t.Fatal("GetOverview read the database past the bound")
	}

	if _, err := c.client.EnqueueRefund(as(ctx, "tok-shop"), refundReq()); err != nil {
		t.Fatalf("an enqueue while the reads are held: %v", err)
	}
	claimed, err := c.client.Claim(as(ctx, "tok-worker-a"), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1})
	if err != nil || len(claimed.Jobs) != 1 {
		t.Fatalf("a claim while the reads are held: %v, %v", claimed, err)
	}
	job := claimed.Jobs[0]
	if _, err := c.client.Complete(as(ctx, "tok-worker-a"), &pb.CompleteRequest{JobId: job.Job.Id, Attempt: job.Attempt,
		LeaseToken: job.LeaseToken, ProviderRefundId: "re_1"}); err != nil {
		t.Fatalf("a completion while the reads are held: %v", err)
	}
	close(gate)
	wg.Wait()
	if err := list(ctx, "tok-rita"); err != nil {
		t.Fatalf("a read after the others ended: %v", err)
	}
}

// GetOverview is served from a short cache: a second overview within
// moments costs no read, and answers what the first read.
func TestGetOverviewIsCached(t *testing.T) {
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) { o.Auth = operatorTokens(t) })
	ctx := ctxFor(t)
	first, err := c.client.GetOverview(as(ctx, "tok-rita"), &pb.GetOverviewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	c.watched.listGate.Store(&gate) // a read of the database would now wait
	defer close(gate)
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	again, err := c.client.GetOverview(as(short, "tok-alice"), &pb.GetOverviewRequest{})
	if err != nil || !again.Now.AsTime().Equal(first.Now.AsTime()) {
		t.Fatalf("a second overview = %v, %v; want the first, from the cache", again, err)
	}
}

// Worker streams are bounded per credential and per coordinator: past the
// credential's bound Work answers RESOURCE_EXHAUSTED (scope credential),
// another credential opens one until the coordinator's are taken (scope
// coordinator), and a stream that ends gives its place back.
func TestWorkerStreamsBounded(t *testing.T) {
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) {
		o.Auth = operatorTokens(t)
		o.MaxStreams, o.MaxStreamsPerCredential = 3, 2
	})
	ctx := ctxFor(t)
	open := func(token string) (pb.Coordinator_WorkClient, context.CancelFunc) {
		t.Helper()
		sctx, cancel := context.WithCancel(as(ctx, token))
		t.Cleanup(cancel)
		st, err := c.client.Work(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.WorkRequest{Kind: &pb.WorkRequest_Start{Start: &pb.WorkStart{WorkerId: "w", Credits: 1,
			LeaseDuration: durationpb.New(time.Minute)}}}); err != nil {
			t.Fatal(err)
		}
		return st, cancel
	}
	refused := func(st pb.Coordinator_WorkClient, scope string) {
		t.Helper()
		_, err := st.Recv()
		tooMany(t, err, scope)
		if !strings.Contains(status.Convert(err).Message(), "worker streams") {
			t.Fatalf("message %q does not say what was bounded", status.Convert(err).Message())
		}
	}
	_, endA := open("tok-worker-a")
	open("tok-worker-a")
	proctest.WaitFor(t, 10*time.Second, "two streams open", func() bool {
		return c.metric(t, "jobfence_worker_streams").GetGauge().GetValue() == 2
	})
	third, _ := open("tok-worker-a")
	refused(third, "credential")
	open("tok-worker-b")
	proctest.WaitFor(t, 10*time.Second, "three streams open", func() bool {
		return c.metric(t, "jobfence_worker_streams").GetGauge().GetValue() == 3
	})
	fourth, _ := open("tok-worker-b")
	refused(fourth, "coordinator")
	endA()
	proctest.WaitFor(t, 10*time.Second, "a place given back", func() bool {
		return c.metric(t, "jobfence_worker_streams").GetGauge().GetValue() == 2
	})
	open("tok-worker-b")
	proctest.WaitFor(t, 10*time.Second, "a stream opened in the place given back", func() bool {
		return c.metric(t, "jobfence_worker_streams").GetGauge().GetValue() == 3
	})
}

// Expensive reads are bounded per second too, per credential and per
// coordinator, which bounds the database time readers take: past the
// credential's rate its next read is refused (scope credential) with a
// RetryInfo of when the next is allowed; another credential reads until the
// coordinator's rate is spent (scope coordinator); after the hint, reads go
// through again.
func TestExpensiveReadsRateBounded(t *testing.T) {
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) {
		o.Auth = operatorTokens(t)
		o.ReadsPerSecond, o.ReadsPerSecondPerCredential = 3, 2
	})
	ctx := ctxFor(t)
	list := func(token string) error {
		_, err := c.client.ListJobs(as(ctx, token), &pb.ListJobsRequest{State: pb.JobState_JOB_STATE_MANUAL_REVIEW,
			ReasonPrefix: "no reason starts so"})
		return err
	}
	for range 2 {
		if err := list("tok-rita"); err != nil {
			t.Fatal(err)
		}
	}
	err := list("tok-rita")
	tooMany(t, err, "credential")
	var hint time.Duration
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			hint = r.RetryDelay.AsDuration()
		}
	}
	if hint <= 0 || hint > time.Second/2 {
		t.Fatalf("retry hint %s, want the time until the credential's next read (at most half a second at 2/s)", hint)
	}
	if err := list("tok-bob"); err != nil {
		t.Fatalf("another credential's first read: %v", err)
	}
	tooMany(t, list("tok-alice"), "coordinator")
	proctest.WaitFor(t, 5*time.Second, "a read allowed again", func() bool { return list("tok-rita") == nil })
}

// Refusals a client can make by the thousand are logged in aggregate: a
// client past its share, hammering, and one with a wrong token get one line
// each per interval, with the count, and the exact count in
// jobfence_calls_refused_total, never a line per call.
func TestRefusalsLoggedInAggregate(t *testing.T) {
	logs := &syncBuffer{}
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) {
		o.Auth = operatorTokens(t)
		o.ReadsPerSecond, o.ReadsPerSecondPerCredential = 1, 1
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ctx := ctxFor(t)
	const n = 300
	refused := 0
	for range n {
		if _, err := c.client.ListJobs(as(ctx, "tok-rita"), &pb.ListJobsRequest{State: pb.JobState_JOB_STATE_MANUAL_REVIEW,
			ReasonPrefix: "x"}); status.Code(err) == codes.ResourceExhausted {
			refused++
		}
		if _, err := c.client.ListJobs(as(ctx, "tok-guessed"), &pb.ListJobsRequest{}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("a wrong token: %v", err)
		}
	}
	if refused < n-2 {
		t.Fatalf("%d of %d reads refused, want all but the first", refused, n)
	}
	out := logs.String()
	if lines := strings.Count(out, "calls refused"); lines < 2 || lines > 4 {
		t.Fatalf("%d aggregate lines for %d refusals of two kinds, want one or two each:\n%s", lines, refused+n, out)
	}
	if strings.Count(out, "finished call") > 4 || !strings.Contains(out, "kind=too_many_calls") ||
		!strings.Contains(out, "kind=unauthenticated") || !strings.Contains(out, "caller=127.0.0.1") {
		t.Fatalf("the log of %d refusals:\n%s", refused+n, out)
	}
	var total float64
	families, err := c.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "jobfence_calls_refused_total" {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	if int(total) != refused+n {
		t.Fatalf("jobfence_calls_refused_total = %v, want %d", total, refused+n)
	}
}
