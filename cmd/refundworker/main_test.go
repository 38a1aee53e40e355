package main_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
)

// The binaries, built once for the package.
var bin struct{ coordinator, refundworker string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "refundworker-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, b := range []struct {
		out  *string
		name string
		pkg  string
	}{
		{&bin.coordinator, "coordinator", "github.com/jobfence/jobfence/cmd/coordinator"},
		{&bin.refundworker, "refundworker", "."},
	} {
		if *b.out, err = proctest.Build(dir, b.name, b.pkg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's world: a coordinator process on its own MySQL database,
// a fake provider over HTTP, and an SDK client for the test's own calls.
type env struct {
	dsn      string
	db       *sql.DB
	coord    *proctest.Process
	client   *jobfence.Client
	provider *fakeprovider.Provider
	url      string
	pay      *fakeprovider.Client
}

func setup(t *testing.T, provider fakeprovider.Config, coordinatorArgs ...string) *env {
	t.Helper()
	return setupWith(t, provider, nil, coordinatorArgs...)
}

// setupWith is setup with options for the test's own client.
func setupWith(t *testing.T, provider fakeprovider.Config, clientOpts []jobfence.Option, coordinatorArgs ...string) *env {
	t.Helper()
	dsn := testdb.MySQL(t) // MySQL is mandatory: never skipped
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e := &env{dsn: dsn, db: db, provider: fakeprovider.New(provider)}
	e.coord = proctest.StartCoordinator(t, bin.coordinator, append([]string{"--mysql-dsn", dsn}, coordinatorArgs...)...)
	srv := httptest.NewServer(e.provider)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	e.pay = fakeprovider.NewClient(srv.URL, nil)
	if e.client, err = jobfence.Dial(e.coord.Addr, clientOpts...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.client.Close() })
	return e
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// worker starts a refundworker process working until stopped, with a
// receipt spool of the test's own (args may name another).
func (e *env) worker(t *testing.T, id string, args ...string) *proctest.Process {
	t.Helper()
	return proctest.Start(t, bin.refundworker, proctest.Options{
		Args: append([]string{"--coordinator", e.coord.Addr, "--provider", e.url, "--worker-id", id,
			"--log-format", "json", "--poll-interval", "100ms", "--receipt-spool", testSpool(t, id)}, args...),
		Ready: "refundworker started",
	})
}

// runJobs runs refundworker --jobs to its end and returns its stdout.
func (e *env) runJobs(t *testing.T, args ...string) string {
	t.Helper()
	p := e.startJobs(t, args...)
	if err := p.Wait(t, 90*time.Second); err != nil {
		t.Fatalf("refundworker --jobs: %v\n%s", err, p.Logs())
	}
	return p.Stdout()
}

// startJobs starts refundworker with args against e.
func (e *env) startJobs(t *testing.T, args ...string) *proctest.Process {
	t.Helper()
	return proctest.Start(t, bin.refundworker, proctest.Options{
		Args: append([]string{"--coordinator", e.coord.Addr, "--provider", e.url, "--worker-id", "runner",
			"--log-format", "json", "--poll-interval", "100ms", "--jobs-timeout", "60s",
			"--receipt-spool", testSpool(t, "runner")}, args...),
	})
}

// testSpool is a receipt spool for worker id in a folder of t's own: tests
// running side by side reuse ids, and must not share the user's cache.
func testSpool(t *testing.T, id string) string {
	return filepath.Join(t.TempDir(), id+".receipts.jsonl")
}

// enqueue makes a refund job for key and registers its payment.
func (e *env) enqueue(t *testing.T, key string) jobfence.Job {
	t.Helper()
	if err := e.pay.RegisterPayment(ctxFor(t), "pay-"+key, 1500, "EUR"); err != nil {
		t.Fatal(err)
	}
	job, created, err := e.client.EnqueueRefund(ctxFor(t), jobfence.EnqueueRequest{
		OperationKey: key, OrderID: "order-" + key, PaymentID: "pay-" + key, AmountMinor: 1500, Currency: "EUR", Provider: "acme",
	})
	if err != nil || !created {
		t.Fatalf("enqueue %s: %v, created=%v", key, err, created)
	}
	return job
}

// expireLease ends a job's lease in the data, by the database's clock (T1:
// never by moving a clock). It only opens the job to takeover (R8). A
// running job's next_attempt_at is its lease end and moves with it: claims
// find expired leases by it (store.Job.NextAttemptAt).
func (e *env) expireLease(t *testing.T, jobID int64) {
	t.Helper()
	res, err := e.db.ExecContext(ctxFor(t), `UPDATE refund_jobs SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND,
  next_attempt_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ? AND state = 'running'`, jobID)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("expire lease of job %d: %d rows, want 1 (is it running?)", jobID, n)
	}
}

func (e *env) get(t *testing.T, id int64) jobfence.JobDetail {
	t.Helper()
	d, err := e.client.GetJob(ctxFor(t), id)
	if err != nil {
		t.Fatalf("GetJob(%d): %v", id, err)
	}
	return d
}

func (e *env) waitJob(t *testing.T, id int64, what string, cond func(jobfence.JobDetail) bool) jobfence.JobDetail {
	t.Helper()
	var d jobfence.JobDetail
	proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("job %d: %s", id, what), func() bool {
		d = e.get(t, id)
		return cond(d)
	})
	return d
}

// history lists the job's transitions as "kind@attempt:worker".
func history(d jobfence.JobDetail) []string {
	out := make([]string, len(d.Events))
	for i, ev := range d.Events {
		out[i] = fmt.Sprintf("%s@%d:%s", ev.Kind, ev.Attempt, ev.WorkerID)
	}
	return out
}

// operation returns the provider's truth about one operation key.
func (e *env) operation(t *testing.T, key string) (fakeprovider.OperationTruth, fakeprovider.OracleReport) {
	t.Helper()
	o := e.provider.Oracle()
	op, ok := o.Operation(key)
	if !ok {
		t.Fatalf("the provider has no refund for %s: %+v", key, o)
	}
	return op, o
}

func hasRecord(p *proctest.Process, msg string) bool {
	for _, r := range p.Records() {
		if r["msg"] == msg {
			return true
		}
	}
	return false
}

// stop sends SIGTERM and requires a clean exit.
func stop(t *testing.T, p *proctest.Process) {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.Logs())
	}
}

var summaryLine = regexp.MustCompile(`^jobs=\d+ succeeded=\d+ manual_review=\d+ double_refunds=\d+ stale_rejected=\d+ observations=\d+\n$`)

func requireSummary(t *testing.T, out, want string) {
	t.Helper()
	if !summaryLine.MatchString(out) || strings.TrimSpace(out) != want {
		t.Fatalf("stdout %q, want exactly the line %q", out, want)
	}
}

// TestRefundDoneReplyLost_T3: A's refund goes through at the provider but A
// hears nothing for longer than its lease: the reply is held and then cut, or
// held and then delivered. A's lease expires; B takes over, reconciles with
// the same operation key and completes without a second refund. A's late
// write is rejected and what it learned lands as an observation.
func TestRefundDoneReplyLost_T3(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  bool
	}{{"reply cut", true}, {"reply late", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, fakeprovider.Config{})
			key := "t3-" + strings.ReplaceAll(tc.name, " ", "-")
			job := e.enqueue(t, key)
			if _, err := e.pay.SetFaults(ctxFor(t), fakeprovider.Faults{
				HangAfter: 4 * time.Second, CutReply: tc.cut, Key: key, Times: 1,
			}); err != nil {
				t.Fatal(err)
			}
			// One slot: A, hanging in its call, cannot take its own job over.
			a := e.worker(t, "A", "--provider-timeout", "10s", "--concurrency", "1")
			proctest.WaitFor(t, 20*time.Second, "A's refund at the provider", func() bool {
				_, ok := e.provider.Oracle().Operation(key)
				return ok
			})
			// A hangs in its provider call; its lease runs out.
			e.expireLease(t, job.ID)
			b := e.worker(t, "B")
			e.waitJob(t, job.ID, "completed by B", func(d jobfence.JobDetail) bool { return d.Job.State == jobfence.StateSucceeded })
			d := e.waitJob(t, job.ID, "A's observation", func(d jobfence.JobDetail) bool { return len(d.Observations) > 0 })

			op, oracle := e.operation(t, key)
			if op.Refunds != 1 || len(op.RefundIDs) != 1 || oracle.DoubleRefunds != 0 || oracle.Stats.CreateRequests != 1 {
				t.Fatalf("provider truth %+v, %d create requests; want exactly one refund, sent once", op, oracle.Stats.CreateRequests)
			}
			if d.Job.State != jobfence.StateSucceeded || d.Job.Attempt != 2 || d.Job.ProviderRefundID != op.RefundIDs[0] {
				t.Fatalf("job %+v, want succeeded under attempt 2 with refund %s", d.Job, op.RefundIDs[0])
			}
			want := []string{"enqueued@0:", "claimed@1:A", "taken_over@2:B", "completed@2:B"}
			if got := history(d); !slices.Equal(got, want) {
				t.Fatalf("history %v, want %v", got, want)
			}
			o := d.Observations[0]
			if len(d.Observations) != 1 || o.Source != "worker:A" || o.ReportedAttempt != 1 || o.JobAttempt != 2 ||
				o.Outcome != jobfence.OutcomeSucceeded || o.ProviderRefundID != op.RefundIDs[0] {
				t.Fatalf("observations %+v, want A's receipt of %s under attempt 1", d.Observations, op.RefundIDs[0])
			}
			if !hasRecord(a, "write-back rejected by the fence; filing the answer as an observation") {
				t.Fatalf("A did not log its rejected write\n%s", a.Logs())
			}
			stop(t, a)
			stop(t, b)
		})
	}
}

// TestRollingDeployOldWorkerFrozen: the old worker is frozen (SIGSTOP) in the
// middle of a provider call and told to go (SIGTERM); its lease expires, the
// new worker takes over and finishes the work. When the old one resumes, its
// late write is rejected and observed, and it drains and exits cleanly. Every
// operation key was refunded exactly once.
func TestRollingDeployOldWorkerFrozen(t *testing.T) {
	t.Parallel()
	e := setup(t, fakeprovider.Config{})
	first := e.enqueue(t, "deploy-1")
	if _, err := e.pay.SetFaults(ctxFor(t), fakeprovider.Faults{HangAfter: 2 * time.Second, Key: "deploy-1", Times: 1}); err != nil {
		t.Fatal(err)
	}
	old := e.worker(t, "old", "--concurrency", "1", "--provider-timeout", "20s")
	proctest.WaitFor(t, 20*time.Second, "the old worker's refund at the provider", func() bool {
		_, ok := e.provider.Oracle().Operation("deploy-1")
		return ok
	})
	if err := old.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The deploy goes on: SIGTERM waits in the frozen process; the new
	// version starts and more work arrives.
	if err := old.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ids := []int64{first.ID}
	for n := 2; n <= 5; n++ {
		ids = append(ids, e.enqueue(t, fmt.Sprintf("deploy-%d", n)).ID)
	}
	e.expireLease(t, first.ID)
	fresh := e.worker(t, "new", "--concurrency", "2")
	for _, id := range ids {
		e.waitJob(t, id, "succeeded", func(d jobfence.JobDetail) bool { return d.Job.State == jobfence.StateSucceeded })
	}

	if err := old.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := old.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("old worker after SIGCONT: %v, want a clean drain\n%s", err, old.Logs())
	}
	d := e.get(t, first.ID)
	want := []string{"enqueued@0:", "claimed@1:old", "taken_over@2:new", "completed@2:new"}
	if got := history(d); !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v", got, want)
	}
	op, oracle := e.operation(t, "deploy-1")
	if len(d.Observations) != 1 || d.Observations[0].Source != "worker:old" || d.Observations[0].ReportedAttempt != 1 ||
		d.Observations[0].Outcome != jobfence.OutcomeSucceeded || d.Observations[0].ProviderRefundID != op.RefundIDs[0] {
		t.Fatalf("observations %+v, want the old worker's late receipt", d.Observations)
	}
	if oracle.DoubleRefunds != 0 || len(oracle.Refunds) != 5 {
		t.Fatalf("provider: %d refunds, %d double; want 5 and 0", len(oracle.Refunds), oracle.DoubleRefunds)
	}
	for n := 1; n <= 5; n++ {
		if op, _ := e.operation(t, fmt.Sprintf("deploy-%d", n)); op.Refunds != 1 {
			t.Fatalf("deploy-%d: %+v, want one refund", n, op)
		}
	}
	if !hasRecord(old, "write-back rejected by the fence; filing the answer as an observation") || !hasRecord(old, "worker drained") {
		t.Fatalf("old worker logs lack the rejected write or the drain\n%s", old.Logs())
	}
	stop(t, fresh)
}

// TestReplicaLagNoRecord_R14: the first request's reply is cut and the
// provider's lookups lag behind its writes, so the reconcile finds no
// record. Inside the provider's idempotency window a same-key resend is safe
// and is answered with the first refund; outside it the job goes to manual
// review and nothing is resent.
func TestReplicaLagNoRecord_R14(t *testing.T) {
	lag := func(key string) fakeprovider.Faults {
		return fakeprovider.Faults{CutReply: true, LookupLag: time.Hour, Key: key, Times: 1}
	}

	t.Run("inside the window resends safely", func(t *testing.T) {
		t.Parallel()
		e := setup(t, fakeprovider.Config{KeyRetention: time.Hour}, "--provider-key-retention", "acme=1h")
		if _, err := e.pay.SetFaults(ctxFor(t), lag("lag-in-1")); err != nil {
			t.Fatal(err)
		}
		out := e.runJobs(t, "--jobs", "1", "--key-prefix", "lag-in-", "--unknown-delay", "100ms", "--resend-margin", "1m")
		requireSummary(t, out, "jobs=1 succeeded=1 manual_review=0 double_refunds=0 stale_rejected=0 observations=0")
		op, oracle := e.operation(t, "lag-in-1")
		if op.Refunds != 1 || oracle.Stats.CreateRequests != 2 || oracle.Stats.Replays != 1 {
			t.Fatalf("provider: %+v, stats %+v; want one refund, the resend answered from the idempotency store", op, oracle.Stats)
		}
		d, err := e.client.GetJobByKey(ctxFor(t), "lag-in-1")
		if err != nil {
			t.Fatal(err)
		}
		var actions []string
		for _, ev := range d.Events {
			actions = append(actions, fmt.Sprintf("%s@%d/%s", ev.Kind, ev.Attempt, ev.NextAction))
		}
		want := []string{"enqueued@0/refund", "claimed@1/refund", "rescheduled@1/reconcile", "claimed@2/reconcile",
			"rescheduled@2/refund", "claimed@3/refund", "completed@3/refund"}
		if !slices.Equal(actions, want) || d.Job.ProviderRefundID != op.RefundIDs[0] {
			t.Fatalf("history %v (refund %s), want %v with refund %s", actions, d.Job.ProviderRefundID, want, op.RefundIDs[0])
		}
	})

	t.Run("outside the window escalates", func(t *testing.T) {
		t.Parallel()
		// The provider forgets keys after 2s and the coordinator knows it.
		e := setup(t, fakeprovider.Config{KeyRetention: 2 * time.Second}, "--provider-key-retention", "acme=2s")
		if _, err := e.pay.SetFaults(ctxFor(t), lag("lag-out-1")); err != nil {
			t.Fatal(err)
		}
		out := e.runJobs(t, "--jobs", "1", "--key-prefix", "lag-out-", "--unknown-delay", "3s", "--resend-margin", "500ms")
		requireSummary(t, out, "jobs=1 succeeded=0 manual_review=1 double_refunds=0 stale_rejected=0 observations=0")
		op, oracle := e.operation(t, "lag-out-1")
		if op.Refunds != 1 || oracle.Stats.CreateRequests != 1 {
			t.Fatalf("provider: %+v, stats %+v; want one refund and no resend", op, oracle.Stats)
		}
		d, err := e.client.GetJobByKey(ctxFor(t), "lag-out-1")
		if err != nil {
			t.Fatal(err)
		}
		if last := d.Events[len(d.Events)-1]; last.Kind != jobfence.EventEscalated || !strings.Contains(last.Reason, "window") {
			t.Fatalf("last event %+v, want an escalation naming the closed window", last)
		}
		// The escalation mattered: the provider has forgotten the key, and a
		// resend now would refund the customer a second time.
		again, err := e.pay.CreateRefund(ctxFor(t), "lag-out-1", fakeprovider.RefundParams{
			PaymentID: "pay-lag-out-1", AmountMinor: 1500, Currency: "EUR"})
		if err != nil || again.Replayed || again.ID == op.RefundIDs[0] {
			t.Fatalf("control resend = %+v, %v; want a new refund (the key was forgotten)", again, err)
		}
	})
}

// TestJobsSummaryUnderFaults: --jobs enqueues, works through 503s and cut
// replies, and prints exactly one summary line.
func TestJobsSummaryUnderFaults(t *testing.T) {
	t.Parallel()
	e := setup(t, fakeprovider.Config{})
	if _, err := e.pay.SetFaults(ctxFor(t), fakeprovider.Faults{ErrorBurst: 2, CutReply: true, Times: 2}); err != nil {
		t.Fatal(err)
	}
	out := e.runJobs(t, "--jobs", "12", "--concurrency", "4", "--key-prefix", "sum-", "--unknown-delay", "100ms")
	requireSummary(t, out, "jobs=12 succeeded=12 manual_review=0 double_refunds=0 stale_rejected=0 observations=0")
	o := e.provider.Oracle()
	if len(o.Refunds) != 12 || o.DoubleRefunds != 0 || o.Stats.CutReplies != 2 || o.Stats.InjectedErrors != 2 {
		t.Fatalf("provider: %d refunds, %d double, stats %+v", len(o.Refunds), o.DoubleRefunds, o.Stats)
	}
}

// TestSummaryCountsDoubleRefundsFromOracle: the summary's double_refunds is
// the provider's truth, not the worker's belief. A refund made earlier for
// the same operation by another path (another Idempotency-Key) makes the
// worker's own, successful, refund a double one.
func TestSummaryCountsDoubleRefundsFromOracle(t *testing.T) {
	t.Parallel()
	e := setup(t, fakeprovider.Config{})
	if _, err := e.pay.CreateRefund(ctxFor(t), "legacy-system-key", fakeprovider.RefundParams{
		PaymentID: "pay-dup-1", AmountMinor: 1500, Currency: "EUR", MerchantReference: "dup-1"}); err != nil {
		t.Fatal(err)
	}
	out := e.runJobs(t, "--jobs", "1", "--key-prefix", "dup-")
	// One duplicated operation and one over-refunded payment.
	requireSummary(t, out, "jobs=1 succeeded=1 manual_review=0 double_refunds=2 stale_rejected=0 observations=0")
}

func TestFlagsHelpAndEnvironment(t *testing.T) {
	t.Parallel()
	help := proctest.Start(t, bin.refundworker, proctest.Options{Args: []string{"--help"}})
	if err := help.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("--help: %v", err)
	}
	for _, f := range []string{"-coordinator", "-provider", "-provider-name", "-worker-id", "-concurrency", "-lease",
		"-provider-timeout", "-same-key-resends", "-resend-margin", "-jobs", "-drain-timeout", "-receipt-spool", "REFUNDWORKER_"} {
		if !strings.Contains(help.Logs(), f) {
			t.Errorf("--help does not mention %s", f)
		}
	}
	bad := proctest.Start(t, bin.refundworker, proctest.Options{Env: []string{"REFUNDWORKER_CONCURRENCY=0"}})
	if err := bad.Wait(t, 10*time.Second); err == nil || !strings.Contains(bad.Logs(), "--concurrency must be 1..100") {
		t.Fatalf("REFUNDWORKER_CONCURRENCY=0: %v\n%s", err, bad.Logs())
	}
}

// TestSummaryObservationsAreReceiptsBySource: the summary's observations
// counts every receipt on file for the run's jobs (R15, R28), a provider
// webhook's too, and the log record "summary" says where they came from.
func TestSummaryObservationsAreReceiptsBySource(t *testing.T) {
	t.Parallel()
	e := setup(t, fakeprovider.Config{})
	// The run's first job, enqueued before the run with the values the run
	// enqueues it with (R1: the run gets this job), with a webhook's receipt.
	job := e.enqueue(t, "obs-1")
	if _, _, err := e.client.ReportObservation(ctxFor(t), jobfence.ObservationRequest{JobID: job.ID, Source: "webhook:acme",
		Outcome: jobfence.OutcomePending, ProviderEventID: "evt_obs_1"}); err != nil {
		t.Fatal(err)
	}
	p := e.startJobs(t, "--jobs", "1", "--key-prefix", "obs-")
	if err := p.Wait(t, 90*time.Second); err != nil {
		t.Fatalf("refundworker --jobs: %v\n%s", err, p.Logs())
	}
	requireSummary(t, p.Stdout(), "jobs=1 succeeded=1 manual_review=0 double_refunds=0 stale_rejected=0 observations=1")
	rec, ok := p.WaitRecord(time.Second, func(r map[string]any) bool { return r["msg"] == "summary" })
	if !ok || rec["observations"] != 1.0 || rec["observations_from_webhooks"] != 1.0 || rec["observations_from_workers"] != 0.0 {
		t.Fatalf("summary record %v; want 1 observation, from a webhook\n%s", rec, p.Logs())
	}
}
