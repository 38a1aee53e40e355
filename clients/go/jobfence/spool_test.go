package jobfence

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

func testReceipt(n int) spooledReceipt {
	return receiptOf(int64(100+n), ObservationRequest{
		OperationKey: fmt.Sprintf("op-%d", n), Attempt: 1, LeaseToken: LeaseToken(fmt.Sprintf("tok-%d-secret", n)),
		Source: "worker:w", Outcome: OutcomeSucceeded, ProviderRefundID: fmt.Sprintf("re_%d", n), Detail: "late\nanswer",
	}, time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC))
}

func openTestSpool(t *testing.T, path string) *receiptSpool {
	t.Helper()
	s, err := openReceiptSpool(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close() })
	return s
}

// crash drops the spool's handles as a killed process would: the kernel
// closes them, nothing is removed, the flock goes with them.
func crash(s *receiptSpool) {
	s.f.Close()
	s.lock.Close()
	s.closed = true
}

func receipts(t *testing.T, s *receiptSpool) []spooledReceipt {
	t.Helper()
	lines, _, err := s.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var out []spooledReceipt
	for _, l := range lines {
		if l.r == nil {
			t.Fatalf("unreadable line %q", l.raw)
		}
		out = append(out, *l.r)
	}
	return out
}

func TestReceiptSpoolKeepsEveryAppendAcrossACrash_R28(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "spool")
	path := filepath.Join(dir, "w.receipts.jsonl")
	s := openTestSpool(t, path)
	var want []spooledReceipt
	for n := range 3 {
		r := testReceipt(n)
		if err := s.append(r); err != nil {
			t.Fatal(err)
		}
		want = append(want, r)
	}
	crash(s)

	again := openTestSpool(t, path)
	if got := receipts(t, again); !slices.Equal(got, want) || again.pending() != 3 {
		t.Fatalf("after the crash: %+v (pending %d), want %+v", got, again.pending(), want)
	}
	// The receipt refiles field for field, the token in clear: the same
	// dedupe key as the first try (R15), attempt verified (R25).
	if req := receipts(t, again)[0].request(); req.OperationKey != "op-0" || req.JobID != 0 || req.Attempt != 1 ||
		string(req.LeaseToken) != "tok-0-secret" || req.Source != "worker:w" || req.Outcome != OutcomeSucceeded ||
		req.ProviderRefundID != "re_0" || req.Detail != "late\nanswer" {
		t.Fatalf("refile request %+v", req)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, path + ".lock": 0o600, dir: 0o700} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != want {
			t.Fatalf("%s: %v, mode %v; want %v", p, err, st.Mode().Perm(), want)
		}
	}
}

func TestReceiptSpoolCutsATornLastLine_R28(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.receipts.jsonl")
	s := openTestSpool(t, path)
	if err := s.append(testReceipt(1)); err != nil {
		t.Fatal(err)
	}
	crash(s)
	// A crash in the middle of the next append: never acknowledged.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"v":1,"job_id":"7","operation_key":"op-`)
	f.Close()

	again := openTestSpool(t, path)
	if again.torn == 0 || again.pending() != 1 {
		t.Fatalf("torn %d, pending %d; want the fragment cut and one receipt", again.torn, again.pending())
	}
	if err := again.append(testReceipt(2)); err != nil {
		t.Fatal(err)
	}
	if got := receipts(t, again); len(got) != 2 || got[0] != testReceipt(1) || got[1] != testReceipt(2) {
		t.Fatalf("receipts %+v", got)
	}
}

func TestReceiptSpoolRewriteIsAtomicAndKeepsLaterAppends_R28(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.receipts.jsonl")
	s := openTestSpool(t, path)
	for n := range 3 {
		if err := s.append(testReceipt(n)); err != nil {
			t.Fatal(err)
		}
	}
	lines, upTo, err := s.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Appended while a refile pass is out filing the snapshot.
	if err := s.append(testReceipt(3)); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	if err := s.rewrite(upTo, [][]byte{lines[1].raw}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(path)
	if os.SameFile(before, after) {
		t.Fatal("the spool was rewritten in place, not replaced by a rename")
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp file left behind: %v", err)
	}
	if after.Mode().Perm() != 0o600 {
		t.Fatalf("rewritten spool mode %v", after.Mode().Perm())
	}
	want := []spooledReceipt{testReceipt(1), testReceipt(3)}
	if got := receipts(t, s); !slices.Equal(got, want) || s.pending() != 2 {
		t.Fatalf("after the rewrite: %+v (pending %d), want %+v", got, s.pending(), want)
	}
	// Appends go to the new file.
	if err := s.append(testReceipt(4)); err != nil {
		t.Fatal(err)
	}
	crash(s)
	// A crash that left a rewrite's temp file: the spool itself is whole.
	if err := os.WriteFile(path+".tmp", []byte("half a rewrite"), 0o600); err != nil {
		t.Fatal(err)
	}
	again := openTestSpool(t, path)
	if got := receipts(t, again); !slices.Equal(got, append(want, testReceipt(4))) {
		t.Fatalf("after the crash: %+v", got)
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale temp file kept: %v", err)
	}
}

func TestReceiptSpoolKeepsLinesItCannotRead_R28(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.receipts.jsonl")
	future := `{"v":2,"something":"new"}`
	if err := os.WriteFile(path, []byte(future+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := openTestSpool(t, path)
	if err := s.append(testReceipt(1)); err != nil {
		t.Fatal(err)
	}
	lines, upTo, _ := s.snapshot()
	if len(lines) != 2 || lines[0].r != nil || lines[1].r == nil {
		t.Fatalf("lines %+v", lines)
	}
	if err := s.rewrite(upTo, [][]byte{lines[0].raw}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(path); string(data) != future+"\n" {
		t.Fatalf("spool %q, want the unreadable line kept as it was", data)
	}
}

func TestReceiptSpoolIsBounded_R28(t *testing.T) {
	s := openTestSpool(t, filepath.Join(t.TempDir(), "w.receipts.jsonl"))
	s.maxCount = 2
	for n := range 2 {
		if err := s.append(testReceipt(n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.append(testReceipt(2)); !errors.Is(err, errSpoolFull) {
		t.Fatalf("third append: %v, want errSpoolFull", err)
	}
	s.maxCount, s.maxBytes = 100, s.size+10
	if err := s.append(testReceipt(3)); !errors.Is(err, errSpoolFull) {
		t.Fatalf("append past the byte bound: %v, want errSpoolFull", err)
	}
	if s.pending() != 2 || len(receipts(t, s)) != 2 {
		t.Fatalf("a refused receipt was written: pending %d", s.pending())
	}
}

func TestReceiptSpoolCloseRemovesAnEmptySpool_R28(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "w.receipts.jsonl")
	s := openTestSpool(t, path)
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("left behind: %v", entries)
	}
	full := openTestSpool(t, path)
	if err := full.append(testReceipt(1)); err != nil {
		t.Fatal(err)
	}
	full.close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a spool with a receipt was removed: %v", err)
	}
	if err := full.append(testReceipt(2)); !errors.Is(err, errSpoolClosed) {
		t.Fatalf("append after close: %v", err)
	}
}

func TestReceiptSpoolLockRefusesASecondOpener_R28(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.receipts.jsonl")
	s := openTestSpool(t, path)
	if _, err := openReceiptSpool(path, 0); !errors.Is(err, ErrReceiptSpoolLocked) {
		t.Fatalf("second opener in the same process: %v, want ErrReceiptSpoolLocked", err)
	}
	start := time.Now()
	if _, err := openReceiptSpool(path, 200*time.Millisecond); !errors.Is(err, ErrReceiptSpoolLocked) ||
		time.Since(start) < 200*time.Millisecond {
		t.Fatalf("a waiting opener: %v after %s", err, time.Since(start))
	}
	s.close()
	again := openTestSpool(t, path)
	again.close()

	// Another process holds it.
	holder := exec.Command(os.Args[0], "-test.run=^TestReceiptSpoolHolderProcess$")
	holder.Env = append(os.Environ(), "JOBFENCE_TEST_HOLD_SPOOL="+path)
	stdin, _ := holder.StdinPipe()
	stdout, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("holder: %q, %v", line, err)
	}
	if _, err := openReceiptSpool(path, 0); !errors.Is(err, ErrReceiptSpoolLocked) ||
		!strings.Contains(err.Error(), strconv.Itoa(holder.Process.Pid)) {
		t.Fatalf("while another process holds the spool: %v, want ErrReceiptSpoolLocked naming pid %d", err, holder.Process.Pid)
	}
	// It dies without letting go (kill -9): the kernel drops its flock.
	holder.Process.Kill()
	holder.Wait()
	stdin.Close()
	after := openTestSpool(t, path)
	after.close()
}

// TestReceiptSpoolHolderProcess is the other process of
// TestReceiptSpoolLockRefusesASecondOpener_R28.
func TestReceiptSpoolHolderProcess(t *testing.T) {
	path := os.Getenv("JOBFENCE_TEST_HOLD_SPOOL")
	if path == "" {
		t.Skip("helper process only")
	}
	if _, err := openReceiptSpool(path, 0); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("held")
	bufio.NewReader(os.Stdin).ReadString('\n') //nolint:errcheck // until killed
	os.Exit(0)
}

func TestReceiptSpoolLockHonoursANodeWorkersPid_R28(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.receipts.jsonl")
	// A Node worker holds the lock by its live pid, with no flock.
	if err := os.WriteFile(path+".lock", []byte(strconv.Itoa(os.Getppid())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openReceiptSpool(path, 0); !errors.Is(err, ErrReceiptSpoolLocked) {
		t.Fatalf("lock file of a live pid: %v, want ErrReceiptSpoolLocked", err)
	}
	// Its holder is gone: the lock is stale.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".lock", []byte(strconv.Itoa(gone.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := openTestSpool(t, path)
	if data, _ := os.ReadFile(path + ".lock"); !bytes.Equal(data, []byte(strconv.Itoa(os.Getpid())+"\n")) {
		t.Fatalf("lock file %q, want this pid", data)
	}
	s.close()
	if _, err := os.Stat(path + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lock file left after close: %v", err)
	}
}

// The Node SDK's test names the same files for the same ids.
func TestDefaultReceiptSpoolNamesAFileAfterTheWorkerID_R28(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	for id, want := range map[string]string{
		"w-1":                    "w-1.receipts.jsonl",
		"refundworker-host-42":   "refundworker-host-42.receipts.jsonl",
		"a/b c":                  "a_b_c-" + spoolHash("a/b c") + ".receipts.jsonl",
		"..":                     "_.-" + spoolHash("..") + ".receipts.jsonl",
		"wörker":                 "w__rker-" + spoolHash("wörker") + ".receipts.jsonl",
		strings.Repeat("x", 128): strings.Repeat("x", 100) + "-" + spoolHash(strings.Repeat("x", 128)) + ".receipts.jsonl",
	} {
		got, err := DefaultReceiptSpool(id)
		if err != nil || got != filepath.Join(cache, "jobfence", want) {
			t.Errorf("DefaultReceiptSpool(%q) = %q, %v; want %q", id, got, err, want)
		}
	}
	for id, want := range map[string]string{
		"a/b c":  "a_b_c-0af99a609169.receipts.jsonl",
		"wörker": "w__rker-9288d7f04611.receipts.jsonl",
	} {
		if got := spoolFileName(id); got != want {
			t.Errorf("spoolFileName(%q) = %q; the Node SDK names it %s", id, got, want)
		}
	}
}

func spoolHash(id string) string {
	name := spoolFileName(id)
	name = strings.TrimSuffix(name, ".receipts.jsonl")
	return name[strings.LastIndexByte(name, '-')+1:]
}

func TestRefileLaterOnlyWhatMaySucceedLater_R28(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&Error{Code: codes.Unavailable}, true},
		{&Error{Code: codes.Unavailable, Reason: ReasonDatabaseUnavailable}, true},
		{&Error{Code: codes.Unavailable, Reason: ReasonDatabaseFull}, true},
		{&Error{Code: codes.DeadlineExceeded}, true},
		{&Error{Code: codes.Canceled}, true},
		{&Error{Code: codes.Internal}, true},
		{&Error{Code: codes.Unauthenticated}, true},
		{errors.New("connection reset"), true},
		{&InvalidArgumentError{Err: &Error{Code: codes.InvalidArgument, Reason: ReasonInvalidArgument}}, false},
		{&Error{Code: codes.NotFound, Reason: ReasonNotFound}, false},
		{&Error{Code: codes.ResourceExhausted, Reason: ReasonObservationLimit}, true}, // an earlier coordinator's: kept (R28)
		{&Error{Code: codes.PermissionDenied, Reason: ReasonPermissionDenied}, false},
	} {
		if got := refileLater(tc.err); got != tc.want {
			t.Errorf("refileLater(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// The Node SDK writes and reads the same lines (clients/node/test/spool.test.ts
// holds the same two).
const (
	goLine   = `{"v":1,"job_id":"101","operation_key":"op-1","attempt":"1","lease_token":"tok-1-secret","source":"worker:w","outcome":"succeeded","provider_refund_id":"re_1","provider_event_id":"","detail":"late\nanswer","spooled_at":"2025-01-02T03:04:05.000000006Z"}`
	nodeLine = `{"v":1,"job_id":"9007199254740993","operation_key":"op-n","attempt":"2","lease_token":"tok-n","source":"worker:node-1","outcome":"not_found","provider_refund_id":"","provider_event_id":"evt_<1>","detail":"a & b","spooled_at":"2025-01-02T03:04:05.006Z"}`
)

func TestReceiptSpoolLinesAreTheNodeSDKs_R28(t *testing.T) {
	if b, err := json.Marshal(testReceipt(1)); err != nil || string(b) != goLine {
		t.Fatalf("line %s, %v; want %s", b, err, goLine)
	}
	lines := parseSpool([]byte(nodeLine + "\n"))
	want := spooledReceipt{Format: 1, JobID: 9007199254740993, OperationKey: "op-n", Attempt: 2, LeaseToken: "tok-n",
		Source: "worker:node-1", Outcome: OutcomeNotFound, ProviderEventID: "evt_<1>", Detail: "a & b",
		SpooledAt: time.Date(2025, 1, 2, 3, 4, 5, 6_000_000, time.UTC)}
	if len(lines) != 1 || lines[0].r == nil || *lines[0].r != want {
		t.Fatalf("the Node SDK's line reads as %+v, want %+v", lines, want)
	}
}
