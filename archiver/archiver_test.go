package archiver_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jobfence/jobfence/archiver"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/mysql"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var keys int

// completed enqueues, claims and completes n refunds, and returns the last.
func completed(t *testing.T, s store.Store, n int) store.Job {
	t.Helper()
	var last store.Job
	for range n {
		keys++
		p := store.EnqueueParams{OperationKey: fmt.Sprintf("arch-%s-%d", t.Name(), keys), OrderID: "o", PaymentID: "p",
			AmountMinor: 100, Currency: "EUR", Provider: "acme"}
		if _, _, err := s.Enqueue(ctxFor(t), p); err != nil {
			t.Fatal(err)
		}
		c, err := s.Claim(ctxFor(t), store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: time.Minute})
		if err != nil || len(c) != 1 {
			t.Fatalf("Claim = %v, %v", c, err)
		}
		res, err := s.Write(ctxFor(t), store.Writeback{Kind: store.EventCompleted, JobID: c[0].Job.ID,
			Attempt: c[0].Job.Attempt, LeaseToken: c[0].LeaseToken, ProviderRefundID: "re"})
		if err != nil {
			t.Fatal(err)
		}
		last = res.Job
	}
	return last
}

// aged waits until the database's clock is a second past job's completion.
func aged(t *testing.T, s store.Store, job store.Job) {
	t.Helper()
	for {
		st, err := s.Stats(ctxFor(t))
		if err != nil {
			t.Fatal(err)
		}
		if st.Now.After(job.NextAttemptAt.Add(store.MinRetention)) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newArchiver(t *testing.T, s store.Store, holder string, configure ...func(*archiver.Options)) (*archiver.Archiver, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts := archiver.Options{RetainSucceeded: time.Second, Batch: 7, Pause: time.Millisecond, Holder: holder,
		Metrics: archiver.NewMetrics(reg), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range configure {
		f(&opts)
	}
	a, err := archiver.New(s.(archiver.Store), opts)
	if err != nil {
		t.Fatal(err)
	}
	return a, reg
}

func counter(t *testing.T, reg *prometheus.Registry, name string, label ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(label) == 0 || labelIs(m, label[0], label[1]) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func labelIs(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// R31: a run moves every succeeded job past its retention, in batches,
// counts them, and leaves a job in review and a young completion.
func TestArchiverRunMovesWhatIsDue_R31(t *testing.T) {
	for _, b := range testdb.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			s := b.Open(t)
			last := completed(t, s, 20)
			p := store.EnqueueParams{OperationKey: "review-" + b.Name, OrderID: "o", PaymentID: "p", AmountMinor: 1,
				Currency: "EUR", Provider: "acme"}
			if _, _, err := s.Enqueue(ctxFor(t), p); err != nil {
				t.Fatal(err)
			}
			c, err := s.Claim(ctxFor(t), store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: time.Minute})
			if err != nil || len(c) != 1 {
				t.Fatal(c, err)
			}
			if _, err := s.Write(ctxFor(t), store.Writeback{Kind: store.EventEscalated, JobID: c[0].Job.ID,
				Attempt: c[0].Job.Attempt, LeaseToken: c[0].LeaseToken, Reason: "a person decides"}); err != nil {
				t.Fatal(err)
			}
			aged(t, s, last)
			young := completed(t, s, 1)
			a, reg := newArchiver(t, s, "a")
			tot, err := a.Once(ctxFor(t))
			if err != nil || tot.Jobs != 20 || tot.Batches != 3 || tot.Events != 20*3 {
				t.Fatalf("Once = %+v, %v; want 20 jobs with 3 events each in 3 batches of at most 7", tot, err)
			}
			if n := counter(t, reg, "jobfence_archived_jobs_total"); n != 20 {
				t.Fatalf("jobfence_archived_jobs_total = %v", n)
			}
			for _, id := range []int64{c[0].Job.ID, young.ID} {
				if d, err := s.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{ID: id}}); err != nil || !d.Job.ArchivedAt.IsZero() {
					t.Fatalf("job %d = %+v, %v; want it still in the working tables", id, d.Job, err)
				}
			}
			if tot, err := a.Once(ctxFor(t)); err != nil || tot.Jobs != 0 {
				t.Fatalf("a second run = %+v, %v; want nothing left", tot, err)
			}
		})
	}
}

// R31: two archivers on one database, each on its own coordinator's
// connections: one holds the lease and moves every job, the other is told
// the lease is held and moves none; no job is moved twice.
func TestTwoArchiversOnlyOneMoves_R31(t *testing.T) {
	dsn := testdb.MySQL(t)
	open := func() store.Store {
		s, err := mysql.Open(context.Background(), dsn, mysql.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	s1, s2 := open(), open()
	aged(t, s1, completed(t, s1, 30))
	a, _ := newArchiver(t, s1, "replica-1")
	b, _ := newArchiver(t, s2, "replica-2")
	var wg sync.WaitGroup
	var ta, tb archiver.Totals
	var ea, eb error
	wg.Add(2)
	go func() { defer wg.Done(); ta, ea = a.Once(ctxFor(t)) }()
	go func() { defer wg.Done(); tb, eb = b.Once(ctxFor(t)) }()
	wg.Wait()
	held := 0
	for _, err := range []error{ea, eb} {
		switch {
		case errors.Is(err, store.ErrLeaseHeld):
			held++
		case err != nil:
			t.Fatalf("an archiver failed: %v", err)
		}
	}
	if held != 1 || ta.Jobs+tb.Jobs != 30 || (ta.Jobs != 0 && tb.Jobs != 0) {
		t.Fatalf("archivers moved %d and %d jobs (%v, %v); want one of them all 30, the other told the lease is held",
			ta.Jobs, tb.Jobs, ea, eb)
	}
}

// R31: while the database's purge falls behind (here: a snapshot held open
// over later commits), the archiver waits instead of deleting more, counts
// the wait, and archives once the backlog is under its bound.
func TestArchiverWaitsForThePurge_R31(t *testing.T) {
	dsn := testdb.MySQL(t)
	s, err := mysql.Open(context.Background(), dsn, mysql.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	aged(t, s, completed(t, s, 5))
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	snap, err := db.BeginTx(ctxFor(t), &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := snap.QueryRow(`SELECT COUNT(*) FROM refund_jobs`).Scan(&n); err != nil { // the read view is taken
		t.Fatal(err)
	}
	completed(t, s, 3) // commits the purge must keep for the snapshot
	strict, reg := newArchiver(t, s, "strict", func(o *archiver.Options) { o.MaxPurgeBacklog = 1 })
	short, cancel := context.WithTimeout(ctxFor(t), 3*time.Second)
	defer cancel()
	if tot, err := strict.Once(short); !errors.Is(err, context.DeadlineExceeded) || tot.Jobs != 0 {
		t.Fatalf("Once while the purge lags = %+v, %v; want it to wait, moving nothing", tot, err)
	}
	if n := counter(t, reg, "jobfence_archive_backoffs_total", "reason", "purge"); n == 0 {
		t.Fatal("no purge back-off counted")
	}
	snap.Rollback()
	easy, _ := newArchiver(t, s, "strict", func(o *archiver.Options) { o.MaxPurgeBacklog = 1 << 40 })
	if tot, err := easy.Once(ctxFor(t)); err != nil || tot.Jobs != 8 {
		t.Fatalf("Once under the bound = %+v, %v; want the 8 due jobs", tot, err)
	}
}

// Bad options are refused naming what is wrong.
func TestArchiverOptionsChecked(t *testing.T) {
	s := testdb.SQLiteBackend().Open(t)
	for _, o := range []archiver.Options{
		{RetainSucceeded: time.Millisecond}, {Batch: store.MaxArchiveBatch + 1}, {Pause: -time.Second},
		{LeaseTTL: time.Second}, {MaxPurgeBacklog: -1},
	} {
		if _, err := archiver.New(s.(archiver.Store), o); err == nil {
			t.Fatalf("New(%+v) accepted", o)
		}
	}
}

// R31: an archiver restarted under the same holder name (the coordinator
// gives its host and listen address) takes its lease again at once, not
// after the lease's time; the earlier process's generation moves nothing.
func TestRestartedArchiverTakesItsLeaseAtOnce_R31(t *testing.T) {
	s := testdb.SQLiteBackend().Open(t)
	first, _ := newArchiver(t, s, "host-1 127.0.0.1:50051", func(o *archiver.Options) { o.LeaseTTL = time.Hour })
	if _, err := first.Once(ctxFor(t)); err != nil { // takes the lease for an hour
		t.Fatal(err)
	}
	aged(t, s, completed(t, s, 3))
	restarted, _ := newArchiver(t, s, "host-1 127.0.0.1:50051", func(o *archiver.Options) { o.LeaseTTL = time.Hour })
	if tot, err := restarted.Once(ctxFor(t)); err != nil || tot.Jobs != 3 {
		t.Fatalf("the restarted archiver = %+v, %v; want the lease at once and the 3 due jobs", tot, err)
	}
	other, _ := newArchiver(t, s, "host-2 127.0.0.1:50051")
	if _, err := other.Once(ctxFor(t)); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("another holder: %v, want ErrLeaseHeld", err)
	}
}
