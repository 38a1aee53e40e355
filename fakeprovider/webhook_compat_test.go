package fakeprovider_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/webhook"
)

// TestWebhooksReadByTheCoordinatorsStripeScheme_R28 sends every event type,
// and the two signature faults, to a receiver that verifies and parses with
// the coordinator's own Stripe scheme: what the simulator sends is what the
// coordinator reads.
func TestWebhooksReadByTheCoordinatorsStripeScheme_R28(t *testing.T) {
	scheme := webhook.Stripe{Tolerance: webhook.DefaultTolerance}
	var mu sync.Mutex
	var got []webhook.Event
	rejected := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if err := scheme.Verify(r.Header, body, [][]byte{[]byte("old-secret"), []byte(testSecret)}, time.Now()); err != nil {
			var rej *webhook.RejectError
			if !errors.As(err, &rej) {
				t.Errorf("Verify: %v, want a *RejectError", err)
			}
			rejected[rej.Reason]++
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		evs, err := scheme.Parse(body)
		if err != nil {
			t.Errorf("Parse(%s): %v", body, err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got = append(got, evs...)
	}))
	t.Cleanup(srv.Close)
	p := fakeprovider.New(fakeprovider.Config{Clock: func() time.Time { return t0 }, WebhookURL: srv.URL + "/webhooks/acme",
		WebhookSecret: testSecret, WebhookRetry: 20 * time.Millisecond})
	t.Cleanup(p.Close)
	api := httptest.NewServer(p)
	t.Cleanup(api.Close)
	c := fakeprovider.NewClient(api.URL, api.Client())
	ctx := testCtx(t)
	a, err := c.CreateRefund(fakeprovider.WithFault(ctx, "pending=10,webhook_bad_signature"), "op-a", refundParams("op-a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateRefund(fakeprovider.WithFault(ctx, "fail,webhook_old_timestamp"), "op-b", refundParams("op-b"))
	if err != nil {
		t.Fatal(err)
	}
	p.Advance(10 * time.Second)
	if w := settled(t, p); w.Undelivered != 0 {
		t.Fatalf("undelivered: %+v", w)
	}

	mu.Lock()
	defer mu.Unlock()
	// Every first attempt was spoiled: a's 3 events, b's 2.
	if rejected[webhook.ReasonBadSignature] != 3 || rejected[webhook.ReasonStaleTimestamp] != 2 || len(rejected) != 2 {
		t.Fatalf("rejections = %v, want 3 bad_signature (op-a) and 2 stale_timestamp (op-b)", rejected)
	}
	type seen struct {
		Type, RefundID, OperationKey string
		Outcome                      store.Outcome
	}
	var have []seen
	for _, e := range got {
		have = append(have, seen{e.Type, e.RefundID, e.OperationKey, e.Outcome})
	}
	for _, want := range []seen{
		{"refund.created", a.ID, "op-a", store.OutcomePending},
		{"refund.updated", a.ID, "op-a", store.OutcomeSucceeded},
		{"charge.refunded", a.ID, "op-a", store.OutcomeSucceeded},
		{"charge.refunded", b.ID, "op-b", store.OutcomeFailed}, // the charge lists every refund of pay_1
		{"refund.created", b.ID, "op-b", store.OutcomeFailed},
		{"refund.failed", b.ID, "op-b", store.OutcomeFailed},
	} {
		if !slices.Contains(have, want) {
			t.Errorf("the coordinator's scheme read no %+v; it read %+v", want, have)
		}
	}
}
