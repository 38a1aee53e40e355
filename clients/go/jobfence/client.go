package jobfence

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// Defaults of a Client.
const (
	// DefaultCallTimeout bounds each call attempt whose context has no
	// earlier deadline.
	DefaultCallTimeout = 10 * time.Second
	// DefaultRetryAttempts is how many times a retry-safe call is tried in
	// all, the first included.
	DefaultRetryAttempts = 6
	// DefaultKeepaliveTime is how long a connection Dial made goes without
	// reading anything before it sends an HTTP/2 PING: the coordinator's
	// minimum (it answers pings more frequent than every 10 s with GOAWAY
	// "too_many_pings"), and grpc-go's too.
	DefaultKeepaliveTime = 10 * time.Second
	// DefaultKeepaliveTimeout is how long a PING waits for its answer before
	// the connection is declared dead and closed, failing every call and
	// stream on it with UNAVAILABLE.
	DefaultKeepaliveTimeout = 5 * time.Second
)

// Client is a typed client of the jobfence.v1.Coordinator service. It is safe
// for concurrent use.
//
// It retries only what is safe to repeat, with the same request, after an
// UNAVAILABLE error or a per-attempt timeout:
//
//   - Complete, Reschedule and Escalate: a write-back is idempotent for its
//     attempt, and a repeat whose first try had landed answers
//     Replayed=true, a success (R21);
//   - ReportObservation: the coordinator deduplicates receipts (R15);
//   - EnqueueRefund: the operation key makes it idempotent (R1);
//   - GetJob: a read.
//
// Claim is never retried: a claim whose outcome is unknown granted nothing
// the caller may act on (R7).
type Client struct {
	rpc    pb.CoordinatorClient
	conn   *grpc.ClientConn // nil when wrapping a caller's connection
	cfg    clientConfig
	jitter func() float64
}

type clientConfig struct {
	transport    credentials.TransportCredentials
	perRPC       []credentials.PerRPCCredentials
	dialOpts     []grpc.DialOption
	callTimeout  time.Duration
	attempts     int
	backoff      time.Duration
	maxBackoff   time.Duration
	log          *slog.Logger
	plainTokenOK bool
	tokens       []TokenSource
}

// Option configures a Client.
type Option func(*clientConfig)

// TokenSource returns the bearer token to send with one call. It is called
// for every call, so it may refresh the token.
type TokenSource func(ctx context.Context) (string, error)

// WithTLS makes Dial connect over TLS with cfg (nil: the system roots and
// defaults). Without it or WithTransportCredentials, Dial connects in
// plaintext, which is what the coordinator serves by default; put TLS in
// front of it in production.
func WithTLS(cfg *tls.Config) Option {
	return func(c *clientConfig) { c.transport = credentials.NewTLS(cfg) }
}

// WithTransportCredentials makes Dial use creds (e.g. ALTS, mTLS from a
// certificate watcher) for the connection.
func WithTransportCredentials(creds credentials.TransportCredentials) Option {
	return func(c *clientConfig) { c.transport = creds }
}

// WithBearerToken sends "authorization: Bearer <token>" with every call,
// the token taken from src per call. The token is only sent over a
// connection with transport security (WithTLS) unless WithPlaintextTokens is
// given; a call that would send it in plaintext fails with code
// UNAUTHENTICATED before anything is sent. An error from src fails the call
// with code UNAVAILABLE.
func WithBearerToken(src TokenSource) Option {
	return func(c *clientConfig) { c.tokens = append(c.tokens, src) }
}

// WithPlaintextTokens allows WithBearerToken's tokens over a plaintext
// connection: for loopback and for a local proxy that adds TLS.
func WithPlaintextTokens() Option {
	return func(c *clientConfig) { c.plainTokenOK = true }
}

// WithPerRPCCredentials attaches creds to every call (any
// credentials.PerRPCCredentials, e.g. an OAuth token source).
func WithPerRPCCredentials(creds credentials.PerRPCCredentials) Option {
	return func(c *clientConfig) { c.perRPC = append(c.perRPC, creds) }
}

// WithDialOptions adds gRPC dial options (interceptors, keepalive, a custom
// dialer…) to Dial's. They are applied after this package's own, so they may
// override them: grpc.WithKeepaliveParams replaces Dial's keepalive (see
// Dial).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *clientConfig) { c.dialOpts = append(c.dialOpts, opts...) }
}

// WithCallTimeout bounds each call attempt when the caller's context has no
// earlier deadline (default DefaultCallTimeout; 0 disables it). A Claim with
// a long-poll Wait gets Wait on top.
func WithCallTimeout(d time.Duration) Option {
	return func(c *clientConfig) { c.callTimeout = d }
}

// WithRetry sets how retry-safe calls (see Client) are repeated after
// UNAVAILABLE or a per-attempt timeout: up to attempts tries in all (1: no
// retry), waiting backoff before the second, doubling up to maxBackoff, with
// jitter. The caller's context bounds the whole. Defaults: 6 tries, 100ms,
// 2s.
func WithRetry(attempts int, backoff, maxBackoff time.Duration) Option {
	return func(c *clientConfig) { c.attempts, c.backoff, c.maxBackoff = attempts, backoff, maxBackoff }
}

// WithLogger logs every retry at level WARN (nil: no logging).
func WithLogger(l *slog.Logger) Option {
	return func(c *clientConfig) { c.log = l }
}

func newConfig(opts []Option) clientConfig {
	cfg := clientConfig{
		callTimeout: DefaultCallTimeout,
		attempts:    DefaultRetryAttempts,
		backoff:     100 * time.Millisecond,
		maxBackoff:  2 * time.Second,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.attempts < 1 {
		cfg.attempts = 1
	}
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// Dial returns a Client for the coordinator at target (e.g.
// "127.0.0.1:50051" or "dns:///coordinator:50051"). Like grpc.NewClient it
// does not connect yet: the first call does, and a coordinator that cannot be
// reached shows as ErrUnavailable there. Errors: an invalid target or
// options (from grpc.NewClient).
//
// The connection is kept alive with HTTP/2 pings: one after
// DefaultKeepaliveTime without reading anything, also while no call is in
// flight, and the connection is closed when one goes unanswered for
// DefaultKeepaliveTimeout. On Linux grpc-go also sets TCP_USER_TIMEOUT to
// that timeout, so data the peer's TCP leaves unacknowledged for 5 s closes
// the connection too. So a coordinator that vanished without a FIN or RST (a
// host gone, a path dropping packets) is noticed within about 5 s while the
// worker stream sends its heartbeats (every second), 15 s at most, where the
// Worker's writes would otherwise sit in the kernel's send buffer until TCP
// gives up some 15 minutes later: the worker stream ends UNAVAILABLE, the
// calls it carried are answered UNAVAILABLE and repeated (R21), and the
// Worker opens a new stream on a new connection.
//
// WithDialOptions(grpc.WithKeepaliveParams(...)) replaces these. The
// coordinator refuses pings more frequent than every 10 s (GOAWAY
// "too_many_pings"), and grpc-go raises a shorter Time to 10 s, a zero Time
// included; a zero Timeout is grpc-go's 20 s; Time:
// time.Duration(math.MaxInt64) turns keepalive off.
func Dial(target string, opts ...Option) (*Client, error) {
	cfg := newConfig(opts)
	transport := cfg.transport
	if transport == nil {
		transport = insecure.NewCredentials()
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		grpc.WithKeepaliveParams(dialKeepalive),
	}
	for _, p := range cfg.perRPC {
		dial = append(dial, grpc.WithPerRPCCredentials(p))
	}
	for _, src := range cfg.tokens {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{src: src, plaintextOK: cfg.plainTokenOK}))
	}
	conn, err := grpc.NewClient(target, append(dial, cfg.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("jobfence: dial %s: %w", target, err)
	}
	c := NewClient(conn, opts...)
	c.conn = conn
	return c, nil
}

// dialKeepalive is the keepalive of a connection Dial makes: pings also
// while no call is in flight, so that a dead coordinator is noticed before
// the next call.
var dialKeepalive = keepalive.ClientParameters{
	Time: DefaultKeepaliveTime, Timeout: DefaultKeepaliveTimeout, PermitWithoutStream: true,
}

// NewClient returns a Client on a connection the caller made and closes. The
// transport, token and dial options are the connection's business and are
// ignored here, keepalive included (give the connection Dial's, see Dial,
// so that a dead coordinator is noticed); the call timeout, retry and
// logger options apply.
func NewClient(conn grpc.ClientConnInterface, opts ...Option) *Client {
	return &Client{rpc: pb.NewCoordinatorClient(conn), cfg: newConfig(opts), jitter: rand.Float64}
}

// Close closes the connection made by Dial; it does nothing for a Client from
// NewClient. Errors: those of grpc.ClientConn.Close.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// bearer is a credentials.PerRPCCredentials sending a bearer token.
type bearer struct {
	src         TokenSource
	plaintextOK bool
}

func (b bearer) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if !b.plaintextOK {
		ri, _ := credentials.RequestInfoFromContext(ctx)
		if err := credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity); err != nil {
			// A status error keeps its code: this is permanent, not UNAVAILABLE.
			return nil, status.Errorf(codes.Unauthenticated,
				"jobfence: bearer token refused on a connection without TLS (WithPlaintextTokens allows it): %v", err)
		}
	}
	tok, err := b.src(ctx)
	if err != nil {
		return nil, fmt.Errorf("jobfence: bearer token: %w", err)
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

// RequireTransportSecurity is false so that WithPlaintextTokens can work;
// GetRequestMetadata enforces TLS itself otherwise.
func (b bearer) RequireTransportSecurity() bool { return false }

// callCtx bounds one call attempt.
func (c *Client) callCtx(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if c.cfg.callTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.callTimeout+extra)
}

// retrySafe runs fn, an RPC that is safe to repeat with the same request,
// until it succeeds, fails in a way a repeat cannot fix, or the tries or ctx
// run out. The last error is returned decoded.
func (c *Client) retrySafe(ctx context.Context, method string, fn func(ctx context.Context) error) error {
	wait := c.cfg.backoff
	for try := 1; ; try++ {
		cctx, cancel := c.callCtx(traceMetadata(ctx), 0)
		err := decodeError(fn(cctx))
		cancel()
		if err == nil || try >= c.cfg.attempts || !retryable(ctx, err) {
			return err
		}
		d := time.Duration(float64(wait) * (0.5 + c.jitter()))
		c.cfg.log.LogAttrs(ctx, slog.LevelWarn, "jobfence: repeating call", slog.String("method", method),
			slog.Int("try", try+1), slog.Duration("after", d), slog.String("error", err.Error()))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, c.cfg.maxBackoff)
	}
}

// retryable: UNAVAILABLE (transport, DATABASE_UNAVAILABLE, WRITE_OUTCOME_UNKNOWN)
// or an attempt that ran out of its own time while the caller still has
// some. Both leave the outcome unknown, which a repeat of the same request
// settles (R21).
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Code == codes.Unavailable || e.Code == codes.DeadlineExceeded
}

// EnqueueRequest describes a new refund job.
type EnqueueRequest struct {
	// OperationKey is the business idempotency key of the refund, sent to the
	// provider as Idempotency-Key (R1): 1..128 printable ASCII characters,
	// never containing an attempt number (R2).
	OperationKey string
	OrderID      string // 1..128 characters
	PaymentID    string // 1..128 characters
	AmountMinor  int64  // > 0, in the currency's minor unit
	Currency     string // ISO 4217, three upper-case letters
	Provider     string // 1..64 characters of [a-z0-9_-]
	// NotBefore delays the first attempt; zero: due now (database clock).
	NotBefore time.Time
}

// EnqueueRefund creates a ready refund job. Enqueuing the same operation key
// with the same values returns the existing job with created=false (R1), so
// the call is repeated after UNAVAILABLE.
//
// Errors: ErrKeyConflict when the key is bound to different values;
// *InvalidArgumentError; ErrUnavailable after the retries; *Error otherwise.
func (c *Client) EnqueueRefund(ctx context.Context, r EnqueueRequest) (job Job, created bool, err error) {
	req := &pb.EnqueueRefundRequest{
		OperationKey: r.OperationKey, OrderId: r.OrderID, PaymentId: r.PaymentID, AmountMinor: r.AmountMinor,
		Currency: r.Currency, Provider: r.Provider, NotBefore: timeToProto(r.NotBefore),
	}
	var resp *pb.EnqueueRefundResponse
	err = c.retrySafe(ctx, "EnqueueRefund", func(ctx context.Context) (err error) {
		resp, err = c.rpc.EnqueueRefund(ctx, req)
		return err
	})
	if err != nil {
		return Job{}, false, err
	}
	return jobFromProto(resp.GetJob()), resp.GetCreated(), nil
}

// ClaimRequest asks for jobs.
type ClaimRequest struct {
	WorkerID string // recorded in the history; 1..128 characters
	// MaxJobs is 1..100. Claim only what you can start now: a claimed job's
	// lease runs whether or not anyone works on it (R18).
	MaxJobs int
	// Lease is 1s..15m; zero: the coordinator's default (R17).
	Lease time.Duration
	// Provider limits the claim to jobs of this provider, when set.
	Provider string
	// Wait long-polls: when no job is available the coordinator waits up to
	// this long (0..60s) for one before answering with none.
	Wait time.Duration
}

// Claim asks for up to r.MaxJobs jobs: ready jobs that are due and running
// jobs whose lease expired (takeovers, R6). Each was granted by a committed
// transaction that bumped its attempt (R5). No work is an empty slice.
//
// Claim is never retried: on any error nothing may be acted on (R7). A job
// the failed call did grant comes back through a takeover once its lease
// expires.
//
// Errors: ErrClaimOutcomeUnknown (also ErrUnavailable); ErrUnavailable;
// *InvalidArgumentError; context errors; *Error otherwise.
func (c *Client) Claim(ctx context.Context, r ClaimRequest) ([]ClaimedJob, error) {
	req := &pb.ClaimRequest{WorkerId: r.WorkerID, MaxJobs: int32(min(max(r.MaxJobs, math.MinInt32), math.MaxInt32)), Provider: r.Provider}
	if r.Lease != 0 {
		req.LeaseDuration = durationpb.New(r.Lease)
	}
	if r.Wait != 0 {
		req.Wait = durationpb.New(r.Wait)
	}
	cctx, cancel := c.callCtx(traceMetadata(ctx), max(r.Wait, 0))
	defer cancel()
	resp, err := c.rpc.Claim(cctx, req)
	if err != nil {
		return nil, decodeError(err)
	}
	if len(resp.GetJobs()) == 0 && resp.GetRetryAfter() != nil {
		return nil, &BudgetExhaustedError{RetryAfter: resp.GetRetryAfter().AsDuration()}
	}
	received := time.Now()
	jobs := make([]ClaimedJob, len(resp.GetJobs()))
	for i, j := range resp.GetJobs() {
		jobs[i] = claimedFromProto(j, received)
	}
	return jobs, nil
}

// CompleteRequest marks a running job succeeded.
type CompleteRequest struct {
	JobID      int64
	Attempt    int64      // the attempt granted by Claim
	LeaseToken LeaseToken // the grant's token, from the same ClaimedJob (R25)
	// ProviderRefundID is the provider's id of the refund; required.
	ProviderRefundID string
}

// Complete moves a running job to succeeded and records the refund, if
// r.Attempt and r.LeaseToken are still the job's current grant (R9, R10, R25). It is repeated with
// the same request after UNAVAILABLE; a repeat whose first try had landed
// returns Replayed=true (R21).
//
// Errors: *StaleAttemptError (ErrStaleAttempt) when the request does not carry
// the job's current grant (taken over, or another token) — never repeat it,
// not even with the StaleAttemptError's current attempt: file the provider's
// answer with ReportObservation (R15);
// *JobNotRunningError (ErrJobNotRunning) when this attempt already wrote a
// different outcome; ErrNotFound; *InvalidArgumentError; ErrUnavailable
// (ErrWriteOutcomeUnknown, ErrDatabaseUnavailable) after the retries.
func (c *Client) Complete(ctx context.Context, r CompleteRequest) (WriteResult, error) {
	req := &pb.CompleteRequest{JobId: r.JobID, Attempt: r.Attempt, LeaseToken: string(r.LeaseToken),
		ProviderRefundId: r.ProviderRefundID}
	var resp *pb.CompleteResponse
	err := c.retrySafe(ctx, "Complete", func(ctx context.Context) (err error) {
		resp, err = c.rpc.Complete(ctx, req)
		return err
	})
	if err != nil {
		return WriteResult{}, err
	}
	return WriteResult{Job: jobFromProto(resp.GetJob()), Replayed: resp.GetReplayed()}, nil
}

// RescheduleRequest hands a running job back for a later attempt.
type RescheduleRequest struct {
	JobID      int64
	Attempt    int64
	LeaseToken LeaseToken
	// NextAction is reconcile when empty. Choose refund only when the
	// provider definitely did not act on the request, or a reconcile found a
	// same-key resend safe (R14).
	NextAction NextAction
	// Delay (0..30 days, from the database's now) or At (absolute, wins over
	// Delay) says when; neither: due now.
	Delay time.Duration
	At    time.Time
	// Reason is kept in the history; up to 1024 characters.
	Reason string
}

// Reschedule moves a running job back to ready, fenced by its grant exactly
// like Complete, and is repeated after UNAVAILABLE the same way (R21).
//
// Errors: as Complete.
func (c *Client) Reschedule(ctx context.Context, r RescheduleRequest) (WriteResult, error) {
	req := &pb.RescheduleRequest{JobId: r.JobID, Attempt: r.Attempt, LeaseToken: string(r.LeaseToken),
		NextAction: actionToProto(r.NextAction), Reason: r.Reason}
	switch {
	case !r.At.IsZero():
		req.When = &pb.RescheduleRequest_NextAttemptAt{NextAttemptAt: timeToProto(r.At)}
	case r.Delay != 0:
		req.When = &pb.RescheduleRequest_Delay{Delay: durationpb.New(r.Delay)}
	}
	var resp *pb.RescheduleResponse
	err := c.retrySafe(ctx, "Reschedule", func(ctx context.Context) (err error) {
		resp, err = c.rpc.Reschedule(ctx, req)
		return err
	})
	if err != nil {
		return WriteResult{}, err
	}
	return WriteResult{Job: jobFromProto(resp.GetJob()), Replayed: resp.GetReplayed()}, nil
}

// EscalateRequest stops automatic handling of a running job.
type EscalateRequest struct {
	JobID      int64
	Attempt    int64
	LeaseToken LeaseToken
	// Reason tells a person why they must look; required, up to 1024
	// characters.
	Reason string
}

// Escalate moves a running job to manual_review (R14, R16), fenced by its
// grant exactly like Complete, and is repeated after UNAVAILABLE the same way
// (R21).
//
// Errors: as Complete.
func (c *Client) Escalate(ctx context.Context, r EscalateRequest) (WriteResult, error) {
	req := &pb.EscalateRequest{JobId: r.JobID, Attempt: r.Attempt, LeaseToken: string(r.LeaseToken), Reason: r.Reason}
	var resp *pb.EscalateResponse
	err := c.retrySafe(ctx, "Escalate", func(ctx context.Context) (err error) {
		resp, err = c.rpc.Escalate(ctx, req)
		return err
	})
	if err != nil {
		return WriteResult{}, err
	}
	return WriteResult{Job: jobFromProto(resp.GetJob()), Replayed: resp.GetReplayed()}, nil
}

// ObservationRequest is one receipt to file (R15).
type ObservationRequest struct {
	// JobID names the job; when zero, OperationKey does.
	JobID        int64
	OperationKey string
	// Attempt is the attempt the reporter held; 0 when it held none
	// (webhook, reconciler). LeaseToken, that grant's token, marks the
	// receipt attempt_verified; it is filed without it too.
	Attempt    int64
	LeaseToken LeaseToken
	// Source says who saw it, e.g. "worker:w-7" or "webhook"; 1..128
	// characters.
	Source           string
	Outcome          Outcome
	ProviderRefundID string
	// ProviderEventID, when set, alone deduplicates the receipt.
	ProviderEventID string
	// Detail is free text, up to 4096 characters.
	Detail string
}

// ReportObservation files what a worker, webhook or reconciler learned from
// the provider. It is accepted from stale workers too and never changes the
// job (R15); the same receipt filed twice is kept once (duplicate=true), so
// the call is repeated after UNAVAILABLE.
//
// Errors: ErrNotFound; *InvalidArgumentError; ErrUnavailable after the
// retries; *Error otherwise.
func (c *Client) ReportObservation(ctx context.Context, r ObservationRequest) (obs Observation, duplicate bool, err error) {
	req := &pb.ReportObservationRequest{
		Attempt: r.Attempt, LeaseToken: string(r.LeaseToken), Source: r.Source, Outcome: outcomeToProto(r.Outcome),
		ProviderRefundId: r.ProviderRefundID, ProviderEventId: r.ProviderEventID, Detail: r.Detail,
	}
	if r.JobID != 0 {
		req.Job = &pb.ReportObservationRequest_JobId{JobId: r.JobID}
	} else {
		req.Job = &pb.ReportObservationRequest_OperationKey{OperationKey: r.OperationKey}
	}
	var resp *pb.ReportObservationResponse
	err = c.retrySafe(ctx, "ReportObservation", func(ctx context.Context) (err error) {
		resp, err = c.rpc.ReportObservation(ctx, req)
		return err
	})
	if err != nil {
		return Observation{}, false, err
	}
	obs = observationFromProto(resp.GetObservation())
	obs.KeptAsideID = resp.GetKeptAside().GetId()
	return obs, resp.GetDuplicate(), nil
}

// GetJob returns the job with this id, its history and its observations.
//
// Errors: ErrNotFound; *InvalidArgumentError; ErrUnavailable after the
// retries; *Error otherwise.
func (c *Client) GetJob(ctx context.Context, jobID int64) (JobDetail, error) {
	return c.getJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: jobID}})
}

// GetJobByKey returns the job with this operation key, its history and its
// observations.
//
// Errors: as GetJob.
func (c *Client) GetJobByKey(ctx context.Context, operationKey string) (JobDetail, error) {
	return c.getJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_OperationKey{OperationKey: operationKey}})
}

func (c *Client) getJob(ctx context.Context, req *pb.GetJobRequest) (JobDetail, error) {
	var resp *pb.GetJobResponse
	err := c.retrySafe(ctx, "GetJob", func(ctx context.Context) (err error) {
		resp, err = c.rpc.GetJob(ctx, req)
		return err
	})
	if err != nil {
		return JobDetail{}, err
	}
	d := JobDetail{Job: jobFromProto(resp.GetJob()), ObservationCount: resp.GetObservationCount()}
	for _, e := range resp.GetEvents() {
		d.Events = append(d.Events, eventFromProto(e))
	}
	for _, o := range resp.GetObservations() {
		d.Observations = append(d.Observations, observationFromProto(o))
	}
	return d, nil
}

// MaxRenewBatch is the most grants one RenewLeases call renews.
const MaxRenewBatch = 100

// Grant names a grant to renew: the job, the attempt Claim granted and its
// lease token (R25).
type Grant struct {
	JobID      int64
	Attempt    int64
	LeaseToken LeaseToken
}

// GrantOf is the grant c holds.
func GrantOf(c ClaimedJob) Grant {
	return Grant{JobID: c.Job.ID, Attempt: c.Attempt, LeaseToken: c.LeaseToken}
}

// Renewal answers the renewal of one grant (R27).
type Renewal struct {
	JobID   int64
	Attempt int64
	// LeaseUntil is the lease's new end (database clock); zero when refused.
	LeaseUntil time.Time
	// Refused is why the grant was not renewed, nil when it was: an *Error
	// matching ErrStaleAttempt (taken over, or not this grant: stop before
	// sending anything new to the provider, and file any answer already
	// received as an observation, R15), ErrJobNotRunning (this grant
	// already wrote its outcome), ErrGrantTooOld (renew no more; the lease
	// runs out and the job is taken over) or ErrNotFound.
	Refused error
	// GrantExpiresAt is the end of the grant's life: no renewal extends its
	// lease past it. Zero unless the job runs under this grant.
	GrantExpiresAt time.Time
	// ReceiptFiledAt is when the newest receipt of success or failure was
	// filed for the job during this grant, if one was (R28): what the
	// provider told someone else while this holder worked.
	ReceiptFiledAt time.Time
}

// RenewLeases extends the leases of grants this process holds, up to
// MaxRenewBatch in one call, each to lease from the coordinator's now (zero:
// the coordinator's default lease), never past its grant's life (R27). Each
// grant is fenced like a write-back and answered on its own, in order. It is
// safe to repeat and is retried after UNAVAILABLE. Errors (the whole call):
// ErrInvalidArgument (the field named: grants, grants[i].job_id,
// lease_duration), ErrUnavailable, ErrPermissionDenied, ErrUnauthenticated.
func (c *Client) RenewLeases(ctx context.Context, grants []Grant, lease time.Duration) ([]Renewal, error) {
	req := &pb.RenewLeasesRequest{Grants: make([]*pb.GrantRef, len(grants))}
	for i, g := range grants {
		req.Grants[i] = &pb.GrantRef{JobId: g.JobID, Attempt: g.Attempt, LeaseToken: string(g.LeaseToken)}
	}
	if lease != 0 {
		req.LeaseDuration = durationpb.New(lease)
	}
	var resp *pb.RenewLeasesResponse
	err := c.retrySafe(ctx, "RenewLeases", func(ctx context.Context) (err error) {
		resp, err = c.rpc.RenewLeases(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]Renewal, len(resp.GetRenewals()))
	for i, r := range resp.GetRenewals() {
		out[i] = Renewal{JobID: r.GetJobId(), Attempt: r.GetAttempt(), LeaseUntil: timeFromProto(r.GetLeaseUntil()),
			GrantExpiresAt: timeFromProto(r.GetGrantExpiresAt()), ReceiptFiledAt: timeFromProto(r.GetReceiptFiledAt())}
		if r.GetRefused() != pb.ErrorReason_ERROR_REASON_UNSPECIFIED {
			out[i].Refused = refusal(r)
		}
	}
	return out, nil
}

// refusal decodes a grant's refusal exactly as the same refusal of a
// write-back would decode (R24: by reason, never by message): a
// *StaleAttemptError for STALE_ATTEMPT, and so on.
func refusal(r *pb.LeaseRenewal) error {
	code := codes.FailedPrecondition
	if r.GetRefused() == pb.ErrorReason_ERROR_REASON_NOT_FOUND {
		code = codes.NotFound
	}
	st, err := status.New(code, r.GetMessage()).WithDetails(&errdetails.ErrorInfo{Domain: ErrorDomain,
		Reason: reasonName(r.GetRefused()), Metadata: r.GetMetadata()})
	if err != nil {
		return decodeError(status.Error(code, r.GetMessage()))
	}
	return decodeError(st.Err())
}
