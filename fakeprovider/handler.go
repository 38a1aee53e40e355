package fakeprovider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Limits on request input.
const (
	maxBodyBytes = 1 << 20
	maxKeyLen    = 255 // Idempotency-Key, as at Stripe
	maxIDLen     = 255 // payment_id, merchant_reference
)

func (p *Provider) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/refunds", p.handleCreate)
	mux.HandleFunc("GET /v1/refunds/{id}", p.handleGet)
	mux.HandleFunc("GET /v1/refunds", p.handleList)
	mux.HandleFunc("GET /v1/_oracle", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, p.Oracle())
	})
	mux.HandleFunc("POST /v1/_admin/advance", p.handleAdvance)
	mux.HandleFunc("GET /v1/_admin/faults", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, p.Faults())
	})
	mux.HandleFunc("POST /v1/_admin/faults", p.handleSetFaults)
	mux.HandleFunc("DELETE /v1/_admin/faults", func(w http.ResponseWriter, r *http.Request) {
		p.ClearFaults()
		writeJSON(w, http.StatusOK, Faults{})
	})
	mux.HandleFunc("POST /v1/_admin/payments", p.handleRegisterPayment)
	mux.HandleFunc("POST /v1/_admin/reset", func(w http.ResponseWriter, r *http.Request) {
		p.Reset()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &StatusError{StatusCode: http.StatusNotFound, Type: "invalid_request_error",
			Code: CodeResourceMissing, Message: fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path)})
	})
	return mux
}

func (p *Provider) handleCreate(w http.ResponseWriter, r *http.Request) {
	received := p.now()
	p.count(func(s *Stats) { s.CreateRequests++ })
	// Read the whole body first: only then does net/http watch the connection
	// and cancel the request's context when the client goes away, which the
	// hangs rely on.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, invalid(CodeParameterInvalid, "", "cannot read body: "+err.Error()))
		return
	}
	hdr, serr := headerFaults(r)
	if serr != nil {
		writeError(w, serr)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	params, serr := parseRefundParams(key, body)
	if serr != nil {
		writeError(w, serr)
		return
	}
	if p.latency > 0 {
		t := time.NewTimer(p.latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return // the client went away: nothing done, as after a hang_before
		}
	}
	f, failed := p.admit(true, key, hdr)
	if failed {
		p.log.Info("fault: error burst", "idempotency_key", key)
		writeError(w, unavailable())
		return
	}
	if !p.hang(w, r, "hang_before", f.HangBefore) {
		return
	}
	refund, replayed, serr := p.create(key, params, f, received)
	if !p.hang(w, r, "hang_after", f.HangAfter) {
		return
	}
	if f.CutReply {
		p.cut(w, r)
		return
	}
	if serr != nil {
		writeError(w, serr)
		return
	}
	w.Header().Set("Idempotent-Replayed", strconv.FormatBool(replayed))
	writeJSON(w, http.StatusOK, refund)
}

func parseRefundParams(key string, body []byte) (RefundParams, *StatusError) {
	switch {
	case key == "":
		return RefundParams{}, invalid(CodeIdempotencyKeyMissing, "Idempotency-Key",
			"POST /v1/refunds requires an Idempotency-Key header")
	case len(key) > maxKeyLen:
		return RefundParams{}, invalid(CodeParameterInvalid, "Idempotency-Key",
			fmt.Sprintf("Idempotency-Key is longer than %d characters", maxKeyLen))
	}
	var params RefundParams
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&params); err != nil {
		return RefundParams{}, invalid(CodeParameterInvalid, "", "body is not a refund request: "+err.Error())
	}
	if dec.More() {
		return RefundParams{}, invalid(CodeParameterInvalid, "", "body has data after the JSON object")
	}
	params.Currency = strings.ToUpper(params.Currency)
	for _, f := range []struct{ name, v string }{
		{"payment_id", params.PaymentID}, {"merchant_reference", params.MerchantReference},
	} {
		if f.v == "" {
			return RefundParams{}, invalid(CodeParameterMissing, f.name, f.name+" is required")
		}
		if len(f.v) > maxIDLen {
			return RefundParams{}, invalid(CodeParameterInvalid, f.name,
				fmt.Sprintf("%s is longer than %d characters", f.name, maxIDLen))
		}
	}
	if params.AmountMinor <= 0 {
		return RefundParams{}, invalid(CodeParameterInvalid, "amount_minor",
			fmt.Sprintf("amount_minor must be a positive integer in minor units, got %d", params.AmountMinor))
	}
	if !isCurrencyCode(params.Currency) {
		return RefundParams{}, invalid(CodeParameterInvalid, "currency",
			fmt.Sprintf("currency must be a three-letter ISO 4217 code, got %q", params.Currency))
	}
	return params, nil
}

func isCurrencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, c := range s {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

func (p *Provider) handleGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p.serveLookup(w, r, func(rf *refund) bool { return rf.id == id }, func(found []Refund) {
		if len(found) == 0 {
			writeError(w, &StatusError{StatusCode: http.StatusNotFound, Type: "invalid_request_error",
				Code: CodeResourceMissing, Param: "id", Message: fmt.Sprintf("no such refund: %q", id)})
			return
		}
		writeJSON(w, http.StatusOK, found[0])
	})
}

func (p *Provider) handleList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ref, byRef := q.Get("merchant_reference"), q.Has("merchant_reference")
	pay, byPay := q.Get("payment_id"), q.Has("payment_id")
	for name := range q {
		if name != "merchant_reference" && name != "payment_id" {
			writeError(w, invalid(CodeParameterInvalid, name, "unknown query parameter; filter by merchant_reference and/or payment_id"))
			return
		}
	}
	keep := func(rf *refund) bool {
		return (!byRef || rf.params.MerchantReference == ref) && (!byPay || rf.params.PaymentID == pay)
	}
	p.serveLookup(w, r, keep, func(found []Refund) {
		writeJSON(w, http.StatusOK, listBody{Object: "list", Data: found})
	})
}

// serveLookup runs one lookup under the request's faults.
func (p *Provider) serveLookup(w http.ResponseWriter, r *http.Request, keep func(*refund) bool, reply func([]Refund)) {
	p.count(func(s *Stats) { s.LookupRequests++ })
	hdr, serr := headerFaults(r)
	if serr != nil {
		writeError(w, serr)
		return
	}
	f, failed := p.admit(false, "", hdr)
	if failed {
		p.log.Info("fault: error burst", "path", r.URL.Path)
		writeError(w, unavailable())
		return
	}
	if !p.hang(w, r, "hang_before", f.HangBefore) {
		return
	}
	found := p.lookup(f.LookupLag, keep)
	if !p.hang(w, r, "hang_after", f.HangAfter) {
		return
	}
	if f.CutReply {
		p.cut(w, r)
		return
	}
	reply(found)
}

// headerFaults parses the request's X-Fake-Fault headers.
func headerFaults(r *http.Request) (Faults, *StatusError) {
	vals := r.Header.Values(FaultHeader)
	if len(vals) == 0 {
		return Faults{}, nil
	}
	f, err := ParseFaults(strings.Join(vals, ","))
	if err == nil && (f.Key != "" || f.Times != 0) {
		err = errors.New("key and times apply only to global faults")
	}
	if err != nil {
		return Faults{}, invalid(CodeInvalidFault, FaultHeader, err.Error())
	}
	return f, nil
}

// hang holds the request for d of wall-clock time. It reports false when the
// request was cancelled first; the connection is then closed without a reply.
func (p *Provider) hang(w http.ResponseWriter, r *http.Request, mode string, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	p.log.Info("fault: hanging", "mode", mode, "for", d, "path", r.URL.Path, "idempotency_key",
		r.Header.Get("Idempotency-Key"))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		abort(w)
		return false
	}
}

// cut closes the connection without a reply (T3).
func (p *Provider) cut(w http.ResponseWriter, r *http.Request) {
	p.count(func(s *Stats) { s.CutReplies++ })
	p.log.Info("fault: reply cut", "path", r.URL.Path, "idempotency_key", r.Header.Get("Idempotency-Key"))
	abort(w)
}

// abort closes the connection without writing anything.
func abort(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	// Not hijackable (HTTP/2): net/http resets the stream and logs nothing.
	panic(http.ErrAbortHandler)
}

func (p *Provider) handleAdvance(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Seconds float64 `json:"seconds"`
	}
	if serr := decodeAdmin(w, r, &req); serr != nil {
		writeError(w, serr)
		return
	}
	d, err := secondsToDuration(req.Seconds)
	if err != nil {
		writeError(w, invalid(CodeParameterInvalid, "seconds", "seconds must be zero or more: "+err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, advanceReply{Now: p.Advance(d)})
}

// advanceReply is the JSON of POST /v1/_admin/advance's reply.
type advanceReply struct {
	Now time.Time `json:"now"`
}

func (p *Provider) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	if serr := decodeAdmin(w, r, &f); serr != nil {
		serr.Code = CodeInvalidFault
		writeError(w, serr)
		return
	}
	if err := p.SetFaults(f); err != nil {
		writeError(w, invalid(CodeInvalidFault, "", err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, p.Faults())
}

// paymentBody is the JSON of POST /v1/_admin/payments.
type paymentBody struct {
	PaymentID   string `json:"payment_id"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

func (p *Provider) handleRegisterPayment(w http.ResponseWriter, r *http.Request) {
	var req paymentBody
	if serr := decodeAdmin(w, r, &req); serr != nil {
		writeError(w, serr)
		return
	}
	if err := p.RegisterPayment(req.PaymentID, req.AmountMinor, strings.ToUpper(req.Currency)); err != nil {
		writeError(w, invalid(CodeParameterInvalid, "", err.Error()))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func decodeAdmin(w http.ResponseWriter, r *http.Request, v any) *StatusError {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid(CodeParameterInvalid, "", "bad JSON body: "+err.Error())
	}
	return nil
}

func invalid(code, param, msg string) *StatusError {
	return &StatusError{StatusCode: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Param: param, Message: msg}
}

func unavailable() *StatusError {
	return &StatusError{StatusCode: http.StatusServiceUnavailable, Type: "api_error", Code: CodeServiceUnavailable,
		Message: "injected error (error_burst): nothing was done"}
}

func writeError(w http.ResponseWriter, e *StatusError) {
	var b errorBody
	b.Error.Type, b.Error.Code, b.Error.Message, b.Error.Param = e.Type, e.Code, e.Message, e.Param
	writeJSON(w, e.StatusCode, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
