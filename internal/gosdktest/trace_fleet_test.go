package jobfence_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/otlptest"
	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
)

// TestFleetAttemptSpansShareTheEnqueueTrace_R35: one job each for a Go, a
// TypeScript and a Python worker, enqueued through a traced coordinator,
// each under a producer span of its own. Each worker's attempt span links to
// its job's enqueue — the coordinator's EnqueueRefund span, in the
// producer's trace — and the coordinator's write-back span of the job is in
// the attempt span's trace: the worker's WorkCall carried it. So the
// producer, the coordinator and the three SDKs make one trace per job,
// joined by links (R35).
//
// Where the spans go: the coordinator's, the producer's and the Go
// worker's (in this process) to an in-memory recorder; the TypeScript
// worker (examples/refund-worker.js, as a process) exports OTLP/gRPC to a
// receiver of this test on a loopback socket, configured by the standard
// OTEL_* variables; the Python worker (examples/refund_worker.py) has no
// OpenTelemetry here, so it runs on the stand-in of its tests
// (tests/otel_standin), which writes its spans to a file.
func TestFleetAttemptSpansShareTheEnqueueTrace_R35(t *testing.T) {
	proctest.SkipShort(t, "the TypeScript and Python example workers")
	nodeJS := nodeWorkerJS(t)
	python := os.Getenv("JOBFENCE_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	repo := repoRoot(t)

	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	coord := startTracedCoordinator(t, tp)
	otlp := otlptest.Start(t)
	prov := httptest.NewServer(fakeprovider.New(fakeprovider.Config{}))
	t.Cleanup(prov.Close)

	// One job per language, each enqueued under a producer span of its own:
	// the SDK's client sends the span's traceparent with the call.
	langs := []string{"go", "node", "python"}
	type enqueued struct {
		job      jobfence.Job
		producer trace.SpanContext
	}
	jobs := map[string]enqueued{}
	for _, lang := range langs {
		ctx, span := tp.Tracer("fleet-producer").Start(ctxFor(t), "enqueue "+lang)
		r := refund("fleet" + lang)
		job, created, err := coord.client.EnqueueRefund(ctx, r)
		span.End()
		if err != nil || !created {
			t.Fatalf("EnqueueRefund(%s): %v, created=%v", lang, err, created)
		}
		jobs[lang] = enqueued{job, span.SpanContext()}
	}

	// The Go worker, in this process.
	w, err := jobfence.NewWorker(coord.client, jobfence.HandlerFuncs{
		RefundFunc:    func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result { return jobfence.Succeeded("re_go") },
		ReconcileFunc: func(ctx context.Context, j jobfence.ClaimedJob) jobfence.Result { return jobfence.Succeeded("re_go") },
	}, jobfence.WorkerOptions{WorkerID: "fleet-go", Provider: "fleetgo", ReceiptSpool: jobfence.ReceiptSpoolOff,
		TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, w)

	flags := func(lang string) []string {
		return []string{"--coordinator", coord.addr, "--provider", prov.URL, "--provider-name", "fleet" + lang,
			"--worker-id", "fleet-" + lang, "--receipt-spool", "off", "--log-level", "debug"}
	}
	node := proctest.Start(t, "node", proctest.Options{
		Args: append([]string{nodeJS}, flags("node")...),
		Env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + otlp.Addr, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
			"OTEL_SERVICE_NAME=fleet-node", "OTEL_BSP_SCHEDULE_DELAY=200"},
		Ready: "refund-worker started",
	})
	spansFile := filepath.Join(t.TempDir(), "python-spans.jsonl")
	py := proctest.Start(t, python, proctest.Options{
		Args: append([]string{filepath.Join(repo, "clients/python/examples/refund_worker.py")}, flags("python")...),
		Env: []string{"PYTHONPATH=" + filepath.Join(repo, "clients/python/tests/otel_standin"),
			"JOBFENCE_OTEL_STANDIN_SPANS=" + spansFile},
		Ready: "refund-worker started",
	})
	if rec, _ := node.WaitRecord(time.Second, func(r map[string]any) bool { return r["msg"] == "tracing" }); rec["tracing"] != "on" {
		t.Errorf("the Node worker's tracing line %v: want tracing on", rec)
	}

	proctest.WaitFor(t, 60*time.Second, "every job succeeded", func() bool {
		for _, e := range jobs {
			if coord.get(t, e.job.ID).Job.State != jobfence.StateSucceeded {
				return false
			}
		}
		return true
	})
	// SIGTERM: the workers drain and flush their spans.
	for _, p := range []*proctest.Process{node, py} {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(t, 30*time.Second); err != nil {
			t.Errorf("%s exited: %v\n%s", p.Cmd.Path, err, p.Logs())
		}
	}

	// Every worker's attempt span, whichever way it came.
	attempts := map[string]fleetSpan{}
	proctest.WaitFor(t, 10*time.Second, "the Go and TypeScript attempt spans", func() bool {
		for _, s := range sr.Ended() {
			if s.Name() == jobfence.AttemptSpanName {
				attempts["go"] = spanOfSDK(s)
			}
		}
		for _, s := range otlp.Spans() {
			if s.GetName() == jobfence.AttemptSpanName {
				attempts["node"] = spanOfOTLP(s)
			}
		}
		return attempts["go"].name != "" && attempts["node"].name != ""
	})
	attempts["python"] = pythonAttemptSpan(t, spansFile)

	for _, lang := range langs {
		e, a := jobs[lang], attempts[lang]
		stored, _ := hex.DecodeString(strings.Split(coord.get(t, e.job.ID).Job.TraceParent, "-")[2])
		switch {
		case a.name == "":
			t.Errorf("%s: no attempt span", lang)
			continue
		case a.kind != "consumer" || a.parent != "":
			t.Errorf("%s: attempt span kind %s parent %q: want a consumer root", lang, a.kind, a.parent)
		case len(a.links) != 1:
			t.Errorf("%s: attempt span links %v, want one, to the enqueue", lang, a.links)
			continue
		}
		l := a.links[0]
		// The link leads into the producer's trace, to the coordinator's
		// EnqueueRefund span: the span the job stored.
		if l.traceID != e.producer.TraceID().String() || l.spanID != hex.EncodeToString(stored) {
			t.Errorf("%s: attempt span links to %s/%s; want the producer's trace %s, the enqueue's span %x",
				lang, l.traceID, l.spanID, e.producer.TraceID(), stored)
		}
		if enq := findSpan(sr, l.traceID, l.spanID); enq == nil || enq.Name() != "jobfence.v1.Coordinator/EnqueueRefund" {
			t.Errorf("%s: the link's span is %v: want the coordinator's EnqueueRefund span", lang, enq)
		}
		want := map[string]string{"jobfence.job.id": fmt.Sprint(e.job.ID), "jobfence.outcome": "completed",
			"jobfence.worker_id": "fleet-" + lang, "messaging.system": "jobfence", "jobfence.provider": "fleet" + lang,
			"jobfence.operation_key": e.job.OperationKey}
		for k, v := range want {
			if a.attrs[k] != v {
				t.Errorf("%s: attempt span %s=%q, want %q", lang, k, a.attrs[k], v)
			}
		}
		// The coordinator's write-back of the job is in the attempt's
		// trace: the worker's WorkCall (or call metadata) carried it.
		var wb sdktrace.ReadOnlySpan
		for _, s := range sr.Ended() {
			if s.Name() == "jobfence.writeback" && attrsOf(s)["jobfence.job.id"] == fmt.Sprint(e.job.ID) {
				wb = s
			}
		}
		if wb == nil {
			t.Errorf("%s: no write-back span of job %d", lang, e.job.ID)
		} else if got := wb.SpanContext().TraceID().String(); got != a.traceID {
			t.Errorf("%s: the coordinator's write-back span is in trace %s, not in the attempt's %s", lang, got, a.traceID)
		}
	}
}

// fleetSpan is an attempt span as the test reads it, from any SDK.
type fleetSpan struct {
	name, kind, traceID, spanID, parent string
	attrs                               map[string]string
	links                               []fleetLink
}

type fleetLink struct{ traceID, spanID string }

func attrsOf(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

func spanOfSDK(s sdktrace.ReadOnlySpan) fleetSpan {
	f := fleetSpan{name: s.Name(), kind: s.SpanKind().String(), traceID: s.SpanContext().TraceID().String(),
		spanID: s.SpanContext().SpanID().String(), attrs: attrsOf(s)}
	if s.Parent().IsValid() {
		f.parent = s.Parent().SpanID().String()
	}
	for _, l := range s.Links() {
		f.links = append(f.links, fleetLink{l.SpanContext.TraceID().String(), l.SpanContext.SpanID().String()})
	}
	return f
}

func spanOfOTLP(s otlptest.Span) fleetSpan {
	f := fleetSpan{name: s.GetName(), kind: strings.ToLower(strings.TrimPrefix(s.GetKind().String(), "SPAN_KIND_")),
		traceID: hex.EncodeToString(s.GetTraceId()), spanID: hex.EncodeToString(s.GetSpanId()),
		parent: hex.EncodeToString(s.GetParentSpanId()), attrs: map[string]string{}}
	for _, kv := range s.GetAttributes() {
		f.attrs[kv.GetKey()] = otlptest.Value(kv.GetValue())
	}
	for _, l := range s.GetLinks() {
		f.links = append(f.links, fleetLink{hex.EncodeToString(l.GetTraceId()), hex.EncodeToString(l.GetSpanId())})
	}
	return f
}

// pythonAttemptSpan reads the Python worker's attempt span from the file the
// stand-in wrote (tests/otel_standin/standin_sdk.py: one JSON object a span).
func pythonAttemptSpan(t *testing.T, path string) fleetSpan {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the Python worker's spans: %v", err)
	}
	defer f.Close()
	var out fleetSpan
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var s struct {
			Name         string         `json:"name"`
			Kind         string         `json:"kind"`
			TraceID      string         `json:"trace_id"`
			SpanID       string         `json:"span_id"`
			ParentSpanID string         `json:"parent_span_id"`
			Attributes   map[string]any `json:"attributes"`
			Links        []struct {
				TraceID string `json:"trace_id"`
				SpanID  string `json:"span_id"`
			} `json:"links"`
		}
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("the Python worker's spans: %v: %s", err, sc.Text())
		}
		if s.Name != jobfence.AttemptSpanName {
			continue
		}
		out = fleetSpan{name: s.Name, kind: strings.ToLower(s.Kind), traceID: s.TraceID, spanID: s.SpanID,
			parent: s.ParentSpanID, attrs: map[string]string{}}
		for k, v := range s.Attributes {
			out.attrs[k] = fmt.Sprint(v)
		}
		for _, l := range s.Links {
			out.links = append(out.links, fleetLink{l.TraceID, l.SpanID})
		}
	}
	return out
}

// findSpan is the recorded span with these ids, nil when none.
func findSpan(sr *tracetest.SpanRecorder, traceID, spanID string) sdktrace.ReadOnlySpan {
	for _, s := range sr.Ended() {
		if s.SpanContext().TraceID().String() == traceID && s.SpanContext().SpanID().String() == spanID {
			return s
		}
	}
	return nil
}

// startTracedCoordinator is a coordinator on MySQL traced by tp, on a
// loopback socket, with a client of its own.
func startTracedCoordinator(t *testing.T, tp trace.TracerProvider) *coordinator {
	t.Helper()
	c := &coordinator{store: testdb.MySQLBackend().Open(t)}
	srv := server.New(c.store, server.Options{Lease: 30 * time.Second, TracerProvider: tp,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(srv.Close)
	gs, _ := srv.NewGRPCServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis) //nolint:errcheck
	t.Cleanup(gs.Stop)
	c.addr = lis.Addr().String()
	c.client, err = jobfence.Dial(c.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.client.Close() })
	return c
}

// repoRoot is the repository's root folder.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// nodeWorkerJS is the TypeScript example worker, compiled:
// JOBFENCE_NODE_WORKER_JS, or clients/node/dist/examples/refund-worker.js,
// built here (tsc, incremental) from clients/node, which needs its
// node_modules (npm ci).
func nodeWorkerJS(t *testing.T) string {
	t.Helper()
	if js := os.Getenv("JOBFENCE_NODE_WORKER_JS"); js != "" {
		return js
	}
	dir := filepath.Join(repoRoot(t), "clients", "node")
	tsc := filepath.Join(dir, "node_modules", ".bin", "tsc")
	if _, err := os.Stat(tsc); err != nil {
		t.Fatalf("the fleet needs the TypeScript worker: run npm ci in clients/node (%v)", err)
	}
	cmd := exec.Command(tsc, "-p", ".", "--incremental")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the TypeScript worker: %v\n%s", err, out)
	}
	return filepath.Join(dir, "dist", "examples", "refund-worker.js")
}
