package server_test

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
)

// rawConn is an HTTP/2 connection that sends what it is told, as a hostile
// client would: unlike grpc-go's client it ignores the server's limits.
type rawConn struct {
	t      *testing.T
	conn   net.Conn
	framer *http2.Framer
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	r := &rawConn{t: t, conn: conn, framer: http2.NewFramer(conn, conn)}
	if err := r.framer.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return r
}

// serverSettings reads frames until the server's SETTINGS and returns them.
func (r *rawConn) serverSettings() map[http2.SettingID]uint32 {
	r.t.Helper()
	for {
		f, err := r.framer.ReadFrame()
		if err != nil {
			r.t.Fatal(err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			out := map[http2.SettingID]uint32{}
			sf.ForeachSetting(func(s http2.Setting) error { out[s.ID] = s.Val; return nil }) //nolint:errcheck
			r.framer.WriteSettingsAck()                                                      //nolint:errcheck
			return out
		}
	}
}

// call sends a GetJob's headers with an authorization header of size bytes
// on stream 1, split into frames of at most 16 KiB, and reports how the
// server answered the stream: "headers" (it took the call), "reset" (the
// stream or the connection refused) or "closed" (the server hung up while
// the headers were still coming).
func (r *rawConn) call(size int) string {
	r.t.Helper()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", "/jobfence.v1.Coordinator/GetJob"},
		{":authority", "coordinator"}, {"content-type", "application/grpc"}, {"te", "trailers"},
		{"authorization", "Bearer " + strings.Repeat("x", size)},
	} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}) //nolint:errcheck
	}
	b := block.Bytes()
	const frame = 16 << 10
	first := b[:min(len(b), frame)]
	if err := r.framer.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first,
		EndHeaders: len(b) <= frame}); err != nil {
		r.t.Fatal(err)
	}
	for rest := b[len(first):]; len(rest) > 0; {
		n := min(len(rest), frame)
		if err := r.framer.WriteContinuation(1, n == len(rest), rest[:n]); err != nil {
			return "closed"
		}
		rest = rest[n:]
	}
	// An empty GetJobRequest, length-prefixed: the call is complete.
	if err := r.framer.WriteData(1, true, []byte{0, 0, 0, 0, 0}); err != nil {
		return "closed"
	}
	for {
		f, err := r.framer.ReadFrame()
		if err != nil {
			return "closed"
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if f.StreamID == 1 {
				return "headers"
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return "reset"
			}
		case *http2.GoAwayFrame:
			return "reset"
		}
	}
}

// Issue: before authentication, grpc-go took header lists of up to 16 MiB
// (RSS past 2.9 GB under a flood of 15 MiB tokens). The coordinator
// advertises its bounds, refuses a header list beyond MaxHeaderBytes before
// reading it, and still serves ordinary calls.
func TestHeaderListBoundedBeforeAuthentication(t *testing.T) {
	c := start(t, testdb.SQLiteBackend())

	settings := dialRaw(t, c.addr).serverSettings()
	if got := settings[http2.SettingMaxHeaderListSize]; got != server.MaxHeaderBytes {
		t.Errorf("SETTINGS_MAX_HEADER_LIST_SIZE = %d, want %d", got, server.MaxHeaderBytes)
	}
	if got := settings[http2.SettingMaxConcurrentStreams]; got != server.MaxStreamsPerConn {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS = %d, want %d", got, server.MaxStreamsPerConn)
	}

	raw := dialRaw(t, c.addr)
	raw.serverSettings()
	if got := raw.call(1 << 20); got == "headers" {
		t.Fatalf("a 1 MiB authorization header was answered with %s, want the stream reset unread", got)
	}
	small := dialRaw(t, c.addr)
	small.serverSettings()
	if got := small.call(2 << 10); got != "headers" {
		t.Fatalf("a 2 KiB authorization header was answered with %s, want the call served", got)
	}
	// And through a real client, with a header of an ordinary size.
	ctx := metadata.AppendToOutgoingContext(ctxFor(t), "x-trace", strings.Repeat("t", 1024))
	if _, err := c.client.ListJobs(ctx, &pb.ListJobsRequest{}); err != nil {
		t.Fatalf("ListJobs with a 1 KiB header: %v", err)
	}
}

// rawCodec sends and takes bytes as they are, as a client with a broken
// serializer would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// Issue: a request that does not parse is answered INTERNAL by grpc-go
// before any interceptor runs, and was seen nowhere. It is counted by method
// and code and logged (at most once a second), and the call log's own calls
// are not counted twice.
func TestUnparsedRequestsAreSeen(t *testing.T) {
	var logged syncBuffer
	c := start(t, testdb.SQLiteBackend(), func(o *server.Options) { o.Logger = slog.New(slog.NewJSONHandler(&logged, nil)) })
	// GetJobRequest{operation_key: "\xff\xfe"}: a string field that is not UTF-8.
	bad := []byte{0x12, 0x02, 0xff, 0xfe}
	var out []byte
	begun := time.Now()
	for range 3 {
		err := c.conn.Invoke(ctxFor(t), "/jobfence.v1.Coordinator/GetJob", bad, &out, grpc.ForceCodec(rawCodec{}))
		if status.Code(err) != codes.Internal {
			t.Fatalf("a request that does not parse: %v, want INTERNAL", err)
		}
	}
	if _, err := c.client.ListJobs(ctxFor(t), &pb.ListJobsRequest{PageSize: -1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("ListJobs(page_size -1): %v", err)
	}
	refused := func() float64 {
		families, err := c.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		total := 0.0
		for _, f := range families {
			if f.GetName() == "jobfence_calls_refused_unparsed_total" {
				for _, m := range f.GetMetric() {
					total += m.GetCounter().GetValue()
				}
			}
		}
		return total
	}
	// A refusal is counted, then logged: wait for both.
	lines := func() int { return strings.Count(logged.String(), "call refused before it reached the service") }
	deadline := time.Now().Add(5 * time.Second)
	for (refused() < 3 || lines() == 0) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := refused(); n != 3 {
		t.Fatalf("%v unparsed calls counted, want 3 (and not the ListJobs the service refused)", n)
	}
	// Lines are logged a second apart at least, all since begun: 3
	// refusals within a second are one line, and a loaded machine that
	// took longer may log one more per second it took.
	n, took := lines(), time.Since(begun)
	if most := 1 + int(took/time.Second); n < 1 || n > most {
		t.Fatalf("%d log lines for 3 refusals within %s, want 1 to %d:\n%s", n, took.Round(time.Millisecond), most, logged.String())
	}
}
