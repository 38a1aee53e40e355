package dispatch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/tracing"
)

// recorder is a tracer provider that keeps every ended span.
func recorder() (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), rec
}

// links returns the span contexts s links to with the given jobfence.link
// kind.
func links(s sdktrace.ReadOnlySpan, kind string) []trace.SpanContext {
	var out []trace.SpanContext
	for _, l := range s.Links() {
		for _, a := range l.Attributes {
			if a.Key == tracing.LinkKind && a.Value.AsString() == kind {
				out = append(out, l.SpanContext)
			}
		}
	}
	return out
}

func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// R35: a shared transaction is one span of its own, a root linked to every
// call it served (not the child of any), and each call's span links back to
// it.
func TestBatchSpanLinksEveryCallItServed_R35(t *testing.T) {
	tp, rec := recorder()
	tracer := tp.Tracer("test")
	running, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := newBatcher[int, int](testFlush{run: func(_ context.Context, ins []int) []int {
		once.Do(func() { close(running); <-release }) // the first batch holds the others back
		out := make([]int, len(ins))
		for i, v := range ins {
			out[i] = v
			if v == 3 {
				out[i] = -1 // failed
			}
		}
		return out
	}}, 1, 8, time.Minute, 0, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}), nil, tp.Tracer(tracing.ScopeName))
	defer b.close()

	call := func(v int, wg *sync.WaitGroup) trace.SpanContext {
		ctx, span := tracer.Start(context.Background(), "call")
		go func() {
			defer wg.Done()
			defer span.End()
			b.do(ctx, v) //nolint:errcheck
		}()
		return span.SpanContext()
	}
	var first sync.WaitGroup
	first.Add(1)
	call(0, &first)
	<-running
	var rest sync.WaitGroup
	var served []trace.SpanContext
	for v := 1; v <= 4; v++ {
		rest.Add(1)
		served = append(served, call(v, &rest))
	}
	waitQueued(t, func() bool { return len(b.queue) == 4 })
	close(release)
	first.Wait()
	rest.Wait()

	var batch sdktrace.ReadOnlySpan
	for _, s := range spansNamed(rec, tracing.SpanBatch+" test") {
		if len(s.Links()) == 4 {
			batch = s
		}
	}
	if batch == nil {
		t.Fatalf("no batch span linking the 4 calls it served: %v", spansNamed(rec, tracing.SpanBatch+" test"))
	}
	if batch.Parent().IsValid() {
		t.Errorf("the batch span has a parent %v: it must be a root linked to its calls", batch.Parent())
	}
	got := links(batch, tracing.LinkCall)
	for _, sc := range served {
		if !containsSC(got, sc) {
			t.Errorf("the batch span does not link call %v", sc.SpanID())
		}
	}
	want := map[string]any{string(tracing.BatchKindKey): "test", string(tracing.BatchSizeKey): int64(4),
		string(tracing.BatchFailedKey): int64(1)}
	for _, a := range batch.Attributes() {
		if w, ok := want[string(a.Key)]; ok {
			if a.Value.AsInterface() != w {
				t.Errorf("%s = %v, want %v", a.Key, a.Value.AsInterface(), w)
			}
			delete(want, string(a.Key))
		}
	}
	if len(want) > 0 {
		t.Errorf("batch span lacks %v", want)
	}
	for _, s := range spansNamed(rec, "call") {
		if !containsSC(served, s.SpanContext()) {
			continue
		}
		if back := links(s, tracing.LinkBatch); len(back) != 1 || !back[0].Equal(batch.SpanContext()) {
			t.Errorf("call %v links %v, want its batch %v", s.SpanContext().SpanID(), back, batch.SpanContext().SpanID())
		}
	}
}

// R35: an enqueue's transaction that claims for a waiting long poll serves
// that call too: its span links the claim, and the claim links back.
func TestEnqueueBatchLinksTheLongPollsItHandsWork_R35(t *testing.T) {
	tp, rec := recorder()
	st := &handOffStore{}
	d := New(st, Options{PollInterval: time.Hour, TracerProvider: tp})
	defer d.Close()
	tracer := tp.Tracer("test")
	cctx, claimSpan := tracer.Start(context.Background(), "claim call")
	got := make(chan []store.ClaimedJob, 1)
	go func() {
		jobs, _ := d.Claim(cctx, store.ClaimParams{MaxJobs: 1, Provider: "p"}, time.Minute)
		claimSpan.End()
		got <- jobs
	}()
	waitQueued(t, func() bool {
		d.waiters.mu.Lock()
		defer d.waiters.mu.Unlock()
		return len(d.waiters.queue) == 1 && d.waiters.queue[0].claim != nil
	})
	ectx, enqSpan := tracer.Start(context.Background(), "enqueue call")
	if _, err := d.Enqueue(ectx, store.EnqueueParams{Provider: "p"}); err != nil {
		t.Fatal(err)
	}
	enqSpan.End()
	if jobs := <-got; len(jobs) != 1 {
		t.Fatalf("the long poll got %v, want the job handed off", jobs)
	}
	batches := spansNamed(rec, tracing.SpanBatch+" enqueue")
	if len(batches) != 1 {
		t.Fatalf("%d enqueue batch spans", len(batches))
	}
	served := links(batches[0], tracing.LinkCall)
	if !containsSC(served, enqSpan.SpanContext()) || !containsSC(served, claimSpan.SpanContext()) {
		t.Fatalf("the enqueue batch links %v; want the enqueue and the long poll it handed work", served)
	}
	for _, s := range spansNamed(rec, "claim call") {
		// Its own claim transaction first (nothing due), then the enqueue's.
		if back := links(s, tracing.LinkBatch); !containsSC(back, batches[0].SpanContext()) {
			t.Fatalf("the long poll links %v, want the enqueue's batch among them", back)
		}
	}
}

// handOffStore has no due work until an enqueue, which grants each claim it
// runs one job.
type handOffStore struct{ nopStore }

func (handOffStore) EnqueueAndClaim(_ context.Context, ps []store.EnqueueParams, cs []store.ClaimParams) ([]store.EnqueueOutcome,
	[]store.ClaimOutcome) {
	out := make([]store.EnqueueOutcome, len(ps))
	for i := range out {
		out[i] = store.EnqueueOutcome{Created: true, Job: store.Job{ID: int64(i + 1), Provider: "p"}}
	}
	cout := make([]store.ClaimOutcome, len(cs))
	for i := range cout {
		cout[i].Jobs = []store.ClaimedJob{{Job: store.Job{ID: int64(i + 1)}}}
	}
	return out, cout
}

func (handOffStore) ClaimMany(_ context.Context, ps []store.ClaimParams) []store.ClaimOutcome {
	return make([]store.ClaimOutcome, len(ps))
}

// nopStore answers every call at once, without allocating more than its
// answers.
type nopStore struct{}

func (nopStore) EnqueueAndClaim(_ context.Context, ps []store.EnqueueParams, cs []store.ClaimParams) ([]store.EnqueueOutcome,
	[]store.ClaimOutcome) {
	return make([]store.EnqueueOutcome, len(ps)), make([]store.ClaimOutcome, len(cs))
}

func (nopStore) ClaimMany(_ context.Context, ps []store.ClaimParams) []store.ClaimOutcome {
	out := make([]store.ClaimOutcome, len(ps))
	for i := range out {
		out[i].Jobs = []store.ClaimedJob{{}}
	}
	return out
}

func (nopStore) WriteMany(_ context.Context, ws []store.Writeback) []store.WriteOutcome {
	return make([]store.WriteOutcome, len(ws))
}

func (nopStore) RenewMany(_ context.Context, rs []store.Renewal) []store.RenewOutcome {
	return make([]store.RenewOutcome, len(rs))
}

func (nopStore) HasWork(context.Context, string) (bool, error) { return true, nil }

// R35: tracing off costs nothing: an enqueue, a write-back and a claim
// through the dispatcher allocate what they did before tracing existed
// (measured on the dispatcher without any tracing code, with this store:
// 8, 8 and 11 allocations, the batch's and the store's answers included).
func TestTracingOffAllocatesNothingMore_R35(t *testing.T) {
	d := New(nopStore{}, Options{PollInterval: time.Hour})
	defer d.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		max  float64
		run  func()
	}{
		{"enqueue", 8, func() { d.Enqueue(ctx, store.EnqueueParams{Provider: "p"}) }}, //nolint:errcheck
		{"write", 8, func() { d.Write(ctx, store.Writeback{}) }},                      //nolint:errcheck
		{"claim", 11, func() { d.Claim(ctx, store.ClaimParams{MaxJobs: 1}, 0) }},      //nolint:errcheck
	} {
		if got := testing.AllocsPerRun(500, tc.run); got > tc.max {
			t.Errorf("%s with tracing off: %v allocations per call, want at most %v", tc.name, got, tc.max)
		}
	}
}

// BenchmarkDispatchWrite: a write-back through the dispatcher with tracing
// off and with a recording tracer provider (sampling everything), for the
// cost per call of each.
func BenchmarkDispatchWrite(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		o := Options{PollInterval: time.Hour}
		if on {
			name = "on"
			o.TracerProvider = sdktrace.NewTracerProvider()
		}
		b.Run(name, func(b *testing.B) {
			d := New(nopStore{}, o)
			defer d.Close()
			ctx := context.Background()
			if on {
				var span trace.Span
				ctx, span = o.TracerProvider.Tracer("b").Start(ctx, "call")
				defer span.End()
			}
			b.ReportAllocs()
			for b.Loop() {
				d.Write(ctx, store.Writeback{}) //nolint:errcheck
			}
		})
	}
}

func containsSC(scs []trace.SpanContext, sc trace.SpanContext) bool {
	for _, s := range scs {
		if s.TraceID() == sc.TraceID() && s.SpanID() == sc.SpanID() {
			return true
		}
	}
	return false
}

func waitQueued(t *testing.T, cond func() bool) {
	t.Helper()
	proctest.WaitFor(t, 10*time.Second, "the calls queued in the batcher", cond)
}
