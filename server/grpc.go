package server

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// NewGRPCServer returns a grpc.Server serving s with health checking and
// server reflection (so `grpcurl -plaintext HOST:PORT list` works without
// proto files), call logging, panic recovery and, with a tracer provider,
// OpenTelemetry spans for every call but health checks and reflection
// (trace.go). The health server reports
// SERVING; set it to NOT_SERVING before a graceful stop.
func (s *Server) NewGRPCServer(extra ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	recoverer := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		s.log.ErrorContext(ctx, "panic in handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	unary := []grpc.UnaryServerInterceptor{
		s.metrics.grpc.UnaryServerInterceptor(),
		s.logCalls,
		recovery.UnaryServerInterceptor(recoverer),
	}
	streams := []grpc.StreamServerInterceptor{
		s.metrics.grpc.StreamServerInterceptor(),
		s.logStreams,
		recovery.StreamServerInterceptor(recoverer),
	}
	if s.opts.Auth != nil {
		unary = append(unary, s.opts.Auth.interceptor())
		streams = append(streams, s.opts.Auth.streamInterceptor())
	}
	opts := []grpc.ServerOption{}
	if s.tracer != nil {
		// First: the calls' spans start before any interceptor runs, so
		// that the call log's lines carry their trace (R35).
		opts = append(opts, grpc.StatsHandler(s.statsHandler()))
	}
	opts = append(append(opts,
		grpc.ChainUnaryInterceptor(unary...),
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		// Bounded before authentication: grpc-go would otherwise take header
		// lists of up to 16 MiB from anyone who connects (a flood of them grew
		// a coordinator past 2.9 GB although every call was refused).
		grpc.MaxHeaderListSize(MaxHeaderBytes),
		grpc.MaxConcurrentStreams(MaxStreamsPerConn),
		// Dead peers (a killed worker's half-open connection) are found and
		// closed; clients may ping every 10 s, and while idle.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.NumStreamWorkers(streamWorkers),
		grpc.ChainStreamInterceptor(streams...),
		grpc.StatsHandler(&earlyRejects{log: s.log, counter: s.metrics.earlyRejects}),
	), extra...)
	gs := grpc.NewServer(opts...)
	s.Register(gs)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(pb.Coordinator_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	s.metrics.grpc.InitializeMetrics(gs)
	return gs, hs
}

// MaxMessageBytes bounds a request's message: the largest valid one (an
// observation with a 4 KiB detail) is far below it.
const MaxMessageBytes = 64 << 10

// MaxHeaderBytes bounds a request's header list (HTTP/2
// SETTINGS_MAX_HEADER_LIST_SIZE, counted as HPACK does: names, values and 32
// bytes per field): a bearer token and gRPC's own headers take a few hundred
// bytes. A larger list is refused (RST_STREAM) before anything reads it, so a
// whole request costs at most MaxHeaderBytes + MaxMessageBytes.
const MaxHeaderBytes = 8 << 10

// MaxStreamsPerConn bounds the calls in flight on one connection: a worker
// needs one long poll and its write-backs, a load balancer a few hundred.
const MaxStreamsPerConn = 1024

// streamWorkers is how many goroutines serve calls and stay for the next:
// a new goroutine per call grows its stack again every time, a few percent
// of a busy coordinator's CPU. A call that finds them all busy gets a
// goroutine of its own, as without workers.
const streamWorkers = 64

// WatchDatabase keeps hs in step with the database until ctx ends: the
// coordinator reports NOT_SERVING while its database does not answer a ping
// (every every, each given at most every to answer), and SERVING once it
// does again, so that load balancers and orchestrators route around a
// coordinator that could only answer UNAVAILABLE. It logs each change. After
// hs.Shutdown the status stays NOT_SERVING.
func (s *Server) WatchDatabase(ctx context.Context, hs *health.Server, every time.Duration) {
	serving := true
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		err := s.store.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if ok := err == nil; ok != serving {
			serving = ok
			status := healthpb.HealthCheckResponse_SERVING
			if ok {
				s.log.Info("database answers again: serving")
			} else {
				status = healthpb.HealthCheckResponse_NOT_SERVING
				s.log.Warn("database does not answer: health NOT_SERVING until it does", "error", err.Error())
			}
			hs.SetServingStatus("", status)
			hs.SetServingStatus(pb.Coordinator_ServiceDesc.ServiceName, status)
		}
	}
}
