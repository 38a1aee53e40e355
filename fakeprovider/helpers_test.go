package fakeprovider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// t0 is the simulator's fixed start time: the clock only moves by Advance, so
// no test waits on the wall clock for key retention, pending or lag.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

type env struct {
	p   *fakeprovider.Provider
	srv *httptest.Server
	c   *fakeprovider.Client
}

// newEnv serves a fresh provider on a loopback listener.
func newEnv(t *testing.T, cfg fakeprovider.Config) env {
	t.Helper()
	if cfg.Clock == nil {
		cfg.Clock = func() time.Time { return t0 }
	}
	p := fakeprovider.New(cfg)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return env{p: p, srv: srv, c: fakeprovider.NewClient(srv.URL, srv.Client())}
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func refundParams(ref string) fakeprovider.RefundParams {
	return fakeprovider.RefundParams{PaymentID: "pay_1", AmountMinor: 1500, Currency: "EUR", MerchantReference: ref}
}

// rawDo sends a request without the Client and returns status, headers and body.
func rawDo(t *testing.T, method, url string, hdr map[string]string, body string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = bytes.NewBufferString(body)
	}
	req, err := http.NewRequestWithContext(testCtx(t), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// errCode extracts the error code of an error reply body.
func errCode(t *testing.T, body []byte) string {
	t.Helper()
	var b struct {
		Error struct {
			Code  string `json:"code"`
			Param string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	return b.Error.Code
}

// wantStatusError asserts err is a *StatusError with the given status and code.
func wantStatusError(t *testing.T, err error, status int, code string) *fakeprovider.StatusError {
	t.Helper()
	var se *fakeprovider.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v (%T), want *StatusError %d %s", err, err, status, code)
	}
	if se.StatusCode != status || se.Code != code {
		t.Fatalf("StatusError = %d %q, want %d %q (%v)", se.StatusCode, se.Code, status, code, se)
	}
	return se
}

// closeWithin closes srv, which waits for every outstanding request, and fails
// when that takes longer than d: a handler kept hanging after its client left.
func closeWithin(t *testing.T, srv *httptest.Server, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("server still busy %s after the client cancelled: the hang ignored cancellation", d)
	}
}
