package server_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store/sqlite"
)

// The fuzz targets drive the real gRPC handlers over a loopback socket on the
// embedded store with whatever the fuzzer makes up, and hold the validation
// layer to its promise: no panic (the recovery interceptor would answer
// Internal), only the documented codes, every INVALID_ARGUMENT naming the
// request's fields in a BadRequest, and nothing written by a call that was
// rejected (bad input, unknown job, fenced write) or that only repeated what
// was already on file. Without -fuzz they run their seeds as ordinary tests.
//
//	go test -run='^$' -fuzz='^FuzzEnqueueRefund$' -fuzztime=60s ./server/
//
// MySQL is left out on purpose: validation happens before any SQL, in one
// layer both backends share, and the embedded store runs hundreds of calls a
// second.

// fuzzCoordinator is one coordinator per fuzz process: inputs run one after
// another, so comparing the database before and after a call is exact.
type fuzzCoordinator struct {
	client pb.CoordinatorClient
	db     *sql.DB // the store's own single connection, read only here
	seq    int64

	running, review, closed fuzzJob  // jobs in those states, for the write-backs
	ready                   int      // jobs known to be due, for Claim
	keys                    []string // operation keys on file
}

type fuzzJob struct {
	id, attempt int64
	token       string // the grant's lease token (R25)
	key         string
	ok          bool
}

func startFuzz(f *testing.F) *fuzzCoordinator {
	f.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(f.TempDir(), "jobfence.db"), sqlite.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	srv := server.New(st, server.Options{
		Lease:             15 * time.Minute, // no takeover in the middle of a run
		ClaimPollInterval: time.Millisecond,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	f.Cleanup(srv.Close) // after the server stops: cleanups run last first
	gs, _ := srv.NewGRPCServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go gs.Serve(lis) //nolint:errcheck
	f.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conn.Close() })
	return &fuzzCoordinator{client: pb.NewCoordinatorClient(conn), db: st.DB()}
}

func fuzzCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// dbState is what a write would change. total_changes() counts every row
// inserted, updated or deleted on the store's one connection since it opened,
// even in a transaction later rolled back; the counts back it up.
type dbState struct {
	changes, jobs, events, observations, ledger, budgets int64
}

func (c *fuzzCoordinator) state(t *testing.T) dbState {
	t.Helper()
	var s dbState
	err := c.db.QueryRowContext(fuzzCtx(t), `SELECT total_changes(),
		(SELECT COUNT(*) FROM refund_jobs), (SELECT COUNT(*) FROM refund_job_events),
		(SELECT COUNT(*) FROM refund_observations), (SELECT COUNT(*) FROM refund_ledger),
		(SELECT COUNT(*) FROM provider_budgets)`).
		Scan(&s.changes, &s.jobs, &s.events, &s.observations, &s.ledger, &s.budgets)
	if err != nil {
		t.Fatalf("read database state: %v", err)
	}
	return s
}

func (c *fuzzCoordinator) unchanged(t *testing.T, before dbState, what string) {
	t.Helper()
	if after := c.state(t); after != before {
		t.Fatalf("%s wrote to the database: before %+v, after %+v", what, before, after)
	}
}

// expectStatus fails t unless err is nil or one of the documented outcomes:
// INVALID_ARGUMENT with a BadRequest naming only fields of the request, or a
// code in allowed with the ErrorInfo reason the API promises for it. It
// returns the code.
func expectStatus(t *testing.T, rpc string, err error, fields []string, allowed ...codes.Code) codes.Code {
	t.Helper()
	if err == nil {
		return codes.OK
	}
	st := status.Convert(err)
	code := st.Code()
	if code != codes.InvalidArgument && !slices.Contains(allowed, code) {
		t.Fatalf("%s: unexpected %s: %s (a panic answers Internal)", rpc, code, st.Message())
	}
	var reason string
	var br *errdetails.BadRequest
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.Domain != server.Domain {
				t.Fatalf("%s: ErrorInfo domain %q", rpc, d.Domain)
			}
			reason = d.Reason
		case *errdetails.BadRequest:
			br = d
		}
	}
	want := map[codes.Code][]string{
		codes.InvalidArgument:    {server.ReasonInvalidArgument},
		codes.NotFound:           {server.ReasonNotFound},
		codes.AlreadyExists:      {server.ReasonKeyConflict},
		codes.FailedPrecondition: {server.ReasonStaleAttempt, server.ReasonJobNotRunning, server.ReasonJobNotInReview},
	}[code]
	if !slices.Contains(want, reason) {
		t.Fatalf("%s: %s with ErrorInfo reason %q, want one of %v: %s", rpc, code, reason, want, st.Message())
	}
	if code == codes.InvalidArgument {
		if br == nil || len(br.FieldViolations) == 0 {
			t.Fatalf("%s: INVALID_ARGUMENT without field violations: %s", rpc, st.Message())
		}
		for _, v := range br.FieldViolations {
			if !slices.Contains(fields, v.Field) || v.Description == "" {
				t.Fatalf("%s: violation %q (%q) does not name a field of the request %v", rpc, v.Field, v.Description, fields)
			}
		}
	}
	return code
}

// validUTF8 keeps the fuzzer's strings valid UTF-8: the client refuses to marshal
// anything else into a proto3 string, and the server never sees it.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

func (c *fuzzCoordinator) nextKey() string {
	c.seq++
	return fmt.Sprintf("fz-%d", c.seq)
}

// enqueueReady files a fresh due refund and returns its key.
func (c *fuzzCoordinator) enqueueReady(t testing.TB) string {
	t.Helper()
	key := c.nextKey()
	_, err := c.client.EnqueueRefund(fuzzCtx(t), &pb.EnqueueRefundRequest{OperationKey: key, OrderId: "ord-" + key,
		PaymentId: "pay-" + key, AmountMinor: 1500, Currency: "EUR", Provider: "acme"})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	c.ready++
	c.keys = append(c.keys, key)
	return key
}

// claimOne enqueues a refund and claims one due job (not necessarily that
// one: the oldest due goes first).
func (c *fuzzCoordinator) claimOne(t *testing.T) fuzzJob {
	t.Helper()
	c.enqueueReady(t)
	resp, err := c.client.Claim(fuzzCtx(t), &pb.ClaimRequest{WorkerId: "fuzz", MaxJobs: 1, Provider: "acme"})
	if err != nil || len(resp.Jobs) != 1 {
		t.Fatalf("claim: %v, %v", resp, err)
	}
	c.ready--
	j := resp.Jobs[0]
	return fuzzJob{id: j.Job.Id, attempt: j.Attempt, token: j.LeaseToken, key: j.Job.OperationKey, ok: true}
}

// What prepare's jobs were closed and escalated with, so that seeds can
// repeat those writes (R21).
const (
	closedRefundID  = "re_closed"
	escalatedReason = "escalated"
)

// prepare makes sure a running, a manual-review and a succeeded job exist.
func (c *fuzzCoordinator) prepare(t *testing.T) {
	t.Helper()
	ctx := fuzzCtx(t)
	if !c.closed.ok {
		j := c.claimOne(t)
		if _, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: j.id, Attempt: j.attempt, LeaseToken: j.token,
			ProviderRefundId: closedRefundID}); err != nil {
			t.Fatalf("complete: %v", err)
		}
		c.closed = j
	}
	if !c.review.ok {
		j := c.claimOne(t)
		if _, err := c.client.Escalate(ctx, &pb.EscalateRequest{JobId: j.id, Attempt: j.attempt, LeaseToken: j.token,
			Reason: escalatedReason}); err != nil {
			t.Fatalf("escalate: %v", err)
		}
		c.review = j
	}
	if !c.running.ok {
		c.running = c.claimOne(t)
	}
}

func fuzzTimestamp(secs int64, nanos int32) *timestamppb.Timestamp {
	return &timestamppb.Timestamp{Seconds: secs, Nanos: nanos}
}

func fuzzDuration(secs int64, nanos int32) *durationpb.Duration {
	return &durationpb.Duration{Seconds: secs, Nanos: nanos}
}

// Boundaries of the accepted timestamps (2000-01-01 ≤ t < 9000-01-01).
var (
	minTimeSecs = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	maxTimeSecs = time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
)

var enqueueFields = []string{"operation_key", "order_id", "payment_id", "amount_minor", "currency", "provider", "not_before"}

func FuzzEnqueueRefund(f *testing.F) {
	long := func(n int) string { return strings.Repeat("k", n) }
	f.Add("op-1", "order-1", "pay-1", int64(1999), "EUR", "acme", false, int64(0), int32(0))
	f.Add("op-1", "order-1", "pay-1", int64(2000), "EUR", "acme", false, int64(0), int32(0)) // conflict
	f.Add(long(128), long(128), long(128), int64(math.MaxInt64), "JPY", long(64), false, int64(0), int32(0))
	f.Add(long(129), long(129), long(129), int64(1), "USD", long(65), false, int64(0), int32(0))
	f.Add("", "", "", int64(0), "", "", false, int64(0), int32(0))
	f.Add("op 2", "order\x00", "pay\u0085", int64(-1), "eur", "Acme", false, int64(0), int32(0))
	f.Add("op-\x7f", "注文-1", "pay-é", int64(math.MinInt64), "EURO", "a.b", false, int64(0), int32(0))
	f.Add("op-3", "order-3", "pay-3", int64(1), "XTS", "acme", true, minTimeSecs, int32(0))
	f.Add("op-4", "order-4", "pay-4", int64(1), "EUR", "acme", true, minTimeSecs-1, int32(999_999_999))
	f.Add("op-5", "order-5", "pay-5", int64(1), "EUR", "acme", true, maxTimeSecs, int32(0))
	f.Add("op-6", "order-6", "pay-6", int64(1), "EUR", "acme", true, maxTimeSecs-1, int32(999_999_999))
	f.Add("op-7", "order-7", "pay-7", int64(1), "EUR", "acme", true, int64(-62135596801), int32(0))
	f.Add("op-8", "order-8", "pay-8", int64(1), "EUR", "acme", true, int64(0), int32(1_000_000_000))
	f.Add("op-9", "order-9", "pay-9", int64(1), "EUR", "acme", true, int64(math.MaxInt64), int32(-1))
	c := startFuzz(f)
	f.Fuzz(func(t *testing.T, key, order, payment string, amount int64, currency, provider string,
		hasNotBefore bool, nbSecs int64, nbNanos int32) {
		req := &pb.EnqueueRefundRequest{OperationKey: validUTF8(key), OrderId: validUTF8(order), PaymentId: validUTF8(payment),
			AmountMinor: amount, Currency: validUTF8(currency), Provider: validUTF8(provider)}
		if hasNotBefore {
			req.NotBefore = fuzzTimestamp(nbSecs, nbNanos)
		}
		before := c.state(t)
		resp, err := c.client.EnqueueRefund(fuzzCtx(t), req)
		switch expectStatus(t, "EnqueueRefund", err, enqueueFields, codes.AlreadyExists) {
		case codes.OK:
			j := resp.Job
			if j.OperationKey != req.OperationKey || j.OrderId != req.OrderId || j.PaymentId != req.PaymentId ||
				j.AmountMinor != req.AmountMinor || j.Currency != req.Currency || j.Provider != req.Provider {
				t.Fatalf("EnqueueRefund(%v) answered a different job %v", req, j)
			}
			if j.State != pb.JobState_JOB_STATE_READY && resp.Created {
				t.Fatalf("new job in state %s", j.State)
			}
			if !resp.Created {
				c.unchanged(t, before, "an enqueue of a key already on file")
			}
		default: // INVALID_ARGUMENT, or OPERATION_KEY_CONFLICT (R1): no second job, nothing written
			c.unchanged(t, before, fmt.Sprintf("a rejected enqueue (%v)", err))
		}
	})
}

func FuzzClaim(f *testing.F) {
	f.Add("worker-1", int32(1), false, int64(0), int32(0), false, int64(0), int32(0), "")
	f.Add("worker-1", int32(100), true, int64(900), int32(0), true, int64(60), int32(0), "acme")
	f.Add("worker-1", int32(101), true, int64(900), int32(1), true, int64(60), int32(1), "acme")
	f.Add("w", int32(0), true, int64(1), int32(0), true, int64(0), int32(0), "")
	f.Add("w", int32(-1), true, int64(0), int32(999_999_999), true, int64(-1), int32(0), "")
	f.Add("", int32(math.MaxInt32), true, int64(-1), int32(-1), true, int64(0), int32(-1), "ACME")
	f.Add(strings.Repeat("w", 129), int32(1), true, int64(math.MaxInt64), int32(0), true, int64(math.MinInt64), int32(0), "a b")
	f.Add("w\x01", int32(1), true, int64(315576000001), int32(0), false, int64(0), int32(0), "")
	c := startFuzz(f)
	fields := []string{"worker_id", "max_jobs", "lease_duration", "provider", "wait"}
	f.Fuzz(func(t *testing.T, worker string, maxJobs int32, hasLease bool, leaseSecs int64, leaseNanos int32,
		hasWait bool, waitSecs int64, waitNanos int32, provider string) {
		if c.ready <= 0 { // takeovers of short leases may grant more than was counted
			c.enqueueReady(t)
		}
		req := &pb.ClaimRequest{WorkerId: validUTF8(worker), MaxJobs: maxJobs, Provider: validUTF8(provider)}
		if hasLease {
			req.LeaseDuration = fuzzDuration(leaseSecs, leaseNanos)
		}
		if hasWait {
			req.Wait = fuzzDuration(waitSecs, waitNanos)
			// A valid long poll stays valid but short: the fuzzer must not
			// sit out minutes of waiting for work.
			if d := req.Wait.AsDuration(); req.Wait.IsValid() && d >= 0 && d <= server.MaxClaimWait {
				req.Wait = durationpb.New(min(d, time.Millisecond))
			}
		}
		before := c.state(t)
		resp, err := c.client.Claim(fuzzCtx(t), req)
		if expectStatus(t, "Claim", err, fields) != codes.OK {
			c.unchanged(t, before, fmt.Sprintf("a rejected claim (%v)", err))
			return
		}
		if len(resp.Jobs) == 0 {
			c.unchanged(t, before, "a claim that granted nothing")
			return
		}
		if len(resp.Jobs) > int(maxJobs) {
			t.Fatalf("max_jobs %d, granted %d", maxJobs, len(resp.Jobs))
		}
		c.ready -= len(resp.Jobs)
	})
}

func FuzzWriteBacks(f *testing.F) {
	// kind: 0 Complete, 1 Reschedule, 2 Escalate, 3 ResolveReview.
	// pick: 0 the fuzzer's job_id and attempt; 1 a job in the state the write
	// needs, with its attempt; 2 that job with the fuzzer's attempt; 3 a
	// succeeded job, 4 a job in manual review, each with its attempt
	// (replays, JOB_NOT_RUNNING, JOB_NOT_IN_REVIEW).
	// when: 0 neither, 1 delay, 2 next_attempt_at (Reschedule).
	for kind := uint8(0); kind < 4; kind++ {
		f.Add(kind, uint8(1), int64(0), int64(0), "re_1", "reason", int32(0), uint8(0), int64(0), int32(0), int32(1))
		f.Add(kind, uint8(3), int64(0), int64(0), "re_1", "reason", int32(1), uint8(1), int64(60), int32(0), int32(2))
		f.Add(kind, uint8(2), int64(0), int64(-1), "", "", int32(0), uint8(0), int64(0), int32(0), int32(0))
		f.Add(kind, uint8(0), int64(1), int64(1), "re_1", "r", int32(2), uint8(2), minTimeSecs, int32(0), int32(2))
		f.Add(kind, uint8(0), int64(math.MaxInt64), int64(math.MaxInt64), strings.Repeat("r", 256),
			strings.Repeat("x", 1025), int32(3), uint8(1), int64(30*24*3600), int32(1), int32(3))
		f.Add(kind, uint8(0), int64(-1), int64(0), "re\x00", "why\n", int32(-1), uint8(2), maxTimeSecs, int32(0), int32(-1))
	}
	f.Add(uint8(0), uint8(3), int64(0), int64(0), closedRefundID, "", int32(0), uint8(0), int64(0), int32(0), int32(0))
	f.Add(uint8(2), uint8(4), int64(0), int64(0), "", escalatedReason, int32(0), uint8(0), int64(0), int32(0), int32(0))
	f.Add(uint8(1), uint8(1), int64(0), int64(0), "", "", int32(0), uint8(1), int64(-1), int32(0), int32(0))
	f.Add(uint8(1), uint8(1), int64(0), int64(0), "", "", int32(0), uint8(1), int64(1), int32(-1), int32(0))
	f.Add(uint8(1), uint8(1), int64(0), int64(0), "", "", int32(0), uint8(2), minTimeSecs-1, int32(0), int32(0))
	f.Add(uint8(1), uint8(1), int64(0), int64(0), "", "", int32(0), uint8(2), int64(0), int32(0), int32(0))
	c := startFuzz(f)
	f.Fuzz(func(t *testing.T, kind, pick uint8, jobID, attempt int64, refID, reason string, nextAction int32,
		when uint8, secs int64, nanos int32, resolution int32) {
		c.prepare(t)
		refID, reason = validUTF8(refID), validUTF8(reason)
		target := &c.running
		if kind%4 == 3 {
			target = &c.review
		}
		// A picked grant comes with its lease token (R25); the fuzzer's own
		// attempts come with none.
		var token string
		switch pick % 5 {
		case 1:
			jobID, attempt, token = target.id, target.attempt, target.token
		case 2:
			jobID = target.id
		case 3:
			jobID, attempt, token = c.closed.id, c.closed.attempt, c.closed.token
		case 4:
			jobID, attempt, token = c.review.id, c.review.attempt, c.review.token
		}
		ctx := fuzzCtx(t)
		before := c.state(t)
		var rpc string
		var fields []string
		var err error
		var replayed bool
		switch kind % 4 {
		case 0:
			rpc, fields = "Complete", []string{"job_id", "attempt", "provider_refund_id"}
			var resp *pb.CompleteResponse
			resp, err = c.client.Complete(ctx, &pb.CompleteRequest{JobId: jobID, Attempt: attempt, LeaseToken: token, ProviderRefundId: refID})
			replayed = resp.GetReplayed()
		case 1:
			rpc, fields = "Reschedule", []string{"job_id", "attempt", "next_action", "delay", "next_attempt_at", "reason"}
			req := &pb.RescheduleRequest{JobId: jobID, Attempt: attempt, LeaseToken: token, NextAction: pb.NextAction(nextAction),
				Reason: reason}
			switch when % 3 {
			case 1:
				req.When = &pb.RescheduleRequest_Delay{Delay: fuzzDuration(secs, nanos)}
			case 2:
				req.When = &pb.RescheduleRequest_NextAttemptAt{NextAttemptAt: fuzzTimestamp(secs, nanos)}
			}
			var resp *pb.RescheduleResponse
			resp, err = c.client.Reschedule(ctx, req)
			replayed = resp.GetReplayed()
		case 2:
			rpc, fields = "Escalate", []string{"job_id", "attempt", "reason"}
			var resp *pb.EscalateResponse
			resp, err = c.client.Escalate(ctx, &pb.EscalateRequest{JobId: jobID, Attempt: attempt, LeaseToken: token, Reason: reason})
			replayed = resp.GetReplayed()
		case 3:
			rpc, fields = "ResolveReview", []string{"job_id", "attempt", "resolution", "provider_refund_id", "note"}
			var resp *pb.ResolveReviewResponse
			resp, err = c.client.ResolveReview(ctx, &pb.ResolveReviewRequest{JobId: jobID, Attempt: attempt,
				Resolution: pb.ReviewResolution(resolution), ProviderRefundId: refID, Note: reason})
			replayed = resp.GetReplayed()
		}
		code := expectStatus(t, rpc, err, fields, codes.NotFound, codes.FailedPrecondition)
		switch {
		case code != codes.OK:
			// Bad input, an unknown job or a fenced write (R9): nothing.
			c.unchanged(t, before, fmt.Sprintf("a rejected %s (%v)", rpc, err))
		case replayed:
			// R21: a repeat answers OK and writes nothing.
			c.unchanged(t, before, "a replayed "+rpc)
		default:
			// The job left the state it was in; find others next time.
			c.running.ok = c.running.ok && jobID != c.running.id
			c.review.ok = c.review.ok && jobID != c.review.id
			c.closed.ok = c.closed.ok && jobID != c.closed.id
		}
	})
}

func FuzzReportObservation(f *testing.F) {
	// pick: 0 the fuzzer's job_id, 1 its operation_key, 2 a job on file by
	// id, 3 a job on file by key.
	f.Add(uint8(2), int64(0), "", int64(1), "worker:w-1", int32(1), "re_1", "", "late success")
	f.Add(uint8(2), int64(0), "", int64(1), "worker:w-1", int32(1), "re_1", "", "late success, again") // duplicate
	f.Add(uint8(3), int64(0), "", int64(0), "webhook", int32(4), "", "evt_1", "")
	f.Add(uint8(3), int64(0), "", int64(0), "webhook", int32(2), "", "evt_1", "") // same event id
	f.Add(uint8(0), int64(0), "", int64(0), "webhook", int32(1), "", "", "")
	f.Add(uint8(0), int64(-1), "", int64(-1), "", int32(0), "", "", "")
	f.Add(uint8(0), int64(math.MaxInt64), "", int64(math.MaxInt64), "s", int32(5), strings.Repeat("r", 256), "", "")
	f.Add(uint8(1), int64(0), "no such key", int64(0), "s\x00", int32(-1), "", strings.Repeat("e", 256), "\x00")
	f.Add(uint8(1), int64(0), "missing-key", int64(0), "s", int32(3), "", "", strings.Repeat("d", 4097))
	c := startFuzz(f)
	fields := []string{"job_id", "operation_key", "attempt", "source", "outcome", "provider_refund_id", "provider_event_id", "detail"}
	f.Fuzz(func(t *testing.T, pick uint8, jobID int64, key string, attempt int64, source string, outcome int32,
		refID, eventID, detail string) {
		if len(c.keys) == 0 {
			c.enqueueReady(t)
		}
		req := &pb.ReportObservationRequest{Attempt: attempt, Source: validUTF8(source), Outcome: pb.ObservationOutcome(outcome),
			ProviderRefundId: validUTF8(refID), ProviderEventId: validUTF8(eventID), Detail: validUTF8(detail)}
		onFile := c.keys[0]
		switch pick % 4 {
		case 0:
			req.Job = &pb.ReportObservationRequest_JobId{JobId: jobID}
		case 1:
			req.Job = &pb.ReportObservationRequest_OperationKey{OperationKey: validUTF8(key)}
		case 2:
			got, err := c.client.GetJob(fuzzCtx(t), &pb.GetJobRequest{Job: &pb.GetJobRequest_OperationKey{OperationKey: onFile}})
			if err != nil {
				t.Fatal(err)
			}
			req.Job = &pb.ReportObservationRequest_JobId{JobId: got.Job.Id}
		case 3:
			req.Job = &pb.ReportObservationRequest_OperationKey{OperationKey: onFile}
		}
		before := c.state(t)
		resp, err := c.client.ReportObservation(fuzzCtx(t), req)
		code := expectStatus(t, "ReportObservation", err, fields, codes.NotFound)
		switch {
		case code != codes.OK:
			c.unchanged(t, before, fmt.Sprintf("a rejected observation (%v)", err))
		case resp.Duplicate:
			c.unchanged(t, before, "a duplicate observation")
		default:
			// R15, R28: filed, and the job itself untouched but for an
			// expedite's schedule, which its history records.
			events := before.events
			if resp.Expedited {
				events++
			}
			if after := c.state(t); after.observations != before.observations+1 || after.jobs != before.jobs ||
				after.events != events {
				t.Fatalf("a new observation (expedited %v) changed more than the observation log: before %+v, after %+v",
					resp.Expedited, before, after)
			}
			if o := resp.Observation.GetOutcome(); resp.Expedited && o != pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED &&
				o != pb.ObservationOutcome_OBSERVATION_OUTCOME_FAILED {
				t.Fatalf("a receipt with outcome %s expedited its job; only success and failure may (R28)", o)
			}
		}
	})
}

func FuzzReads(f *testing.F) {
	// byKey: GetJob by operation_key instead of job_id. forge: build a page
	// token for these filters around at and id, so that the fuzzer reaches
	// the cursor (it cannot guess the filters' fingerprint).
	f.Add(false, int64(1), "", int32(0), "", "", int32(0), "", false, int64(0), int64(0))
	f.Add(true, int64(0), "fz-1", int32(1), "acme", "", int32(500), "", false, int64(0), int64(0))
	f.Add(false, int64(-1), "", int32(99), "ACME", "ord\x00", int32(501), "not-a-token", false, int64(0), int64(0))
	f.Add(true, int64(0), "", int32(-1), "", strings.Repeat("o", 129), int32(-1), "AAAA", false, int64(0), int64(0))
	f.Add(false, int64(math.MaxInt64), "", int32(2), "acme", "", int32(1), "", true, int64(math.MaxInt64), int64(math.MaxInt64))
	f.Add(false, int64(0), "", int32(0), "", "ord-fz-1", int32(1), "", true, int64(math.MinInt64), int64(math.MinInt64))
	f.Add(false, int64(0), "", int32(1), "", "", int32(1), "", true, int64(-1), int64(-1))
	c := startFuzz(f)
	for range 3 {
		c.enqueueReady(f)
	}
	// A real token of the first page of everything.
	page, err := c.client.ListJobs(fuzzCtx(f), &pb.ListJobsRequest{PageSize: 1})
	if err != nil || page.NextPageToken == "" {
		f.Fatalf("ListJobs: %v %v", page, err)
	}
	f.Add(false, int64(0), "", int32(0), "", "", int32(1), page.NextPageToken, false, int64(0), int64(0))
	f.Add(false, int64(0), "", int32(0), "acme", "", int32(1), page.NextPageToken, false, int64(0), int64(0))
	getFields := []string{"job_id", "operation_key"}
	listFields := []string{"state", "provider", "order_id", "page_size", "page_token"}
	f.Fuzz(func(t *testing.T, byKey bool, jobID int64, key string, state int32, provider, orderID string,
		pageSize int32, token string, forge bool, at, id int64) {
		before := c.state(t)
		get := &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: jobID}}
		if byKey {
			get.Job = &pb.GetJobRequest_OperationKey{OperationKey: validUTF8(key)}
		}
		resp, err := c.client.GetJob(fuzzCtx(t), get)
		if expectStatus(t, "GetJob", err, getFields, codes.NotFound) == codes.OK && resp.Job == nil {
			t.Fatal("GetJob answered OK without a job")
		}
		list := &pb.ListJobsRequest{State: pb.JobState(state), Provider: validUTF8(provider), OrderId: validUTF8(orderID),
			PageSize: pageSize, PageToken: validUTF8(token)}
		if forge {
			list.PageToken = forgeToken(list, at, id)
		}
		_, err = c.client.ListJobs(fuzzCtx(t), list)
		expectStatus(t, "ListJobs", err, listFields)
		c.unchanged(t, before, "a read")
	})
}

// FuzzLookups drives the operator console's reads: ListJobs with the
// lookups by payment and provider refund id, the reason prefix and the
// created range, and GetOverview with any limit. Nothing is written.
func FuzzLookups(f *testing.F) {
	// hasAfter, hasBefore: send created_after, created_before.
	f.Add(int32(0), "pay-fz-1", "", "", false, int64(0), int32(0), false, int64(0), int32(0), int32(1), "", int32(0))
	f.Add(int32(4), "", "re_1", "no record", true, minTimeSecs, int32(0), true, maxTimeSecs-1, int32(999999999),
		int32(500), "", int32(100))
	f.Add(int32(1), "ord", "re_1", "50% off_", true, maxTimeSecs, int32(0), true, minTimeSecs, int32(-1), int32(0),
		"AAAA", int32(101))
	f.Add(int32(0), strings.Repeat("p", 129), strings.Repeat("r", 256), strings.Repeat("x", 1025), true, int64(1),
		int32(1), false, int64(0), int32(0), int32(-1), "not-a-token", int32(-1))
	f.Add(int32(0), "", "", "a\x00b", true, minTimeSecs+1, int32(0), true, minTimeSecs+1, int32(0), int32(2), "", int32(1))
	c := startFuzz(f)
	key := c.enqueueReady(f)
	c.enqueueReady(f)
	// A real token of a lookup by payment, and one of a created range.
	for _, req := range []*pb.ListJobsRequest{{PaymentId: "pay-" + key, PageSize: 1},
		{State: pb.JobState_JOB_STATE_READY, CreatedAfter: fuzzTimestamp(minTimeSecs, 0), PageSize: 1}} {
		page, err := c.client.ListJobs(fuzzCtx(f), req)
		if err != nil {
			f.Fatalf("ListJobs: %v %v", page, err)
		}
		f.Add(int32(0), req.PaymentId, "", "", req.CreatedAfter != nil, minTimeSecs, int32(0), false, int64(0), int32(0),
			int32(1), page.NextPageToken, int32(0))
	}
	listFields := []string{"state", "payment_id", "provider_refund_id", "reason_prefix", "created_after", "created_before",
		"page_size", "page_token"}
	f.Fuzz(func(t *testing.T, state int32, payment, refundID, prefix string, hasAfter bool, afterSecs int64,
		afterNanos int32, hasBefore bool, beforeSecs int64, beforeNanos int32, pageSize int32, token string, limit int32) {
		before := c.state(t)
		list := &pb.ListJobsRequest{State: pb.JobState(state), PaymentId: validUTF8(payment),
			ProviderRefundId: validUTF8(refundID), ReasonPrefix: validUTF8(prefix), PageSize: pageSize,
			PageToken: validUTF8(token)}
		if hasAfter {
			list.CreatedAfter = fuzzTimestamp(afterSecs, afterNanos)
		}
		if hasBefore {
			list.CreatedBefore = fuzzTimestamp(beforeSecs, beforeNanos)
		}
		resp, err := c.client.ListJobs(fuzzCtx(t), list)
		if expectStatus(t, "ListJobs", err, listFields) == codes.OK {
			for id := range resp.ObservationCounts {
				if !slices.ContainsFunc(resp.Jobs, func(j *pb.Job) bool { return j.Id == id }) {
					t.Fatalf("observation_counts names job %d, not on the page", id)
				}
			}
		}
		_, err = c.client.GetOverview(fuzzCtx(t), &pb.GetOverviewRequest{Limit: limit})
		expectStatus(t, "GetOverview", err, []string{"limit"})
		c.unchanged(t, before, "a read")
	})
}

// forgeToken builds a page token for r's filters the way the store does
// (store.ListParams.NextToken), with any cursor: a client may send whatever
// it likes.
func forgeToken(r *pb.ListJobsRequest, at, id int64) string {
	states := map[pb.JobState]string{pb.JobState_JOB_STATE_READY: "ready", pb.JobState_JOB_STATE_RUNNING: "running",
		pb.JobState_JOB_STATE_SUCCEEDED: "succeeded", pb.JobState_JOB_STATE_MANUAL_REVIEW: "manual_review"}
	state := states[r.State]
	order := "id"
	switch {
	case r.OrderId != "":
		order = "order"
	case state != "":
		order = "state"
	}
	sum := sha256.Sum256([]byte(state + "\x00" + r.Provider + "\x00" + r.OrderId))
	raw := strings.Join([]string{hex.EncodeToString(sum[:6]), order, strconv.FormatInt(at, 10), strconv.FormatInt(id, 10)}, "|")
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}
