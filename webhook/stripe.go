package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jobfence/jobfence/store"
)

// StripeSignatureHeader carries a Stripe-scheme delivery's signatures.
const StripeSignatureHeader = "Stripe-Signature"

// Stripe is the signature scheme of Stripe, which most providers copy:
//
//	Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]
//
// where each v1 is the HMAC-SHA256, under one of the endpoint's secrets, of
// "<t>.<raw body>". A delivery is genuine when one v1 matches one secret
// (compared in constant time) and t is within Tolerance of now, either way:
// an old t is a replay, a future one a forgery or a broken clock.
type Stripe struct {
	Tolerance time.Duration
}

// Name implements Scheme.
func (Stripe) Name() string { return "stripe" }

// Verify implements Scheme.
func (s Stripe) Verify(h http.Header, body []byte, secrets [][]byte, now time.Time) error {
	header := h.Get(StripeSignatureHeader)
	if header == "" {
		return &RejectError{Reason: ReasonNoSignature, Err: errors.New("no " + StripeSignatureHeader + " header")}
	}
	var ts int64
	var sigs [][]byte
	var badV1 []string // v1 values that are not an HMAC-SHA256 in hex, described
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return &RejectError{Reason: ReasonMalformed, Err: fmt.Errorf("t=%q is not a unix time", v)}
			}
			ts = n
		case "v1":
			sig, err := hex.DecodeString(v)
			switch {
			case err != nil:
				badV1 = append(badV1, fmt.Sprintf("%d characters, not all hex digits", len(v)))
			case len(sig) != sha256.Size:
				badV1 = append(badV1, fmt.Sprintf("%d hex digits", len(v)))
			default:
				sigs = append(sigs, sig)
			}
		}
	}
	switch {
	case ts == 0:
		return &RejectError{Reason: ReasonMalformed, Err: errors.New("the signature header has no t=<unix seconds>")}
	case len(sigs) == 0 && len(badV1) > 0:
		// The secret is never the problem here: the value is not the shape
		// of a signature (cut, re-encoded, or another scheme's).
		return &RejectError{Reason: ReasonMalformed, Err: fmt.Errorf("the signature header's v1= is not 64 hex digits "+
			"(an HMAC-SHA256 in hex): %s", strings.Join(badV1, "; "))}
	case len(sigs) == 0:
		return &RejectError{Reason: ReasonMalformed, Err: errors.New("the signature header has no v1= signature")}
	}
	// The signature first: an unsigned stale request says nothing about
	// anybody's clock.
	signed := []byte(strconv.FormatInt(ts, 10) + ".")
	ok := false
	for _, secret := range secrets {
		mac := hmac.New(sha256.New, secret)
		mac.Write(signed)
		mac.Write(body)
		want := mac.Sum(nil)
		for _, sig := range sigs {
			ok = hmac.Equal(sig, want) || ok // every comparison runs: no early exit to time
		}
	}
	if !ok {
		return &RejectError{Reason: ReasonBadSignature, Err: errors.New("no v1 signature matches a secret of this provider")}
	}
	if age := now.Sub(time.Unix(ts, 0)); age > s.Tolerance || age < -s.Tolerance {
		return &RejectError{Reason: ReasonStaleTimestamp, Err: fmt.Errorf("signed %s from now, tolerance %s", -age.Round(time.Second), s.Tolerance)}
	}
	return nil
}

// stripeEvent is the part of a Stripe event the coordinator reads.
type stripeEvent struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
	Data    struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
	Request struct {
		IdempotencyKey string `json:"idempotency_key"`
	} `json:"request"`
}

// stripeRefund is a refund object.
type stripeRefund struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Status        string            `json:"status"`
	Amount        int64             `json:"amount"`
	Currency      string            `json:"currency"`
	FailureReason string            `json:"failure_reason"`
	Metadata      map[string]string `json:"metadata"`
}

// stripeCharge is the charge of a charge.refunded event, with its refunds.
type stripeCharge struct {
	Object  string `json:"object"`
	Refunds struct {
		Data []stripeRefund `json:"data"`
	} `json:"refunds"`
}

// Parse implements Scheme: refund.created, refund.updated, refund.failed
// (one refund each) and charge.refunded (each refund of the charge); other
// event types carry no refund outcome and give none.
func (Stripe) Parse(body []byte) ([]Event, error) {
	var ev stripeEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("not a JSON event: %w", err)
	}
	if ev.ID == "" || ev.Type == "" {
		return nil, errors.New("an event needs an id and a type")
	}
	var refunds []stripeRefund
	switch ev.Type {
	case "refund.created", "refund.updated", "refund.failed":
		var r stripeRefund
		if err := json.Unmarshal(ev.Data.Object, &r); err != nil || r.Object != "refund" || r.ID == "" {
			return nil, fmt.Errorf("%s: data.object is not a refund", ev.Type)
		}
		refunds = []stripeRefund{r}
	case "charge.refunded":
		var c stripeCharge
		if err := json.Unmarshal(ev.Data.Object, &c); err != nil || c.Object != "charge" {
			return nil, fmt.Errorf("%s: data.object is not a charge", ev.Type)
		}
		refunds = c.Refunds.Data
	default:
		return nil, nil
	}
	var out []Event
	for _, r := range refunds {
		if r.ID == "" {
			return nil, fmt.Errorf("%s: a refund without an id", ev.Type)
		}
		id := ev.ID
		if ev.Type == "charge.refunded" {
			id += ":" + r.ID // one charge event names several refunds: one receipt each
		}
		key := r.Metadata[MetadataKey]
		if key == "" {
			key = ev.Request.IdempotencyKey
		}
		e := Event{ID: id, Type: ev.Type, RefundID: r.ID, OperationKey: key, Outcome: stripeOutcome(r.Status),
			AmountMinor: r.Amount, Currency: strings.ToUpper(r.Currency),
			Detail: fmt.Sprintf("%s: refund %s status %s, %d %s", ev.Type, r.ID, r.Status, r.Amount,
				strings.ToUpper(r.Currency))}
		if r.FailureReason != "" {
			e.Detail += ", failure reason " + r.FailureReason
		}
		if e.Outcome == "" {
			return nil, fmt.Errorf("%s: refund %s has status %q, not one of succeeded, pending, failed, canceled",
				ev.Type, r.ID, r.Status)
		}
		out = append(out, e)
	}
	return out, nil
}

// stripeOutcome maps a refund's status. Pending is never success (R4);
// canceled means the refund was not made.
func stripeOutcome(status string) store.Outcome {
	switch status {
	case "succeeded":
		return store.OutcomeSucceeded
	case "pending", "requires_action":
		return store.OutcomePending
	case "failed", "canceled":
		return store.OutcomeFailed
	}
	return ""
}
