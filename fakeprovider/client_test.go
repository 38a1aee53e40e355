package fakeprovider_test

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

func TestLookups(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)
	mk := func(key, payment string) fakeprovider.Refund {
		t.Helper()
		p := refundParams(key)
		p.PaymentID = payment
		r, err := e.c.CreateRefund(ctx, key, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b, c := mk("op-a", "pay_1"), mk("op-b", "pay_1"), mk("op-c", "pay_2")

	got, err := e.c.GetRefund(ctx, b.ID)
	if err != nil || got != b {
		t.Fatalf("GetRefund = %+v, %v; want %+v", got, err, b)
	}
	ids := func(rs []fakeprovider.Refund) string {
		var s []string
		for _, r := range rs {
			s = append(s, r.ID)
		}
		return strings.Join(s, ",")
	}
	if rs, err := e.c.ListByPayment(ctx, "pay_1"); err != nil || ids(rs) != a.ID+","+b.ID {
		t.Fatalf("ListByPayment(pay_1) = %s, %v", ids(rs), err)
	}
	if rs, err := e.c.FindByReference(ctx, "op-c"); err != nil || ids(rs) != c.ID {
		t.Fatalf("FindByReference(op-c) = %s, %v", ids(rs), err)
	}
	if rs, err := e.c.FindByReference(ctx, "op-none"); err != nil || rs == nil || len(rs) != 0 {
		t.Fatalf("FindByReference(op-none) = %#v, %v; want an empty, non-nil list", rs, err)
	}

	status, _, body := rawDo(t, http.MethodGet, e.srv.URL+"/v1/refunds?payment_id=pay_1&merchant_reference=op-b", nil, "")
	if status != http.StatusOK || !strings.Contains(string(body), b.ID) || strings.Contains(string(body), a.ID) {
		t.Fatalf("combined filters: %d %s", status, body)
	}
	status, _, body = rawDo(t, http.MethodGet, e.srv.URL+"/v1/refunds?charge=ch_1", nil, "")
	if status != http.StatusBadRequest || errCode(t, body) != fakeprovider.CodeParameterInvalid {
		t.Fatalf("unknown filter: %d %s", status, body)
	}
}

func TestClientTypedErrors(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	ctx := testCtx(t)

	_, err := e.c.GetRefund(ctx, "re_999999")
	if !errors.Is(err, fakeprovider.ErrNotFound) || errors.Is(err, fakeprovider.ErrIdempotencyConflict) {
		t.Fatalf("unknown refund: err = %v, want only ErrNotFound", err)
	}
	se := wantStatusError(t, err, http.StatusNotFound, fakeprovider.CodeResourceMissing)
	if se.Param != "id" || se.Type != "invalid_request_error" || !strings.Contains(se.Error(), "resource_missing") {
		t.Fatalf("StatusError = %#v (%q)", se, se.Error())
	}

	if _, err := e.c.Advance(ctx, -time.Second); err == nil {
		t.Fatal("negative advance accepted")
	} else {
		wantStatusError(t, err, http.StatusBadRequest, fakeprovider.CodeParameterInvalid)
	}
	if err := e.c.RegisterPayment(ctx, "", 5, "EUR"); err == nil {
		t.Fatal("payment without id accepted")
	}

	status, _, body := rawDo(t, http.MethodGet, e.srv.URL+"/v2/nothing", nil, "")
	if status != http.StatusNotFound || errCode(t, body) != fakeprovider.CodeResourceMissing {
		t.Fatalf("unknown endpoint: %d %s", status, body)
	}
}

func TestClientNonJSONErrorBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad gateway", http.StatusBadGateway)
	}))
	defer srv.Close()
	_, err := fakeprovider.NewClient(srv.URL, nil).GetRefund(testCtx(t), "re_1")
	se := wantStatusError(t, err, http.StatusBadGateway, "")
	if se.Message != "bad gateway" {
		t.Fatalf("message = %q", se.Message)
	}
}

func TestClientUnreachableIsNoReply(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	_, err = fakeprovider.NewClient("http://"+addr, nil).CreateRefund(testCtx(t), "op-1", refundParams("op-1"))
	if !errors.Is(err, fakeprovider.ErrNoReply) {
		t.Fatalf("err = %v, want ErrNoReply", err)
	}
	var se *fakeprovider.StatusError
	if errors.As(err, &se) {
		t.Fatalf("err = %v carries a StatusError", err)
	}
}

func TestAdvanceMovesTheClock(t *testing.T) {
	e := newEnv(t, fakeprovider.Config{})
	now, err := e.c.Advance(testCtx(t), 90*time.Minute)
	if err != nil || !now.Equal(t0.Add(90*time.Minute)) || !e.p.Now().Equal(now) {
		t.Fatalf("Advance = %s, %v; provider says %s", now, err, e.p.Now())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Advance(-1s) did not panic")
		}
	}()
	e.p.Advance(-time.Second)
}

func TestDefaultClockIsRealTime(t *testing.T) {
	p := fakeprovider.New(fakeprovider.Config{})
	before := time.Now()
	now := p.Now()
	if now.Before(before.Add(-time.Second)) || now.After(time.Now().Add(time.Second)) || now.Location() != time.UTC {
		t.Fatalf("Now = %s, want about %s in UTC", now, before)
	}
	if p.KeyRetention() != fakeprovider.DefaultKeyRetention {
		t.Fatalf("KeyRetention = %s", p.KeyRetention())
	}
}
