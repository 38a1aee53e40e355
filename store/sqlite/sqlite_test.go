package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/sqlite"
	"github.com/jobfence/jobfence/store/storetest"
)

func open(t *testing.T) store.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), testdb.SQLitePath(t), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, open) }

func openSharing(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.OpenSharing(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func openAt(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A restart loses nothing: the job, its attempt and its history are in the
// file, the migrations are not applied twice, and the holder of the attempt
// granted before the restart can still write (R2, R8: only a committed
// takeover ends a holder's right, not a restart).
func TestRestartKeepsJobsAttemptsAndFence_R2_R8(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "not", "yet", "there", "jobfence.db") // Open creates the directories
	s := openAt(t, path)
	job, _, err := s.Enqueue(ctx, store.EnqueueParams{OperationKey: "refund-restart-1", OrderID: "order-1",
		PaymentID: "pay-1", AmountMinor: 990, Currency: "EUR", Provider: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Claim(ctx, store.ClaimParams{WorkerID: "A", MaxJobs: 1, Lease: 30 * time.Second})
	if err != nil || len(got) != 1 || got[0].Job.ID != job.ID {
		t.Fatalf("Claim = %d jobs, %v", len(got), err)
	}
	held, token := got[0].Job, got[0].LeaseToken
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openAt(t, path)
	d, err := s.Get(ctx, store.GetParams{JobRef: store.JobRef{ID: job.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Job != held {
		t.Fatalf("after restart job = %+v\nwant %+v", d.Job, held)
	}
	if len(d.Events) != 2 || d.Events[0].Kind != store.EventEnqueued || d.Events[1].Kind != store.EventClaimed ||
		d.Events[1].Attempt != held.Attempt {
		t.Fatalf("after restart history = %+v", d.Events)
	}
	var versions, applied int
	if err := s.DB().QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT version) FROM jobfence_schema_migrations`).
		Scan(&applied, &versions); err != nil {
		t.Fatal(err)
	}
	if applied != versions || applied == 0 {
		t.Fatalf("%d migrations recorded for %d versions", applied, versions)
	}
	// The live lease survived too: nobody can take the job over yet.
	if again, err := s.Claim(ctx, store.ClaimParams{WorkerID: "B", MaxJobs: 1, Lease: 30 * time.Second}); err != nil || len(again) != 0 {
		t.Fatalf("Claim after restart = %d jobs, %v; want none", len(again), err)
	}

	res, err := s.Write(ctx, store.Writeback{Kind: store.EventCompleted, JobID: job.ID, Attempt: held.Attempt,
		LeaseToken: token, ProviderRefundID: "re_restart"})
	if err != nil || res.Replayed || res.Job.State != store.StateSucceeded || res.Job.Attempt != held.Attempt {
		t.Fatalf("Write with the pre-restart attempt = %+v, %v", res, err)
	}
}

// Two stores on one file stand for two processes where nothing stops them
// (the process lock set aside, as on a platform without flock): each has its
// own connection, and BEGIN IMMEDIATE with busy_timeout serialises their
// claims, so no job is granted twice (R5, R13).
func TestTwoStoresOneFileNeverGrantTwice_R5_R13(t *testing.T) {
	ctx := context.Background()
	path := testdb.SQLitePath(t)
	a, b := openSharing(t, path), openSharing(t, path)
	const jobs = 300
	for i := 0; i < jobs; i++ {
		if _, _, err := a.Enqueue(ctx, store.EnqueueParams{OperationKey: fmt.Sprintf("refund-two-%d", i),
			OrderID: "order-2", PaymentID: fmt.Sprintf("pay-%d", i), AmountMinor: 100, Currency: "EUR",
			Provider: "acme"}); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu      sync.Mutex
		granted = map[int64]int{}
		wg      sync.WaitGroup
		errs    = make(chan error, 16)
	)
	for w := 0; w < 16; w++ {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func(w int, s *sqlite.Store) {
			defer wg.Done()
			for {
				got, err := s.Claim(ctx, store.ClaimParams{WorkerID: fmt.Sprintf("w%d", w), MaxJobs: 3, Lease: time.Minute})
				if err != nil {
					errs <- err
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, c := range got {
					granted[c.Job.ID]++
					if c.Job.Attempt != 1 {
						errs <- fmt.Errorf("job %d granted with attempt %d", c.Job.ID, c.Job.Attempt)
					}
				}
				mu.Unlock()
			}
		}(w, s)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(granted) != jobs {
		t.Fatalf("%d jobs granted, want %d", len(granted), jobs)
	}
	for id, n := range granted {
		if n != 1 {
			t.Fatalf("job %d granted %d times", id, n)
		}
	}
}

// When another process keeps the write lock past busy_timeout, every try
// fails before anything is written: the caller gets ErrUnavailable, retrying
// is safe, and the job is untouched (R20).
func TestWriteLockHeldElsewhereIsUnavailable_R20(t *testing.T) {
	ctx := context.Background()
	path := testdb.SQLitePath(t)
	s, err := sqlite.Open(ctx, path, sqlite.Options{BusyTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	job, _, err := s.Enqueue(ctx, store.EnqueueParams{OperationKey: "refund-busy-1", OrderID: "order-3",
		PaymentID: "pay-3", AmountMinor: 500, Currency: "EUR", Provider: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Claim(ctx, store.ClaimParams{WorkerID: "A", MaxJobs: 1, Lease: time.Minute})
	if err != nil || len(got) != 1 {
		t.Fatalf("Claim = %d jobs, %v", len(got), err)
	}

	// Another program on the file (an operator's sqlite3 shell, a backup):
	// a second store would be refused (TestSecondProcessRefused).
	other, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTx(ctx, nil) // BEGIN IMMEDIATE: holds the write lock
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, store.ClaimParams{WorkerID: "B", MaxJobs: 1, Lease: time.Minute}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Claim under a held write lock: %v, want ErrUnavailable", err)
	}
	w := store.Writeback{Kind: store.EventCompleted, JobID: job.ID, Attempt: got[0].Job.Attempt,
		LeaseToken: got[0].LeaseToken, ProviderRefundID: "re_busy"}
	if _, err := s.Write(ctx, w); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Write under a held write lock: %v, want ErrUnavailable", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	d, err := s.Get(ctx, store.GetParams{JobRef: store.JobRef{ID: job.ID}})
	if err != nil || d.Job.State != store.StateRunning || d.Job.Attempt != 1 || len(d.Events) != 2 {
		t.Fatalf("after the failed tries: job %+v, %d events, %v", d.Job, len(d.Events), err)
	}
	if res, err := s.Write(ctx, w); err != nil || res.Replayed || res.Job.State != store.StateSucceeded {
		t.Fatalf("Write once the lock is free = %+v, %v", res, err)
	}
}

// A second coordinator on the same file is refused while the first runs, with
// the first one's pid, rather than serving beside it: long-poll wake-ups and
// the single-node promise assume one process. Once the first closes, the
// file opens again.
func TestSecondProcessRefused(t *testing.T) {
	ctx := context.Background()
	path := testdb.SQLitePath(t)
	first, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sqlite.Open(ctx, path, sqlite.Options{})
	if err == nil || !strings.Contains(err.Error(), "in use by another process") ||
		!strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Fatalf("second Open = %v, want a refusal naming pid %d", err, os.Getpid())
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatalf("Open after the first closed: %v", err)
	}
	again.Close()
}
