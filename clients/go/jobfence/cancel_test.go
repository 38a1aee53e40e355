package jobfence

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// recordingConn is a coordinator connection that accepts every unary call
// with an empty answer and records it; it has no worker stream.
type recordingConn struct {
	mu    sync.Mutex
	calls []recordedCall
}

type recordedCall struct {
	method string
	req    proto.Message
}

func (c *recordingConn) Invoke(_ context.Context, method string, args, _ any, _ ...grpc.CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, recordedCall{path.Base(method), proto.Clone(args.(proto.Message))})
	return nil
}

func (c *recordingConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "no worker stream here")
}

func (c *recordingConn) recorded() []recordedCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]recordedCall(nil), c.calls...)
}

// answeringHandler answers every call with one result (or panics) and
// counts the calls of each method.
type answeringHandler struct {
	answer  func() Result
	mu      sync.Mutex
	refunds int
	asks    int
	sawFlag []bool // ClaimedJob.CancelRequested as each call saw it
}

func (h *answeringHandler) Refund(_ context.Context, c ClaimedJob) Result {
	h.mu.Lock()
	h.refunds++
	h.sawFlag = append(h.sawFlag, c.CancelRequested)
	h.mu.Unlock()
	return h.answer()
}

func (h *answeringHandler) Reconcile(_ context.Context, c ClaimedJob) Result {
	h.mu.Lock()
	h.asks++
	h.sawFlag = append(h.sawFlag, c.CancelRequested)
	h.mu.Unlock()
	return h.answer()
}

// cancelGrant is a grant of a job first sent a minute before the claim,
// whose same-key resend window ends at the claim's time plus window, as the
// coordinator sends it; how says how it tells of the cancel request (R32).
func cancelGrant(action pb.NextAction, window time.Duration, how string) *pb.ClaimedJob {
	now := time.Now()
	g := &pb.ClaimedJob{
		Job: &pb.Job{Id: 7, OperationKey: "op-7", Provider: "acme", State: pb.JobState_JOB_STATE_RUNNING,
			Attempt: 3, NextAction: action, FirstSentAt: timestamppb.New(now.Add(-time.Minute))},
		Attempt: 3, LeaseToken: "tok-7", NextAction: action, Takeover: action == pb.NextAction_NEXT_ACTION_RECONCILE,
		LeaseUntil: timestamppb.New(now.Add(30 * time.Second)), ClaimedAt: timestamppb.New(now),
		ResendDeadline: timestamppb.New(now.Add(window)),
	}
	switch how {
	case "grant":
		g.CancelRequested = true
	case "job":
		g.Job.CancelRequestedAt = timestamppb.New(now.Add(-time.Second))
	}
	return g
}

// workOne runs one grant through the Worker's own path (the resend check,
// the handler call, DecideAt, the fenced write-back) against a recording
// coordinator, with a policy that trusts same-key resends, and returns the
// calls the coordinator received.
func workOne(t *testing.T, g *pb.ClaimedJob, h Handler) []recordedCall {
	t.Helper()
	conn := &recordingConn{}
	w, err := NewWorker(NewClient(conn), h, WorkerOptions{
		WorkerID: "w-cancel", NoStream: true, NoLeaseRenewal: true, ReceiptSpool: ReceiptSpoolOff,
		Policy: ProviderPolicy{SameKeyResendSafe: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	w.work(context.Background(), claimedFromProto(g, time.Now()))
	return conn.recorded()
}

// R32: a job whose cancel was requested is never sent, whatever the provider
// answers, inside the resend window or past it, with a policy that trusts
// same-key resends, and even under a grant that (wrongly) says refund: the
// refund handler is never called, and no write-back asks for a send.
func TestWorkerNeverSendsACancelRequestedJob_R32(t *testing.T) {
	answers := []struct {
		name   string
		answer func() Result
		method string     // the write-back
		action NextAction // Reschedule: the next action
		reason string     // part of the reason
	}{
		{"refunded", func() Result { return Succeeded("re_1") }, "Complete", "", ""},
		{"pending", func() Result { return Pending("re_1", 0) }, "Reschedule", ActionReconcile, "pending"},
		{"no record", func() Result { return NoRecord() }, "Escalate", "", "cancel requested"},
		{"rejected", func() Result { return Failed("re_1", "declined") }, "Escalate", "", "cancel requested"},
		{"handler error", func() Result { return Unknown(errors.New("connection cut")) }, "Reschedule", ActionReconcile, "outcome unknown"},
		{"handler panic", func() Result { panic("provider client blew up") }, "Reschedule", ActionReconcile, "outcome unknown"},
		{"not sent", func() Result { return NotSent("rate limited", 0) }, "Reschedule", ActionReconcile, "rate limited"},
		{"escalate", func() Result { return Escalate("odd") }, "Escalate", "", "odd"},
	}
	for _, a := range answers {
		for _, window := range []time.Duration{time.Hour, -time.Second} {
			for _, action := range []pb.NextAction{pb.NextAction_NEXT_ACTION_RECONCILE, pb.NextAction_NEXT_ACTION_REFUND} {
				for _, how := range []string{"grant", "job"} {
					name := fmt.Sprintf("%s/window %s/grant says %s/cancel on the %s", a.name, window,
						actionFromProto(action), how)
					t.Run(name, func(t *testing.T) {
						h := &answeringHandler{answer: a.answer}
						calls := workOne(t, cancelGrant(action, window, how), h)
						if h.refunds != 0 {
							t.Fatalf("the refund handler was called %d times for a job whose cancel was requested", h.refunds)
						}
						if h.asks != 1 {
							t.Fatalf("the reconcile handler was called %d times, want once", h.asks)
						}
						if len(h.sawFlag) != 1 || !h.sawFlag[0] {
							t.Errorf("the handler saw CancelRequested %v, want true", h.sawFlag)
						}
						if len(calls) != 1 {
							t.Fatalf("the coordinator got %d calls (%v), want one write-back", len(calls), calls)
						}
						c := calls[0]
						if c.method != a.method {
							t.Fatalf("write-back %s %v, want %s", c.method, c.req, a.method)
						}
						var reason string
						switch r := c.req.(type) {
						case *pb.CompleteRequest:
							if r.GetProviderRefundId() != "re_1" || r.GetAttempt() != 3 || r.GetLeaseToken() != "tok-7" {
								t.Errorf("complete %v", r)
							}
						case *pb.RescheduleRequest:
							if got := actionFromProto(r.GetNextAction()); got != a.action {
								t.Errorf("reschedule to %s, want %s (%v)", got, a.action, r)
							}
							if r.GetAttempt() != 3 || r.GetLeaseToken() != "tok-7" {
								t.Errorf("reschedule without the grant: %v", r)
							}
							reason = r.GetReason()
						case *pb.EscalateRequest:
							if r.GetAttempt() != 3 || r.GetLeaseToken() != "tok-7" {
								t.Errorf("escalate without the grant: %v", r)
							}
							reason = r.GetReason()
						}
						if !strings.Contains(reason, a.reason) {
							t.Errorf("reason %q does not contain %q", reason, a.reason)
						}
					})
				}
			}
		}
	}
}

// The premise of the test above: the same grants without a cancel request
// are sent. A refund grant calls the refund handler, and no record inside
// the window reschedules a same-key resend (R14, R22).
func TestWithoutACancelRequestTheSameGrantsSend_R14_R32(t *testing.T) {
	h := &answeringHandler{answer: NoRecord}
	calls := workOne(t, cancelGrant(pb.NextAction_NEXT_ACTION_RECONCILE, time.Hour, "none"), h)
	if len(calls) != 1 {
		t.Fatalf("the coordinator got %v, want one write-back", calls)
	}
	if r, ok := calls[0].req.(*pb.RescheduleRequest); !ok || r.GetNextAction() != pb.NextAction_NEXT_ACTION_REFUND {
		t.Fatalf("no record inside the window without a cancel request: %v, want a reschedule to refund", calls)
	}
	h = &answeringHandler{answer: func() Result { return Succeeded("re_1") }}
	workOne(t, cancelGrant(pb.NextAction_NEXT_ACTION_REFUND, time.Hour, "none"), h)
	if h.refunds != 1 || h.asks != 0 || len(h.sawFlag) != 1 || h.sawFlag[0] {
		t.Fatalf("a refund grant without a cancel request: %d refunds, %d reconciles, flag %v", h.refunds, h.asks, h.sawFlag)
	}
}
