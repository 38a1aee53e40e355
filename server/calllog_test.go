package server_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
)

// syncBuffer is a log sink the server's goroutines may write concurrently.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// finishedCalls returns the "finished call" records written so far.
func (b *syncBuffer) finishedCalls(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(b.buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == "finished call" {
			out = append(out, rec)
		}
	}
	return out
}

// Every finished call is logged at its code's level: at info a rejected
// write is (the fence doing its job, R9), successful calls are not; at debug
// both are, with the call's service, method, peer, code, error and duration.
func TestFinishedCallsLoggedAtTheirCodesLevel(t *testing.T) {
	b := testdb.SQLiteBackend() // the embedded store: the log does not depend on it
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			var sink syncBuffer
			c := start(t, b, func(o *server.Options) {
				o.Logger = slog.New(slog.NewJSONHandler(&sink, &slog.HandlerOptions{Level: level}))
			})
			ctx := ctxFor(t)
			job := c.enqueue(t)
			a := c.claimOne(t, "A", job.Id)
			if _, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, ProviderRefundId: "re_1"}); err != nil {
				t.Fatal(err)
			}
			_, err := c.client.Escalate(ctx, &pb.EscalateRequest{JobId: job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken, Reason: "second thoughts"})
			errorInfo(t, err, codes.FailedPrecondition, server.ReasonJobNotRunning)

			calls := sink.finishedCalls(t)
			want := map[string]string{"Escalate": "FailedPrecondition"}
			if level == slog.LevelDebug {
				want["EnqueueRefund"], want["Claim"], want["Complete"] = "OK", "OK", "OK"
			}
			if len(calls) != len(want) {
				t.Fatalf("%d finished calls logged, want %d: %v", len(calls), len(want), calls)
			}
			for _, rec := range calls {
				method, _ := rec["grpc.method"].(string)
				if code, ok := want[method]; !ok || rec["grpc.code"] != code {
					t.Fatalf("logged %s with code %v; want %v", method, rec["grpc.code"], want)
				}
				if rec["grpc.service"] != "jobfence.v1.Coordinator" || rec["protocol"] != "grpc" ||
					rec["grpc.component"] != "server" || rec["grpc.method_type"] != "unary" {
					t.Fatalf("record %v", rec)
				}
				if addr, _ := rec["peer.address"].(string); !strings.HasPrefix(addr, "127.0.0.1:") {
					t.Fatalf("peer.address = %v", rec["peer.address"])
				}
				if ms, ok := rec["grpc.time_ms"].(float64); !ok || ms < 0 {
					t.Fatalf("grpc.time_ms = %v", rec["grpc.time_ms"])
				}
				for _, k := range []string{"grpc.start_time", "grpc.request.deadline"} { // ctxFor sets a deadline
					if _, ok := rec[k].(string); !ok {
						t.Fatalf("%s = %v", k, rec[k])
					}
				}
				errText, hasErr := rec["grpc.error"].(string)
				if (want[method] != "OK") != hasErr {
					t.Fatalf("grpc.error = %v for %s", rec["grpc.error"], method)
				}
				if hasErr && !strings.Contains(errText, "no longer running under attempt") {
					t.Fatalf("grpc.error = %q", errText)
				}
				wantLevel := "INFO"
				if want[method] == "OK" {
					wantLevel = "DEBUG"
				}
				if rec["level"] != wantLevel {
					t.Fatalf("%s logged at %v, want %s", method, rec["level"], wantLevel)
				}
			}
		})
	}
}
