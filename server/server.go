// Package server is the gRPC face of the coordinator: it translates
// jobfence.v1 messages to store calls and store errors to gRPC statuses, and
// coalesces concurrent calls into shared transactions. It keeps no job state
// of its own; every decision about a job is made by the store under the
// database's row locks and clock.
package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jobfence/jobfence/dispatch"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/tracing"
)

// Options configure a Server.
type Options struct { // zero fields take Defaults
	// Lease is used when a Claim names no lease_duration (R17).
	Lease time.Duration
	// KeyRetention is how long a provider keeps an idempotency key, unless
	// ProviderKeyRetention names the provider. Same-key resends are safe only
	// inside it (R14, R22).
	KeyRetention         time.Duration
	ProviderKeyRetention map[string]time.Duration
	// MaxGrantAge bounds how long renewals may keep one grant alive, from
	// its claim (R27): past it RenewLeases answers GRANT_TOO_OLD, the lease
	// runs out and the job is taken over.
	MaxGrantAge time.Duration
	// ClaimPollInterval is how often a long-polling Claim looks again for work
	// it was not woken for: jobs enqueued through other replicas, delays that
	// ran out, leases that expired. Waiting Claims look together, at the
	// multiples of it on the clock (dispatch.Dispatcher.Claim).
	ClaimPollInterval time.Duration
	// WriteFlushers is how many enqueue, how many write-back and how many
	// claim transactions may run at once: one runs calls as they come, and
	// calls arriving meanwhile share its next transaction of up to
	// WriteBatch enqueues or write-backs (claims: up to 16); the others only
	// take queued calls while that transaction has run for 20ms (a slow or
	// stalled one).
	WriteFlushers int
	WriteBatch    int
	// CoalesceWindow is the longest an enqueue, write-back or renewal
	// transaction is held open for more calls when they come at least twice
	// per window (dispatch.Options.Window; claims are never held); negative
	// never.
	CoalesceWindow time.Duration
	// Auth authenticates and authorises every call but health checks and
	// reflection; nil runs open (for loopback only: the command refuses
	// anything else).
	Auth *Authenticator
	// Metrics records what operators watch; when nil the metrics are kept on
	// a private registry nobody scrapes.
	Metrics *Metrics
	// Logger receives one line per notable event about a job; slog.Default()
	// when nil.
	Logger *slog.Logger
	// MaxReads and MaxReadsPerCredential bound the expensive reads (a
	// ListJobs that filters its walk by reason or creation time, which may
	// read every row it filters; GetOverview when not cached) in flight on
	// this coordinator and per credential: past them a read answers
	// RESOURCE_EXHAUSTED (TOO_MANY_CALLS) with a RetryInfo, so that readers
	// cannot take the database from claims and write-backs.
	MaxReads, MaxReadsPerCredential int
	// ReadsPerSecond and ReadsPerSecondPerCredential bound how many
	// expensive reads start each second (token buckets with a burst of as
	// many): what bounds the database time readers take, since one read of
	// a filter that matches nothing walks every row it filters.
	ReadsPerSecond, ReadsPerSecondPerCredential float64
	// MaxStreams and MaxStreamsPerCredential bound the worker streams open
	// on this coordinator and per credential (each holds a few goroutines
	// and buffers): past them Work answers RESOURCE_EXHAUSTED
	// (TOO_MANY_CALLS).
	MaxStreams, MaxStreamsPerCredential int
	// TracerProvider, when set, traces the calls, the grants, the
	// write-backs and the shared transactions (R35, trace.go); nil traces
	// nothing and costs nothing. An enqueue stores its caller's trace
	// context either way.
	TracerProvider trace.TracerProvider
}

// MaxClaimWait bounds ClaimRequest.wait.
const MaxClaimWait = time.Minute

// Server implements jobfence.v1.Coordinator on a store.Store: it translates
// messages and statuses; the Dispatcher coalesces the calls into
// transactions and parks idle long polls.
type Server struct {
	pb.UnimplementedCoordinatorServer
	store    store.Store
	dispatch *dispatch.Dispatcher
	opts     Options
	log      *slog.Logger
	metrics  *Metrics
	// tracer traces grants and write-backs; nil when tracing is off.
	tracer trace.Tracer
	// draining is closed by Drain: worker streams end, their calls answered.
	draining  chan struct{}
	drainOnce sync.Once
	// stale keeps the write-backs this coordinator refused as
	// STALE_ATTEMPT, for GetOverview: a refusal leaves nothing in the
	// database.
	stale *staleLog
	// reads and streams bound expensive reads and worker streams in flight
	// (Options.MaxReads, Options.MaxStreams); overview keeps GetOverview's
	// answers for overviewTTL.
	reads, streams *callLimit
	overview       overviewCache
	// activity keeps GetActivity's answers for activityTTL, per window.
	activity ttlCache[int, *pb.GetActivityResponse]
	// refused logs the calls refused in bulk in aggregate.
	refused refusedCalls
	// stopPauses ends watchPauses; pausesDone is closed when it has.
	stopPauses context.CancelFunc
	pausesDone chan struct{}
}

// Defaults are the options a zero field of Options takes, and the defaults
// of the coordinator's flags: one place for both.
var Defaults = Options{
	Lease:             30 * time.Second,
	KeyRetention:      24 * time.Hour,
	MaxGrantAge:       store.DefaultMaxGrantAge,
	ClaimPollInterval: dispatch.Defaults.PollInterval,
	WriteFlushers:     dispatch.Defaults.Flushers,
	WriteBatch:        dispatch.Defaults.MaxBatch,
	CoalesceWindow:    dispatch.Defaults.Window,

	MaxReads:                    4,
	MaxReadsPerCredential:       2,
	ReadsPerSecond:              20,
	ReadsPerSecondPerCredential: 5,
	MaxStreams:                  2000,
	MaxStreamsPerCredential:     500,
}

// New returns a Server on st. Zero options take Defaults.
func New(st store.Store, opts Options) *Server {
	setDefault := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	setDefault(&opts.Lease, Defaults.Lease)
	setDefault(&opts.KeyRetention, Defaults.KeyRetention)
	setDefault(&opts.MaxGrantAge, Defaults.MaxGrantAge)
	setDefault(&opts.ClaimPollInterval, Defaults.ClaimPollInterval)
	if opts.WriteFlushers == 0 {
		opts.WriteFlushers = Defaults.WriteFlushers
	}
	for _, v := range []struct {
		opt *int
		def int
	}{
		{&opts.WriteBatch, Defaults.WriteBatch}, {&opts.MaxReads, Defaults.MaxReads},
		{&opts.MaxReadsPerCredential, Defaults.MaxReadsPerCredential}, {&opts.MaxStreams, Defaults.MaxStreams},
		{&opts.MaxStreamsPerCredential, Defaults.MaxStreamsPerCredential},
	} {
		if *v.opt == 0 {
			*v.opt = v.def
		}
	}
	if opts.ReadsPerSecond == 0 {
		opts.ReadsPerSecond = Defaults.ReadsPerSecond
	}
	if opts.ReadsPerSecondPerCredential == 0 {
		opts.ReadsPerSecondPerCredential = Defaults.ReadsPerSecondPerCredential
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(prometheus.NewRegistry(), st)
	}
	m := opts.Metrics
	s := &Server{store: st, opts: opts, log: opts.Logger, metrics: m, stale: &staleLog{started: time.Now()},
		draining: make(chan struct{}),
		reads: newCallLimit("expensive reads (ListJobs filtered by reason or time, GetOverview, GetActivity)", opts.MaxReadsPerCredential, opts.MaxReads,
			time.Second).withRates(opts.ReadsPerSecondPerCredential, opts.ReadsPerSecond),
		streams: newCallLimit("worker streams", opts.MaxStreamsPerCredential, opts.MaxStreams, 5*time.Second),
		dispatch: dispatch.New(st, dispatch.Options{PollInterval: opts.ClaimPollInterval,
			Flushers: opts.WriteFlushers, MaxBatch: opts.WriteBatch, Window: opts.CoalesceWindow, Logger: opts.Logger,
			TracerProvider: opts.TracerProvider,
			Metrics: dispatch.Metrics{ClaimTx: m.claimTxBatch, WriteBatch: m.writeBatch, EnqueueBatch: m.enqueueBatch,
				RenewBatch: m.renewBatch, Holds: m.batchHolds,
				Handoffs: m.handoffs, IdleLooks: m.idleLooks}}),
		pausesDone: make(chan struct{})}
	if opts.TracerProvider != nil {
		s.tracer = opts.TracerProvider.Tracer(tracing.ScopeName)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopPauses = cancel
	go func() {
		defer close(s.pausesDone)
		s.watchPauses(ctx)
	}()
	return s
}

// Drain makes waiting and future long-poll Claims return at once, and worker
// streams end once the calls they carry are answered (the workers open them
// again elsewhere), so that a graceful stop is not held up by idle workers.
// Call it before GracefulStop.
func (s *Server) Drain() {
	s.drainOnce.Do(func() { close(s.draining) })
	s.dispatch.Drain()
}

// Close stops the dispatcher's flushers; call it once the gRPC server has
// stopped.
func (s *Server) Close() {
	s.stopPauses()
	<-s.pausesDone
	s.dispatch.Close()
}

// Register adds the Coordinator service to r.
func (s *Server) Register(r grpc.ServiceRegistrar) { pb.RegisterCoordinatorServer(r, s) }

// EnqueueRefund implements jobfence.v1.Coordinator.
func (s *Server) EnqueueRefund(ctx context.Context, req *pb.EnqueueRefundRequest) (*pb.EnqueueRefundResponse, error) {
	p, err := enqueueFromProto(req)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{key: req.GetOperationKey()})
	}
	if id, ok := IdentityFrom(ctx); ok {
		p.Producer = id.Name // R32: a producer may cancel what it enqueued
	}
	// R35: the job carries its enqueue's trace, to every grant.
	p.TraceParent, p.TraceState = tracing.EnqueueContext(ctx)
	out, err := s.dispatch.Enqueue(ctx, p)
	if err == nil {
		err = out.Err
	}
	job, created := out.Job, out.Created
	reader := mayReadJobs(ctx)
	if err != nil {
		attrs := jobAttrs{key: p.OperationKey}
		if reader {
			attrs.id = job.ID // a conflict names the job to those who may look it up
		}
		err = s.toStatus(ctx, err, attrs)
		if s.tracer != nil {
			s.traceEnqueue(ctx, p, job, created, err)
		}
		return nil, err
	}
	if s.tracer != nil {
		s.traceEnqueue(ctx, p, job, created, nil)
	}
	if created && s.log.Enabled(ctx, slog.LevelDebug) { // the attributes cost more than the call's own work
		s.log.LogAttrs(ctx, slog.LevelDebug, "refund enqueued", attrsOf(job).attrs()...)
	}
	pj := jobToProto(job)
	if !reader {
		producerView(pj)
	}
	return &pb.EnqueueRefundResponse{Job: pj, Created: created}, nil
}

// mayReadJobs reports whether ctx's caller may read jobs (GetJob): a reader
// or an operator, or anyone on a coordinator without credentials.
func mayReadJobs(ctx context.Context) bool {
	id, ok := IdentityFrom(ctx)
	return !ok || slices.Contains(id.Roles, RoleReader) || slices.Contains(id.Roles, RoleOperator)
}

// producerView keeps of j what a producer needs to know of its refund:
// that it exists, under which id, with which values, where it stands and
// when it is due. Who handled it, why it was rescheduled and the provider's
// refund id are for readers: an enqueue with another producer's values (R1)
// must not tell whose worker made the refund, nor the provider's id of it.
func producerView(j *pb.Job) {
	j.WorkerId, j.LastReason, j.ProviderRefundId, j.LeaseUntil = "", "", "", nil
}

// Claim implements jobfence.v1.Coordinator.
func (s *Server) Claim(ctx context.Context, req *pb.ClaimRequest) (*pb.ClaimResponse, error) {
	began := time.Now()
	p, wait, err := claimFromProto(req, s.opts.Lease)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	if id, ok := IdentityFrom(ctx); ok {
		p.WorkerID = id.Name // the history names the credential, not a request field
	}
	claimed, err := s.dispatch.Claim(ctx, p, wait)
	var budget *store.BudgetExhaustedError
	if errors.As(err, &budget) {
		// R19: due work waits on the provider's budget, not on a fault.
		return &pb.ClaimResponse{RetryAfter: durationpb.New(budget.RetryAfter)}, nil
	}
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	s.traceGrants(ctx, began, p.WorkerID, claimed, false)
	return &pb.ClaimResponse{Jobs: s.grantedToProto(ctx, p.WorkerID, claimed)}, nil
}

// grantedToProto is what a claim granted, as the worker gets it, counted and
// logged: the Claim call's answer and a worker stream's grants alike.
func (s *Server) grantedToProto(ctx context.Context, workerID string, claimed []store.ClaimedJob) []*pb.ClaimedJob {
	jobs := make([]*pb.ClaimedJob, len(claimed))
	if len(claimed) > 0 {
		s.metrics.jobsPerClaim.Observe(float64(len(claimed)))
	}
	for i, c := range claimed {
		s.metrics.granted.WithLabelValues(string(c.Job.NextAction)).Inc()
		jobs[i] = claimedToProto(c, s.resendDeadline(c.Job))
		level, msg := slog.LevelDebug, "job claimed"
		if c.Takeover {
			// M1: frequent takeovers point at GC pauses, short leases or
			// over-claiming.
			level, msg = slog.LevelInfo, "job taken over; next action reconcile"
			s.metrics.takeovers.Inc()
		}
		if s.log.Enabled(ctx, level) {
			s.log.LogAttrs(ctx, level, msg, append(attrsOf(c.Job).attrs(), slog.String("worker_id", workerID))...)
		}
	}
	return jobs
}

// Complete implements jobfence.v1.Coordinator.
func (s *Server) Complete(ctx context.Context, req *pb.CompleteRequest) (*pb.CompleteResponse, error) {
	res, err := s.write(ctx, completeFromProto(req))
	if err != nil {
		return nil, err
	}
	return &pb.CompleteResponse{Job: jobToProto(res.Job), Replayed: res.Replayed}, nil
}

// Reschedule implements jobfence.v1.Coordinator.
func (s *Server) Reschedule(ctx context.Context, req *pb.RescheduleRequest) (*pb.RescheduleResponse, error) {
	w, err := rescheduleFromProto(req)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{id: req.GetJobId(), attempt: req.GetAttempt()})
	}
	res, err := s.write(ctx, w)
	if err != nil {
		return nil, err
	}
	return &pb.RescheduleResponse{Job: jobToProto(res.Job), Replayed: res.Replayed, Expedited: res.Expedited}, nil
}

// Escalate implements jobfence.v1.Coordinator.
func (s *Server) Escalate(ctx context.Context, req *pb.EscalateRequest) (*pb.EscalateResponse, error) {
	res, err := s.write(ctx, escalateFromProto(req))
	if err != nil {
		return nil, err
	}
	return &pb.EscalateResponse{Job: jobToProto(res.Job), Replayed: res.Replayed}, nil
}

func (s *Server) write(ctx context.Context, w store.Writeback) (store.WriteResult, error) {
	if id, ok := IdentityFrom(ctx); ok && w.Actor == "" {
		w.Actor = id.Name // the history names the writer's credential
	}
	if s.tracer != nil {
		var span trace.Span
		ctx, span = s.startWriteback(ctx, w)
		res, err := s.writeTraced(ctx, w)
		endWriteback(span, res, err)
		return res, err
	}
	return s.writeTraced(ctx, w)
}

// writeTraced is write under the write-back's span, when traced.
func (s *Server) writeTraced(ctx context.Context, w store.Writeback) (store.WriteResult, error) {
	out, err := s.dispatch.Write(ctx, w)
	if err == nil {
		err = out.Err
	}
	res := out.Result
	if errors.Is(err, store.ErrStaleAttempt) {
		s.metrics.stale.WithLabelValues(rpcOf(w.Kind)).Inc()
		s.stale.add(ctx, w, err)
	}
	if err != nil {
		return res, s.toStatus(ctx, err, jobAttrs{id: w.JobID, attempt: w.Attempt})
	}
	s.tooLate(ctx, w, res)
	if w.Kind == store.EventCompleted && !res.Replayed && !res.Job.EvidenceAt.IsZero() {
		s.metrics.receiptToCompletion.Observe(res.Job.UpdatedAt.Sub(res.Job.EvidenceAt).Seconds())
	}
	level := slog.LevelDebug
	switch w.Kind {
	case store.EventEscalated:
		level = slog.LevelWarn // a person has to look
	case store.EventResolved:
		level = slog.LevelInfo
	}
	if s.log.Enabled(ctx, level) {
		s.log.LogAttrs(ctx, level, "job "+string(w.Kind), append(attrsOf(res.Job).attrs(),
			slog.Bool("replayed", res.Replayed), slog.String("reason", w.Reason))...)
	}
	return res, nil
}

// ReportObservation implements jobfence.v1.Coordinator.
func (s *Server) ReportObservation(ctx context.Context, req *pb.ReportObservationRequest) (*pb.ReportObservationResponse, error) {
	attrs := jobAttrs{id: req.GetJobId(), key: req.GetOperationKey(), attempt: req.GetAttempt()}
	p, err := observationFromProto(req)
	if err != nil {
		return nil, s.toStatus(ctx, err, attrs)
	}
	if id, ok := IdentityFrom(ctx); ok {
		p.Reporter = id.Name // R28: the job's room is kept per credential, whatever source it names
	}
	obs, dup, err := s.store.Observe(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err, attrs)
	}
	resp := &pb.ReportObservationResponse{Observation: observationToProto(obs), Duplicate: dup, Expedited: obs.Expedited}
	switch {
	case obs.KeptAside != nil:
		resp.KeptAside = unmatchedToProto(*obs.KeptAside)
		if !dup {
			s.log.LogAttrs(ctx, slog.LevelWarn, "receipt kept in the unmatched log: its job has no room for it",
				slog.String("operation_key", obs.OperationKey), slog.Int64("job_id", obs.JobID),
				slog.Int64("attempt", obs.ReportedAttempt), slog.String("source", obs.Source),
				slog.String("reporter", obs.Reporter), slog.String("outcome", string(obs.Outcome)),
				slog.Int64("unmatched_event_id", obs.KeptAside.ID))
		}
	case !dup && obs.Attention:
		s.log.LogAttrs(ctx, slog.LevelWarn, "a succeeded refund needs a person: on the attention list (R34)",
			slog.String("operation_key", obs.OperationKey), slog.Int64("job_id", obs.JobID),
			slog.String("source", obs.Source), slog.String("outcome", string(obs.Outcome)),
			slog.String("provider_refund_id", obs.ProviderRefundID))
	case !dup:
		s.log.LogAttrs(ctx, slog.LevelInfo, "observation filed",
			slog.String("operation_key", obs.OperationKey), slog.Int64("job_id", obs.JobID),
			slog.Int64("attempt", obs.ReportedAttempt), slog.Int64("job_attempt", obs.JobAttempt),
			slog.String("source", obs.Source), slog.String("outcome", string(obs.Outcome)))
	}
	return resp, nil
}

// GetJob implements jobfence.v1.Coordinator.
func (s *Server) GetJob(ctx context.Context, req *pb.GetJobRequest) (*pb.GetJobResponse, error) {
	d, err := s.store.Get(ctx, getFromProto(req))
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{id: req.GetJobId(), key: req.GetOperationKey()})
	}
	resp := JobDetailToProto(d)
	resp.ResendDeadline = timeToProto(s.resendDeadline(d.Job))
	return resp, nil
}

// JobDetailToProto is d as GetJob answers it (but for the resend
// deadline, which is the coordinator's): the shape an archive export
// writes, one per line.
func JobDetailToProto(d store.JobDetail) *pb.GetJobResponse {
	resp := &pb.GetJobResponse{Job: jobToProto(d.Job), ObservationCount: d.ObservationCount,
		NextObservationsPageToken: d.NextObservationsToken, Ledger: ledgerToProto(d.Ledger), Now: timeToProto(d.Now)}
	for _, e := range d.Events {
		resp.Events = append(resp.Events, eventToProto(e))
	}
	for _, o := range d.Observations {
		resp.Observations = append(resp.Observations, observationToProto(o))
	}
	return resp
}

// ListJobs implements jobfence.v1.Coordinator.
func (s *Server) ListJobs(ctx context.Context, req *pb.ListJobsRequest) (*pb.ListJobsResponse, error) {
	p, err := listFromProto(req)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	if err := p.Validate(); err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	if p.Filtered() { // the expensive kind: it may walk every row it filters
		release, err := s.reads.acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	page, err := s.store.List(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	resp := &pb.ListJobsResponse{Jobs: make([]*pb.Job, len(page.Jobs)), NextPageToken: page.NextPageToken,
		ObservationCounts: page.ObservationCounts}
	for i, j := range page.Jobs {
		resp.Jobs[i] = jobToProto(j)
	}
	return resp, nil
}

// ResolveReview implements jobfence.v1.Coordinator. The operator is the
// caller's credential; an open coordinator (loopback, no credentials) records
// "operator".
func (s *Server) ResolveReview(ctx context.Context, req *pb.ResolveReviewRequest) (*pb.ResolveReviewResponse, error) {
	actor := "operator"
	if id, ok := IdentityFrom(ctx); ok {
		actor = id.Name
	}
	res, err := s.write(ctx, resolveFromProto(req, actor))
	if err != nil {
		return nil, err
	}
	return &pb.ResolveReviewResponse{Job: jobToProto(res.Job), Replayed: res.Replayed}, nil
}

// WhoAmI implements jobfence.v1.Coordinator: the caller's credential and its
// roles, which any credential may ask for (R29). An open coordinator
// (loopback, no credentials) authenticates nobody.
func (s *Server) WhoAmI(ctx context.Context, _ *pb.WhoAmIRequest) (*pb.WhoAmIResponse, error) {
	id, ok := IdentityFrom(ctx)
	if !ok {
		return &pb.WhoAmIResponse{}, nil
	}
	return &pb.WhoAmIResponse{Name: id.Name, Roles: rolesToProto(id.Roles), Authenticated: true}, nil
}

// GetOverview implements jobfence.v1.Coordinator: what operators watch (M1),
// each part read from an index or a bounded window (Q3): the queue's counts
// and oldest unfinished job (Store.Stats), the reviews waiting longest (the
// listing of manual_review, oldest first), the takeovers among the newest
// transitions, every provider's budget, the newest provider events that
// matched no job (the unmatched log, R28) and this coordinator's own stale
// rejections. The parts are read one after another, not at one moment.
func (s *Server) GetOverview(ctx context.Context, req *pb.GetOverviewRequest) (*pb.GetOverviewResponse, error) {
	limit, err := overviewLimitFromProto(req)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	resp, err := s.overview.get(limit, func() (*pb.GetOverviewResponse, error) {
		release, err := s.reads.acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
		return s.overviewOf(ctx, limit)
	})
	if err != nil {
		return nil, err
	}
	return proto.Clone(resp).(*pb.GetOverviewResponse), nil // one answer, many callers
}

// overviewOf reads the overview GetOverview answers, limit of each list.
func (s *Server) overviewOf(ctx context.Context, limit int) (*pb.GetOverviewResponse, error) {
	stats, err := s.store.Stats(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	reviews, err := s.store.List(ctx, store.ListParams{State: store.StateManualReview, Limit: limit})
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	takeovers, err := s.store.RecentTakeovers(ctx, limit)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	budgets, err := s.store.Budgets(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	unmatched, unmatchedTotal, err := s.store.Unmatched(ctx, limit)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	pauses, err := s.store.RefreshPauses(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	pauseEvents, err := s.store.PauseEvents(ctx, limit)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	attention, attentionTotal, err := s.store.Attention(ctx, limit)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	stale, staleTotal := s.stale.recent(limit)
	resp := &pb.GetOverviewResponse{
		Now:                       timeToProto(stats.Now),
		ReadyJobs:                 stats.Jobs[store.StateReady],
		RunningJobs:               stats.Jobs[store.StateRunning],
		ManualReviewJobs:          stats.Jobs[store.StateManualReview],
		OldestUnfinishedCreatedAt: timeToProto(stats.OldestUnfinished),
		TakeoversWindow:           store.TakeoverWindow,
		StaleRejectionsSinceStart: staleTotal,
		CoordinatorStartedAt:      timeToProto(s.stale.started),
		UnmatchedEvents:           unmatchedTotal,
		AttentionJobs:             attentionTotal,
	}
	for _, p := range pauses {
		resp.PausedProviders = append(resp.PausedProviders, pauseToProto(p))
	}
	for _, e := range pauseEvents {
		resp.RecentPauseEvents = append(resp.RecentPauseEvents, pauseEventToProto(e))
	}
	for _, j := range attention {
		resp.Attention = append(resp.Attention, jobToProto(j))
	}
	for _, j := range reviews.Jobs {
		resp.OldestReviews = append(resp.OldestReviews, jobToProto(j))
	}
	for _, e := range takeovers {
		resp.RecentTakeovers = append(resp.RecentTakeovers, eventToProto(e))
	}
	for _, r := range stale {
		resp.RecentStaleRejections = append(resp.RecentStaleRejections, staleRejectionToProto(r))
	}
	for _, b := range budgets {
		resp.Budgets = append(resp.Budgets, budgetToProto(b))
	}
	for _, e := range unmatched {
		resp.RecentUnmatched = append(resp.RecentUnmatched, unmatchedToProto(e))
	}
	return resp, nil
}

// resendDeadline is until when a same-key resend of job is inside its
// provider's key retention window, counted from the job's first send (R22).
func (s *Server) resendDeadline(j store.Job) time.Time {
	if j.FirstSentAt.IsZero() {
		return time.Time{}
	}
	retention, ok := s.opts.ProviderKeyRetention[j.Provider]
	if !ok {
		retention = s.opts.KeyRetention
	}
	return j.FirstSentAt.Add(retention)
}

// jobAttrs is what every log line about a job carries (R3).
type jobAttrs struct {
	id      int64
	key     string
	attempt int64
}

func attrsOf(j store.Job) jobAttrs {
	return jobAttrs{id: j.ID, key: j.OperationKey, attempt: j.Attempt}
}

func (a jobAttrs) attrs() []slog.Attr {
	return []slog.Attr{slog.String("operation_key", a.key), slog.Int64("job_id", a.id), slog.Int64("attempt", a.attempt)}
}
