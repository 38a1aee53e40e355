// Command otlpsink is an OTLP trace receiver that counts what it is sent and
// keeps nothing: the far end of a coordinator traced at 100 % sampling in a
// benchmark (docs/BENCHMARKS.md), so that the cost measured is the
// coordinator's own, exporter included, and not a collector's.
//
//	go run ./bench/otlpsink --listen 127.0.0.1:4317
//
// It prints the spans and requests received every --every, and at SIGINT or
// SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

type sink struct {
	collectortrace.UnimplementedTraceServiceServer
	spans, requests atomic.Int64
}

func (s *sink) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	n := 0
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			n += len(ss.GetSpans())
		}
	}
	s.spans.Add(int64(n))
	s.requests.Add(1)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:4317", "the address to receive OTLP/gRPC traces on")
	every := flag.Duration("every", 10*time.Second, "how often to print the counts; 0: only at the end")
	flag.Parse()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("--listen %s: %v", *listen, err)
	}
	s := &sink{}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	collectortrace.RegisterTraceServiceServer(gs, s)
	go gs.Serve(lis) //nolint:errcheck // ends with Stop
	print := func() { fmt.Printf("otlpsink spans=%d requests=%d\n", s.spans.Load(), s.requests.Load()) }
	fmt.Printf("otlpsink listening on %s\n", lis.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var tick <-chan time.Time
	if *every > 0 {
		t := time.NewTicker(*every)
		defer t.Stop()
		tick = t.C
	}
	for done := false; !done; {
		select {
		case <-tick:
			print()
		case <-ctx.Done():
			done = true
		}
	}
	gs.Stop()
	print()
}
