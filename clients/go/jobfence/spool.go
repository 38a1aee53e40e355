package jobfence

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ReceiptSpoolOff, as WorkerOptions.ReceiptSpool, turns the receipt spool
// off: a receipt the coordinator does not take is then only logged.
const ReceiptSpoolOff = "off"

// The receipt spool's bounds and refile period (R28). A spooled receipt is
// a few hundred bytes (at most about 5 KB with a full detail), so 10,000 of
// them hold hours of a busy worker's late receipts while the coordinator is
// away, and 16 MiB caps the worst case: a refile pass reads the whole file
// into memory and a full spool refiles in minutes, one call per receipt.
// A worker with that many receipts nobody took has a larger problem than
// its disk; past either bound a receipt is refused and logged at ERROR.
const (
	MaxSpooledReceipts    = 10_000
	MaxReceiptSpoolBytes  = 16 << 20
	ReceiptRefileInterval = 30 * time.Second
)

// ErrReceiptSpoolLocked is returned by NewWorker when another worker (a
// process, or another Worker of this one) holds the receipt spool: two
// workers with the same id on one machine. Give each its own WorkerID or
// ReceiptSpool.
var ErrReceiptSpoolLocked = errors.New("jobfence: receipt spool in use by another worker")

// errSpoolFull: the receipt would pass MaxSpooledReceipts or
// MaxReceiptSpoolBytes.
var errSpoolFull = errors.New("jobfence: receipt spool full")

// errSpoolClosed: the Worker's Run has returned and released the spool.
var errSpoolClosed = errors.New("jobfence: receipt spool closed")

// spoolFormat is the version of a spooled line; a line of another version
// is kept as it is, never dropped.
const spoolFormat = 1

// spooledReceipt is one line of the spool: everything ReportObservation
// needs to file it again with the same dedupe key (job, attempt, source,
// outcome, provider refund id; the provider event id alone when set, R15).
// The Node SDK writes and reads the same lines. Int64s are strings, exact in
// JavaScript too. LeaseToken is the grant's secret in clear (R25): the file
// is 0600 and no log line carries it.
type spooledReceipt struct {
	Format           int       `json:"v"`
	JobID            int64     `json:"job_id,string"`
	OperationKey     string    `json:"operation_key"`
	Attempt          int64     `json:"attempt,string"`
	LeaseToken       string    `json:"lease_token"`
	Source           string    `json:"source"`
	Outcome          Outcome   `json:"outcome"`
	ProviderRefundID string    `json:"provider_refund_id"`
	ProviderEventID  string    `json:"provider_event_id"`
	Detail           string    `json:"detail"`
	SpooledAt        time.Time `json:"spooled_at"` // this machine's clock: for people, never for a decision (R12)
}

func receiptOf(jobID int64, r ObservationRequest, at time.Time) spooledReceipt {
	return spooledReceipt{
		Format: spoolFormat, JobID: jobID, OperationKey: r.OperationKey, Attempt: r.Attempt,
		LeaseToken: string(r.LeaseToken), Source: r.Source, Outcome: r.Outcome, ProviderRefundID: r.ProviderRefundID,
		ProviderEventID: r.ProviderEventID, Detail: r.Detail, SpooledAt: at.UTC(),
	}
}

// request is the ReportObservation of the receipt, field for field as first
// tried. By operation key when it has one, as the Worker files (R1, R26).
func (r spooledReceipt) request() ObservationRequest {
	req := ObservationRequest{
		OperationKey: r.OperationKey, Attempt: r.Attempt, LeaseToken: LeaseToken(r.LeaseToken), Source: r.Source,
		Outcome: r.Outcome, ProviderRefundID: r.ProviderRefundID, ProviderEventID: r.ProviderEventID, Detail: r.Detail,
	}
	if r.OperationKey == "" {
		req.JobID = r.JobID
	}
	return req
}

// logAttrs name the receipt in a log line, without its lease token (R25).
func (r spooledReceipt) logAttrs() []any {
	return []any{"job_id", r.JobID, "operation_key", r.OperationKey, "attempt", r.Attempt,
		"grant", LeaseToken(r.LeaseToken).Fingerprint(), "source", r.Source, "outcome", r.Outcome,
		"provider_refund_id", r.ProviderRefundID, "provider_event_id", r.ProviderEventID, "spooled_at", r.SpooledAt}
}

// DefaultReceiptSpool is the spool file of a worker with this id when
// WorkerOptions.ReceiptSpool is empty: <os.UserCacheDir()>/jobfence/<name>.receipts.jsonl,
// where name is the id with every byte outside [A-Za-z0-9._-] (and a leading
// dot) replaced by '_', cut to 100 bytes, and followed by '-' and 12 hex
// digits of the id's SHA-256 whenever it differs from the id. The Node SDK
// names it alike. Errors: those of os.UserCacheDir (no $HOME or
// $XDG_CACHE_HOME).
func DefaultReceiptSpool(workerID string) (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("jobfence: receipt spool: %w", err)
	}
	return filepath.Join(dir, "jobfence", spoolFileName(workerID)), nil
}

func spoolFileName(workerID string) string {
	b := []byte(workerID)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' ||
			c == '.' && i > 0
		if !ok {
			b[i] = '_'
		}
	}
	name := string(b)
	if name != workerID || len(name) > 100 {
		sum := sha256.Sum256([]byte(workerID))
		name = name[:min(len(name), 100)] + "-" + hex.EncodeToString(sum[:6])
	}
	return name + ".receipts.jsonl"
}

// receiptSpool is an append-only file of receipts a Worker could not file
// (R28), one JSON line each, held under an exclusive lock on <path>.lock so
// that two workers with the same id never write one file. Appends are
// fsynced before they return; a rewrite replaces the file atomically (temp
// file, fsync, rename, fsync of the folder). A crash at any point leaves
// every acknowledged receipt in the file, at worst one already filed, which
// the coordinator deduplicates.
type receiptSpool struct {
	path string
	lock *os.File // flocked, holding this process's pid

	// maxCount and maxBytes bound the file: MaxSpooledReceipts and
	// MaxReceiptSpoolBytes.
	maxCount int
	maxBytes int64

	mu     sync.Mutex
	f      *os.File // O_APPEND
	count  int      // lines in the file
	size   int64
	closed bool
	// torn is how many bytes of an unfinished last line open cut off: a
	// crash in the middle of an append that was never acknowledged.
	torn int64
}

// spoolLine is one line of the spool as read: r is nil when the line is not
// a receipt this version reads; it is then kept as it is.
type spoolLine struct {
	raw []byte // without its newline
	r   *spooledReceipt
}

// openReceiptSpool opens (creating it and its folder, 0700, when missing)
// the spool at path and takes its lock, trying for up to wait. Errors:
// ErrReceiptSpoolLocked; file system errors.
func openReceiptSpool(path string, wait time.Duration) (*receiptSpool, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("jobfence: receipt spool folder: %w", err)
	}
	var lock *os.File
	var err error
	for deadline := time.Now().Add(wait); ; {
		lock, err = lockSpool(path + ".lock")
		if !errors.Is(err, ErrReceiptSpoolLocked) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("jobfence: receipt spool %s: %w", path, err)
	}
	s := &receiptSpool{path: path, lock: lock, maxCount: MaxSpooledReceipts, maxBytes: MaxReceiptSpoolBytes}
	if err := s.open(); err != nil {
		unlockSpool(lock, path+".lock")
		return nil, fmt.Errorf("jobfence: receipt spool %s: %w", path, err)
	}
	return s, nil
}

// open opens the file for appending under the lock, cuts off a torn last
// line and counts the lines.
func (s *receiptSpool) open() error {
	os.Remove(s.path + ".tmp") //nolint:errcheck // a rewrite a crash left unfinished: the file is still whole
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	// The file holds lease tokens (R25), whoever created it.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		f.Close()
		return err
	}
	if end := bytes.LastIndexByte(data, '\n') + 1; end < len(data) {
		if err := f.Truncate(int64(end)); err != nil {
			f.Close()
			return err
		}
		s.torn = int64(len(data) - end)
		data = data[:end]
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := syncDir(filepath.Dir(s.path)); err != nil {
		f.Close()
		return err
	}
	s.f, s.count, s.size = f, bytes.Count(data, []byte{'\n'}), int64(len(data))
	return nil
}

// pending is how many receipts the file holds.
func (s *receiptSpool) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// append writes r as one line and fsyncs it. Errors: errSpoolFull,
// errSpoolClosed, file system errors (the file is cut back to what it held).
func (s *receiptSpool) append(r spooledReceipt) error {
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errSpoolClosed
	case s.count >= s.maxCount || s.size+int64(len(line)) > s.maxBytes:
		return fmt.Errorf("%w: %d receipts, %d bytes (bounds %d, %d)", errSpoolFull, s.count, s.size,
			s.maxCount, s.maxBytes)
	}
	if _, err := s.f.Write(line); err != nil {
		s.f.Truncate(s.size) //nolint:errcheck // best effort: a torn line is cut at the next open anyway
		return err
	}
	if err := s.f.Sync(); err != nil {
		// Not acknowledged: take it back, so that count and size stay true.
		s.f.Truncate(s.size) //nolint:errcheck
		return err
	}
	s.count++
	s.size += int64(len(line))
	return nil
}

// snapshot reads the lines on file and the offset they end at.
func (s *receiptSpool) snapshot() ([]spoolLine, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, 0, errSpoolClosed
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return nil, 0, err
	}
	return parseSpool(data), int64(len(data)), nil
}

func parseSpool(data []byte) []spoolLine {
	var lines []spoolLine
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break // cut off by open; never acknowledged
		}
		raw := data[:i]
		data = data[i+1:]
		l := spoolLine{raw: raw}
		var r spooledReceipt
		if json.Unmarshal(raw, &r) == nil && r.Format == spoolFormat {
			l.r = &r
		}
		lines = append(lines, l)
	}
	return lines
}

// rewrite replaces the file's first upTo bytes (a snapshot) with keep, and
// keeps what was appended since, atomically: a temp file, fsync, rename,
// fsync of the folder. Errors: errSpoolClosed; file system errors, with
// the old file intact.
func (s *receiptSpool) rewrite(upTo int64, keep [][]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errSpoolClosed
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return err
	}
	if upTo > int64(len(data)) {
		return fmt.Errorf("the spool shrank under its lock: %d bytes, snapshot of %d", len(data), upTo)
	}
	var buf bytes.Buffer
	for _, l := range keep {
		buf.Write(l)
		buf.WriteByte('\n')
	}
	buf.Write(data[upTo:])
	tmp := s.path + ".tmp"
	if err := writeSynced(tmp, buf.Bytes()); err != nil {
		os.Remove(tmp) //nolint:errcheck
		return err
	}
	if err := os.Rename(tmp, s.path); err != nil {
		os.Remove(tmp) //nolint:errcheck
		return err
	}
	// The rename is durable once the folder is; until then a crash leaves
	// the old file, whose receipts are refiled and deduplicated.
	if err := syncDir(filepath.Dir(s.path)); err != nil {
		return err
	}
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	s.f.Close()
	s.f, s.count, s.size = f, bytes.Count(buf.Bytes(), []byte{'\n'}), int64(buf.Len())
	return nil
}

// close releases the spool; an empty spool's file is removed with it, so a
// worker that spooled nothing, or filed all it spooled, leaves nothing
// behind.
func (s *receiptSpool) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.f.Close()
	if s.count == 0 {
		if rmErr := os.Remove(s.path); rmErr == nil {
			err = errors.Join(err, syncDir(filepath.Dir(s.path)))
		}
	}
	unlockSpool(s.lock, s.path+".lock")
	return err
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// lockHolder reads the pid a lock file names; 0 when none.
func lockHolder(f *os.File) int {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil {
		return 0
	}
	return pid
}
