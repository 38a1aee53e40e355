package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// The canceller (R32): as an operator would, it cancels a share of the
// campaign's refunds (--cancel-share) at moments that matter, each after
// reading the job's attempt with GetJob, and keeps every answer for the
// checks (invariants 13 and 14). The coordinators run open on loopback (no
// --tokens-file, as every caller of the campaign reaches them), so the
// history names the canceller "operator", as it does any caller without a
// credential: the operator role is the one every caller has there.

// The moments of a cancel.
const (
	// cancelAtEnqueue: just after the enqueue was acknowledged, mostly
	// before any claim (a worker stream waiting for work may be granted the
	// job in the enqueue's own transaction: then it runs).
	cancelAtEnqueue = "enqueued"
	// cancelInCall: 0-3 ms after a worker logged its claim of the job to
	// refund: its provider call is under way; or, on cue, while the
	// provider holds the job's create in a hang or a slow call.
	cancelInCall = "in-call"
	// cancelAtRefund: 0-5 ms after the provider made the job's refund: the
	// worker's write-back of it is in flight, and races the cancel.
	cancelAtRefund = "refund-made"
	// cancelAfterCut: right after a cut: the provider cut its reply to the
	// create of the job's refund (provider-cut-reply: made, and its worker
	// does not know), or the worker front cut a replica's streams and calls
	// (coordinator-stream-cut: a job running on one of its workers).
	cancelAfterCut = "after-cut"
)

// Pacing of the canceller.
const (
	cancelTries = 3 // cancels of one job sent with a fresh attempt after STALE_ATTEMPT
	// A call that answered nothing is repeated as it was, on the next
	// replica, cancelCallRetry apart, for cancelCallFor at most: a
	// coordinator restarts, a database comes back.
	cancelCallFor     = 15 * time.Second
	cancelCallRetry   = 250 * time.Millisecond
	cancelCallTimeout = 3 * time.Second
	cancelCueWait     = 15 * time.Second // how long a targeted cancel waits for its moment
	// Of the cancels, cancelHangShare come while the provider holds the
	// job's create (a hang or a slow call: the worker is calling it) and
	// cancelCutShare right after cuts, on cue, as long as those shares
	// last; the rest are drawn per job at its enqueue.
	cancelHangShare = 0.25
	cancelCutShare  = 0.15
)

// cancelAnswer is one cancel the canceller made, with what it was
// answered: the checks hold each to the job's history.
type cancelAnswer struct {
	Key    string
	JobID  int64
	Moment string
	// StateSeen and Attempt are what the last GetJob before the last
	// CancelRefund said; Tries how many CancelRefund calls were answered
	// STALE_ATTEMPT before the last.
	StateSeen string
	Attempt   int64
	Stale     int
	// Outcome is "cancelled", "requested" or "replayed", or the error's
	// reason (STALE_ATTEMPT, JOB_NOT_CANCELLABLE, ...) or code.
	Outcome string
	Err     string
	// CoordAt is the coordinator's time of the answer: the job's
	// updated_at for a cancel that took effect (the history entry's
	// created_at), GetJob's now read after it for the others.
	CoordAt time.Time
	// At is when the campaign had the answer.
	At time.Time
}

// ok reports whether the cancel took effect (now or before: a replay).
func (a cancelAnswer) ok() bool {
	return a.Outcome == "cancelled" || a.Outcome == "requested" || a.Outcome == "replayed"
}

// ackedJob is an enqueue the producer had acknowledged.
type ackedJob struct {
	Key   string
	JobID int64
}

// operator is the campaign's operator: gRPC clients of every replica,
// called directly (not through the workers' fronts).
type operator struct {
	conns   []*grpc.ClientConn
	clients []pb.CoordinatorClient
	next    int
	mu      sync.Mutex
}

func (s *system) newOperator() (*operator, error) {
	o := &operator{}
	for _, r := range s.replicas {
		// A killed coordinator comes back within seconds: reconnect soon
		// (gRPC's default backoff grows to two minutes), and let each call
		// wait for the connection within its own deadline.
		cc, err := grpc.NewClient(r.listen, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: time.Second,
				Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}),
			grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
		if err != nil {
			o.close()
			return nil, err
		}
		o.conns = append(o.conns, cc)
		o.clients = append(o.clients, pb.NewCoordinatorClient(cc))
	}
	return o, nil
}

func (o *operator) close() {
	for _, cc := range o.conns {
		cc.Close()
	}
}

// call runs fn against one replica after another until one answers
// (anything but UNAVAILABLE, DEADLINE_EXCEEDED or an outcome unknown), at
// most for cancelCallFor or until ctx ends. Every call the campaign's
// operator makes is safe to repeat: a read, or a fenced, idempotent write
// repeated as it was (R21).
func (o *operator) call(ctx context.Context, fn func(ctx context.Context, c pb.CoordinatorClient) error) error {
	var err error
	for until := time.Now().Add(cancelCallFor); time.Now().Before(until) && ctx.Err() == nil; {
		o.mu.Lock()
		c := o.clients[o.next%len(o.clients)]
		o.next++
		o.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, cancelCallTimeout)
		err = fn(cctx, c)
		cancel()
		if !repeatable(err) {
			return err
		}
		sleepCtx(ctx, cancelCallRetry)
	}
	if err == nil {
		err = ctx.Err()
	}
	return err
}

// repeatable reports whether err left the call's outcome open: nothing
// answered, or the coordinator could not tell.
func repeatable(err error) bool {
	if err == nil {
		return false
	}
	switch reasonOf(err) {
	case "WRITE_OUTCOME_UNKNOWN", "DATABASE_UNAVAILABLE":
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// reasonOf is the ErrorInfo reason of a coordinator's error ("" for none).
func reasonOf(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// canceller cancels a share of the campaign's refunds.
type canceller struct {
	s  *system
	op *operator
	// life bounds the cancels' calls: they may end after the window that
	// chose them, within the settle.
	life   context.Context
	rng    *rand.Rand // run's draws
	cueRng *rand.Rand // watchProvider's
	share  float64
	// specs: the campaign's refunds (those dated beyond the campaign are
	// never cancelled: invariant 11 holds them to their enqueue).
	specs map[string]refundSpec

	mu      sync.Mutex
	answers []cancelAnswer
	chosen  map[string]bool // keys cancelled or waiting for their moment
	// cued counts the cancels on cue so far (cancelInCall: the provider's
	// hangs; cancelAfterCut: cuts), within cueMax.
	cued, cueMax map[string]int
	wg           sync.WaitGroup
}

// newCanceller makes the canceller of the campaign's seed.
func (s *system) newCanceller(life context.Context, seed uint64, specs []refundSpec, share float64) (*canceller, error) {
	op, err := s.newOperator()
	if err != nil {
		return nil, err
	}
	h := fnv.New64a()
	h.Write([]byte("canceller"))
	c := &canceller{s: s, op: op, life: life, rng: rand.New(rand.NewPCG(seed, h.Sum64())),
		cueRng: rand.New(rand.NewPCG(seed, h.Sum64()+1)), share: share,
		specs: map[string]refundSpec{}, chosen: map[string]bool{}, cued: map[string]int{}}
	n := 0.0
	for _, sp := range specs {
		c.specs[sp.Key] = sp
		if !sp.Beyond {
			n++
		}
	}
	c.cueMax = map[string]int{cancelInCall: int(n*share*cancelHangShare + 0.5),
		cancelAfterCut: int(n*share*cancelCutShare + 0.5)}
	return c, nil
}

// run draws, for each acknowledged enqueue of acked, whether and when to
// cancel it, and cancels after cuts (cuts: the replicas whose worker fronts
// were just cut; the provider's log for its cut replies), until ctx ends;
// then it waits for the cancels under way.
func (c *canceller) run(ctx context.Context, acked <-chan ackedJob, cuts <-chan string) {
	defer c.wg.Wait()
	c.wg.Go(func() { c.watchProvider(ctx) })
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-acked:
			sp := c.specs[a.Key]
			if sp.Beyond || c.rng.Float64() >= c.share*(1-cancelHangShare-cancelCutShare) {
				continue
			}
			moment := []string{cancelAtEnqueue, cancelInCall, cancelAtRefund}[c.rng.IntN(3)]
			delay := time.Duration(c.rng.IntN(4)) * time.Millisecond
			c.mu.Lock()
			c.chosen[a.Key] = true
			c.mu.Unlock()
			c.wg.Go(func() { c.cancelAt(ctx, a, moment, delay) })
		case replica := <-cuts:
			c.wg.Go(func() { c.cancelAfterStreamCut(ctx, replica) })
		}
	}
}

// take reserves key for a cancel on cue (cancelInCall or
// cancelAfterCut), within that cue's share.
func (c *canceller) take(cue, key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chosen[key] || c.cued[cue] >= c.cueMax[cue] || c.specs[key].Beyond || c.specs[key].Key == "" {
		return false
	}
	c.chosen[key] = true
	c.cued[cue]++
	return true
}

// cancelAt waits for the job's moment, then cancels it.
func (c *canceller) cancelAt(ctx context.Context, a ackedJob, moment string, delay time.Duration) {
	var ok bool
	switch moment {
	case cancelAtEnqueue:
		ok = true
	case cancelInCall:
		// Its claim may be logged already (granted in the enqueue's own
		// transaction): the workers' recent lines are looked at too.
		ok = c.waitWorkers(ctx, func(r map[string]any) bool {
			action, _ := r["next_action"].(string)
			return r["msg"] == "job claimed" && r["operation_key"] == a.Key && strings.EqualFold(action, "refund")
		})
	case cancelAtRefund:
		p := c.s.provider
		_, err := p.waitRecord(min(cancelCueWait, time.Until(deadlineOf(ctx))), max(0, p.recordCount()-2000),
			func(r map[string]any) bool { return r["msg"] == "refund created" && r["idempotency_key"] == a.Key })
		ok = err == nil
	}
	if !ok {
		moment += " (its moment did not come: cancelled when the wait ended)"
	}
	time.Sleep(delay)
	c.cancel(c.life, a, moment)
}

// waitWorkers waits (within cancelCueWait and the window) for a line of
// any running worker that match accepts, looking back over their recent
// lines first.
func (c *canceller) waitWorkers(ctx context.Context, match func(map[string]any) bool) bool {
	var ps []*proc
	var from []int
	for _, w := range c.s.workers {
		if p := w.current(); p != nil && !p.exited() {
			ps, from = append(ps, p), append(from, max(0, p.recordCount()-500))
		}
	}
	if len(ps) == 0 {
		return false
	}
	_, _, err := waitAnyFrom(ps, from, min(cancelCueWait, time.Until(deadlineOf(ctx))), match)
	return err == nil
}

// watchProvider cancels on the provider's cues, within their shares: the
// job whose create the provider holds in a hang or a slow call (its worker
// is calling it: cancelled 0-3 ms into the hold), and the job whose create
// the provider just made and cut the reply to (provider-cut-reply: its
// worker does not know the refund exists).
func (c *canceller) watchProvider(ctx context.Context) {
	p := c.s.provider
	from := p.recordCount()
	for ctx.Err() == nil {
		wait := min(time.Second, time.Until(deadlineOf(ctx)))
		var recs []map[string]any
		_, _ = p.waitRecord(wait, from, func(r map[string]any) bool {
			if key, _ := r["idempotency_key"].(string); key != "" &&
				(r["msg"] == "fault: reply cut" || r["msg"] == "fault: hanging") {
				recs = append(recs, r)
			}
			return false // every record up to the wait's end
		})
		from = p.recordCount()
		for _, r := range recs {
			key, _ := r["idempotency_key"].(string)
			cue, moment := cancelAfterCut, cancelAfterCut+" (the provider cut its reply)"
			if r["msg"] == "fault: hanging" {
				mode, _ := r["mode"].(string)
				d, _ := r["for"].(float64) // slog writes a duration in nanoseconds
				cue, moment = cancelInCall, fmt.Sprintf("%s (the provider holds its create: %s for %s)", cancelInCall, mode,
					time.Duration(d).Round(time.Millisecond))
			}
			if !c.take(cue, key) {
				continue
			}
			delay := time.Duration(c.cueRng.IntN(4)) * time.Millisecond
			c.wg.Go(func() {
				time.Sleep(delay)
				c.cancel(c.life, ackedJob{Key: key}, moment)
			})
		}
	}
}

// cancelAfterStreamCut cancels, within the cuts' share, a job running on
// a worker of replica, whose worker front was just cut.
func (c *canceller) cancelAfterStreamCut(ctx context.Context, replica string) {
	var workers []string
	for _, w := range c.s.workers {
		if w.replica.name != replica {
			continue
		}
		w.mu.Lock()
		for _, wp := range w.procs {
			workers = append(workers, wp.id)
		}
		w.mu.Unlock()
	}
	var running []*pb.Job
	err := c.op.call(ctx, func(ctx context.Context, cl pb.CoordinatorClient) error {
		resp, err := cl.ListJobs(ctx, &pb.ListJobsRequest{State: pb.JobState_JOB_STATE_RUNNING, PageSize: 100})
		running = resp.GetJobs()
		return err
	})
	if err != nil {
		return
	}
	for _, j := range running {
		if slices.Contains(workers, j.GetWorkerId()) && c.take(cancelAfterCut, j.GetOperationKey()) {
			c.cancel(c.life, ackedJob{Key: j.GetOperationKey(), JobID: j.GetId()},
				fmt.Sprintf("%s (%s's worker front cut; running on %s)", cancelAfterCut, replica, j.GetWorkerId()))
			return
		}
	}
}

// getJob reads the job of key: its id (after a failover the new primary
// may have given it another), its attempt, its state and the
// coordinator's now.
func (c *canceller) getJob(ctx context.Context, key string) (*pb.GetJobResponse, error) {
	var out *pb.GetJobResponse
	err := c.op.call(ctx, func(ctx context.Context, cl pb.CoordinatorClient) error {
		var err error
		out, err = cl.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_OperationKey{OperationKey: key},
			ObservationsPageSize: 1})
		return err
	})
	return out, err
}

// cancel cancels job a as a person would: it reads the job's attempt,
// cancels with it, and when the job moved on meanwhile (STALE_ATTEMPT)
// reads it again and cancels with the fresh attempt, at most cancelTries
// times. A call that answered nothing is repeated as it was (the same
// attempt and reason: a repeat of a cancel that took effect answers
// replayed, R21). Every answer is kept, with the coordinator's time.
func (c *canceller) cancel(ctx context.Context, a ackedJob, moment string) {
	ans := cancelAnswer{Key: a.Key, JobID: a.JobID, Moment: moment}
	reason := "chaos: cancelled " + strings.SplitN(moment, " ", 2)[0]
	for try := 1; ; try++ {
		got, err := c.getJob(ctx, a.Key)
		if err != nil {
			ans.Outcome, ans.Err = "GetJob failed: "+status.Code(err).String(), err.Error()
			break
		}
		a.JobID, ans.JobID = got.GetJob().GetId(), got.GetJob().GetId()
		ans.StateSeen = strings.ToLower(strings.TrimPrefix(got.GetJob().GetState().String(), "JOB_STATE_"))
		ans.Attempt = got.GetJob().GetAttempt()
		var resp *pb.CancelRefundResponse
		err = c.op.call(ctx, func(ctx context.Context, cl pb.CoordinatorClient) error {
			var err error
			resp, err = cl.CancelRefund(ctx, &pb.CancelRefundRequest{JobId: a.JobID, Attempt: ans.Attempt, Reason: reason})
			return err
		})
		if err == nil {
			switch {
			case resp.GetReplayed():
				ans.Outcome = "replayed"
			case resp.GetCancelled():
				ans.Outcome = "cancelled"
			default:
				ans.Outcome = "requested"
			}
			ans.CoordAt = resp.GetJob().GetUpdatedAt().AsTime()
			break
		}
		ans.Outcome, ans.Err = reasonOf(err), err.Error()
		if ans.Outcome == "" {
			ans.Outcome = status.Code(err).String()
		}
		if ans.Outcome == "STALE_ATTEMPT" && try < cancelTries {
			ans.Stale++
			continue
		}
		if after, err := c.getJob(context.WithoutCancel(ctx), a.Key); err == nil {
			ans.CoordAt = after.GetNow().AsTime()
		}
		break
	}
	ans.At = time.Now()
	c.mu.Lock()
	c.answers = append(c.answers, ans)
	c.mu.Unlock()
	c.s.tl.printf("canceller: job %d (%s) %s: seen %s under attempt %d, answered %s%s", a.JobID, a.Key, moment,
		or(ans.StateSeen, "?"), ans.Attempt, ans.Outcome, staleNote(ans.Stale))
}

func staleNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (after %d STALE_ATTEMPT, read again)", n)
}

// all returns the answers so far, in the order they came.
func (c *canceller) all() []cancelAnswer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.answers)
}

// cancelSummary is the campaign's line about its cancels.
func cancelSummary(answers []cancelAnswer) string {
	byMoment, byOutcome := map[string]int{}, map[string]int{}
	stale := 0
	for _, a := range answers {
		byMoment[strings.SplitN(a.Moment, " ", 2)[0]]++
		byOutcome[a.Outcome]++
		stale += a.Stale
	}
	return fmt.Sprintf("canceller: %d cancels (%s); answered %s; %d STALE_ATTEMPT answers read again and repeated",
		len(answers), formatCounts(byMoment), formatCounts(byOutcome), stale)
}

// resolution is a person's decision on a cancel-requested job in review,
// as the resolver made it.
type resolution struct {
	Key      string
	JobID    int64
	As       string // "cancelled" or "refunded"
	RefundID string
	Outcome  string // "resolved", "replayed", or the error's reason or code
}

// resolveReviews is a person at the end of the campaign (R29, R32): each
// job whose cancel the canceller requested and that ended in manual_review
// is looked up at the provider, as a person would, and resolved: refunded,
// with its refund's id, when the provider has a refund of it that
// succeeded; cancelled when it has none (or only failed ones); left alone
// while one is pending. The resolution is fenced by the attempt GetJob
// shows.
func (c *canceller) resolveReviews(ctx context.Context) []resolution {
	var out []resolution
	done := map[string]bool{}
	for _, a := range c.all() {
		if a.Outcome != "requested" && a.Outcome != "replayed" || done[a.Key] {
			continue
		}
		done[a.Key] = true
		got, err := c.getJob(ctx, a.Key)
		if err != nil || got.GetJob().GetState() != pb.JobState_JOB_STATE_MANUAL_REVIEW ||
			got.GetJob().GetCancelRequestedAt() == nil {
			continue
		}
		found, err := c.s.pay.FindByReference(ctx, a.Key)
		if err != nil {
			continue
		}
		r := resolution{Key: a.Key, JobID: got.GetJob().GetId(), As: "cancelled"}
		req := &pb.ResolveReviewRequest{JobId: r.JobID, Attempt: got.GetJob().GetAttempt(),
			Resolution: pb.ReviewResolution_REVIEW_RESOLUTION_CANCELLED,
			Note:       "chaos: the provider has no refund of it; cancelled as asked"}
		pending := false
		for _, f := range found {
			switch f.Status {
			case "succeeded":
				r.As, r.RefundID = "refunded", f.ID
				req.Resolution, req.ProviderRefundId = pb.ReviewResolution_REVIEW_RESOLUTION_REFUNDED, f.ID
				req.Note = "chaos: the provider made the refund; the cancel came too late"
			case "pending":
				pending = true
			}
		}
		if pending && r.RefundID == "" {
			continue // a person waits for the provider
		}
		err = c.op.call(ctx, func(ctx context.Context, cl pb.CoordinatorClient) error {
			resp, err := cl.ResolveReview(ctx, req)
			r.Outcome = "resolved"
			if resp.GetReplayed() {
				r.Outcome = "replayed"
			}
			return err
		})
		if err != nil {
			if r.Outcome = reasonOf(err); r.Outcome == "" {
				r.Outcome = status.Code(err).String()
			}
		}
		c.s.tl.printf("resolver: job %d (%s), cancel requested, in review: resolved %s%s: %s", r.JobID, r.Key, r.As,
			orEmpty(" with "+r.RefundID, r.RefundID), r.Outcome)
		out = append(out, r)
	}
	return out
}

// orEmpty is s when cond is not empty, else "".
func orEmpty(s, cond string) string {
	if cond == "" {
		return ""
	}
	return s
}

// resolutionSummary is the campaign's line about the resolver's work.
func resolutionSummary(rs []resolution) string {
	as, outcomes := map[string]int{}, map[string]int{}
	for _, r := range rs {
		as[r.As]++
		outcomes[r.Outcome]++
	}
	return fmt.Sprintf("resolver: %d cancel-requested jobs in review resolved by a person (%s); answered %s", len(rs),
		formatCounts(as), formatCounts(outcomes))
}
