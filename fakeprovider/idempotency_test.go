package fakeprovider_test

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

func TestSameKeySameBodyReturnsSameRefund_R1(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)

	first, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	if first.ID != "re_000001" || first.Replayed || first.Status != fakeprovider.StatusSucceeded {
		t.Fatalf("first = %+v, want re_000001, not replayed, succeeded", first)
	}
	if first.PaymentID != "pay_1" || first.AmountMinor != 1500 || first.Currency != "EUR" ||
		first.MerchantReference != "op-1" || first.Object != "refund" || !first.Created.Equal(t0) {
		t.Fatalf("first = %+v, does not echo the request", first)
	}
	second, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	if second.ID != first.ID || !second.Replayed {
		t.Fatalf("second = %+v, want a replay of %s", second, first.ID)
	}

	o := e.p.Oracle()
	if len(o.Refunds) != 1 || o.DoubleRefunds != 0 || o.Stats.Replays != 1 || o.Stats.RefundsCreated != 1 {
		t.Fatalf("oracle = %+v, want one refund, one replay, no double refund", o)
	}
}

func TestEmptyMerchantReferenceDefaultsToKey(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	r, err := e.c.CreateRefund(testCtx(t), "op-9", refundParams(""))
	if err != nil {
		t.Fatal(err)
	}
	if r.MerchantReference != "op-9" {
		t.Fatalf("merchant_reference = %q, want the idempotency key", r.MerchantReference)
	}
}

func TestSameKeyDifferentBodyIsConflict_R1(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	if _, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1")); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*fakeprovider.RefundParams){
		"payment":   func(p *fakeprovider.RefundParams) { p.PaymentID = "pay_2" },
		"amount":    func(p *fakeprovider.RefundParams) { p.AmountMinor = 1501 },
		"currency":  func(p *fakeprovider.RefundParams) { p.Currency = "USD" },
		"reference": func(p *fakeprovider.RefundParams) { p.MerchantReference = "op-2" },
	} {
		t.Run(name, func(t *testing.T) {
			p := refundParams("op-1")
			mutate(&p)
			_, err := e.c.CreateRefund(ctx, "op-1", p)
			if !errors.Is(err, fakeprovider.ErrIdempotencyConflict) {
				t.Fatalf("err = %v, want ErrIdempotencyConflict", err)
			}
			wantStatusError(t, err, http.StatusConflict, fakeprovider.CodeIdempotencyKeyReused)
		})
	}
	// Lower-case currency is the same body: it is normalised before comparing.
	p := refundParams("op-1")
	p.Currency = "eur"
	if r, err := e.c.CreateRefund(ctx, "op-1", p); err != nil || !r.Replayed {
		t.Fatalf("lower-case currency: %+v, %v; want a replay", r, err)
	}
	o := e.p.Oracle()
	if len(o.Refunds) != 1 || o.Stats.Conflicts != 4 || o.DoubleRefunds != 0 {
		t.Fatalf("oracle = %+v, want one refund and four conflicts", o)
	}
}

func TestMissingIdempotencyKeyIsRejected(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	_, err := e.c.CreateRefund(testCtx(t), "", refundParams("op-1"))
	wantStatusError(t, err, http.StatusBadRequest, fakeprovider.CodeIdempotencyKeyMissing)
	if n := len(e.p.Oracle().Refunds); n != 0 {
		t.Fatalf("%d refunds created without a key", n)
	}
}

func TestInvalidRequestStoresNothingUnderItsKey(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	url := e.srv.URL + "/v1/refunds"
	key := map[string]string{"Idempotency-Key": "op-1"}
	for _, tc := range []struct {
		name, body, code string
	}{
		{"not json", `{`, fakeprovider.CodeParameterInvalid},
		{"unknown field (an attempt must never reach the provider, R2)",
			`{"payment_id":"pay_1","amount_minor":1500,"currency":"EUR","merchant_reference":"op-1","attempt":7}`,
			fakeprovider.CodeParameterInvalid},
		{"no payment", `{"amount_minor":1500,"currency":"EUR","merchant_reference":"op-1"}`, fakeprovider.CodeParameterMissing},
		{"no reference", `{"payment_id":"pay_1","amount_minor":1500,"currency":"EUR"}`, fakeprovider.CodeParameterMissing},
		{"zero amount", `{"payment_id":"pay_1","amount_minor":0,"currency":"EUR","merchant_reference":"op-1"}`, fakeprovider.CodeParameterInvalid},
		{"bad currency", `{"payment_id":"pay_1","amount_minor":1500,"currency":"EURO","merchant_reference":"op-1"}`, fakeprovider.CodeParameterInvalid},
		{"trailing data", `{"payment_id":"pay_1","amount_minor":1500,"currency":"EUR","merchant_reference":"op-1"} {}`, fakeprovider.CodeParameterInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := rawDo(t, http.MethodPost, url, key, tc.body)
			if status != http.StatusBadRequest || errCode(t, body) != tc.code {
				t.Fatalf("got %d %s, want 400 %s", status, body, tc.code)
			}
		})
	}
	// Nothing was stored under op-1: a valid request with other values is
	// not a conflict.
	p := refundParams("op-1")
	p.AmountMinor = 99
	r, err := e.c.CreateRefund(testCtx(t), "op-1", p)
	if err != nil || r.Replayed || r.AmountMinor != 99 {
		t.Fatalf("valid request after rejected ones: %+v, %v", r, err)
	}
}

func TestResendAfterKeyRetentionCreatesSecondRefund_R14(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{}) // default retention: 24h
	ctx := testCtx(t)
	first, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}

	// One second inside the window: still the same refund.
	if _, err := e.c.Advance(ctx, 24*time.Hour-time.Second); err != nil {
		t.Fatal(err)
	}
	inside, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil || inside.ID != first.ID || !inside.Replayed {
		t.Fatalf("resend inside the window = %+v, %v; want a replay of %s", inside, err, first.ID)
	}
	if o := e.p.Oracle(); o.DoubleRefunds != 0 {
		t.Fatalf("double refunds inside the window: %+v", o)
	}

	// At the window's end the key is forgotten: the resend is a new refund.
	now := e.p.Advance(time.Second)
	if !now.Equal(t0.Add(24 * time.Hour)) {
		t.Fatalf("clock = %s, want %s", now, t0.Add(24*time.Hour))
	}
	outside, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	if outside.ID == first.ID || outside.Replayed {
		t.Fatalf("resend after the window = %+v, want a new refund", outside)
	}

	o, err := e.c.Oracle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	op, ok := o.Operation("op-1")
	if !ok || op.Refunds != 2 || !op.Duplicate || op.RefundedMinor != 3000 {
		t.Fatalf("operation op-1 = %+v, want two live refunds totalling 3000", op)
	}
	if o.DoubleRefunds != 1 || o.DuplicateOperations != 1 {
		t.Fatalf("double_refunds = %d, duplicate_operations = %d; want 1, 1", o.DoubleRefunds, o.DuplicateOperations)
	}
	if found, err := e.c.FindByReference(ctx, "op-1"); err != nil || len(found) != 2 {
		t.Fatalf("FindByReference = %v, %v; want both refunds", found, err)
	}
	// The new refund renewed the key: inside the new window it replays.
	again, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil || again.ID != outside.ID || !again.Replayed {
		t.Fatalf("resend after renewal = %+v, %v; want a replay of %s", again, err, outside.ID)
	}
}

func TestKeyRetentionIsConfigurable(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{KeyRetention: time.Hour})
	ctx := testCtx(t)
	if e.p.KeyRetention() != time.Hour {
		t.Fatalf("KeyRetention = %s", e.p.KeyRetention())
	}
	first, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	e.p.Advance(time.Hour)
	// After the window a different body is no longer a conflict either.
	p := refundParams("op-1")
	p.AmountMinor = 700
	second, err := e.c.CreateRefund(ctx, "op-1", p)
	if err != nil || second.ID == first.ID {
		t.Fatalf("after a 1h window = %+v, %v; want a new refund", second, err)
	}
	if o := e.p.Oracle(); o.KeyRetentionSeconds != 3600 || o.DoubleRefunds != 1 {
		t.Fatalf("oracle = %+v", o)
	}
}

func TestConcurrentSameKeyCreatesOneRefund(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	const n = 32
	var wg sync.WaitGroup
	ids := make([]string, n)
	replayed := make([]bool, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			r, err := e.c.CreateRefund(ctx, "op-race", refundParams("op-race"))
			ids[i], replayed[i], errs[i] = r.ID, r.Replayed, err
		})
	}
	wg.Wait()
	fresh := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if ids[i] != ids[0] {
			t.Fatalf("ids differ: %s and %s", ids[0], ids[i])
		}
		if !replayed[i] {
			fresh++
		}
	}
	if o := e.p.Oracle(); fresh != 1 || len(o.Refunds) != 1 || o.Stats.Replays != n-1 {
		t.Fatalf("fresh = %d, oracle = %+v; want exactly one refund", fresh, o)
	}
}

func TestRefundIDsAreSequentialAndNeverReused(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	for i, want := range []string{"re_000001", "re_000002"} {
		r, err := e.c.CreateRefund(ctx, []string{"a", "b"}[i], refundParams(""))
		if err != nil || r.ID != want {
			t.Fatalf("refund %d = %+v, %v; want %s", i, r, err, want)
		}
	}
	if err := e.c.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	o := e.p.Oracle()
	if len(o.Refunds) != 0 || o.Stats != (fakeprovider.Stats{}) {
		t.Fatalf("after Reset: %+v", o)
	}
	// The key is forgotten with the refund, and ids continue.
	r, err := e.c.CreateRefund(ctx, "a", refundParams(""))
	if err != nil || r.ID != "re_000003" || r.Replayed {
		t.Fatalf("after Reset = %+v, %v; want a fresh re_000003", r, err)
	}
}
