package server

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// earlyRejects sees the calls grpc-go answers before any interceptor runs —
// a request that does not parse (malformed protobuf, invalid UTF-8 in a
// string field) is answered INTERNAL there, as gRPC's status table
// prescribes — and makes them seen: counted by method and code, and logged at
// most once a second with how many were left out. Every other call reaches
// the call log (logCalls), which marks it.
type earlyRejects struct {
	log     *slog.Logger
	counter *prometheus.CounterVec

	mu         sync.Mutex
	lastLog    time.Time
	suppressed int
}

// callMark is put in each call's context by TagRPC; the interceptors set it.
type callMark struct{ reached atomic.Bool }

type callMarkKey struct{}

// markReached notes that a call got past grpc-go's decoding to the
// interceptors.
func markReached(ctx context.Context) {
	if m, ok := ctx.Value(callMarkKey{}).(*callMark); ok {
		m.reached.Store(true)
	}
}

// TagRPC implements stats.Handler.
func (e *earlyRejects) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, callMarkKey{}, &callMark{})
}

// HandleRPC implements stats.Handler.
func (e *earlyRejects) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok || end.Error == nil {
		return
	}
	if m, ok := ctx.Value(callMarkKey{}).(*callMark); !ok || m.reached.Load() {
		return
	}
	method, _ := grpc.Method(ctx)
	st := status.Convert(end.Error)
	e.counter.WithLabelValues(method, st.Code().String()).Inc()
	e.mu.Lock()
	now := time.Now()
	if now.Sub(e.lastLog) < time.Second {
		e.suppressed++
		e.mu.Unlock()
		return
	}
	suppressed := e.suppressed
	e.lastLog, e.suppressed = now, 0
	e.mu.Unlock()
	e.log.LogAttrs(ctx, slog.LevelWarn, "call refused before it reached the service (the request did not parse)",
		slog.String("grpc.method", method), slog.String("grpc.code", st.Code().String()),
		slog.String("grpc.error", st.Message()), slog.Int("also_refused_since_last_line", suppressed))
}

// TagConn implements stats.Handler.
func (e *earlyRejects) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

// HandleConn implements stats.Handler.
func (e *earlyRejects) HandleConn(context.Context, stats.ConnStats) {}
