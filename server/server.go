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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
)

// Options configure a Server.
type Options struct {
	// Lease is used when a Claim names no lease_duration (R17). Default 30s.
	Lease time.Duration
	// KeyRetention is how long a provider keeps an idempotency key, unless
	// ProviderKeyRetention names the provider. Same-key resends are safe only
	// inside it (R14, R22). Default 24h.
	KeyRetention         time.Duration
	ProviderKeyRetention map[string]time.Duration
	// ClaimPollInterval is how often a long-polling Claim looks again for work
	// it was not woken for: jobs enqueued through other replicas, delays that
	// ran out, leases that expired. Waiting Claims look together, at the
	// multiples of it on the clock, in one transaction (pollRound). Default
	// 200ms.
	ClaimPollInterval time.Duration
	// WriteFlushers is how many enqueue, how many write-back and how many
	// claim transactions may run at once: one runs calls as they come, and
	// calls arriving meanwhile share its next transaction of up to
	// WriteBatch enqueues or write-backs (claims: up to 16); the others only
	// take queued calls while that transaction has run for 20ms (a slow or
	// stalled one). Defaults 2 and 128.
	WriteFlushers int
	WriteBatch    int
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
}

// claimsPerTx bounds the claims sharing one transaction.
const claimsPerTx = 16

// MaxClaimWait bounds ClaimRequest.wait.
const MaxClaimWait = time.Minute

// Server implements jobfence.v1.Coordinator on a store.Store.
type Server struct {
	pb.UnimplementedCoordinatorServer
	store    store.Store
	opts     Options
	log      *slog.Logger
	waiters  waiters
	idle     idleLooks
	writes   *batcher[store.Writeback, store.WriteOutcome]
	enqueues *batcher[store.EnqueueParams, store.EnqueueOutcome]
	claims   *batcher[store.ClaimParams, store.ClaimOutcome]
	metrics  *Metrics
}

// New returns a Server on st. Zero options take their defaults.
func New(st store.Store, opts Options) *Server {
	if opts.Lease == 0 {
		opts.Lease = 30 * time.Second
	}
	if opts.KeyRetention == 0 {
		opts.KeyRetention = 24 * time.Hour
	}
	if opts.ClaimPollInterval == 0 {
		opts.ClaimPollInterval = 200 * time.Millisecond
	}
	if opts.WriteFlushers == 0 {
		opts.WriteFlushers = 2
	}
	if opts.WriteBatch == 0 {
		opts.WriteBatch = 128
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(prometheus.NewRegistry(), st)
	}
	srv := &Server{store: st, opts: opts, log: opts.Logger, metrics: opts.Metrics,
		writes: newBatcher(st.WriteMany, opts.WriteFlushers, opts.WriteBatch, time.Minute, opts.Metrics.writeBatch),
		// Claims are short and lock rows: few at a time, so that concurrent
		// claimers share a COMMIT instead of contending in the database.
		claims: newBatcher(st.ClaimMany, opts.WriteFlushers, claimsPerTx, time.Minute, opts.Metrics.claimTxBatch)}
	srv.enqueues = newBatcher(srv.enqueueMany, opts.WriteFlushers, opts.WriteBatch, time.Minute, opts.Metrics.enqueueBatch)
	srv.claims.abandoned = srv.release
	return srv
}

// enqueueMany runs a batch of enqueues and, in the same transaction, the
// claims of idle long-polling workers that could take the new jobs
// (store.EnqueueAndClaim): a job enqueued while a worker waits reaches it
// with the enqueue's own COMMIT. Each taken claim takes what it would take
// one call later, oldest due work first (Q1). A new job no claim took wakes
// one more waiter, as before.
func (s *Server) enqueueMany(ctx context.Context, ps []store.EnqueueParams) []store.EnqueueOutcome {
	providers := make(map[string]bool, len(ps))
	for _, p := range ps {
		providers[p.Provider] = true
	}
	taken := s.waiters.take(len(ps), providers)
	claims := make([]store.ClaimParams, len(taken))
	for i, wt := range taken {
		claims[i] = *wt.claim
	}
	out, claimed := s.store.EnqueueAndClaim(ctx, ps, claims)
	granted := map[int64]bool{}
	for i, wt := range taken {
		for _, c := range claimed[i].Jobs {
			granted[c.Job.ID] = true
		}
		if len(claimed[i].Jobs) > 0 {
			s.metrics.handoffs.Inc()
		}
		s.waiters.hand(wt, claimed[i])
	}
	for _, o := range out {
		if o.Err == nil && o.Created && !granted[o.Job.ID] {
			s.waiters.wake(o.Job.Provider)
		}
	}
	return out
}

// Drain makes waiting and future long-poll Claims return at once, so that a
// graceful stop is not held up by idle workers. Call it before GracefulStop.
func (s *Server) Drain() { s.waiters.stop() }

// Register adds the Coordinator service to r.
func (s *Server) Register(r grpc.ServiceRegistrar) { pb.RegisterCoordinatorServer(r, s) }

// EnqueueRefund implements jobfence.v1.Coordinator.
func (s *Server) EnqueueRefund(ctx context.Context, req *pb.EnqueueRefundRequest) (*pb.EnqueueRefundResponse, error) {
	p, err := enqueueFromProto(req)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{key: req.GetOperationKey()})
	}
	out, err := s.enqueues.do(ctx, p)
	if err == nil {
		err = out.Err
	}
	job, created := out.Job, out.Created
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{id: job.ID, key: p.OperationKey})
	}
	if created && s.log.Enabled(ctx, slog.LevelDebug) { // the attributes cost more than the call's own work
		s.log.LogAttrs(ctx, slog.LevelDebug, "refund enqueued", attrsOf(job).attrs()...)
	}
	return &pb.EnqueueRefundResponse{Job: jobToProto(job), Created: created}, nil
}

// Claim implements jobfence.v1.Coordinator.
func (s *Server) Claim(ctx context.Context, req *pb.ClaimRequest) (*pb.ClaimResponse, error) {
	p, wait, err := claimFromProto(req, s.opts.Lease)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	if id, ok := IdentityFrom(ctx); ok {
		p.WorkerID = id.Name // the history names the credential, not a request field
	}
	claimed, err := s.claim(ctx, p, wait)
	var budget *store.BudgetExhaustedError
	if errors.As(err, &budget) {
		// R19: due work waits on the provider's budget, not on a fault.
		return &pb.ClaimResponse{RetryAfter: durationpb.New(budget.RetryAfter)}, nil
	}
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	resp := &pb.ClaimResponse{Jobs: make([]*pb.ClaimedJob, len(claimed))}
	if len(claimed) > 0 {
		s.metrics.jobsPerClaim.Observe(float64(len(claimed)))
	}
	for i, c := range claimed {
		s.metrics.granted.WithLabelValues(string(c.Job.NextAction)).Inc()
		resp.Jobs[i] = claimedToProto(c, s.resendDeadline(c.Job))
		level, msg := slog.LevelDebug, "job claimed"
		if c.Takeover {
			// M1: frequent takeovers point at GC pauses, short leases or
			// over-claiming.
			level, msg = slog.LevelInfo, "job taken over; next action reconcile"
			s.metrics.takeovers.Inc()
		}
		if s.log.Enabled(ctx, level) {
			s.log.LogAttrs(ctx, level, msg, append(attrsOf(c.Job).attrs(), slog.String("worker_id", p.WorkerID))...)
		}
	}
	return resp, nil
}

// claim claims, and when nothing is granted waits up to wait for a wake, a
// hand-off from an enqueue (enqueueMany) or the next poll instant, and claims
// again. At a poll instant the first waiter to wake claims for every armed
// waiter in one transaction (pollRound); a waiter that round found nothing
// for waits on without a claim of its own. Waiting is not a lease decision:
// time.Now here only bounds the call (R12 concerns leases).
func (s *Server) claim(ctx context.Context, p store.ClaimParams, wait time.Duration) ([]store.ClaimedJob, error) {
	deadline := time.Now().Add(wait)
	looked := false // a poll round has just claimed for this caller and found nothing
	for {
		wt := s.waiters.add(p.Provider)
		if !looked {
			out, err := s.claims.do(ctx, p)
			if err == nil {
				err = out.Err
			}
			if err != nil || len(out.Jobs) > 0 {
				s.waiters.remove(wt) // not armed: it can only have been woken
				return out.Jobs, err
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			s.waiters.remove(wt) // not armed: it can only have been woken
			return nil, nil
		}
		s.waiters.arm(wt, p)
		next := untilNextPoll(time.Now(), s.opts.ClaimPollInterval)
		timer := time.NewTimer(min(left, next))
		ticked := false // a poll instant came, not the deadline
		select {
		case <-wt.ch:
		case <-timer.C:
			ticked = next <= left
		case <-ctx.Done():
		}
		timer.Stop()
		if !s.waiters.remove(wt) {
			<-wt.ch // woken, or taken by an enqueue or a poll round: its outcome comes with its COMMIT
		} else if ticked && ctx.Err() == nil {
			if s.idle.nothingFor(s, p.Provider) {
				wt.handed, wt.looked = true, true // looked at this instant: wait for the next
			} else {
				s.pollRound(wt, p)
			}
		}
		if wt.handed && (wt.out.Err != nil || len(wt.out.Jobs) > 0) {
			if ctx.Err() != nil {
				s.release(p, wt.out) // granted to a caller that left
				return nil, nil
			}
			return wt.out.Jobs, wt.out.Err
		}
		looked = wt.handed && wt.looked
		if ctx.Err() != nil || s.waiters.isStopped() {
			return nil, nil
		}
	}
}

// pollRound claims, in one transaction, for wt (which its caller has taken
// out of the waiters) with p and for the other armed waiters, oldest first,
// up to claimsPerTx in all, and hands each its outcome: idle long polls look
// for work together, one transaction per poll instant however many wait.
// The transaction outlives any one caller, like a batch. Its waiters are out
// of the queue while it runs, so a wake then (an enqueue after its candidate
// walk) may have found none of them: if there was one, they all claim again
// at once, as woken waiters do, instead of waiting for the next instant.
func (s *Server) pollRound(wt *waiter, p store.ClaimParams) {
	wakes := s.waiters.wakeCount()
	peers := s.waiters.take(claimsPerTx-1, nil)
	claims := make([]store.ClaimParams, 0, len(peers)+1)
	claims = append(claims, p)
	for _, w := range peers {
		claims = append(claims, *w.claim)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	outs := s.store.ClaimMany(ctx, claims)
	cancel()
	s.metrics.claimTxBatch.Observe(float64(len(claims)))
	looked := s.waiters.wakeCount() == wakes
	wt.out, wt.handed, wt.looked = outs[0], true, looked
	for i, w := range peers {
		w.looked = looked
		s.waiters.hand(w, outs[i+1])
	}
}

// idleLooks is the one look idle long polls share at each poll instant
// (store.Store.HasWork): a read without locks or a transaction, per provider
// filter, so that two thousand idle workers cost the database a few reads
// per instant rather than a claim transaction per sixteen of them. A poll
// round runs only for the filters the look found work for.
type idleLooks struct {
	mu      sync.Mutex
	instant time.Time       // the poll instant the looks are of
	wakes   uint64          // waiters.wakeCount() when they were taken
	nothing map[string]bool // provider filter → no work was found
}

// nothingFor reports whether this poll instant's look found no work for the
// filter provider, looking once per instant and filter. A wake since the look
// (an enqueue or reschedule this replica saw) voids it, and an error is
// taken for work: the poll round then looks for itself.
func (l *idleLooks) nothingFor(s *Server, provider string) bool {
	instant := time.Now().Truncate(s.opts.ClaimPollInterval)
	wakes := s.waiters.wakeCount()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.instant.Equal(instant) || l.wakes != wakes {
		l.instant, l.wakes, l.nothing = instant, wakes, map[string]bool{}
	}
	if nothing, looked := l.nothing[provider]; looked {
		return nothing
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ClaimPollInterval)
	work, err := s.store.HasWork(ctx, provider)
	cancel()
	nothing := err == nil && !work
	if s.waiters.wakeCount() != wakes {
		return false // woken meanwhile: claim to be sure
	}
	l.nothing[provider] = nothing
	s.metrics.idleLooks.Inc()
	return nothing
}

// untilNextPoll is the time from now to the next multiple of interval on the
// clock: the instants at which idle long polls look again, together.
func untilNextPoll(now time.Time, interval time.Duration) time.Duration {
	return now.Truncate(interval).Add(interval).Sub(now)
}

// release hands back the jobs of a claim whose caller left before it was
// answered (a cancelled long poll, a worker stopping): a fenced Reschedule
// under the granted attempt, due now, so they need not wait for their leases
// to expire. A takeover keeps its RECONCILE; a first claim sent nothing.
func (s *Server) release(p store.ClaimParams, out store.ClaimOutcome) {
	for _, c := range out.Jobs {
		w := store.Writeback{Kind: store.EventRescheduled, JobID: c.Job.ID, Attempt: c.Job.Attempt,
			LeaseToken: c.LeaseToken, NextAction: c.Job.NextAction,
			Reason: "claim abandoned by its caller before the answer"}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := s.write(ctx, w); err != nil {
				s.log.LogAttrs(ctx, slog.LevelWarn, "abandoned claim not released; its lease will expire",
					append(attrsOf(c.Job).attrs(), slog.String("error", err.Error()))...)
			}
		}()
	}
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
	return &pb.RescheduleResponse{Job: jobToProto(res.Job), Replayed: res.Replayed}, nil
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
	out, err := s.writes.do(ctx, w)
	if err == nil {
		err = out.Err
	}
	res := out.Result
	if errors.Is(err, store.ErrStaleAttempt) {
		s.metrics.stale.WithLabelValues(rpcOf(w.Kind)).Inc()
	}
	if err != nil {
		return res, s.toStatus(ctx, err, jobAttrs{id: w.JobID, attempt: w.Attempt})
	}
	if w.Kind == store.EventRescheduled && !res.Replayed {
		s.waiters.wake(res.Job.Provider) // it may be due now
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
	obs, dup, err := s.store.Observe(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err, attrs)
	}
	if !dup {
		s.log.LogAttrs(ctx, slog.LevelInfo, "observation filed",
			slog.String("operation_key", obs.OperationKey), slog.Int64("job_id", obs.JobID),
			slog.Int64("attempt", obs.ReportedAttempt), slog.Int64("job_attempt", obs.JobAttempt),
			slog.String("source", obs.Source), slog.String("outcome", string(obs.Outcome)))
	}
	return &pb.ReportObservationResponse{Observation: observationToProto(obs), Duplicate: dup}, nil
}

// GetJob implements jobfence.v1.Coordinator.
func (s *Server) GetJob(ctx context.Context, req *pb.GetJobRequest) (*pb.GetJobResponse, error) {
	d, err := s.store.Get(ctx, getFromProto(req))
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{id: req.GetJobId(), key: req.GetOperationKey()})
	}
	resp := &pb.GetJobResponse{Job: jobToProto(d.Job), ObservationCount: d.ObservationCount,
		NextObservationsPageToken: d.NextObservationsToken}
	for _, e := range d.Events {
		resp.Events = append(resp.Events, eventToProto(e))
	}
	for _, o := range d.Observations {
		resp.Observations = append(resp.Observations, observationToProto(o))
	}
	return resp, nil
}

// ListJobs implements jobfence.v1.Coordinator.
func (s *Server) ListJobs(ctx context.Context, req *pb.ListJobsRequest) (*pb.ListJobsResponse, error) {
	p, err := listFromProto(req)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	page, err := s.store.List(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	resp := &pb.ListJobsResponse{Jobs: make([]*pb.Job, len(page.Jobs)), NextPageToken: page.NextPageToken}
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
	if res.Job.State == store.StateReady && !res.Replayed {
		s.waiters.wake(res.Job.Provider)
	}
	return &pb.ResolveReviewResponse{Job: jobToProto(res.Job), Replayed: res.Replayed}, nil
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
