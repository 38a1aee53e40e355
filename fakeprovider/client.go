package fakeprovider

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to a fakeprovider over HTTP. Its zero value is not usable; use
// NewClient. It is safe for concurrent use.
//
// It never resends on its own. (A plain net/http request with a replayable
// body and an Idempotency-Key header is silently resent by the transport when
// the reply is cut on a reused connection; Client disables that, and a worker
// with its own HTTP client should too, by setting Request.GetBody to nil.)
type Client struct {
	base string
	hc   *http.Client
}

// NewClient returns a client for the provider at baseURL (e.g.
// "http://127.0.0.1:8099"). A nil hc means http.DefaultClient; give one with
// a Timeout, or pass contexts with deadlines, so a hang cannot block forever.
func NewClient(baseURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), hc: hc}
}

type faultCtxKey struct{}

// WithFault returns a context whose requests through Client carry the
// X-Fake-Fault header spec (syntax of ParseFaults), so a test can target one
// call. Specs from nested WithFault calls are joined.
func WithFault(ctx context.Context, spec string) context.Context {
	if prev, ok := ctx.Value(faultCtxKey{}).(string); ok && prev != "" {
		spec = prev + "," + spec
	}
	return context.WithValue(ctx, faultCtxKey{}, spec)
}

// CreateRefund asks for a refund under idempotencyKey, the job's unchanging
// operation key (R1). An empty p.MerchantReference is set to idempotencyKey.
// The result's Replayed is true when the provider answered from its
// idempotency store. A pending refund is not a success (R4).
//
// Errors: ErrIdempotencyConflict (409); ErrUnavailable (503); ErrNoReply when
// no reply came — the refund may exist, reconcile before resending (R14);
// other *StatusError for rejected input.
func (c *Client) CreateRefund(ctx context.Context, idempotencyKey string, p RefundParams) (Refund, error) {
	if p.MerchantReference == "" {
		p.MerchantReference = idempotencyKey
	}
	body, err := json.Marshal(p)
	if err != nil {
		return Refund{}, err
	}
	hdr := http.Header{}
	if idempotencyKey != "" {
		hdr.Set("Idempotency-Key", idempotencyKey)
	}
	var out Refund
	resp, err := c.do(ctx, http.MethodPost, "/v1/refunds", hdr, body, &out)
	if err != nil {
		return Refund{}, err
	}
	out.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	return out, nil
}

// GetRefund returns the refund with the given id. Errors: ErrNotFound (which,
// under lookup lag, does not prove the refund does not exist), ErrUnavailable,
// ErrNoReply, *StatusError.
func (c *Client) GetRefund(ctx context.Context, id string) (Refund, error) {
	var out Refund
	_, err := c.do(ctx, http.MethodGet, "/v1/refunds/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// FindByReference returns the visible refunds with this merchant reference,
// oldest first. An empty result is "no record", not proof that nothing
// happened (R14). Errors: ErrUnavailable, ErrNoReply, *StatusError.
func (c *Client) FindByReference(ctx context.Context, merchantReference string) ([]Refund, error) {
	return c.list(ctx, url.Values{"merchant_reference": {merchantReference}})
}

// ListByPayment returns the visible refunds of a payment, oldest first.
// Errors: ErrUnavailable, ErrNoReply, *StatusError.
func (c *Client) ListByPayment(ctx context.Context, paymentID string) ([]Refund, error) {
	return c.list(ctx, url.Values{"payment_id": {paymentID}})
}

func (c *Client) list(ctx context.Context, q url.Values) ([]Refund, error) {
	var out listBody
	if _, err := c.do(ctx, http.MethodGet, "/v1/refunds?"+q.Encode(), nil, nil, &out); err != nil {
		return nil, err
	}
	if out.Data == nil {
		out.Data = []Refund{}
	}
	return out.Data, nil
}

// Oracle returns the provider's truth (GET /v1/_oracle). Errors: ErrNoReply,
// *StatusError.
func (c *Client) Oracle(ctx context.Context) (OracleReport, error) {
	var out OracleReport
	_, err := c.do(ctx, http.MethodGet, "/v1/_oracle", nil, nil, &out)
	return out, err
}

// SetFaults replaces the provider's global faults and returns them as set.
// Errors: *StatusError with CodeInvalidFault, ErrNoReply.
func (c *Client) SetFaults(ctx context.Context, f Faults) (Faults, error) {
	body, err := json.Marshal(f)
	if err != nil {
		return Faults{}, err
	}
	var out Faults
	_, err = c.do(ctx, http.MethodPost, "/v1/_admin/faults", nil, body, &out)
	return out, err
}

// ClearFaults removes the provider's global faults. Errors: ErrNoReply,
// *StatusError.
func (c *Client) ClearFaults(ctx context.Context) error {
	_, err := c.do(ctx, http.MethodDelete, "/v1/_admin/faults", nil, nil, nil)
	return err
}

// Faults returns the provider's global faults as they stand. Errors:
// ErrNoReply, *StatusError.
func (c *Client) Faults(ctx context.Context) (Faults, error) {
	var out Faults
	_, err := c.do(ctx, http.MethodGet, "/v1/_admin/faults", nil, nil, &out)
	return out, err
}

// Advance moves the provider's clock forward by d and returns its new time.
// Errors: *StatusError for a negative d, ErrNoReply.
func (c *Client) Advance(ctx context.Context, d time.Duration) (time.Time, error) {
	body, err := json.Marshal(map[string]float64{"seconds": d.Seconds()})
	if err != nil {
		return time.Time{}, err
	}
	var out advanceReply
	_, err = c.do(ctx, http.MethodPost, "/v1/_admin/advance", nil, body, &out)
	return out.Now, err
}

// RegisterPayment records a payment's amount so the oracle can flag
// over-refunds. Errors: *StatusError for bad input, ErrNoReply.
func (c *Client) RegisterPayment(ctx context.Context, paymentID string, amountMinor int64, currency string) error {
	body, err := json.Marshal(paymentBody{PaymentID: paymentID, AmountMinor: amountMinor, Currency: currency})
	if err != nil {
		return err
	}
	_, err = c.do(ctx, http.MethodPost, "/v1/_admin/payments", nil, body, nil)
	return err
}

// Reset makes the provider forget every refund, key, payment and counter
// (see Provider.Reset). Errors: ErrNoReply, *StatusError.
func (c *Client) Reset(ctx context.Context) error {
	_, err := c.do(ctx, http.MethodPost, "/v1/_admin/reset", nil, nil, nil)
	return err
}

// do sends one request and decodes a 2xx reply into out (when non-nil).
func (c *Client) do(ctx context.Context, method, path string, hdr http.Header, body []byte, out any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	// Without GetBody net/http cannot replay the body, so it will not
	// silently resend a POST carrying an Idempotency-Key whose reply was cut
	// on a reused connection. Whether to resend is the worker's decision
	// (R14, R16), not the transport's.
	req.GetBody = nil
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if spec, ok := ctx.Value(faultCtxKey{}).(string); ok && spec != "" {
		req.Header.Set(FaultHeader, spec)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %w", ErrNoReply, method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: reading reply: %w", ErrNoReply, method, path, err)
	}
	if resp.StatusCode >= 300 {
		return nil, decodeError(resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("fakeprovider: %s %s: bad reply: %w", method, path, err)
		}
	}
	return resp, nil
}

func decodeError(status int, raw []byte) *StatusError {
	var b errorBody
	if err := json.Unmarshal(raw, &b); err != nil || b.Error.Code == "" {
		return &StatusError{StatusCode: status, Message: strings.TrimSpace(string(raw))}
	}
	return &StatusError{StatusCode: status, Type: b.Error.Type, Code: b.Error.Code, Message: b.Error.Message, Param: b.Error.Param}
}
