package fakeprovider_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

func TestOracleFlagsOverRefundedPayment(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	if err := e.c.RegisterPayment(ctx, "pay_1", 1000, "eur"); err != nil {
		t.Fatal(err)
	}
	p := refundParams("")
	p.AmountMinor = 600
	for _, key := range []string{"op-a", "op-b"} {
		if _, err := e.c.CreateRefund(ctx, key, p); err != nil {
			t.Fatal(err)
		}
	}
	// A failed refund moves no money and does not count.
	if _, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "fail"), "op-c", p); err != nil {
		t.Fatal(err)
	}
	o, err := e.c.Oracle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pay, ok := o.Payment("pay_1")
	if !ok || pay.Refunds != 2 || pay.Failed != 1 || pay.RefundedMinor != 1200 || pay.AmountMinor != 1000 ||
		!pay.OverRefunded || len(pay.RefundIDs) != 3 {
		t.Fatalf("payment = %+v, want over-refunded 1200 of 1000", pay)
	}
	if o.DuplicateOperations != 0 || o.OverRefundedPayments != 1 || o.DoubleRefunds != 1 {
		t.Fatalf("oracle counts = %d/%d/%d, want 0 duplicate operations, 1 over-refunded payment, 1 double refund",
			o.DuplicateOperations, o.OverRefundedPayments, o.DoubleRefunds)
	}
}

func TestOracleUnregisteredPaymentIsNeverOverRefunded(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	for _, key := range []string{"op-a", "op-b"} {
		if _, err := e.c.CreateRefund(ctx, key, refundParams("")); err != nil {
			t.Fatal(err)
		}
	}
	o := e.p.Oracle()
	if pay, _ := o.Payment("pay_1"); pay.Refunds != 2 || pay.OverRefunded || o.DoubleRefunds != 0 {
		t.Fatalf("two partial refunds under two keys: %+v, double=%d", pay, o.DoubleRefunds)
	}
}

func TestOracleFlagsAttemptInIdempotencyKey_R2(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	// The bug R2 forbids: the attempt leaks into the key, so every takeover
	// is a new refund to the provider.
	for _, key := range []string{"op-1-7", "op-1-8"} {
		if _, err := e.c.CreateRefund(ctx, key, refundParams("op-1")); err != nil {
			t.Fatal(err)
		}
	}
	o := e.p.Oracle()
	op, ok := o.Operation("op-1")
	if !ok || !op.Duplicate || op.Refunds != 2 || !slices.Equal(op.IdempotencyKeys, []string{"op-1-7", "op-1-8"}) {
		t.Fatalf("operation = %+v, want a duplicate under two keys", op)
	}
	if o.DoubleRefunds != 1 {
		t.Fatalf("double_refunds = %d, want 1", o.DoubleRefunds)
	}
}

func TestOracleGroupsByKeyWhenTheReferenceVaries_R2(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	// The attempt leaks into the reference instead: inside the window the
	// provider refuses (different body), after it a second refund follows.
	if _, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1-7")); err != nil {
		t.Fatal(err)
	}
	e.p.Advance(fakeprovider.DefaultKeyRetention)
	if _, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1-8")); err != nil {
		t.Fatal(err)
	}
	// An unrelated refund stays its own operation.
	if _, err := e.c.CreateRefund(ctx, "op-2", refundParams("op-2")); err != nil {
		t.Fatal(err)
	}
	o := e.p.Oracle()
	op, ok := o.Operation("op-1-8")
	if !ok || !op.Duplicate || op.MerchantReference != "op-1-7" ||
		!slices.Equal(op.MerchantReferences, []string{"op-1-7", "op-1-8"}) || !slices.Equal(op.IdempotencyKeys, []string{"op-1"}) {
		t.Fatalf("operation = %+v, want one duplicate operation under key op-1", op)
	}
	if len(o.Operations) != 2 || o.DoubleRefunds != 1 {
		t.Fatalf("operations = %+v, double_refunds = %d; want 2 operations, 1 double refund", o.Operations, o.DoubleRefunds)
	}
	if other, _ := o.Operation("op-2"); other.Duplicate || other.Refunds != 1 {
		t.Fatalf("op-2 = %+v", other)
	}
}

func TestOracleOverHTTPMatchesProvider(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	for _, key := range []string{"op-1", "op-2"} {
		if _, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "lookup_lag=60,pending=60"), key, refundParams("")); err != nil {
			t.Fatal(err)
		}
	}
	viaHTTP, err := e.c.Oracle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(viaHTTP)
	b, _ := json.Marshal(e.p.Oracle())
	if string(a) != string(b) {
		t.Fatalf("oracle over HTTP\n%s\ndiffers from the Go method\n%s", a, b)
	}
	// The oracle ignores lookup lag and reports true status.
	if len(viaHTTP.Refunds) != 2 || viaHTTP.Refunds[0].Status != fakeprovider.StatusPending || !viaHTTP.Now.Equal(t0) {
		t.Fatalf("oracle = %s", a)
	}
	// The raw JSON carries the documented field names.
	status, _, raw := rawDo(t, http.MethodGet, e.srv.URL+"/v1/_oracle", nil, "")
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || status != http.StatusOK {
		t.Fatalf("GET /v1/_oracle: %d %s", status, raw)
	}
	for _, k := range []string{"now", "key_retention_seconds", "refunds", "operations", "payments",
		"duplicate_operations", "over_refunded_payments", "double_refunds", "stats"} {
		if _, ok := m[k]; !ok {
			t.Errorf("oracle JSON lacks %q: %s", k, raw)
		}
	}
}

func TestOracleStatsCountLookups_M1(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	r, err := e.c.CreateRefund(ctx, "op-1", refundParams("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	e.c.GetRefund(ctx, r.ID)
	e.c.FindByReference(ctx, "op-1")
	e.c.ListByPayment(ctx, "pay_1")
	want := fakeprovider.Stats{CreateRequests: 1, RefundsCreated: 1, LookupRequests: 3}
	if got := e.p.Oracle().Stats; got != want {
		t.Fatalf("stats = %+v, want %+v", got, want)
	}
}

// The oracle tells when the request that made a refund arrived, apart from
// when the refund was made: a request held by a hang arrived before it.
func TestOracleKeepsWhenTheCreateArrived(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	done := make(chan error, 1)
	go func() {
		_, err := e.c.CreateRefund(fakeprovider.WithFault(ctx, "hang_before=500ms"), "op-1", refundParams("op-1"))
		done <- err
	}()
	for e.p.Oracle().Stats.CreateRequests == 0 { // the request arrived: it is in its hang
		time.Sleep(5 * time.Millisecond)
	}
	e.p.Advance(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	o, err := e.c.Oracle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Refunds) != 1 {
		t.Fatalf("refunds = %+v, want 1", o.Refunds)
	}
	r := o.Refunds[0]
	if r.Received.IsZero() || r.Created.Sub(r.Received) != time.Second {
		t.Fatalf("received %s, created %s: want the arrival before the second the clock moved during the hang", r.Received, r.Created)
	}
	if got, err := e.c.GetRefund(ctx, r.ID); err != nil || !got.Received.IsZero() {
		t.Fatalf("GetRefund = %+v, %v: the provider's API does not tell when a request arrived", got, err)
	}
}
