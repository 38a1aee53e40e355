package fakeprovider_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

const testSecret = "whsec_test_0123456789"

// delivery is one POST the receiver got, with its own verdict on it.
type delivery struct {
	at     time.Time
	header string // Stripe-Signature
	body   []byte
	t      int64  // the signature's timestamp
	reject string // why the receiver refused it; "" when it verified
	status int    // what it answered
	event  wireEvent
}

// wireEvent is the event as the receiver reads it, decoded here on its own,
// not with the package's types.
type wireEvent struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
	Data    struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
	Request struct {
		ID             string `json:"id"`
		IdempotencyKey string `json:"idempotency_key"`
	} `json:"request"`
}

type wireRefund struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Amount        int64             `json:"amount"`
	Currency      string            `json:"currency"`
	Status        string            `json:"status"`
	PaymentIntent string            `json:"payment_intent"`
	FailureReason *string           `json:"failure_reason"`
	Metadata      map[string]string `json:"metadata"`
}

type wireCharge struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Refunds struct {
		Data []wireRefund `json:"data"`
	} `json:"refunds"`
}

// receiver is a webhook endpoint that verifies Stripe signatures with its
// own HMAC code (secret, 300 s tolerance) and answers 400 to a bad one, like
// the coordinator's receiver; answer, when set, overrides the status of a
// verified delivery.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []delivery
	answer func(n int, d delivery) int // n: verified deliveries before this one
}

func newReceiver(t *testing.T, answer func(n int, d delivery) int) *receiver {
	t.Helper()
	rc := &receiver{answer: answer}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	d := delivery{at: time.Now(), header: r.Header.Get("Stripe-Signature"), body: body, status: http.StatusOK}
	d.t, d.reject = verifyStripe(d.header, body, []byte(testSecret), d.at)
	if d.reject != "" {
		d.status = http.StatusBadRequest
	} else if err := json.Unmarshal(body, &d.event); err != nil {
		d.reject, d.status = "body: "+err.Error(), http.StatusBadRequest
	}
	rc.mu.Lock()
	if d.reject == "" && rc.answer != nil {
		n := 0
		for _, g := range rc.got {
			if g.reject == "" {
				n++
			}
		}
		d.status = rc.answer(n, d)
	}
	rc.got = append(rc.got, d)
	rc.mu.Unlock()
	w.WriteHeader(d.status)
}

// verifyStripe checks "t=…,v1=…" over "<t>.<body>"; it returns the t and why
// the delivery is refused, "" when it is genuine.
func verifyStripe(header string, body, secret []byte, now time.Time) (int64, string) {
	var t int64
	var sigs []string
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			t, _ = strconv.ParseInt(v, 10, 64)
		case "v1":
			sigs = append(sigs, v)
		}
	}
	if t == 0 || len(sigs) == 0 {
		return t, "malformed"
	}
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "%d.", t)
	mac.Write(body)
	want := mac.Sum(nil)
	ok := false
	for _, s := range sigs {
		got, err := hex.DecodeString(s)
		ok = ok || (err == nil && hmac.Equal(got, want))
	}
	if !ok {
		return t, "bad_signature"
	}
	if age := now.Sub(time.Unix(t, 0)); age > 300*time.Second || age < -300*time.Second {
		return t, "stale_timestamp"
	}
	return t, ""
}

// deliveries returns what the receiver has got so far.
func (rc *receiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got)
}

// verified returns the deliveries that verified and were answered 2xx.
func (rc *receiver) verified() []delivery {
	var out []delivery
	for _, d := range rc.deliveries() {
		if d.reject == "" && d.status/100 == 2 {
			out = append(out, d)
		}
	}
	return out
}

func types(ds []delivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.event.Type)
	}
	return out
}

// newWebhookEnv serves a provider that sends its webhooks to rc.
func newWebhookEnv(t *testing.T, rc *receiver, cfg fakeprovider.Config) env {
	t.Helper()
	cfg.WebhookURL, cfg.WebhookSecret = rc.srv.URL+"/webhooks/acme", testSecret
	if cfg.WebhookRetry == 0 {
		cfg.WebhookRetry, cfg.WebhookMaxRetry = 20*time.Millisecond, 200*time.Millisecond
	}
	e := newEnv(t, cfg)
	t.Cleanup(e.p.Close) // before the receiver closes: cleanups run last first
	return e
}

// settled waits until the sender has nothing left to do and returns the
// oracle's webhooks section.
func settled(t *testing.T, p *fakeprovider.Provider) fakeprovider.WebhookReport {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		w := p.Oracle().Webhooks
		if w.Pending == 0 {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhooks still pending after 15s: %+v", w)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func refundOf(t *testing.T, d delivery) wireRefund {
	t.Helper()
	var r wireRefund
	if err := json.Unmarshal(d.event.Data.Object, &r); err != nil {
		t.Fatalf("%s: data.object: %v", d.event.Type, err)
	}
	return r
}

// wantRefundObject checks the Stripe refund object of an event.
func wantRefundObject(t *testing.T, r wireRefund, id, status, key string) {
	t.Helper()
	if r.ID != id || r.Object != "refund" || r.Amount != 1500 || r.Currency != "eur" || r.Status != status ||
		r.PaymentIntent != "pay_1" || r.Metadata["operation_key"] != key {
		t.Fatalf("refund object = %+v, want %s %s, 1500 eur, payment_intent pay_1, metadata.operation_key %s", r, id, status, key)
	}
	if (status == "failed") != (r.FailureReason != nil) || (r.FailureReason != nil && *r.FailureReason != "declined") {
		t.Fatalf("refund object %s: failure_reason = %v, want declined exactly when failed", status, r.FailureReason)
	}
}

// wantEnvelope checks an event's outer shape and its signature's t, which
// must be the wall clock (the simulator's is years ahead).
func wantEnvelope(t *testing.T, d delivery, typ, key string) {
	t.Helper()
	ev := d.event
	if !strings.HasPrefix(ev.ID, "evt_") || ev.Object != "event" || ev.Type != typ || ev.Created != t0.Unix() ||
		!strings.HasPrefix(ev.Request.ID, "req_") || ev.Request.IdempotencyKey != key {
		t.Fatalf("event = %+v, want evt_…, object event, type %s, created %d (simulator), request req_… with key %s",
			ev, typ, t0.Unix(), key)
	}
	if skew := d.at.Sub(time.Unix(d.t, 0)); skew < -2*time.Second || skew > 2*time.Second {
		t.Fatalf("%s signed at t=%d, %s from the wall clock: t must be the wall clock", typ, d.t, skew)
	}
}

func TestWebhookSucceededRefundSendsCreatedAndChargeRefunded_R28(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	r, err := e.c.CreateRefund(testCtx(t), "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	settled(t, e.p)
	got := rc.deliveries()
	if !slices.Equal(types(got), []string{"refund.created", "charge.refunded"}) {
		t.Fatalf("deliveries = %q, want refund.created then charge.refunded", types(got))
	}
	for _, d := range got {
		if d.reject != "" || d.header == "" {
			t.Fatalf("%s: refused by the receiver (%s), header %q", d.event.Type, d.reject, d.header)
		}
		wantEnvelope(t, d, d.event.Type, "op-1")
	}
	if got[0].event.ID == got[1].event.ID {
		t.Fatalf("two events share the id %s", got[0].event.ID)
	}
	wantRefundObject(t, refundOf(t, got[0]), r.ID, "succeeded", "op-1")
	var ch wireCharge
	if err := json.Unmarshal(got[1].event.Data.Object, &ch); err != nil || ch.Object != "charge" || ch.ID != "pay_1" ||
		len(ch.Refunds.Data) != 1 {
		t.Fatalf("charge.refunded data.object = %s, %v; want the charge pay_1 with its one refund", got[1].event.Data.Object, err)
	}
	wantRefundObject(t, ch.Refunds.Data[0], r.ID, "succeeded", "op-1")
}

func TestWebhookPendingRefundSendsUpdatedWhenItSettles_R4(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	ctx := testCtx(t)
	first, err := e.c.CreateRefund(ctx, "op-0", refundParams("op-0"))
	if err != nil {
		t.Fatal(err)
	}
	settled(t, e.p) // different refunds' events may arrive in any order
	r, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "pending=30"), "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	settled(t, e.p)
	if got := types(rc.deliveries()); !slices.Equal(got, []string{"refund.created", "charge.refunded", "refund.created"}) {
		t.Fatalf("before settling: %q, want no update for the pending refund yet", got)
	}
	wantRefundObject(t, refundOf(t, rc.deliveries()[2]), r.ID, "pending", "op-1")

	e.p.Advance(30 * time.Second)
	settled(t, e.p)
	got := rc.deliveries()[3:]
	if !slices.Equal(types(got), []string{"refund.updated", "charge.refunded"}) {
		t.Fatalf("after settling: %q, want refund.updated then charge.refunded", types(got))
	}
	settledAt := t0.Add(30 * time.Second).Unix()
	for _, d := range got {
		if d.reject != "" || d.event.Created != settledAt || d.event.Request.IdempotencyKey != "op-1" {
			t.Fatalf("%s: reject %q, created %d (want %d), request %+v", d.event.Type, d.reject, d.event.Created,
				settledAt, d.event.Request)
		}
	}
	wantRefundObject(t, refundOf(t, got[0]), r.ID, "succeeded", "op-1")
	var ch wireCharge
	if err := json.Unmarshal(got[1].event.Data.Object, &ch); err != nil || len(ch.Refunds.Data) != 2 ||
		ch.Refunds.Data[0].ID != r.ID || ch.Refunds.Data[1].ID != first.ID {
		t.Fatalf("charge.refunded = %s, %v; want both refunds of pay_1, newest first", got[1].event.Data.Object, err)
	}
}

func TestWebhookPendingRefundSettlingByTheWallClockIsSentUnasked(t *testing.T) {
	rc := newReceiver(t, nil)
	// The wall clock moves the simulator's; nobody asks the provider anything
	// after the create, so only the sender can notice the settling.
	e := newWebhookEnv(t, rc, fakeprovider.Config{Clock: time.Now})
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "pending=0.3"), "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(rc.verified()) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("deliveries = %q 10s after a 0.3s pending refund, want refund.updated and charge.refunded",
				types(rc.deliveries()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := types(rc.verified()); !slices.Equal(got, []string{"refund.created", "refund.updated", "charge.refunded"}) {
		t.Fatalf("deliveries = %q", got)
	}
}

func TestWebhookFailedRefundSendsFailed(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	ctx := testCtx(t)
	now, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "fail"), "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	later, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "pending=10,fail"), "op-2", refundParams("op-2"))
	if err != nil {
		t.Fatal(err)
	}
	e.p.Advance(10 * time.Second)
	settled(t, e.p)
	byRefund := map[string][]string{}
	for _, d := range rc.deliveries() {
		r := refundOf(t, d)
		byRefund[r.ID] = append(byRefund[r.ID], d.event.Type+":"+r.Status)
		if d.event.Type == "refund.failed" {
			wantRefundObject(t, r, r.ID, "failed", r.Metadata["operation_key"])
		}
	}
	if got := byRefund[now.ID]; !slices.Equal(got, []string{"refund.created:failed", "refund.failed:failed"}) {
		t.Fatalf("failed at once: %q", got)
	}
	if got := byRefund[later.ID]; !slices.Equal(got, []string{"refund.created:pending", "refund.failed:failed"}) {
		t.Fatalf("failed after pending: %q", got)
	}
}

func TestWebhookRetriedAfter500WithAFreshSignature(t *testing.T) {
	rc := newReceiver(t, func(n int, d delivery) int {
		if n < 2 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	e := newWebhookEnv(t, rc, fakeprovider.Config{WebhookRetry: 100 * time.Millisecond, WebhookMaxRetry: time.Second})
	// Pending, so that one event (refund.created) is all there is.
	r, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "pending=60"), "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	w := settled(t, e.p)
	got := rc.deliveries()
	if len(got) != 3 {
		t.Fatalf("%d deliveries, want 3 (500, 500, 200)", len(got))
	}
	for i, d := range got[1:] {
		if d.event.ID != got[0].event.ID || string(d.body) != string(got[0].body) {
			t.Fatalf("attempt %d is another event: %s, want a redelivery of %s", i+2, d.body, got[0].body)
		}
	}
	// Each wait is at least the backoff: 100ms, then 200ms.
	if gap := got[1].at.Sub(got[0].at); gap < 100*time.Millisecond {
		t.Fatalf("second attempt after %s, want ≥ 100ms", gap)
	}
	if gap := got[2].at.Sub(got[1].at); gap < 200*time.Millisecond {
		t.Fatalf("third attempt after %s, want ≥ 200ms (doubling)", gap)
	}
	if len(w.Events) != 1 {
		t.Fatalf("oracle events = %+v, want one", w.Events)
	}
	ev := w.Events[0]
	var statuses []int
	for _, a := range ev.Attempts {
		statuses = append(statuses, a.Status)
	}
	if ev.ID != got[0].event.ID || ev.Type != fakeprovider.EventRefundCreated || ev.RefundID != r.ID ||
		ev.OperationKey != "op-1" || ev.IdempotencyKey != "op-1" || ev.Status != fakeprovider.StatusPending ||
		!slices.Equal(statuses, []int{500, 500, 200}) || !ev.Delivered || ev.Deliveries != 1 || ev.GaveUp ||
		w.Pending != 0 || w.Undelivered != 0 || !w.Enabled {
		t.Fatalf("oracle = %+v (attempt statuses %v), want one delivered event after 500, 500, 200", w, statuses)
	}
}

func TestWebhookGivenUpAfterMaxAttempts(t *testing.T) {
	rc := newReceiver(t, func(int, delivery) int { return http.StatusServiceUnavailable })
	e := newWebhookEnv(t, rc, fakeprovider.Config{WebhookMaxAttempts: 3})
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "pending=60"), "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	w := settled(t, e.p)
	if n := len(rc.deliveries()); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
	if len(w.Events) != 1 || !w.Events[0].GaveUp || w.Events[0].Delivered || len(w.Events[0].Attempts) != 3 ||
		w.Undelivered != 1 || w.Pending != 0 {
		t.Fatalf("oracle = %+v, want one event given up after 3 attempts", w)
	}
}

func TestWebhookUnreachableReceiverIsRecordedWithoutStatus(t *testing.T) {
	rc := newReceiver(t, nil)
	rc.srv.Close() // nothing listens on its port now
	e := newWebhookEnv(t, rc, fakeprovider.Config{WebhookMaxAttempts: 2})
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "pending=60"), "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	w := settled(t, e.p)
	if len(w.Events) != 1 || len(w.Events[0].Attempts) != 2 || !w.Events[0].GaveUp {
		t.Fatalf("oracle = %+v, want 2 failed attempts", w)
	}
	for _, a := range w.Events[0].Attempts {
		if a.Status != 0 || a.Error == "" {
			t.Fatalf("attempt = %+v, want status 0 and the connection error", a)
		}
	}
}

func TestWebhookFaultDelay(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	start := time.Now()
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "webhook_delay=1"), "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	settled(t, e.p)
	got := rc.verified()
	if len(got) != 2 {
		t.Fatalf("deliveries = %q, want both events", types(got))
	}
	for _, d := range got {
		if held := d.at.Sub(start); held < time.Second {
			t.Fatalf("%s delivered %s after the create, want ≥ 1s", d.event.Type, held)
		}
	}
}

func TestWebhookFaultDuplicateReusesTheEventID(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "webhook_duplicate"), "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	w := settled(t, e.p)
	got := rc.verified()
	if !slices.Equal(types(got), []string{"refund.created", "refund.created", "charge.refunded", "charge.refunded"}) {
		t.Fatalf("deliveries = %q, want each event twice", types(got))
	}
	for i := 0; i < 4; i += 2 {
		if got[i].event.ID != got[i+1].event.ID || string(got[i].body) != string(got[i+1].body) {
			t.Fatalf("duplicate of %s is %s: want the same id and body", got[i].event.ID, got[i+1].event.ID)
		}
	}
	for _, ev := range w.Events {
		if ev.Deliveries != 2 || !ev.Delivered || ev.Faults != "webhook_duplicate" {
			t.Fatalf("oracle event = %+v, want 2 deliveries under webhook_duplicate", ev)
		}
	}
}

func TestWebhookFaultReorderDeliversNewestFirst(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "pending=10,webhook_reorder"), "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	// refund.created is held until the refund's last event exists.
	time.Sleep(200 * time.Millisecond)
	if w := e.p.Oracle().Webhooks; len(rc.deliveries()) != 0 || w.Pending != 1 {
		t.Fatalf("before settling: %d deliveries, oracle %+v; want refund.created held", len(rc.deliveries()), w)
	}
	e.p.Advance(10 * time.Second)
	w := settled(t, e.p)
	if got := types(rc.verified()); !slices.Equal(got, []string{"charge.refunded", "refund.updated", "refund.created"}) {
		t.Fatalf("deliveries = %q, want newest first", got)
	}
	if got := []string{w.Events[0].Type, w.Events[1].Type, w.Events[2].Type}; !slices.Equal(got,
		[]string{"refund.created", "refund.updated", "charge.refunded"}) {
		t.Fatalf("oracle events = %q, want them in order of creation", got)
	}
}

func TestWebhookFaultBadSignatureFirstThenRight(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "pending=60,webhook_bad_signature"), "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	w := settled(t, e.p)
	got := rc.deliveries()
	if len(got) != 2 || got[0].reject != "bad_signature" || got[1].reject != "" {
		t.Fatalf("receiver verdicts = %+v, want bad_signature then genuine", got)
	}
	a := w.Events[0].Attempts
	if len(a) != 2 || a[0].Status != 400 || a[0].Fault != "webhook_bad_signature" || a[1].Status != 200 || a[1].Fault != "" ||
		!w.Events[0].Delivered {
		t.Fatalf("oracle attempts = %+v, want 400 (spoiled), then 200", a)
	}
}

func TestWebhookFaultOldTimestampFirstThenFresh(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "pending=60,webhook_old_timestamp"), "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	w := settled(t, e.p)
	got := rc.deliveries()
	if len(got) != 2 || got[0].reject != "stale_timestamp" || got[1].reject != "" {
		t.Fatalf("receiver verdicts = %+v, want stale_timestamp then genuine", got)
	}
	if age := got[0].at.Sub(time.Unix(got[0].t, 0)); age < 9*time.Minute || age > 11*time.Minute {
		t.Fatalf("first attempt signed %s ago, want 10 minutes", age)
	}
	a := w.Events[0].Attempts
	if len(a) != 2 || a[0].Fault != "webhook_old_timestamp" || a[0].Timestamp != got[0].t || a[1].Timestamp != got[1].t {
		t.Fatalf("oracle attempts = %+v, want the old t, then a fresh one", a)
	}
}

func TestWebhookFaultDropNeverDelivers(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	ctx := testCtx(t)
	dropped, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "webhook_drop"), "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	// A later refund's events arriving shows the sender ran past the dropped ones.
	kept, err := e.c.CreateRefund(ctx, "op-2", refundParams("op-2"))
	if err != nil {
		t.Fatal(err)
	}
	w := settled(t, e.p)
	for _, d := range rc.deliveries() {
		if r := refundOf(t, d); r.ID == dropped.ID || d.event.Type == "charge.refunded" && !strings.Contains(string(d.body), kept.ID) {
			t.Fatalf("a dropped event arrived: %s", d.body)
		}
	}
	if n := len(rc.verified()); n != 2 {
		t.Fatalf("%d deliveries, want the 2 of the kept refund", n)
	}
	evs := w.ForRefund(dropped.ID)
	if len(evs) != 2 || w.Undelivered != 2 {
		t.Fatalf("oracle = %+v, want 2 dropped events counted undelivered", w)
	}
	for _, ev := range evs {
		if !ev.Dropped || ev.Delivered || len(ev.Attempts) != 0 {
			t.Fatalf("dropped event = %+v", ev)
		}
	}
}

func TestWebhookGlobalFaultsScopedByKey(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	ctx := testCtx(t)
	if _, err := e.c.SetFaults(ctx, fakeprovider.Faults{WebhookDuplicate: true, Key: "op-1"}); err != nil {
		t.Fatal(err)
	}
	a, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.c.CreateRefund(ctx, "op-2", refundParams("op-2"))
	if err != nil {
		t.Fatal(err)
	}
	w := settled(t, e.p)
	for _, tc := range []struct {
		id   string
		want int
	}{{a.ID, 2}, {b.ID, 1}} {
		for _, ev := range w.ForRefund(tc.id) {
			if ev.Deliveries != tc.want {
				t.Fatalf("%s %s: %d deliveries, want %d", tc.id, ev.Type, ev.Deliveries, tc.want)
			}
		}
	}
}

func TestWebhookOracleRecordsEveryRefundDelivered(t *testing.T) {
	rc := newReceiver(t, func(n int, d delivery) int {
		if n%3 == 0 {
			return http.StatusBadGateway // every third fails once: retries must still land them
		}
		return http.StatusNoContent
	})
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			key := fmt.Sprintf("op-%d", i)
			spec := []string{"", "pending=5", "fail", "pending=5,fail"}[i%4]
			if _, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, spec), key, refundParams(key)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	e.p.Advance(5 * time.Second)
	o := e.p.Oracle()
	w := settled(t, e.p)
	if w.Undelivered != 0 {
		t.Fatalf("%d events undelivered", w.Undelivered)
	}
	seen := map[string]bool{}
	for _, d := range rc.verified() {
		seen[d.event.ID] = true
	}
	for _, r := range o.Refunds {
		evs := w.ForRefund(r.ID)
		final := map[fakeprovider.RefundStatus]string{fakeprovider.StatusSucceeded: "charge.refunded",
			fakeprovider.StatusFailed: "refund.failed"}[r.Status]
		if len(evs) == 0 || evs[0].Type != "refund.created" || evs[len(evs)-1].Type != final {
			t.Fatalf("refund %s (%s): events %+v, want refund.created … %s", r.ID, r.Status, evs, final)
		}
		for _, ev := range evs {
			if !ev.Delivered || !seen[ev.ID] || ev.OperationKey != r.MerchantReference || len(ev.Attempts) == 0 ||
				ev.Attempts[len(ev.Attempts)-1].Status != http.StatusNoContent {
				t.Fatalf("refund %s: event %+v, want delivered (receiver saw it: %v)", r.ID, ev, seen[ev.ID])
			}
		}
	}
}

func TestWebhooksOffWithoutURL(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(testCtx(t), "webhook_duplicate"), "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	if w := e.p.Oracle().Webhooks; w.Enabled || len(w.Events) != 0 {
		t.Fatalf("webhooks without a URL: %+v", w)
	}
	e.p.Close() // nothing to stop
}

func TestWebhookResetForgetsEventsNotIDs(t *testing.T) {
	rc := newReceiver(t, nil)
	e := newWebhookEnv(t, rc, fakeprovider.Config{})
	ctx := testCtx(t)
	if _, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	before := settled(t, e.p)
	e.p.Reset()
	if w := e.p.Oracle().Webhooks; len(w.Events) != 0 {
		t.Fatalf("after Reset: %+v", w)
	}
	if _, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	after := settled(t, e.p)
	for _, ev := range after.Events {
		if _, reused := before.Event(ev.ID); reused {
			t.Fatalf("event id %s reused after Reset: a receiver would take it for a redelivery", ev.ID)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []fakeprovider.Config{
		{WebhookURL: "127.0.0.1:8443/webhooks/acme", WebhookSecret: "s"},
		{WebhookURL: "ftp://host/x", WebhookSecret: "s"},
		{WebhookURL: "http://127.0.0.1:8443/webhooks/acme"},
		{WebhookURL: "http://127.0.0.1:8443/webhooks/acme", WebhookSecret: "s", WebhookMaxAttempts: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) accepted", c)
		}
	}
	if err := (fakeprovider.Config{WebhookURL: "https://h/webhooks/acme", WebhookSecret: "s"}).Validate(); err != nil {
		t.Errorf("a good config: %v", err)
	}
}

// goroutineIDs returns the ids of the live goroutines.
func goroutineIDs() map[string]string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	out := map[string]string{}
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if id, _, ok := strings.Cut(strings.TrimPrefix(g, "goroutine "), " "); ok {
			out[id] = g
		}
	}
	return out
}

func TestWebhookCloseLeavesNoGoroutine(t *testing.T) {
	// hold keeps every delivery until its client goes away, so that an
	// attempt is in flight at Close; quick answers at once and keeps the
	// connection alive, so that an idle one is left at Close.
	holding := make(chan struct{}, 16)
	hold := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // only then does net/http watch for the client going away
		holding <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(hold.Close)
	quick := newReceiver(t, nil)
	before := goroutineIDs()

	ctx := testCtx(t)
	clock := func() time.Time { return t0 }
	p := fakeprovider.New(fakeprovider.Config{Clock: clock, WebhookURL: hold.URL, WebhookSecret: testSecret})
	q := fakeprovider.New(fakeprovider.Config{Clock: clock, WebhookURL: quick.srv.URL, WebhookSecret: testSecret})
	t.Cleanup(p.Close) // should the test fail early (both before hold's Close)
	t.Cleanup(q.Close)
	for _, prov := range []*fakeprovider.Provider{p, q} {
		api := httptest.NewServer(prov)
		c := fakeprovider.NewClient(api.URL, api.Client())
		if _, err := c.CreateRefund(ctx, "op-1", refundParams("op-1")); err != nil {
			t.Fatal(err)
		}
		// A pending refund keeps the sender's loop waiting on the clock.
		if _, err := c.CreateRefund(fakeprovider.WithFault(ctx, "pending=60"), "op-2", refundParams("op-2")); err != nil {
			t.Fatal(err)
		}
		api.Close()
	}
	<-holding
	settled(t, q)

	// Close cancels the held attempt rather than waiting out its timeout,
	// and returns once it is recorded.
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close still waiting 5s on an attempt in flight: it must cancel it")
	}
	if a := p.Oracle().Webhooks.Events[0].Attempts; len(a) != 1 || a[0].Error == "" {
		t.Fatalf("the attempt in flight at Close: %+v, want it recorded, failed", a)
	}
	q.Close()
	p.Close() // a second Close is harmless
	// The sender's own goroutines are gone when Close returns; the
	// connections' (client and server side) once the closed sockets are seen.
	for id, stack := range goroutineIDs() {
		if _, old := before[id]; !old && strings.Contains(stack, "fakeprovider.(*Provider)") {
			t.Fatalf("a sender goroutine outlived Close:\n\n%s", stack)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var leaked []string
		for id, stack := range goroutineIDs() {
			if _, old := before[id]; !old && !strings.Contains(stack, "TestWebhookCloseLeavesNoGoroutine") {
				leaked = append(leaked, stack)
			}
		}
		if len(leaked) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after Close:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Closed, the provider still records its events, and sends none.
	sent := len(quick.deliveries())
	q.Advance(time.Minute)
	time.Sleep(100 * time.Millisecond)
	if w := q.Oracle().Webhooks; len(quick.deliveries()) != sent || w.Pending != 2 {
		t.Fatalf("after Close: %d new deliveries, oracle %+v; want the settled refund's 2 events recorded, unsent",
			len(quick.deliveries())-sent, w)
	}
}
