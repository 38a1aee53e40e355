package jobfence

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// specReceipt is a receipt as spool.json writes it: the line's fields
// without "v", int64s as strings, spooled_at as text ("" for none).
type specReceipt struct {
	JobID            string `json:"job_id"`
	OperationKey     string `json:"operation_key"`
	Attempt          string `json:"attempt"`
	LeaseToken       string `json:"lease_token"`
	Source           string `json:"source"`
	Outcome          string `json:"outcome"`
	ProviderRefundID string `json:"provider_refund_id"`
	ProviderEventID  string `json:"provider_event_id"`
	Detail           string `json:"detail"`
	SpooledAt        string `json:"spooled_at"`
}

func (r specReceipt) spooled(t *testing.T) spooledReceipt {
	t.Helper()
	id, err := strconv.ParseInt(r.JobID, 10, 64)
	if err != nil {
		t.Fatalf("receipt job_id %q: %v", r.JobID, err)
	}
	attempt, err := strconv.ParseInt(r.Attempt, 10, 64)
	if err != nil {
		t.Fatalf("receipt attempt %q: %v", r.Attempt, err)
	}
	var at time.Time
	if r.SpooledAt != "" {
		if at, err = time.Parse(time.RFC3339Nano, r.SpooledAt); err != nil {
			t.Fatalf("receipt spooled_at %q: %v", r.SpooledAt, err)
		}
	}
	return spooledReceipt{Format: spoolFormat, JobID: id, OperationKey: r.OperationKey, Attempt: attempt,
		LeaseToken: r.LeaseToken, Source: r.Source, Outcome: Outcome(r.Outcome), ProviderRefundID: r.ProviderRefundID,
		ProviderEventID: r.ProviderEventID, Detail: r.Detail, SpooledAt: at}
}

// sameReceipt compares a receipt read with the one expected; spooled_at as
// an instant.
func sameReceipt(t *testing.T, got spooledReceipt, want specReceipt) {
	t.Helper()
	w := want.spooled(t)
	if !got.SpooledAt.Equal(w.SpooledAt) {
		t.Errorf("spooled_at %v, want %v", got.SpooledAt, w.SpooledAt)
	}
	got.SpooledAt, w.SpooledAt = time.Time{}, time.Time{}
	if got != w {
		t.Errorf("receipt %+v, want %+v", got, w)
	}
}

type spoolVector struct {
	vectorHead
	Op string `json:"op"`
	// write_line
	Receipt *specReceipt `json:"receipt"`
	Line    *string      `json:"line"`
	Exact   bool         `json:"exact"`
	// parse_file
	Contents string `json:"contents"`
	// open_file
	Files map[string]string `json:"files"`
	// close
	Appends int `json:"appends"`
	// lock
	LockFile string `json:"lock_file"`
	// file_name, default_path
	WorkerID string            `json:"worker_id"`
	FileName string            `json:"file_name"`
	Env      map[string]string `json:"env"`
}

type spoolLineExpect struct {
	Receipt    *specReceipt `json:"receipt"`
	Unreadable bool         `json:"unreadable"`
	Raw        *string      `json:"raw"`
}

type spoolExpect struct {
	spoolLineExpect
	Lines     []spoolLineExpect  `json:"lines"`
	Files     map[string]*string `json:"files"`
	Pending   *int               `json:"pending"`
	TornBytes *int64             `json:"torn_bytes"`
	Mode      string             `json:"mode"`
	DirMode   string             `json:"dir_mode"`
	Locked    *bool              `json:"locked"`
	Holder    string             `json:"holder"`
	LockFile  string             `json:"lock_file"`
	Path      string             `json:"path"`
	Error     *bool              `json:"error"`
}

// checkLine checks one line as parseSpool read it.
func checkLine(t *testing.T, got spoolLine, want spoolLineExpect) {
	t.Helper()
	switch {
	case want.Unreadable == (want.Receipt != nil):
		t.Fatal("a line expects either a receipt or unreadable")
	case want.Unreadable && got.r != nil:
		t.Errorf("line %q read as %+v, want it unreadable", got.raw, *got.r)
	case want.Receipt != nil && got.r == nil:
		t.Errorf("line %q unreadable, want %+v", got.raw, *want.Receipt)
	case want.Receipt != nil:
		sameReceipt(t, *got.r, *want.Receipt)
	}
	if want.Raw != nil && string(got.raw) != *want.Raw {
		t.Errorf("line kept as %q, want %q", got.raw, *want.Raw)
	}
}

// runSpoolVector runs a vector of spool.json against the receipt spool's
// own code: its line encoding and parsing, its open, close and lock, its
// file names.
func runSpoolVector(t *testing.T, raw json.RawMessage) {
	var v spoolVector
	if err := strictJSON(raw, &v); err != nil {
		t.Fatal(err)
	}
	switch v.Op {
	case "write_line":
		if v.Receipt == nil || v.Line == nil {
			t.Fatal("write_line needs receipt and line")
		}
		got, err := json.Marshal(v.Receipt.spooled(t))
		if err != nil {
			t.Fatal(err)
		}
		if v.Exact {
			if string(got) != *v.Line {
				t.Errorf("line\n%s\nwant\n%s", got, *v.Line)
			}
		} else {
			sameJSON(t, got, []byte(*v.Line))
		}
		// What one SDK writes every SDK reads: this SDK's line and the
		// vector's.
		for _, l := range []string{string(got), *v.Line} {
			lines := parseSpool([]byte(l + "\n"))
			if len(lines) != 1 {
				t.Fatalf("%q parses as %d lines", l, len(lines))
			}
			checkLine(t, lines[0], spoolLineExpect{Receipt: v.Receipt})
		}
		return
	case "file_name":
		if got := spoolFileName(v.WorkerID); got != v.FileName {
			t.Errorf("spoolFileName(%q) = %q, want %q", v.WorkerID, got, v.FileName)
		}
		return
	}

	var want spoolExpect
	v.expected(t, &want)
	switch v.Op {
	case "read_line":
		if v.Line == nil {
			t.Fatal("read_line needs a line")
		}
		lines := parseSpool([]byte(*v.Line + "\n"))
		if len(lines) != 1 {
			t.Fatalf("%q parses as %d lines", *v.Line, len(lines))
		}
		checkLine(t, lines[0], want.spoolLineExpect)
	case "parse_file":
		lines := parseSpool([]byte(v.Contents))
		if len(lines) != len(want.Lines) {
			t.Fatalf("%d lines %+v, want %d", len(lines), lines, len(want.Lines))
		}
		for i := range lines {
			checkLine(t, lines[i], want.Lines[i])
		}
	case "open_file":
		dir := filepath.Join(t.TempDir(), "cache", "jobfence")
		path := filepath.Join(dir, "w.receipts.jsonl")
		writeSpecFiles(t, path, v.Files)
		s, err := openReceiptSpool(path, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		checkSpecFiles(t, path, want.Files)
		if want.Pending != nil && s.pending() != *want.Pending {
			t.Errorf("pending %d, want %d", s.pending(), *want.Pending)
		}
		if want.TornBytes != nil && s.torn != *want.TornBytes {
			t.Errorf("cut off %d torn bytes, want %d", s.torn, *want.TornBytes)
		}
		checkMode(t, path, want.Mode)
		checkMode(t, dir, want.DirMode)
	case "close":
		path := filepath.Join(t.TempDir(), "w.receipts.jsonl")
		s, err := openReceiptSpool(path, 0)
		if err != nil {
			t.Fatal(err)
		}
		for n := range v.Appends {
			if err := s.append(testReceipt(n)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.close(); err != nil {
			t.Fatal(err)
		}
		checkSpecFiles(t, path, want.Files)
		if want.Pending != nil {
			data, _ := os.ReadFile(path)
			if n := len(parseSpool(data)); n != *want.Pending {
				t.Errorf("%d receipts left in the file, want %d", n, *want.Pending)
			}
		}
	case "lock":
		runLockVector(t, v.LockFile, want)
	case "default_path":
		if runtime.GOOS != "linux" {
			t.Skip("default_path vectors name Linux's cache folder")
		}
		for _, k := range []string{"XDG_CACHE_HOME", "HOME"} {
			t.Setenv(k, v.Env[k])
			if _, ok := v.Env[k]; !ok {
				os.Unsetenv(k)
			}
		}
		for k := range v.Env {
			if k != "XDG_CACHE_HOME" && k != "HOME" {
				t.Fatalf("env %s", k)
			}
		}
		got, err := DefaultReceiptSpool(v.WorkerID)
		if want.Error != nil && (err != nil) != *want.Error {
			t.Errorf("DefaultReceiptSpool: %q, %v; want an error: %v", got, err, *want.Error)
		}
		if want.Path != "" && got != want.Path {
			t.Errorf("DefaultReceiptSpool = %q, %v; want %q", got, err, want.Path)
		}
	default:
		t.Fatalf("op %q", v.Op)
	}
}

// runLockVector opens a spool whose lock file is in the state the vector
// names, as Run's NewWorker does.
func runLockVector(t *testing.T, state string, want spoolExpect) {
	path := filepath.Join(t.TempDir(), "w.receipts.jsonl")
	pids := map[string]int{
		"own_pid":        os.Getpid(),
		"live_other_pid": os.Getppid(), // the go command, alive while its test runs
		"dead_pid":       1<<31 - 1,    // past any pid_max: no process has it
	}
	switch state {
	case "absent":
	case "own_pid", "live_other_pid", "dead_pid":
		if err := os.WriteFile(path+".lock", []byte(strconv.Itoa(pids[state])+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	case "garbage":
		if err := os.WriteFile(path+".lock", []byte("not a pid\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	case "held_here":
		first, err := openReceiptSpool(path, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer first.close()
	default:
		t.Fatalf("lock_file %q", state)
	}
	s, err := openReceiptSpool(path, 0)
	if err == nil {
		defer s.close()
	}
	if want.Locked != nil && errors.Is(err, ErrReceiptSpoolLocked) != *want.Locked {
		t.Fatalf("open: %v; want locked: %v", err, *want.Locked)
	}
	if !errors.Is(err, ErrReceiptSpoolLocked) && err != nil {
		t.Fatal(err)
	}
	if want.Holder != "" {
		pid, ok := pids[want.Holder]
		if !ok {
			t.Fatalf("holder %q", want.Holder)
		}
		if err == nil || !strings.Contains(err.Error(), "pid "+strconv.Itoa(pid)) {
			t.Errorf("open: %v; want it to name the holder, pid %d", err, pid)
		}
	}
	if want.LockFile != "" {
		pid, ok := pids[want.LockFile]
		if !ok {
			t.Fatalf("expect.lock_file %q", want.LockFile)
		}
		if data, _ := os.ReadFile(path + ".lock"); string(data) != strconv.Itoa(pid)+"\n" {
			t.Errorf("lock file %q, want pid %d", data, pid)
		}
	}
}

// writeSpecFiles writes the files of an open_file vector: "" is the spool,
// any other key a suffix of its path (".tmp", ".lock"); 0644, so that the
// open must make them private.
func writeSpecFiles(t *testing.T, path string, files map[string]string) {
	t.Helper()
	if len(files) == 0 {
		return
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	for suffix, data := range files {
		if err := os.WriteFile(path+suffix, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkSpecFiles checks the files a vector expects: null for none.
func checkSpecFiles(t *testing.T, path string, files map[string]*string) {
	t.Helper()
	for suffix, want := range files {
		data, err := os.ReadFile(path + suffix)
		switch {
		case want == nil && !errors.Is(err, os.ErrNotExist):
			t.Errorf("%q: %q, %v; want no file", "spool"+suffix, data, err)
		case want != nil && err != nil:
			t.Errorf("%q: %v", "spool"+suffix, err)
		case want != nil && string(data) != *want:
			t.Errorf("%q holds %q, want %q", "spool"+suffix, data, *want)
		}
	}
}

func checkMode(t *testing.T, path, want string) {
	t.Helper()
	if want == "" {
		return
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := "0" + strconv.FormatUint(uint64(fi.Mode().Perm()), 8); got != want {
		t.Errorf("%s has mode %s, want %s", filepath.Base(path), got, want)
	}
}

// sameJSON checks that two lines are one JSON object: the same keys in the
// same order, the same values.
func sameJSON(t *testing.T, got, want []byte) {
	t.Helper()
	keys := func(b []byte) []string {
		d := json.NewDecoder(bytes.NewReader(b))
		var out []string
		depth := 0
		for {
			tok, err := d.Token()
			if err != nil {
				return out
			}
			switch tok {
			case json.Delim('{'), json.Delim('['):
				depth++
				continue
			case json.Delim('}'), json.Delim(']'):
				depth--
				continue
			}
			if s, ok := tok.(string); ok && depth == 1 && d.More() {
				out = append(out, s)
				if _, err := d.Token(); err != nil { // its value
					return out
				}
			}
		}
	}
	var g, w map[string]any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("%s: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) || !reflect.DeepEqual(keys(got), keys(want)) {
		t.Errorf("line\n%s\nis not, as JSON,\n%s", got, want)
	}
}
