package jobfence_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/internal/proctest"
)

// events collects a Worker's events.
type events struct {
	mu  sync.Mutex
	all []jobfence.WorkerEvent
	on  func(jobfence.WorkerEvent) // called with each, under mu
}

func (e *events) add(ev jobfence.WorkerEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
	if e.on != nil {
		e.on(ev)
	}
}

func (e *events) of(kind jobfence.WorkerEventKind) []jobfence.WorkerEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []jobfence.WorkerEvent
	for _, ev := range e.all {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// goStale runs worker A (o) on a fresh job until its provider call is under
// way, lets B take the job over and complete it, and returns the job and a
// release that hands A the provider's answer: A's write-back is then stale
// and A files the answer as an observation (R15).
func goStale(t *testing.T, c *coordinator, o jobfence.WorkerOptions) (jobfence.Job, *jobfence.Worker, *running, func()) {
	t.Helper()
	job := c.enqueue(t, "acme")
	sent, answer := make(chan struct{}), make(chan struct{})
	h := &recorder{refund: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result {
		close(sent)
		<-answer
		return jobfence.Succeeded("re_late")
	}}
	a := newWorker(t, c, h, o)
	r := runWorker(t, a)
	<-sent
	c.expire(t, job.ID)
	b := c.claimOne(t, "B", job)
	if _, err := c.client.Complete(ctxFor(t), jobfence.CompleteRequest{JobID: job.ID, Attempt: b.Attempt,
		LeaseToken: b.LeaseToken, ProviderRefundID: "re_late"}); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(func() { close(answer) }) }
	t.Cleanup(release)
	return job, a, r, release
}

// spoolLines reads the spool's receipts as JSON objects; none when the
// file is gone.
func spoolLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("spool line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func requireOneVerifiedReceipt(t *testing.T, c *coordinator, jobID int64, source string) {
	t.Helper()
	d := c.get(t, jobID)
	if len(d.Observations) != 1 {
		t.Fatalf("observations %+v, want exactly one", d.Observations)
	}
	o := d.Observations[0]
	if o.Source != source || o.ReportedAttempt != 1 || o.JobAttempt != 2 || !o.AttemptVerified ||
		o.Outcome != jobfence.OutcomeSucceeded || o.ProviderRefundID != "re_late" {
		t.Fatalf("observation %+v, want %s's verified receipt of re_late under attempt 1", o, source)
	}
}

// TestWorkerRefilesItsSpoolBeforeClaiming_R28: the coordinator cannot take
// A's receipt, so A spools it, durably, and stops with it unfiled. The next
// worker on that spool files it before its first claim, with the grant's
// token (verified), once; the spool is then removed. No log line carries the
// token.
func TestWorkerRefilesItsSpoolBeforeClaiming_R28(t *testing.T) {
	c := startCoordinator(t)
	spool := filepath.Join(t.TempDir(), "spool", "A.receipts.jsonl")
	var logs proctest.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var first events
	job, a, r, release := goStale(t, c, jobfence.WorkerOptions{WorkerID: "A", ReceiptSpool: spool, Logger: log, OnEvent: first.add})
	c.refuseCalls("ReportObservation", 1000, status.New(codes.Unavailable, "test: coordinator unreachable"))
	release()
	proctest.WaitFor(t, 20*time.Second, "A's receipt spooled", func() bool { return len(first.of(jobfence.WorkerSpooled)) > 0 })
	lines := spoolLines(t, spool)
	if len(lines) != 1 {
		t.Fatalf("spool %+v, want one receipt", lines)
	}
	l := lines[0]
	token, _ := l["lease_token"].(string)
	if l["operation_key"] != job.OperationKey || l["attempt"] != "1" || l["source"] != "worker:A" ||
		l["outcome"] != "succeeded" || l["provider_refund_id"] != "re_late" || len(token) < 22 {
		t.Fatalf("spooled %+v", l)
	}
	r.cancel()
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if s := a.Stats(); s.Spooled != 1 || s.Refiled != 0 || len(first.of(jobfence.WorkerObserveFailed)) != 0 {
		t.Fatalf("stats %+v", s)
	}
	if len(spoolLines(t, spool)) != 1 || len(c.get(t, job.ID).Observations) != 0 {
		t.Fatal("the receipt left the spool without being filed")
	}

	c.refuseCalls("ReportObservation", 0, nil)
	claimsBefore := c.callCount("Claim")
	var next events
	claimsAtRefile := -1
	next.on = func(e jobfence.WorkerEvent) {
		if e.Kind == jobfence.WorkerRefiled {
			claimsAtRefile = c.callCount("Claim")
		}
	}
	again := newWorker(t, c, &recorder{}, jobfence.WorkerOptions{WorkerID: "A2", ReceiptSpool: spool, Logger: log, OnEvent: next.add})
	r2 := runWorker(t, again)
	proctest.WaitFor(t, 20*time.Second, "the spooled receipt filed", func() bool { return len(next.of(jobfence.WorkerRefiled)) > 0 })
	next.mu.Lock()
	if claimsAtRefile != claimsBefore {
		t.Errorf("the receipt was refiled after %d claims, want before the first", claimsAtRefile-claimsBefore)
	}
	next.mu.Unlock()
	// The receipt keeps its own source: it is A's, not A2's.
	requireOneVerifiedReceipt(t, c, job.ID, "worker:A")
	// The refile pass tells of each receipt as it is filed and rewrites the
	// spool after the last one.
	proctest.WaitFor(t, 10*time.Second, "the spool rewritten without the filed receipt", func() bool {
		return len(spoolLines(t, spool)) == 0
	})
	r2.cancel()
	if err := r2.wait(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if s := again.Stats(); s.Refiled != 1 || s.Observations != 1 {
		t.Fatalf("stats %+v", s)
	}
	if entries, _ := os.ReadDir(filepath.Dir(spool)); len(entries) != 0 {
		t.Fatalf("left behind after a clean stop: %v", entries)
	}
	if strings.Contains(logs.String(), token) {
		t.Fatal("a log line carries the lease token")
	}
	if !strings.Contains(logs.String(), "spooled, to be filed when the coordinator takes it") {
		t.Fatalf("no spool line in the logs:\n%s", logs.String())
	}
}

// TestWorkerRefileAfterALostReplyIsDeduplicated_R28: every try of A's
// receipt lands and loses its reply, so A spools a receipt the coordinator
// already has. The refile, kicked by the next successful call, is answered
// duplicate: one observation on file, the spool empty.
func TestWorkerRefileAfterALostReplyIsDeduplicated_R28(t *testing.T) {
	c := startCoordinator(t)
	spool := filepath.Join(t.TempDir(), "A.receipts.jsonl")
	var ev events
	job, a, _, release := goStale(t, c, jobfence.WorkerOptions{WorkerID: "A", ReceiptSpool: spool, OnEvent: ev.add})
	c.dropAfterCommit("ReportObservation", 6) // the client's tries, all of them
	release()
	proctest.WaitFor(t, 20*time.Second, "A's receipt spooled", func() bool { return len(ev.of(jobfence.WorkerSpooled)) > 0 })
	// Spooled: the client's tries are over. On a loaded machine its context
	// may have ended them before they used every drop, which must not eat the
	// refile's tries instead.
	c.dropAfterCommit("ReportObservation", 0)
	// The pass comes at the worker's next refile tick at the latest.
	proctest.WaitFor(t, jobfence.ReceiptRefileInterval+15*time.Second, "the spooled receipt refiled", func() bool {
		return len(ev.of(jobfence.WorkerRefiled)) > 0
	})
	if got := ev.of(jobfence.WorkerRefiled); len(got) != 1 || !got[0].Duplicate {
		t.Fatalf("refiled events %+v, want one duplicate", got)
	}
	requireOneVerifiedReceipt(t, c, job.ID, "worker:A")
	// The refile pass tells of each receipt as it is filed and rewrites the
	// spool after the last one.
	proctest.WaitFor(t, 10*time.Second, "the spool rewritten without the refiled receipt", func() bool {
		return len(spoolLines(t, spool)) == 0
	})
	if s := a.Stats(); s.Spooled != 1 || s.Refiled != 1 || s.Observations != 0 {
		t.Fatalf("stats %+v: the one observation was filed by the first, lost, reply", s)
	}
}

// TestWorkerDoesNotSpoolAPermanentRefusal_R28: a receipt the coordinator
// refuses for good is logged, not spooled: refiling it could never work.
func TestWorkerDoesNotSpoolAPermanentRefusal_R28(t *testing.T) {
	c := startCoordinator(t)
	spool := filepath.Join(t.TempDir(), "A.receipts.jsonl")
	var ev events
	_, a, _, release := goStale(t, c, jobfence.WorkerOptions{WorkerID: "A", ReceiptSpool: spool, OnEvent: ev.add})
	c.refuseCalls("ReportObservation", 1, status.New(codes.PermissionDenied, "test: not a worker"))
	release()
	proctest.WaitFor(t, 20*time.Second, "A's receipt refused", func() bool { return len(ev.of(jobfence.WorkerObserveFailed)) > 0 })
	if s := a.Stats(); s.Spooled != 0 || len(spoolLines(t, spool)) != 0 {
		t.Fatalf("stats %+v, spool %+v: a permanent refusal was spooled", s, spoolLines(t, spool))
	}
}

// TestNewWorkerRefusesASpoolInUse_R28: two workers on one spool (the same id
// on one machine) would write one file; the second is refused until the
// first lets go.
func TestNewWorkerRefusesASpoolInUse_R28(t *testing.T) {
	c := startCoordinator(t)
	spool := filepath.Join(t.TempDir(), "w.receipts.jsonl")
	first := newWorker(t, c, &recorder{}, jobfence.WorkerOptions{ReceiptSpool: spool})
	if _, err := jobfence.NewWorker(c.client, &recorder{}, jobfence.WorkerOptions{WorkerID: "w", ReceiptSpool: spool}); !errors.Is(err, jobfence.ErrReceiptSpoolLocked) {
		t.Fatalf("second worker on the spool: %v, want ErrReceiptSpoolLocked", err)
	}
	if err := first.Shutdown(ctxFor(t)); err != nil { // never run: releases the spool
		t.Fatal(err)
	}
	newWorker(t, c, &recorder{}, jobfence.WorkerOptions{ReceiptSpool: spool})

	// The default spool lives under the user's cache folder, named after the id.
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	w, err := jobfence.NewWorker(c.client, &recorder{}, jobfence.WorkerOptions{WorkerID: "w-default"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cache, "jobfence", "w-default.receipts.jsonl")); err != nil {
		t.Fatalf("default spool: %v", err)
	}
	if st, err := os.Stat(filepath.Join(cache, "jobfence")); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("default spool folder: %v %v", err, st.Mode().Perm())
	}
	if err := w.Shutdown(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := jobfence.NewWorker(c.client, &recorder{}, jobfence.WorkerOptions{WorkerID: "w",
		ReceiptSpool: filepath.Join(spool, "not-a-folder", "x")}); err == nil {
		t.Fatal("NewWorker accepted a spool it cannot create")
	}
}
