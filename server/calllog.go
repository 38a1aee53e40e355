package server

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// logCalls logs every finished unary call at its code's level (codeToLevel)
// as "finished call", with the fields of go-grpc-middleware's logging
// interceptor: protocol, grpc.component, grpc.service, grpc.method,
// grpc.method_type, peer.address, grpc.start_time, grpc.request.deadline,
// grpc.code, grpc.error and grpc.time_ms. Unlike that interceptor it builds
// nothing for a call whose level is off: successful calls log at debug, and
// building their fields anyway cost a busy coordinator about 6 % of its CPU.
func (s *Server) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo,
	handler grpc.UnaryHandler) (any, error) {
	markReached(ctx)
	start := time.Now()
	resp, err := handler(ctx, req)
	s.logFinished(ctx, info.FullMethod, "unary", start, err)
	return resp, err
}

// logStreams is logCalls for streams (the worker stream): one line when the
// stream ends. The calls a worker stream carries are logged as the unary
// handlers log them.
func (s *Server) logStreams(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	markReached(ss.Context())
	start := time.Now()
	err := handler(srv, ss)
	s.logFinished(ss.Context(), info.FullMethod, "bidi_stream", start, err)
	return err
}

// logFinished logs one finished call, unless its code's level is off. A
// call refused in bulk (refusedInBulk) is counted and logged in aggregate
// instead (refusedCalls), its own line at debug.
func (s *Server) logFinished(ctx context.Context, fullMethod, methodType string, start time.Time, err error) {
	code := status.Code(err)
	level := codeToLevel(code)
	if kind := refusedInBulk(err); kind != "" {
		s.metrics.refused.WithLabelValues(kind).Inc()
		s.refused.note(ctx, s.log, kind, fullMethod, err)
		level = slog.LevelDebug
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	elapsed := time.Since(start)
	service, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	attrs := make([]slog.Attr, 0, 11)
	attrs = append(attrs, slog.String("protocol", "grpc"), slog.String("grpc.component", "server"),
		slog.String("grpc.service", service), slog.String("grpc.method", method),
		slog.String("grpc.method_type", methodType))
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, slog.String("peer.address", p.Addr.String()))
	}
	attrs = append(attrs, slog.String("grpc.start_time", start.Format(time.RFC3339)))
	if d, ok := ctx.Deadline(); ok {
		attrs = append(attrs, slog.String("grpc.request.deadline", d.Format(time.RFC3339)))
	}
	attrs = append(attrs, slog.String("grpc.code", code.String()))
	if err != nil {
		attrs = append(attrs, slog.String("grpc.error", err.Error()))
	}
	attrs = append(attrs, slog.Float64("grpc.time_ms", float64(elapsed.Microseconds())/1000))
	s.log.LogAttrs(ctx, level, "finished call", attrs...)
}

// codeToLevel keeps successful calls at debug (a busy coordinator serves
// thousands a second) and rejected writes at info: they are the fencing doing
// its job, not faults.
func codeToLevel(c codes.Code) slog.Level {
	switch c {
	case codes.OK, codes.Canceled:
		return slog.LevelDebug
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition,
		codes.DeadlineExceeded, codes.Unauthenticated, codes.PermissionDenied:
		return slog.LevelInfo
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// refusedInBulk names the kinds of refusal a client can make by the
// thousand a second — past its share of calls (TOO_MANY_CALLS), or with a
// token that is no credential's — which are logged in aggregate: a line per
// call would cost the coordinator more than the refusal. "" for any other.
func refusedInBulk(err error) string {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return ""
	}
	switch st.Code() {
	case codes.Unauthenticated:
		return "unauthenticated"
	case codes.ResourceExhausted:
		for _, d := range st.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok && i.GetReason() == ReasonTooManyCalls {
				return "too_many_calls"
			}
		}
	}
	return ""
}

// refusedCallsInterval is how often the log says, per kind of refusal and
// caller, how many calls were refused.
const refusedCallsInterval = 10 * time.Second

// refusedCalls logs refusals in bulk in aggregate: the first of a kind and
// caller (its address: a refused call may carry no credential) at once, then at most one line
// per refusedCallsInterval with the count since the last line. The exact
// counts are jobfence_calls_refused_total. Safe for concurrent use.
type refusedCalls struct {
	mu     sync.Mutex
	byKey  map[refusalKey]*refusalCount
	pruned time.Time
}

type refusalKey struct{ kind, caller string }

type refusalCount struct {
	logged time.Time
	since  int // refused since the last line
}

// note counts one refusal of kind and logs it when its key's line is due.
func (r *refusedCalls) note(ctx context.Context, log *slog.Logger, kind, fullMethod string, err error) {
	caller := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		caller = p.Addr.String()
		if host, _, splitErr := net.SplitHostPort(caller); splitErr == nil {
			caller = host
		}
	}
	now := time.Now()
	r.mu.Lock()
	if r.byKey == nil {
		r.byKey = map[refusalKey]*refusalCount{}
	}
	if now.Sub(r.pruned) > refusedCallsInterval { // keys quiet for an interval are forgotten
		for k, c := range r.byKey {
			if now.Sub(c.logged) > refusedCallsInterval && c.since == 0 {
				delete(r.byKey, k)
			}
		}
		r.pruned = now
	}
	k := refusalKey{kind, caller}
	c := r.byKey[k]
	if c == nil {
		c = &refusalCount{}
		r.byKey[k] = c
	}
	c.since++
	due := c.logged.IsZero() || now.Sub(c.logged) >= refusedCallsInterval
	n := c.since
	if due {
		c.logged, c.since = now, 0
	}
	r.mu.Unlock()
	if due {
		log.LogAttrs(ctx, slog.LevelWarn, "calls refused", slog.String("kind", kind), slog.String("caller", caller),
			slog.Int("count", n), slog.String("last_method", fullMethod), slog.String("last_error", err.Error()))
	}
}
