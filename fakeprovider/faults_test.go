package fakeprovider_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

func TestPendingRefundSettlesByTheSimulatorClock_R4(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	r, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "pending=30"), "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != fakeprovider.StatusPending {
		t.Fatalf("status = %s, want pending", r.Status)
	}
	e.p.Advance(29 * time.Second)
	if got, err := e.c.GetRefund(ctx, r.ID); err != nil || got.Status != fakeprovider.StatusPending {
		t.Fatalf("after 29s: %+v, %v; want pending", got, err)
	}
	if replay, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1")); err != nil ||
		!replay.Replayed || replay.Status != fakeprovider.StatusPending {
		t.Fatalf("replay after 29s: %+v, %v; want the pending refund", replay, err)
	}
	// Pending money is on its way: the oracle counts it.
	if op, _ := e.p.Oracle().Operation("op-1"); op.Refunds != 1 || op.RefundedMinor != 1500 {
		t.Fatalf("oracle while pending: %+v", op)
	}
	e.p.Advance(time.Second)
	if got, err := e.c.GetRefund(ctx, r.ID); err != nil || got.Status != fakeprovider.StatusSucceeded {
		t.Fatalf("after 30s: %+v, %v; want succeeded", got, err)
	}
}

func TestFailFaultEndsRefundFailed(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	r, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "pending=10,fail"), "op-1", refundParams("op-1"))
	if err != nil || r.Status != fakeprovider.StatusPending {
		t.Fatalf("create: %+v, %v; want pending first", r, err)
	}
	e.p.Advance(10 * time.Second)
	got, err := e.c.GetRefund(ctx, r.ID)
	if err != nil || got.Status != fakeprovider.StatusFailed || got.FailureReason != "declined" {
		t.Fatalf("after 10s: %+v, %v; want failed, declined", got, err)
	}
	replay, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil || replay.ID != r.ID || replay.Status != fakeprovider.StatusFailed {
		t.Fatalf("same-key resend: %+v, %v; want the failed refund again", replay, err)
	}
	op, _ := e.p.Oracle().Operation("op-1")
	if op.Refunds != 0 || op.Failed != 1 || op.RefundedMinor != 0 {
		t.Fatalf("oracle: %+v; a failed refund moves no money", op)
	}
}

func TestLookupLagHidesARefundThatExists_R14(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	r, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "lookup_lag=10"), "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	e.p.Advance(9 * time.Second)
	if _, err := e.c.GetRefund(ctx, r.ID); !errors.Is(err, fakeprovider.ErrNotFound) {
		t.Fatalf("GetRefund under lag: err = %v, want ErrNotFound", err)
	}
	if found, err := e.c.FindByReference(ctx, "op-1"); err != nil || len(found) != 0 {
		t.Fatalf("FindByReference under lag = %v, %v; want no record", found, err)
	}
	if found, err := e.c.ListByPayment(ctx, "pay_1"); err != nil || len(found) != 0 {
		t.Fatalf("ListByPayment under lag = %v, %v; want no record", found, err)
	}
	// "No record" is not "nothing happened": the oracle knows.
	if n := len(e.p.Oracle().Refunds); n != 1 {
		t.Fatalf("oracle refunds = %d, want 1", n)
	}
	// Inside the key window a same-key resend is safe: it replays.
	replay, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil || replay.ID != r.ID || !replay.Replayed {
		t.Fatalf("resend under lag = %+v, %v; want a replay of %s", replay, err, r.ID)
	}
	e.p.Advance(time.Second)
	if found, err := e.c.FindByReference(ctx, "op-1"); err != nil || len(found) != 1 || found[0].ID != r.ID {
		t.Fatalf("FindByReference after the lag = %v, %v", found, err)
	}
	if o := e.p.Oracle(); o.DoubleRefunds != 0 {
		t.Fatalf("double refunds: %+v", o)
	}
}

func TestLookupLagOnALookupRequest(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	r, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	lagged := fakeprovider.WithFault(ctx, "lookup_lag=5")
	if _, err := e.c.GetRefund(lagged, r.ID); !errors.Is(err, fakeprovider.ErrNotFound) {
		t.Fatalf("lagged lookup: err = %v, want ErrNotFound", err)
	}
	if _, err := e.c.GetRefund(ctx, r.ID); err != nil {
		t.Fatalf("unlagged lookup: %v", err)
	}
	e.p.Advance(5 * time.Second)
	if _, err := e.c.GetRefund(lagged, r.ID); err != nil {
		t.Fatalf("lagged lookup after 5s: %v", err)
	}
}

func TestErrorBurstDoesNothing(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	if _, err := e.c.SetFaults(ctx, fakeprovider.Faults{ErrorBurst: 2}); err != nil {
		t.Fatal(err)
	}
	_, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if !errors.Is(err, fakeprovider.ErrUnavailable) {
		t.Fatalf("create in burst: err = %v, want ErrUnavailable", err)
	}
	wantStatusError(t, err, http.StatusServiceUnavailable, fakeprovider.CodeServiceUnavailable)
	if _, err := e.c.FindByReference(ctx, "op-1"); !errors.Is(err, fakeprovider.ErrUnavailable) {
		t.Fatalf("lookup in burst: err = %v, want ErrUnavailable", err)
	}
	if n := len(e.p.Oracle().Refunds); n != 0 {
		t.Fatalf("%d refunds created during the burst", n)
	}
	if f, err := e.c.Faults(ctx); err != nil || !f.IsZero() {
		t.Fatalf("faults after the burst = %+v, %v; want none left", f, err)
	}
	r, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil || r.Replayed {
		t.Fatalf("after the burst: %+v, %v; want a fresh refund", r, err)
	}

	// In a header, error_burst=2 fails this request and the next one.
	if _, err := e.c.GetRefund(fakeprovider.WithFault(ctx, "error_burst=2"), r.ID); !errors.Is(err, fakeprovider.ErrUnavailable) {
		t.Fatalf("header burst: err = %v", err)
	}
	if _, err := e.c.GetRefund(ctx, r.ID); !errors.Is(err, fakeprovider.ErrUnavailable) {
		t.Fatalf("request after header burst=2: err = %v, want ErrUnavailable", err)
	}
	if _, err := e.c.GetRefund(ctx, r.ID); err != nil {
		t.Fatalf("burst over: %v", err)
	}
	if o := e.p.Oracle(); o.Stats.InjectedErrors != 4 {
		t.Fatalf("injected errors = %d, want 4", o.Stats.InjectedErrors)
	}
}

func TestHangBeforeCancelledDoesNothing(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx, cancel := context.WithTimeout(fakeprovider.WithFault(testCtx(t), "hang_before=30"), 200*time.Millisecond)
	defer cancel()
	_, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if !errors.Is(err, fakeprovider.ErrNoReply) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrNoReply wrapping DeadlineExceeded", err)
	}
	closeWithin(t, e.srv, 10*time.Second)
	if o := e.p.Oracle(); len(o.Refunds) != 0 {
		t.Fatalf("refunds = %+v, want none: the request was cancelled before anything happened", o.Refunds)
	}
}

func TestHangBeforeThenActs(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	r, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "hang_before=50ms"), "op-1", refundParams("op-1"))
	if err != nil || r.ID == "" {
		t.Fatalf("create after a short hang: %+v, %v", r, err)
	}
}

// TestLatencyHoldsEveryCreation: Config.Latency holds each creation before
// it acts (a call is in flight that long), and a client that goes away
// meanwhile has nothing done, as after a hang_before.
func TestLatencyHoldsEveryCreation(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{Latency: 300 * time.Millisecond})
	start := time.Now()
	if r, err := e.c.CreateRefund(testCtx(t), "op-1", refundParams("op-1")); err != nil || r.ID == "" {
		t.Fatalf("create: %+v, %v", r, err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("the creation answered after %s, before its latency of 300ms", took)
	}
	ctx, cancel := context.WithTimeout(testCtx(t), 50*time.Millisecond)
	defer cancel()
	if _, err := e.c.CreateRefund(ctx, "op-2", refundParams("op-2")); !errors.Is(err, fakeprovider.ErrNoReply) {
		t.Fatalf("err = %v, want ErrNoReply", err)
	}
	closeWithin(t, e.srv, 10*time.Second)
	if o := e.p.Oracle(); len(o.Refunds) != 1 {
		t.Fatalf("refunds = %+v, want op-1's alone: op-2's client went away during the latency", o.Refunds)
	}
}

func TestHangAfterCancelledRefundStands_T3(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx, cancel := context.WithTimeout(fakeprovider.WithFault(testCtx(t), "hang_after=30"), 200*time.Millisecond)
	defer cancel()
	_, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if !errors.Is(err, fakeprovider.ErrNoReply) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrNoReply wrapping DeadlineExceeded", err)
	}
	o := e.p.Oracle()
	if len(o.Refunds) != 1 {
		t.Fatalf("refunds = %d, want 1: the refund happened before the hang", len(o.Refunds))
	}
	// The next holder reconciles with the same key and finds it.
	found, err := e.c.FindByReference(testCtx(t), "op-1")
	if err != nil || len(found) != 1 || found[0].ID != o.Refunds[0].ID {
		t.Fatalf("reconcile = %v, %v", found, err)
	}
	closeWithin(t, e.srv, 10*time.Second)
}

func TestCutReplyLosesTheReplyNotTheRefund_T3(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	// Warm a keep-alive connection: on a reused connection net/http would
	// resend a replayable POST whose reply was cut; the Client must not.
	if _, err := e.c.ListByPayment(ctx, "pay_1"); err != nil {
		t.Fatal(err)
	}
	_, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "cut_reply"), "op-1", refundParams("op-1"))
	if !errors.Is(err, fakeprovider.ErrNoReply) {
		t.Fatalf("err = %v, want ErrNoReply", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v: the cut, not a timeout, must end the call", err)
	}
	o := e.p.Oracle()
	if len(o.Refunds) != 1 || o.Stats.CreateRequests != 1 || o.Stats.CutReplies != 1 {
		t.Fatalf("oracle = %+v; want one refund from exactly one create request", o)
	}
	// A same-key resend inside the window replays; no second refund.
	r, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil || !r.Replayed || r.ID != o.Refunds[0].ID {
		t.Fatalf("resend = %+v, %v; want a replay of %s", r, err, o.Refunds[0].ID)
	}
	if o := e.p.Oracle(); o.DoubleRefunds != 0 || len(o.Refunds) != 1 {
		t.Fatalf("oracle after resend = %+v", o)
	}
}

func TestCutReplyOnALookup(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	if _, err := e.c.FindByReference(fakeprovider.WithFault(ctx, "cut_reply"), "op-1"); !errors.Is(err, fakeprovider.ErrNoReply) {
		t.Fatalf("err = %v, want ErrNoReply", err)
	}
}

func TestGlobalFaultsScopedByKeyAndTimes(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	set, err := e.c.SetFaults(ctx, fakeprovider.Faults{CutReply: true, Pending: 30 * time.Second, Key: "op-2", Times: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !set.CutReply || set.Pending != 30*time.Second || set.Key != "op-2" || set.Times != 1 {
		t.Fatalf("SetFaults returned %+v", set)
	}
	// Another key and lookups are untouched.
	r1, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil || r1.Status != fakeprovider.StatusSucceeded {
		t.Fatalf("op-1: %+v, %v; want untouched", r1, err)
	}
	if _, err := e.c.FindByReference(ctx, "op-2"); err != nil {
		t.Fatalf("lookup: %v", err)
	}
	if _, err := e.c.CreateRefund(ctx, "op-2", refundParams("op-2")); !errors.Is(err, fakeprovider.ErrNoReply) {
		t.Fatalf("op-2: err = %v, want the reply cut", err)
	}
	if f, err := e.c.Faults(ctx); err != nil || !f.IsZero() {
		t.Fatalf("faults after times=1 used = %+v, %v; want cleared", f, err)
	}
	r2, err := e.c.CreateRefund(ctx, "op-2", refundParams("op-2"))
	if err != nil || !r2.Replayed || r2.Status != fakeprovider.StatusPending {
		t.Fatalf("op-2 resend: %+v, %v; want a replay of the pending refund", r2, err)
	}
}

func TestHeaderFaultOverridesGlobal(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{Faults: fakeprovider.Faults{Pending: 30 * time.Second}})
	ctx := testCtx(t)
	r, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "pending=5"), "op-1", refundParams("op-1"))
	if err != nil || r.Status != fakeprovider.StatusPending {
		t.Fatal(r, err)
	}
	e.p.Advance(5 * time.Second)
	if got, err := e.c.GetRefund(ctx, r.ID); err != nil || got.Status != fakeprovider.StatusSucceeded {
		t.Fatalf("after 5s: %+v, %v; want the header's 5s, not the global 30s", got, err)
	}
	// Without a header the global 30s applies.
	r2, _ := e.c.CreateRefund(ctx, "op-2", refundParams("op-2"))
	e.p.Advance(29 * time.Second)
	if got, err := e.c.GetRefund(ctx, r2.ID); err != nil || got.Status != fakeprovider.StatusPending {
		t.Fatalf("global pending: %+v, %v", got, err)
	}
	e.c.ClearFaults(ctx)
	if f := e.p.Faults(); !f.IsZero() {
		t.Fatalf("after ClearFaults: %+v", f)
	}
}

func TestBadFaultHeaderIsRejected(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	for _, spec := range []string{"explode", "hang_before", "pending=-1", "pending=soon", "error_burst=x", "key=op-1", "times=2"} {
		_, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), spec), "op-1", refundParams("op-1"))
		se := wantStatusError(t, err, http.StatusBadRequest, fakeprovider.CodeInvalidFault)
		if se.Param != fakeprovider.FaultHeader {
			t.Fatalf("%q: param = %q", spec, se.Param)
		}
	}
	if n := len(e.p.Oracle().Refunds); n != 0 {
		t.Fatalf("%d refunds created by rejected requests", n)
	}
}

func TestAdminFaultsJSON(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	url := e.srv.URL + "/v1/_admin/faults"
	status, _, body := rawDo(t, http.MethodPost, url, nil,
		`{"hang_after":1.5,"lookup_lag":10,"error_burst":3,"fail":true,"webhook_delay":2,"webhook_reorder":true}`)
	if status != http.StatusOK {
		t.Fatalf("POST: %d %s", status, body)
	}
	want := fakeprovider.Faults{HangAfter: 1500 * time.Millisecond, LookupLag: 10 * time.Second, ErrorBurst: 3, Fail: true,
		WebhookDelay: 2 * time.Second, WebhookReorder: true}
	if got := e.p.Faults(); got != want {
		t.Fatalf("faults = %+v, want %+v", got, want)
	}
	status, _, body = rawDo(t, http.MethodGet, url, nil, "")
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil || status != http.StatusOK {
		t.Fatalf("GET: %d %s", status, body)
	}
	if m["hang_after"] != 1.5 || m["lookup_lag"] != 10.0 || m["error_burst"] != 3.0 || m["fail"] != true || m["cut_reply"] != false ||
		m["webhook_delay"] != 2.0 || m["webhook_reorder"] != true || m["webhook_drop"] != false {
		t.Fatalf("GET faults = %s", body)
	}
	for _, bad := range []string{`{`, `{"hang_after":-1}`, `{"explode":true}`, `{"error_burst":-2}`, `{"webhook_delay":-1}`} {
		status, _, body := rawDo(t, http.MethodPost, url, nil, bad)
		if status != http.StatusBadRequest || errCode(t, body) != fakeprovider.CodeInvalidFault {
			t.Fatalf("POST %s: %d %s, want 400 invalid_fault", bad, status, body)
		}
	}
	if got := e.p.Faults(); got != want {
		t.Fatalf("a rejected POST changed the faults: %+v", got)
	}
	if status, _, body := rawDo(t, http.MethodDelete, url, nil, ""); status != http.StatusOK {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	if got := e.p.Faults(); !got.IsZero() {
		t.Fatalf("after DELETE: %+v", got)
	}
}

func TestParseFaults(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want fakeprovider.Faults
	}{
		{"", fakeprovider.Faults{}},
		{"hang_before=2.5", fakeprovider.Faults{HangBefore: 2500 * time.Millisecond}},
		{" hang_after = 250ms , cut_reply ", fakeprovider.Faults{HangAfter: 250 * time.Millisecond, CutReply: true}},
		{"pending=30,lookup_lag=24h", fakeprovider.Faults{Pending: 30 * time.Second, LookupLag: 24 * time.Hour}},
		{"error_burst", fakeprovider.Faults{ErrorBurst: 1}},
		{"error_burst=4,fail", fakeprovider.Faults{ErrorBurst: 4, Fail: true}},
		{"cut_reply=false,fail=true", fakeprovider.Faults{Fail: true}},
		{"cut_reply,key=op-1,times=2", fakeprovider.Faults{CutReply: true, Key: "op-1", Times: 2}},
		{"webhook_delay=1.5,webhook_duplicate,webhook_reorder", fakeprovider.Faults{WebhookDelay: 1500 * time.Millisecond,
			WebhookDuplicate: true, WebhookReorder: true}},
		{"webhook_bad_signature,webhook_old_timestamp,webhook_drop=true", fakeprovider.Faults{WebhookBadSignature: true,
			WebhookOldTimestamp: true, WebhookDrop: true}},
	} {
		got, err := fakeprovider.ParseFaults(tc.spec)
		if err != nil || got != tc.want {
			t.Errorf("ParseFaults(%q) = %+v, %v; want %+v", tc.spec, got, err, tc.want)
			continue
		}
		back, err := fakeprovider.ParseFaults(got.String())
		if err != nil || back != got {
			t.Errorf("round trip of %q via %q = %+v, %v", tc.spec, got.String(), back, err)
		}
	}
	for _, bad := range []string{"explode", "hang_before", "hang_before=", "pending=-3", "pending=NaN",
		"lookup_lag=1e300", "error_burst=-1", "times", "key=", "cut_reply=maybe", "webhook_delay", "webhook_delay=-1",
		"webhook_drop=sometimes", "webhook_explode"} {
		if f, err := fakeprovider.ParseFaults(bad); err == nil {
			t.Errorf("ParseFaults(%q) = %+v, want an error", bad, f)
		} else if !strings.Contains(err.Error(), strings.TrimSpace(bad)) {
			t.Errorf("ParseFaults(%q) error %q does not name the item", bad, err)
		}
	}
}

func TestFaultsJSONRoundTrip(t *testing.T) {
	f := fakeprovider.Faults{HangBefore: time.Second, HangAfter: 2 * time.Second, CutReply: true,
		Pending: 3 * time.Second, LookupLag: 4 * time.Second, ErrorBurst: 5, Fail: true, Key: "op-1", Times: 6,
		WebhookDelay: 7 * time.Second, WebhookDuplicate: true, WebhookReorder: true, WebhookBadSignature: true,
		WebhookOldTimestamp: true, WebhookDrop: true}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	var back fakeprovider.Faults
	if err := json.Unmarshal(b, &back); err != nil || back != f {
		t.Fatalf("round trip via %s = %+v, %v", b, back, err)
	}
}

func TestSetFaultsValidates(t *testing.T) {
	p := fakeprovider.New(fakeprovider.Config{})
	if err := p.SetFaults(fakeprovider.Faults{Pending: -time.Second}); err == nil {
		t.Fatal("negative pending accepted")
	}
	if err := p.SetFaults(fakeprovider.Faults{Times: -1}); err == nil {
		t.Fatal("negative times accepted")
	}
}
