package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/webhook"
)

// sign is Stripe's v1 signature, written out independently of the code under
// test: HMAC-SHA256 over "<t>.<body>".
func sign(secret string, t int64, body string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "%d.%s", t, body)
	return hex.EncodeToString(mac.Sum(nil))
}

func header(v string) http.Header {
	h := http.Header{}
	if v != "" {
		h.Set(webhook.StripeSignatureHeader, v)
	}
	return h
}

const (
	secretOld = "whsec_old_0123456789abcdef"
	secretNew = "whsec_new_0123456789abcdef"
)

// TestStripeSignatureVectors_R28: only the raw body signed with one of the
// provider's secrets, at a time within the tolerance either way, verifies.
func TestStripeSignatureVectors_R28(t *testing.T) {
	now := time.Unix(1_780_000_000, 0)
	ts := now.Unix()
	body := `{"id":"evt_1","type":"refund.updated"}`
	s := webhook.Stripe{Tolerance: 5 * time.Minute}
	both := [][]byte{[]byte(secretOld), []byte(secretNew)}
	// What a malformed header's refusal says is wrong: the operator reading
	// the log line fixes the sender by it.
	says := map[string]string{
		"a v0 (test-mode) signature only": "has no v1= signature",
		"no t":                            "has no t=<unix seconds>",
		"v1 not hex":                      "v1= is not 64 hex digits (an HMAC-SHA256 in hex): 2 characters, not all hex digits",
		"v1 cut short":                    "v1= is not 64 hex digits (an HMAC-SHA256 in hex): 62 hex digits",
		"v1 as base64":                    "v1= is not 64 hex digits",
	}
	for _, c := range []struct {
		name    string
		header  string
		body    string
		secrets [][]byte
		reason  string // "" when it verifies
	}{
		{"valid", fmt.Sprintf("t=%d,v1=%s", ts, sign(secretNew, ts, body)), body, both, ""},
		{"rotated: the old secret still verifies", fmt.Sprintf("t=%d,v1=%s", ts, sign(secretOld, ts, body)), body, both, ""},
		{"the old secret after rotation ended", fmt.Sprintf("t=%d,v1=%s", ts, sign(secretOld, ts, body)), body,
			[][]byte{[]byte(secretNew)}, webhook.ReasonBadSignature},
		{"two v1, the second valid", fmt.Sprintf("t=%d,v1=%s,v1=%s", ts, sign("whsec_wrong_0123456789", ts, body),
			sign(secretNew, ts, body)), body, both, ""},
		{"a v0 (test-mode) signature only", fmt.Sprintf("t=%d,v0=%s", ts, sign(secretNew, ts, body)), body, both,
			webhook.ReasonMalformed},
		{"wrong secret", fmt.Sprintf("t=%d,v1=%s", ts, sign("whsec_wrong_0123456789", ts, body)), body, both,
			webhook.ReasonBadSignature},
		{"tampered body", fmt.Sprintf("t=%d,v1=%s", ts, sign(secretNew, ts, body)), strings.Replace(body, "evt_1", "evt_2", 1),
			both, webhook.ReasonBadSignature},
		{"signed t changed", fmt.Sprintf("t=%d,v1=%s", ts+1, sign(secretNew, ts, body)), body, both, webhook.ReasonBadSignature},
		{"stale: 301s old", fmt.Sprintf("t=%d,v1=%s", ts-301, sign(secretNew, ts-301, body)), body, both,
			webhook.ReasonStaleTimestamp},
		{"299s old", fmt.Sprintf("t=%d,v1=%s", ts-299, sign(secretNew, ts-299, body)), body, both, ""},
		{"future: 301s ahead", fmt.Sprintf("t=%d,v1=%s", ts+301, sign(secretNew, ts+301, body)), body, both,
			webhook.ReasonStaleTimestamp},
		{"missing header", "", body, both, webhook.ReasonNoSignature},
		{"no t", "v1=" + sign(secretNew, ts, body), body, both, webhook.ReasonMalformed},
		{"t not a number", "t=yesterday,v1=" + sign(secretNew, ts, body), body, both, webhook.ReasonMalformed},
		{"v1 not hex", fmt.Sprintf("t=%d,v1=zz", ts), body, both, webhook.ReasonMalformed},
		{"v1 cut short", fmt.Sprintf("t=%d,v1=%s", ts, sign(secretNew, ts, body)[:62]), body, both, webhook.ReasonMalformed},
		{"v1 as base64", fmt.Sprintf("t=%d,v1=3q2+7w==", ts), body, both, webhook.ReasonMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := s.Verify(header(c.header), []byte(c.body), c.secrets, now)
			var rej *webhook.RejectError
			switch {
			case c.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.reason != "" && !errors.As(err, &rej):
				t.Fatalf("error %v, want a refusal %s", err, c.reason)
			case c.reason != "" && rej.Reason != c.reason:
				t.Fatalf("refused as %s, want %s (%v)", rej.Reason, c.reason, err)
			case says[c.name] != "" && !strings.Contains(err.Error(), says[c.name]):
				t.Fatalf("refused with %q, want it to say %q", err, says[c.name])
			}
		})
	}
}

func refundEvent(id, typ, refundID, status, key string) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":%q,"created":1780000000,"data":{"object":{"id":%q,"object":"refund",`+
		`"amount":4250,"currency":"eur","status":%q,"metadata":{"operation_key":%q}}},"request":{"id":"req_1","idempotency_key":"idem-%s"}}`,
		id, typ, refundID, status, key, key)
}

// TestStripeEventsMapToOutcomes_R4: each refund status maps to an
// observation outcome, pending never to success; a charge.refunded event
// names each of its refunds under an id of its own.
func TestStripeEventsMapToOutcomes_R4(t *testing.T) {
	s := webhook.Stripe{}
	for status, want := range map[string]store.Outcome{"succeeded": store.OutcomeSucceeded, "pending": store.OutcomePending,
		"failed": store.OutcomeFailed, "canceled": store.OutcomeFailed} {
		evs, err := s.Parse([]byte(refundEvent("evt_"+status, "refund.updated", "re_1", status, "key-1")))
		if err != nil || len(evs) != 1 {
			t.Fatalf("%s: %v %v", status, evs, err)
		}
		e := evs[0]
		if e.Outcome != want || e.ID != "evt_"+status || e.RefundID != "re_1" || e.OperationKey != "key-1" {
			t.Fatalf("%s: %+v, want outcome %s", status, e, want)
		}
	}
	if _, err := s.Parse([]byte(refundEvent("evt_x", "refund.updated", "re_1", "sort_of", "k"))); err == nil {
		t.Fatal("an unknown refund status was accepted")
	}
	// Without metadata, the request's idempotency key names the job.
	noMeta := strings.Replace(refundEvent("evt_m", "refund.created", "re_2", "pending", "k"), `"metadata":{"operation_key":"k"}`,
		`"metadata":{}`, 1)
	if evs, err := s.Parse([]byte(noMeta)); err != nil || evs[0].OperationKey != "idem-k" {
		t.Fatalf("no metadata: %v %v", evs, err)
	}
	charge := `{"id":"evt_c","type":"charge.refunded","data":{"object":{"object":"charge","id":"pay_1","refunds":{"data":[` +
		`{"id":"re_a","object":"refund","status":"succeeded","amount":1,"currency":"eur","metadata":{"operation_key":"k-a"}},` +
		`{"id":"re_b","object":"refund","status":"pending","amount":2,"currency":"eur","metadata":{"operation_key":"k-b"}}]}}}}`
	evs, err := s.Parse([]byte(charge))
	if err != nil || len(evs) != 2 || evs[0].ID != "evt_c:re_a" || evs[1].ID != "evt_c:re_b" ||
		evs[1].Outcome != store.OutcomePending || evs[0].OperationKey != "k-a" {
		t.Fatalf("charge.refunded: %+v %v", evs, err)
	}
	// Other events carry no refund outcome.
	if evs, err := s.Parse([]byte(`{"id":"evt_p","type":"payment_intent.succeeded","data":{"object":{}}}`)); err != nil || len(evs) != 0 {
		t.Fatalf("payment_intent.succeeded: %v %v", evs, err)
	}
	for _, bad := range []string{`not json`, `{"type":"refund.updated"}`, `{"id":"evt_1"}`,
		`{"id":"evt_1","type":"refund.updated","data":{"object":{"object":"charge"}}}`,
		`{"id":"evt_1","type":"refund.updated","data":{"object":{"object":"refund"}}}`} {
		if _, err := s.Parse([]byte(bad)); err == nil {
			t.Errorf("%s: parsed", bad)
		}
	}
}
