package main_test

import (
	"encoding/json"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/server"
)

// refuseReceipts makes the coordinator's database refuse every new receipt
// the way a read-only server does (error 1290, a demoted primary during a
// failover): the coordinator answers UNAVAILABLE (DATABASE_UNAVAILABLE) to
// ReportObservation and serves everything else. Only this test's database
// has the trigger.
const refuseReceipts = `CREATE TRIGGER test_refuse_receipts BEFORE INSERT ON refund_observations FOR EACH ROW
SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1290,
MESSAGE_TEXT = 'The MariaDB server is running with the --read-only option so it cannot execute this statement'`

// TestReceiptOutlivesTheWorkerProcess_R28: worker A's refund is made at the
// provider while A is frozen in the call; its lease runs out, B takes the job
// over and completes it. When A wakes, its receipt cannot be filed — the
// database refuses receipts after the fence refused A's write (STALE_ATTEMPT),
// or the coordinator is stopped and A's grant is lost with it — so A spools
// it, and is killed with SIGKILL. The coordinator is restarted on the same
// database and A again on its spool: the receipt is on file exactly once,
// A's own (source worker:A, attempt 1, attempt_verified: it carries the
// token). Putting the spooled line back, as a crash between filing and
// rewriting the spool would leave it, files it again as a duplicate.
func TestReceiptOutlivesTheWorkerProcess_R28(t *testing.T) {
	for _, tc := range []struct {
		name      string
		refuseObs bool // the database refuses receipts; else the coordinator is stopped
		aLogs     string
	}{
		{"stale write then receipts refused", true, "write-back rejected by the fence; filing the answer as an observation"},
		{"coordinator stopped", false, "write-back failed; the lease will expire and a takeover reconciles"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, fakeprovider.Config{})
			key := "r28-" + strings.ReplaceAll(tc.name, " ", "-")
			job := e.enqueue(t, key)
			// The provider makes the refund and holds the reply: A is inside
			// its provider call when it is frozen.
			if _, err := e.pay.SetFaults(ctxFor(t), fakeprovider.Faults{HangAfter: 2 * time.Second, Key: key, Times: 1}); err != nil {
				t.Fatal(err)
			}
			spool := filepath.Join(t.TempDir(), "spool", "A.receipts.jsonl")
			a := e.worker(t, "A", "--provider-timeout", "20s", "--call-timeout", "2s", "--receipt-spool", spool)
			proctest.WaitFor(t, 20*time.Second, "A's refund at the provider", func() bool {
				_, ok := e.provider.Oracle().Operation(key)
				return ok
			})
			if err := a.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			// Frozen, A's stream falls silent and is offered no more work: the
			// takeover goes to B.
			time.Sleep(server.StreamSilence + 500*time.Millisecond)
			e.expireLease(t, job.ID)
			b := e.worker(t, "B")
			e.waitJob(t, job.ID, "completed by B", func(d jobfence.JobDetail) bool { return d.Job.State == jobfence.StateSucceeded })
			stop(t, b)
			if tc.refuseObs {
				if _, err := e.db.ExecContext(ctxFor(t), refuseReceipts); err != nil {
					t.Fatal(err)
				}
			} else {
				stop(t, e.coord)
			}

			if err := a.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if _, ok := a.WaitRecord(60*time.Second, func(r map[string]any) bool {
				return r["msg"] == "observation not filed; spooled, to be filed when the coordinator takes it (R28)"
			}); !ok {
				t.Fatalf("A did not spool its receipt\n%s", a.Logs())
			}
			if !hasRecord(a, tc.aLogs) {
				t.Fatalf("A's logs lack %q\n%s", tc.aLogs, a.Logs())
			}
			spooled, err := os.ReadFile(spool)
			if err != nil {
				t.Fatal(err)
			}
			var line map[string]any
			if err := json.Unmarshal(spooled, &line); err != nil || strings.Count(string(spooled), "\n") != 1 {
				t.Fatalf("spool %q: %v; want one receipt", spooled, err)
			}
			token, _ := line["lease_token"].(string)
			if line["operation_key"] != key || line["attempt"] != "1" || line["source"] != "worker:A" || len(token) < 22 {
				t.Fatalf("spooled %v", line)
			}
			if st, err := os.Stat(spool); err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("spool mode: %v %v", err, st.Mode().Perm())
			}
			// It dies without a drain: only the spool remembers.
			if err := a.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			a.Wait(t, 10*time.Second) //nolint:errcheck // killed
			if strings.Contains(a.Logs(), token) {
				t.Fatal("A logged its lease token")
			}

			if tc.refuseObs {
				stop(t, e.coord)
				if _, err := e.db.ExecContext(ctxFor(t), "DROP TRIGGER test_refuse_receipts"); err != nil {
					t.Fatal(err)
				}
			}
			coord := proctest.StartCoordinator(t, bin.coordinator, "--mysql-dsn", e.dsn)
			client, err := jobfence.Dial(coord.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			restart := func() *proctest.Process {
				return proctest.Start(t, bin.refundworker, proctest.Options{
					Args: []string{"--coordinator", coord.Addr, "--provider", e.url, "--worker-id", "A", "--log-format", "json",
						"--poll-interval", "100ms", "--receipt-spool", spool},
					Ready: "refundworker started",
				})
			}
			refiled := func(p *proctest.Process, duplicate bool) {
				t.Helper()
				if _, ok := p.WaitRecord(30*time.Second, func(r map[string]any) bool {
					return r["msg"] == "spooled receipt filed" && r["duplicate"] == duplicate
				}); !ok {
					t.Fatalf("the restarted worker did not refile the receipt (duplicate=%v)\n%s", duplicate, p.Logs())
				}
			}
			again := restart()
			refiled(again, false)
			requireOneReceipt := func() {
				t.Helper()
				d, err := client.GetJob(ctxFor(t), job.ID)
				if err != nil {
					t.Fatal(err)
				}
				op, _ := e.operation(t, key)
				if len(d.Observations) != 1 {
					t.Fatalf("observations %+v, want exactly A's receipt", d.Observations)
				}
				o := d.Observations[0]
				if o.Source != "worker:A" || o.ReportedAttempt != 1 || o.JobAttempt != 2 || !o.AttemptVerified ||
					o.Outcome != jobfence.OutcomeSucceeded || o.ProviderRefundID != op.RefundIDs[0] {
					t.Fatalf("observation %+v, want A's verified receipt of %s under attempt 1", o, op.RefundIDs[0])
				}
				if d.Job.State != jobfence.StateSucceeded || d.Job.Attempt != 2 {
					t.Fatalf("job %+v: a receipt moved state", d.Job)
				}
			}
			requireOneReceipt()
			stop(t, again)
			if _, err := os.Stat(spool); !os.IsNotExist(err) {
				t.Fatalf("the filed spool was not removed on a clean stop: %v", err)
			}

			// A crash after filing, before the spool was rewritten, leaves
			// the receipt in it: filed again, kept once.
			if err := os.WriteFile(spool, spooled, 0o600); err != nil {
				t.Fatal(err)
			}
			third := restart()
			refiled(third, true)
			requireOneReceipt()
			stop(t, third)
		})
	}
}

// TestFailedStartLeavesNoSpool: a --jobs run that fails before its worker
// runs — the provider does not answer the payment registrations, or the
// coordinator does not answer the enqueues — exits with the error and
// leaves no spool (named after its pid, by default) in the user's cache:
// the spool was opened, and released empty.
func TestFailedStartLeavesNoSpool(t *testing.T) {
	closed := func() string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		return lis.Addr().String()
	}
	provider := httptest.NewServer(fakeprovider.New(fakeprovider.Config{}))
	t.Cleanup(provider.Close) // after the parallel subtests
	for _, tc := range []struct {
		name, coordinator, provider, says string
	}{
		{"provider away", closed(), "http://" + closed(), "register payment"},
		{"coordinator away", closed(), provider.URL, "enqueue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cache := t.TempDir()
			p := proctest.Start(t, bin.refundworker, proctest.Options{
				Args: []string{"--coordinator", tc.coordinator, "--provider", tc.provider, "--jobs", "1",
					"--call-timeout", "1s", "--log-format", "json"},
				Env: []string{"XDG_CACHE_HOME=" + cache, "HOME=" + cache},
			})
			if err := p.Wait(t, time.Minute); err == nil || !strings.Contains(p.Logs(), tc.says) {
				t.Fatalf("refundworker exited %v; want a failure saying %q:\n%s", err, tc.says, p.Logs())
			}
			left, err := os.ReadDir(filepath.Join(cache, "jobfence"))
			if err != nil {
				t.Fatalf("the spool's folder: %v (the worker did not open its spool there)", err)
			}
			for _, f := range left {
				t.Errorf("left behind: %s", f.Name())
			}
		})
	}
}
