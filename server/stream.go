package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jobfence/jobfence/dispatch"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
)

// MaxStreamCredits bounds the credits one worker stream holds: the jobs it
// may be granted before it gives a slot back.
const MaxStreamCredits = 1000

// maxStreamCalls bounds the calls in flight on one worker stream. Past it the
// stream reads no more until one is answered, and HTTP/2 flow control holds
// the worker back: one worker cannot queue unbounded work here.
const maxStreamCalls = 256

// StreamSilence is how long a worker stream may send nothing and still be
// granted work. A worker that is frozen (SIGSTOP, a long pause) keeps its
// stream and its credits; granting it more would leave each job waiting a
// lease for its takeover. So a stream silent for longer is granted nothing
// (its waiting claim is withdrawn, and whatever it had been granted by then
// handed back) until its next message. Workers send a heartbeat, a
// WorkCredit of 0, every StreamHeartbeat while they send nothing else.
const (
	StreamSilence   = 3 * time.Second
	StreamHeartbeat = time.Second
)

// maxStreamClaim is the most jobs one claim of a stream asks for, a Claim's
// max_jobs bound.
const maxStreamClaim = 100

// MaxUnshownGrants bounds the grants one worker stream holds that its
// worker has not shown it received — by a WorkAck, or a renewal or
// write-back on the stream — whatever its credits: a worker that reads
// nothing holds at most this many jobs, and those only briefly
// (StreamAckTimeout).
const MaxUnshownGrants = 100

// StreamAckTimeout is how long a worker that acknowledges its grants
// (WorkStart.acknowledges) may leave one it was sent unacknowledged, and at
// most half the grant's lease (ackTimeout): past it the grant is handed
// back through the fenced path, as one the stream could not deliver.
const StreamAckTimeout = 5 * time.Second

// maxAckGrants bounds the grants one WorkAck names.
const maxAckGrants = 100

// Work implements jobfence.v1.Coordinator: the worker stream. Three
// goroutines serve it: this one reads (WorkStart first, then credits and
// calls), a claimer grants jobs while the stream holds credits, and a
// sender is the one writer of the stream. Each call runs on its own
// goroutine through the unary handler of its kind, so its answer is the
// unary call's to the byte (R9, R21, R24, R25). A grant the sender could not
// write is handed back (dispatch.Dispatcher.HandBack), and so is every grant
// made after the worker half-closed or the stream ended.
func (s *Server) Work(stream pb.Coordinator_WorkServer) error {
	release, err := s.streams.acquire(stream.Context())
	if err != nil {
		return err
	}
	defer release()
	first, err := stream.Recv()
	if err != nil {
		return streamEnd(err)
	}
	ctx := stream.Context()
	p, credits, err := workStartFromProto(first, s.opts.Lease)
	if err != nil {
		return s.toStatus(ctx, err, jobAttrs{})
	}
	if id, ok := IdentityFrom(ctx); ok {
		p.WorkerID = id.Name // the history names the credential, as for Claim
	}
	ws := newWorkStream(s, ctx, p, credits, first.GetStart().GetAcknowledges())
	s.metrics.workStreams.Inc()
	defer s.metrics.workStreams.Dec()
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.LogAttrs(ctx, slog.LevelDebug, "worker stream opened", slog.String("worker_id", p.WorkerID),
			slog.String("provider", p.Provider), slog.Int("credits", credits))
	}
	return ws.serve(stream)
}

// workStream is one worker stream's state.
type workStream struct {
	s   *Server
	ctx context.Context // the stream's: ends when the stream does
	// fail ends the stream with an error (the sender's, or a worker that
	// stopped reading); failed is closed by the first call.
	fail     func(error)
	failed   <-chan struct{}
	failErr  error
	failOnce sync.Once

	claim store.ClaimParams // WorkerID, Provider and Lease; MaxJobs per claim
	// acks: the worker acknowledges each grant as it reads it
	// (WorkStart.acknowledges); one it leaves unacknowledged is handed back.
	acks bool

	mu       sync.Mutex
	credits  int
	creditCh chan struct{} // a token when credits rose from nothing
	// unshown are the grants made on the stream that its worker has not
	// shown it received (MaxUnshownGrants); shownCh a token when one left.
	unshown map[grantKey]*unshownGrant
	shownCh chan struct{}
	// stopClaims ends the claimer: the worker half-closed, the coordinator
	// drains, or the stream ended.
	stopClaims context.CancelFunc
	claimCtx   context.Context

	out     chan outgoing // to the sender
	sending atomic.Int64  // UnixNano when the sender's Send began, 0 between sends
	calls   sync.WaitGroup

	// heard is when the worker last sent something (UnixNano); heardCh a
	// token for each message, for a claimer waiting out a silence.
	heard   atomic.Int64
	heardCh chan struct{}
	// withdraw cancels the claim waiting now, when the stream falls silent.
	withdraw context.CancelFunc
}

// outgoing is one message for the sender, with the jobs it grants: handed
// back when it cannot be written.
type outgoing struct {
	msg  *pb.WorkResponse
	jobs []store.ClaimedJob
}

// grantKey names one grant of a stream: a job may come back to the same
// stream under a later attempt.
type grantKey struct{ job, attempt int64 }

func keyOf(c store.ClaimedJob) grantKey { return grantKey{c.Job.ID, c.Job.Attempt} }

// unshownGrant is a grant its worker has not shown it received, and when
// it was sent (zero until then).
type unshownGrant struct {
	c    store.ClaimedJob
	sent time.Time
}

func newWorkStream(s *Server, ctx context.Context, p store.ClaimParams, credits int, acks bool) *workStream {
	failed := make(chan struct{})
	ws := &workStream{s: s, ctx: ctx, claim: p, acks: acks, credits: credits, creditCh: make(chan struct{}, 1),
		unshown: map[grantKey]*unshownGrant{}, shownCh: make(chan struct{}, 1),
		out: make(chan outgoing, maxStreamCalls+1), failed: failed, heardCh: make(chan struct{}, 1)}
	ws.heard.Store(time.Now().UnixNano())
	ws.fail = func(err error) {
		ws.failOnce.Do(func() { ws.failErr = err; close(failed) })
	}
	ws.claimCtx, ws.stopClaims = context.WithCancel(ctx)
	return ws
}

// serve runs the stream until the worker half-closes (nil, once every call
// read is answered), the coordinator drains (UNAVAILABLE, likewise), or it
// fails.
func (ws *workStream) serve(stream pb.Coordinator_WorkServer) error {
	sent := make(chan struct{})
	go func() { defer close(sent); ws.send(stream) }()
	claimed := make(chan struct{})
	go func() { defer close(claimed); ws.claimLoop() }()
	go ws.watch()

	in := make(chan received)
	go func() {
		for {
			m, err := stream.Recv()
			select {
			case in <- received{m, err}:
			case <-ws.failed:
				return
			case <-ws.ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	slots := make(chan struct{}, maxStreamCalls)
	var end error
	drained := false // the coordinator drains: read acknowledgements on their way
loop:
	for {
		select {
		case r := <-in:
			if r.err != nil {
				end = streamEnd(r.err) // nil on a half-close
				break loop
			}
			ws.heard.Store(time.Now().UnixNano())
			select {
			case ws.heardCh <- struct{}{}:
			default:
			}
			if err := ws.take(r.m, slots); err != nil {
				end = ws.s.toStatus(ws.ctx, err, jobAttrs{})
				break loop
			}
		case <-ws.s.draining:
			end = status.Error(codes.Unavailable, "the coordinator is stopping: open the stream again "+
				"(another replica, or this one once it is back); unanswered calls are safe to repeat (R21)")
			drained = true
			break loop
		case <-ws.failed:
			end = ws.failErr
			break loop
		case <-ws.ctx.Done():
			end = status.FromContextError(ws.ctx.Err()).Err()
			break loop
		}
	}
	// No more grants; answer what was read, then let the sender finish.
	ws.stopClaims()
	<-claimed
	if drained && ws.acks {
		ws.awaitAcks(in, slots)
	}
	ws.calls.Wait()
	close(ws.out)
	select {
	case <-sent:
	case <-ws.failed:
		// A Send may be blocked on a worker that reads nothing: it returns
		// once this handler has, and the sender hands back what is left.
	}
	if ws.acks {
		// The worker never showed it had these: none may wait out its
		// lease on a stream that is gone.
		sent := ws.takeUnshown(func(g *unshownGrant) bool { return !g.sent.IsZero() })
		ws.s.metrics.unacknowledged.Add(float64(len(sent)))
		ws.handBack(sent, "worker stream ended before the worker acknowledged the grant")
		ws.handBack(ws.takeUnshown(func(*unshownGrant) bool { return true }),
			"worker stream ended before the grant was sent")
	}
	if ws.failErr != nil {
		return ws.failErr
	}
	return end
}

// received is one message read from a worker stream, or the error that
// ended the reading.
type received struct {
	m   *pb.WorkRequest
	err error
}

// StreamDrainGrace is how long a stopping coordinator keeps reading a
// worker stream that acknowledges its grants while grants it sent there
// are still unacknowledged. An acknowledgement already on the wire when
// the stop began then keeps its grant with the worker that has it, instead
// of the grant being handed back and run again under a new attempt (whose
// COMMIT would fence the first worker's write-back off, R25). Nothing is
// granted meanwhile; what is still unacknowledged at its end is handed back.
const StreamDrainGrace = time.Second

// awaitAcks reads the stream after its claimer stopped, until no grant it
// was sent is unacknowledged, StreamDrainGrace has passed, or the stream
// ends or fails. Calls read meanwhile are answered as ever.
func (ws *workStream) awaitAcks(in <-chan received, slots chan struct{}) {
	grace := time.NewTimer(StreamDrainGrace)
	defer grace.Stop()
	for ws.holdsUnshown() {
		select {
		case r := <-in:
			if r.err != nil || ws.take(r.m, slots) != nil {
				return
			}
		case <-ws.shownCh:
		case <-grace.C:
			return
		case <-ws.failed:
			return
		case <-ws.ctx.Done():
			return
		}
	}
}

// holdsUnshown reports whether any grant of the stream is unshown.
func (ws *workStream) holdsUnshown() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.unshown) > 0
}

// take handles one message after WorkStart: credits for the claimer, a call
// on a goroutine of its own. An error ends the stream.
func (ws *workStream) take(m *pb.WorkRequest, slots chan struct{}) error {
	switch k := m.GetKind().(type) {
	case *pb.WorkRequest_Credit:
		return ws.addCredits(int(k.Credit.GetCredits()))
	case *pb.WorkRequest_Ack:
		return ws.acknowledge(k.Ack.GetGrants())
	case *pb.WorkRequest_Call:
		ws.showCall(k.Call)
		select {
		case slots <- struct{}{}:
		case <-ws.failed:
			return nil // serve sees it
		case <-ws.ctx.Done():
			return nil
		}
		ws.calls.Add(1)
		go func() {
			defer func() { <-slots; ws.calls.Done() }()
			ws.queue(outgoing{msg: &pb.WorkResponse{Kind: &pb.WorkResponse_Reply{Reply: ws.s.workCall(ws.ctx, k.Call)}}})
		}()
		return nil
	case *pb.WorkRequest_Start:
		return store.Invalid("start", "only the stream's first message may be a WorkStart")
	default:
		return store.Invalid("kind", "one of credit, call or ack is required")
	}
}

// acknowledge marks the grants refs names as received: each one of this
// stream's unshown grants whose job, attempt and lease token it names.
// Others (handed back already, another stream's, a wrong token) are
// ignored. Errors: more than maxAckGrants, or none.
func (ws *workStream) acknowledge(refs []*pb.GrantRef) error {
	if len(refs) == 0 || len(refs) > maxAckGrants {
		return store.Invalid("ack.grants", "must name 1..%d grants, got %d", maxAckGrants, len(refs))
	}
	for _, r := range refs {
		ws.show(r.GetJobId(), r.GetAttempt(), r.GetLeaseToken())
	}
	return nil
}

// showCall marks the grants a call on the stream carries as received: a
// worker that renews or writes back a grant has it.
func (ws *workStream) showCall(c *pb.WorkCall) {
	switch k := c.GetCall().(type) {
	case *pb.WorkCall_Complete:
		ws.show(k.Complete.GetJobId(), k.Complete.GetAttempt(), k.Complete.GetLeaseToken())
	case *pb.WorkCall_Reschedule:
		ws.show(k.Reschedule.GetJobId(), k.Reschedule.GetAttempt(), k.Reschedule.GetLeaseToken())
	case *pb.WorkCall_Escalate:
		ws.show(k.Escalate.GetJobId(), k.Escalate.GetAttempt(), k.Escalate.GetLeaseToken())
	case *pb.WorkCall_RenewLeases:
		for _, g := range k.RenewLeases.GetGrants() {
			ws.show(g.GetJobId(), g.GetAttempt(), g.GetLeaseToken())
		}
	case *pb.WorkCall_ReportObservation:
		r := k.ReportObservation
		ws.show(r.GetJobId(), r.GetAttempt(), r.GetLeaseToken())
	}
}

// show marks one grant received when it is one of the stream's unshown
// grants and token is its lease token: a worker that never read the grant
// cannot know it (R25).
func (ws *workStream) show(job, attempt int64, token string) {
	if job == 0 || token == "" {
		return
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	g, ok := ws.unshown[grantKey{job, attempt}]
	if !ok || subtle.ConstantTimeCompare([]byte(g.c.LeaseToken), []byte(token)) != 1 {
		return
	}
	delete(ws.unshown, grantKey{job, attempt})
	ws.signalShown()
}

// signalShown wakes a claimer waiting for room among the unshown grants.
// Call it with mu held.
func (ws *workStream) signalShown() {
	select {
	case ws.shownCh <- struct{}{}:
	default:
	}
}

// takeUnshown removes the unshown grants that match and returns them: the
// one who takes a grant out hands it back, so none is handed back twice.
func (ws *workStream) takeUnshown(match func(*unshownGrant) bool) []store.ClaimedJob {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []store.ClaimedJob
	for k, g := range ws.unshown {
		if match(g) {
			out = append(out, g.c)
			delete(ws.unshown, k)
		}
	}
	if len(out) > 0 {
		ws.signalShown()
	}
	return out
}

// takeUnshownOf removes jobs from the unshown grants and returns those that
// were there.
func (ws *workStream) takeUnshownOf(jobs []store.ClaimedJob) []store.ClaimedJob {
	if len(jobs) == 0 {
		return nil
	}
	in := make(map[grantKey]bool, len(jobs))
	for _, c := range jobs {
		in[keyOf(c)] = true
	}
	return ws.takeUnshown(func(g *unshownGrant) bool { return in[keyOf(g.c)] })
}

// markSent records when jobs' grant went to the transport.
func (ws *workStream) markSent(jobs []store.ClaimedJob, at time.Time) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, c := range jobs {
		if g, ok := ws.unshown[keyOf(c)]; ok {
			g.sent = at
		}
	}
}

// expireUnshown ends the wait for grants sent long enough ago. A worker
// that acknowledges has its grants handed back after ackTimeout: it never
// showed it had them. One of an earlier release, which shows a grant only
// by a renewal or write-back, has it counted as received once its lease has
// run (a takeover is due by then anyway, R6), so that room is not held
// forever by grants written back outside the stream.
func (ws *workStream) expireUnshown(now time.Time) {
	wait := ws.claim.Lease
	if ws.acks {
		wait = ackTimeout(ws.claim.Lease)
	}
	expired := ws.takeUnshown(func(g *unshownGrant) bool { return !g.sent.IsZero() && now.Sub(g.sent) > wait })
	if !ws.acks || len(expired) == 0 {
		return
	}
	ws.s.metrics.unacknowledged.Add(float64(len(expired)))
	ws.handBack(expired, "worker stream: the worker did not acknowledge the grant within "+wait.String())
}

// ackTimeout is how long an acknowledging worker may leave a grant of lease
// unacknowledged: StreamAckTimeout, at most half the lease.
func ackTimeout(lease time.Duration) time.Duration {
	return min(StreamAckTimeout, lease/2)
}

// addCredits adds n credits (0..MaxStreamCredits, and at most that many
// held; 0 is a heartbeat) and wakes the claimer.
func (ws *workStream) addCredits(n int) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if n < 0 || n > MaxStreamCredits {
		return store.Invalid("credit.credits", "must be 0..%d (0: a heartbeat), got %d", MaxStreamCredits, n)
	}
	if ws.credits+n > MaxStreamCredits {
		return store.Invalid("credit.credits", "the stream would hold %d credits, more than %d: give back only "+
			"slots that freed", ws.credits+n, MaxStreamCredits)
	}
	ws.credits += n
	select {
	case ws.creditCh <- struct{}{}:
	default:
	}
	return nil
}

// claimLoop grants jobs while the stream holds credits, through the
// dispatcher's long-polling Claim: an enqueue on this coordinator hands its
// job to a waiting stream in its own transaction (hand-off), and other
// replicas' work is found at the next poll instant.
func (ws *workStream) claimLoop() {
	backoff := 50 * time.Millisecond
	var shortfall dispatch.Shortfall // a grant of fewer jobs than asked for spares the next claim its first look
	for {
		ws.mu.Lock()
		n := min(ws.credits, maxStreamClaim, MaxUnshownGrants-len(ws.unshown))
		ws.mu.Unlock()
		if n <= 0 {
			// No free slot, or as many grants out as a worker may hold
			// without showing it has them.
			select {
			case <-ws.creditCh:
				continue
			case <-ws.shownCh:
				continue
			case <-ws.claimCtx.Done():
				return
			}
		}
		if ws.silent() {
			select { // its next message, a heartbeat at the latest, resumes it
			case <-ws.heardCh:
				continue
			case <-ws.claimCtx.Done():
				return
			}
		}
		p := ws.claim
		p.MaxJobs = n
		began := time.Now()
		cctx, withdraw := context.WithCancel(ws.claimCtx)
		ws.mu.Lock()
		ws.withdraw = withdraw
		ws.mu.Unlock()
		claimed, err := ws.s.dispatch.ClaimNext(cctx, p, MaxClaimWait, &shortfall)
		ws.mu.Lock()
		ws.withdraw = nil
		ws.mu.Unlock()
		withdrawn := cctx.Err() != nil
		withdraw()
		var budget *store.BudgetExhaustedError
		switch {
		case ws.claimCtx.Err() != nil:
			ws.handBack(claimed, "worker stream closed before the grant was sent")
			return
		case withdrawn:
			ws.handBack(claimed, "worker stream silent: the worker sent nothing for "+StreamSilence.String())
			continue
		case errors.As(err, &budget):
			// R19: due work waits on the provider's budget; the stream keeps
			// its credits and is offered work again after the wait.
			ws.queue(outgoing{msg: &pb.WorkResponse{Kind: &pb.WorkResponse_RetryAfter{
				RetryAfter: durationpb.New(budget.RetryAfter)}}})
			ws.pause(budget.RetryAfter)
			continue
		case err != nil:
			// R7: a failed claim grants nothing; try again, backing off.
			_ = ws.s.toStatus(ws.ctx, err, jobAttrs{})
			ws.pause(backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		if len(claimed) == 0 {
			if time.Since(began) < ws.s.opts.ClaimPollInterval/2 && ws.s.dispatch.Draining() {
				return // a draining dispatcher no longer waits: serve ends the stream
			}
			continue
		}
		ws.mu.Lock()
		ws.credits -= len(claimed)
		for _, c := range claimed {
			ws.unshown[keyOf(c)] = &unshownGrant{c: c}
		}
		ws.mu.Unlock()
		ws.s.traceGrants(ws.ctx, began, p.WorkerID, claimed, true)
		grant := &pb.WorkGrant{Jobs: ws.s.grantedToProto(ws.ctx, p.WorkerID, claimed)}
		ws.queue(outgoing{msg: &pb.WorkResponse{Kind: &pb.WorkResponse_Grant{Grant: grant}}, jobs: claimed})
	}
}

// silent reports whether the worker has sent nothing for StreamSilence.
func (ws *workStream) silent() bool {
	return time.Since(time.Unix(0, ws.heard.Load())) > StreamSilence
}

// pause waits d or until the claimer is stopped.
func (ws *workStream) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ws.claimCtx.Done():
	}
}

// queue gives o to the sender; when the stream has failed, its grants are
// handed back instead.
func (ws *workStream) queue(o outgoing) {
	select {
	case ws.out <- o:
	case <-ws.failed:
		ws.handBack(ws.takeUnshownOf(o.jobs), "worker stream failed before the grant was sent")
	}
}

// handBack hands back grants that did not reach the worker, counted.
func (ws *workStream) handBack(jobs []store.ClaimedJob, reason string) {
	if len(jobs) > 0 {
		ws.s.metrics.handedBack.Add(float64(len(jobs)))
		ws.s.dispatch.HandBack(jobs, reason)
	}
}

// send is the stream's one writer. After a failed Send it hands back every
// grant it is given.
func (ws *workStream) send(stream pb.Coordinator_WorkServer) {
	var err error
	for o := range ws.out {
		if err == nil {
			ws.sending.Store(time.Now().UnixNano())
			err = stream.Send(o.msg)
			ws.sending.Store(0)
			if err != nil {
				ws.fail(streamEnd(err))
			} else {
				ws.markSent(o.jobs, time.Now())
			}
		}
		if err != nil {
			// gRPC fails a Send only for a message it did not hand to the
			// transport; the token dies with the hand-back either way
			// (docs/DESIGN.md, "The worker stream").
			ws.handBack(ws.takeUnshownOf(o.jobs), "worker stream: the grant could not be sent")
		}
	}
}

// watch is the stream's watchdog. It ends a stream whose worker has read
// nothing for streamSendTimeout while a message waits for it: the leases of
// the grants it holds run meanwhile, and its calls' answers wait in vain;
// ending it hands back what was not written, and frees its goroutines. And
// it withdraws the waiting claim of a stream that falls silent.
func (ws *workStream) watch() {
	limit := streamSendTimeout(ws.claim.Lease)
	t := time.NewTicker(min(limit/4, StreamSilence/6))
	defer t.Stop()
	for {
		select {
		case <-ws.failed:
			return
		case <-ws.ctx.Done():
			return
		case <-t.C:
		}
		if since := ws.sending.Load(); since != 0 && time.Since(time.Unix(0, since)) > limit {
			ws.fail(status.Errorf(codes.Unavailable, "the worker read nothing for %s: stream closed, "+
				"grants not yet sent handed back", limit))
			return
		}
		ws.expireUnshown(time.Now())
		if ws.silent() {
			ws.mu.Lock()
			if ws.withdraw != nil {
				ws.withdraw()
			}
			ws.mu.Unlock()
		}
	}
}

// streamSendTimeout is how long a worker may leave a message unread: a
// third of its lease, between 1 s and 10 s.
func streamSendTimeout(lease time.Duration) time.Duration {
	return min(max(lease/3, time.Second), 10*time.Second)
}

// workCall answers one call of a worker stream with its unary handler.
func (s *Server) workCall(ctx context.Context, c *pb.WorkCall) *pb.WorkReply {
	reply := &pb.WorkReply{CallId: c.GetCallId()}
	if s.tracer != nil {
		var span trace.Span
		ctx, span = s.startStreamCall(ctx, c)
		defer func() { endStreamCall(span, reply) }()
	}
	var err error
	switch k := c.GetCall().(type) {
	case *pb.WorkCall_Complete:
		var r *pb.CompleteResponse
		if r, err = s.Complete(ctx, k.Complete); err == nil {
			reply.Result = &pb.WorkReply_Complete{Complete: r}
		}
	case *pb.WorkCall_Reschedule:
		var r *pb.RescheduleResponse
		if r, err = s.Reschedule(ctx, k.Reschedule); err == nil {
			reply.Result = &pb.WorkReply_Reschedule{Reschedule: r}
		}
	case *pb.WorkCall_Escalate:
		var r *pb.EscalateResponse
		if r, err = s.Escalate(ctx, k.Escalate); err == nil {
			reply.Result = &pb.WorkReply_Escalate{Escalate: r}
		}
	case *pb.WorkCall_RenewLeases:
		var r *pb.RenewLeasesResponse
		if r, err = s.RenewLeases(ctx, k.RenewLeases); err == nil {
			reply.Result = &pb.WorkReply_RenewLeases{RenewLeases: r}
		}
	case *pb.WorkCall_ReportObservation:
		var r *pb.ReportObservationResponse
		if r, err = s.ReportObservation(ctx, k.ReportObservation); err == nil {
			reply.Result = &pb.WorkReply_ReportObservation{ReportObservation: r}
		}
	default:
		err = s.toStatus(ctx, store.Invalid("call", "one of complete, reschedule, escalate, renew_leases or "+
			"report_observation is required"), jobAttrs{})
	}
	if err != nil {
		reply.Error = statusBytes(err)
	}
	return reply
}

// statusBytes is err's google.rpc.Status, serialized as gRPC's
// grpc-status-details-bin trailer carries it.
func statusBytes(err error) []byte {
	b, merr := proto.Marshal(status.Convert(err).Proto())
	if merr != nil {
		b, _ = proto.Marshal(status.New(codes.Internal, "internal error").Proto())
	}
	return b
}

// streamEnd is the status a stream ends with after err from Recv or Send:
// none after a half-close.
func streamEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unavailable, err.Error())
}

// workStartFromProto validates the stream's first message, naming its
// fields as start.<field>.
func workStartFromProto(m *pb.WorkRequest, defaultLease time.Duration) (store.ClaimParams, int, error) {
	start := m.GetStart()
	if start == nil {
		return store.ClaimParams{}, 0, store.Invalid("start", "the stream's first message must be a WorkStart")
	}
	p, _, err := claimFromProto(&pb.ClaimRequest{WorkerId: start.GetWorkerId(), MaxJobs: 1,
		LeaseDuration: start.GetLeaseDuration(), Provider: start.GetProvider()}, defaultLease)
	if err == nil {
		err = p.Validate()
	}
	var ve *store.ValidationError
	if errors.As(err, &ve) {
		for i := range ve.Violations {
			ve.Violations[i].Field = "start." + ve.Violations[i].Field
		}
	}
	if err != nil {
		return p, 0, err
	}
	if c := start.GetCredits(); c < 0 || c > MaxStreamCredits {
		return p, 0, store.Invalid("start.credits", "must be 0..%d, got %d", MaxStreamCredits, c)
	}
	return p, int(start.GetCredits()), nil
}
