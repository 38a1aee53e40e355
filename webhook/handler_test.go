package webhook_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobfence/jobfence/internal/proctest"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/webhook"
)

// endpoint is the webhook handler over a real store and a real HTTP socket.
type endpoint struct {
	st      store.Store
	url     string
	reg     *prometheus.Registry
	metrics *webhook.Metrics
	logs    *proctest.Buffer
}

func startEndpoint(t *testing.T, b testdb.Backend) *endpoint {
	t.Helper()
	e := &endpoint{st: b.Open(t), reg: prometheus.NewRegistry(), logs: &proctest.Buffer{}}
	e.metrics = webhook.NewMetrics(e.reg)
	providers := map[string]*webhook.Provider{
		"acme": {Scheme: webhook.Stripe{Tolerance: 5 * time.Minute}, Secrets: [][]byte{[]byte(secretOld), []byte(secretNew)}},
		// Another provider: its webhooks speak for its own refunds only (R28).
		"globex": {Scheme: webhook.Stripe{Tolerance: 5 * time.Minute}, Secrets: [][]byte{[]byte(secretGlobex)}},
	}
	h := webhook.NewHandler(providers, e.st, e.metrics, slog.New(slog.NewTextHandler(e.logs, nil)))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

// deliver posts body to provider's endpoint signed with secret at t.
func (e *endpoint) deliver(t *testing.T, provider, secret string, at time.Time, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.url+"/webhooks/"+provider, strings.NewReader(body))
	req.Header.Set(webhook.StripeSignatureHeader, fmt.Sprintf("t=%d,v1=%s", at.Unix(), sign(secret, at.Unix(), body)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// counter reads a counter of the endpoint's registry by its labels (name,
// value pairs); 0 when absent.
func (e *endpoint) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func enqueue(t *testing.T, st store.Store, key string) store.Job {
	t.Helper()
	return enqueueAt(t, st, key, time.Time{})
}

// enqueueAt enqueues an acme refund of 42.50 EUR under key, due at notBefore
// (now when zero).
func enqueueAt(t *testing.T, st store.Store, key string, notBefore time.Time) store.Job {
	t.Helper()
	job, _, err := st.Enqueue(ctxFor(t), store.EnqueueParams{OperationKey: key, OrderID: "order-" + key,
		PaymentID: "pay-" + key, AmountMinor: 4250, Currency: "EUR", Provider: "acme", NotBefore: notBefore})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func receipts(t *testing.T, st store.Store, id int64) []store.Observation {
	t.Helper()
	d, err := st.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{ID: id}})
	if err != nil {
		t.Fatal(err)
	}
	return d.Observations
}

func forEachBackend(t *testing.T, fn func(t *testing.T, e *endpoint)) {
	for _, b := range testdb.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, startEndpoint(t, b))
		})
	}
}

// TestVerifiedEventsBecomeObservations_R28: an event is filed on the job it
// names, once however often it is delivered, answered 2xx once stored; the
// job's state is never changed by it.
func TestVerifiedEventsBecomeObservations_R28(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *endpoint) {
		job := enqueue(t, e.st, "wh-key-1")
		body := refundEvent("evt_1", "refund.updated", "re_1", "succeeded", "wh-key-1")
		for range 3 { // the provider redelivers
			if code, resp := e.deliver(t, "acme", secretNew, time.Now(), body); code != http.StatusOK ||
				!strings.Contains(resp, `"received":1`) {
				t.Fatalf("delivery: %d %s", code, resp)
			}
		}
		obs := receipts(t, e.st, job.ID)
		if len(obs) != 1 || obs[0].Source != "webhook:acme" || obs[0].ProviderEventID != "evt_1" ||
			obs[0].ProviderRefundID != "re_1" || obs[0].Outcome != store.OutcomeSucceeded || obs[0].ReportedAttempt != 0 {
			t.Fatalf("receipts after three deliveries: %+v", obs)
		}
		d, err := e.st.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{ID: job.ID}})
		if err != nil || d.Job.State != store.StateReady || d.Job.Attempt != 0 {
			t.Fatalf("a webhook changed the job: %+v %v", d.Job, err)
		}
		// Found by the refund id alone (no metadata, no idempotency key).
		noKey := strings.NewReplacer(`"metadata":{"operation_key":"k"}`, `"metadata":{}`,
			`"idempotency_key":"idem-k"`, `"idempotency_key":""`).Replace(refundEvent("evt_2", "refund.updated", "re_1", "succeeded", "k"))
		if code, _ := e.deliver(t, "acme", secretOld, time.Now(), noKey); code != http.StatusOK {
			t.Fatalf("by refund id: %d", code)
		}
		if obs := receipts(t, e.st, job.ID); len(obs) != 2 || obs[1].ProviderEventID != "evt_2" {
			t.Fatalf("the refund id did not find its job: %+v", obs)
		}
		if n := e.counter(t, "jobfence_webhooks_received_total", "provider", "acme"); n != 4 {
			t.Fatalf("received %v, want 4", n)
		}
	})
}

// TestOutOfOrderEventsNeverDecideState_R28: events delivered newest first and
// twice each leave one receipt per event and the job where only its fenced
// writers put it.
func TestOutOfOrderEventsNeverDecideState_R28(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *endpoint) {
		job := enqueue(t, e.st, "wh-key-2")
		created := refundEvent("evt_c", "refund.created", "re_2", "pending", "wh-key-2")
		updated := refundEvent("evt_u", "refund.updated", "re_2", "succeeded", "wh-key-2")
		for _, body := range []string{updated, updated, created, created} {
			if code, _ := e.deliver(t, "acme", secretNew, time.Now(), body); code != http.StatusOK {
				t.Fatalf("delivery: %d", code)
			}
		}
		obs := receipts(t, e.st, job.ID)
		if len(obs) != 2 || obs[0].ProviderEventID != "evt_u" || obs[1].ProviderEventID != "evt_c" {
			t.Fatalf("receipts: %+v", obs)
		}
		d, _ := e.st.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{ID: job.ID}})
		if d.Job.State != store.StateReady || d.Job.ProviderRefundID != "" {
			t.Fatalf("the events decided the job: %+v", d.Job)
		}
	})
}

// TestUnmatchedEventsAreKept_R28: a verified event that names no job is
// stored in the unmatched log (once) and answered 2xx, never dropped.
func TestUnmatchedEventsAreKept_R28(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *endpoint) {
		body := refundEvent("evt_lost", "refund.updated", "re_nobody", "succeeded", "no-such-key")
		for range 2 {
			if code, _ := e.deliver(t, "acme", secretNew, time.Now(), body); code != http.StatusOK {
				t.Fatalf("unmatched delivery: %d", code)
			}
		}
		got, total, err := e.st.Unmatched(ctxFor(t), 10)
		if err != nil || total != 1 || len(got) != 1 || got[0].ProviderEventID != "evt_lost" ||
			got[0].ProviderRefundID != "re_nobody" || got[0].OperationKey != "no-such-key" || got[0].Provider != "acme" {
			t.Fatalf("unmatched log: %+v total %d %v", got, total, err)
		}
		if n := e.counter(t, "jobfence_webhook_events_unmatched_total", "provider", "acme"); n != 1 {
			t.Fatalf("unmatched counter %v, want 1", n)
		}
	})
}

// TestRefusedDeliveriesStoreNothing_R28: a bad or stale signature, an
// unknown provider, an oversized or malformed body store nothing, are
// answered 4xx, counted by reason and logged without the body.
func TestRefusedDeliveriesStoreNothing_R28(t *testing.T) {
	e := startEndpoint(t, testdb.SQLiteBackend())
	job := enqueue(t, e.st, "wh-key-3")
	body := refundEvent("evt_bad", "refund.updated", "re_3", "succeeded", "wh-key-3")
	for _, c := range []struct {
		name     string
		provider string
		secret   string
		at       time.Time
		body     string
		code     int
		reason   string
	}{
		{"wrong secret", "acme", "whsec_wrong_0123456789", time.Now(), body, http.StatusBadRequest, webhook.ReasonBadSignature},
		{"stale", "acme", secretNew, time.Now().Add(-10 * time.Minute), body, http.StatusBadRequest, webhook.ReasonStaleTimestamp},
		{"future", "acme", secretNew, time.Now().Add(10 * time.Minute), body, http.StatusBadRequest, webhook.ReasonStaleTimestamp},
		{"unknown provider", "initech", secretNew, time.Now(), body, http.StatusNotFound, webhook.ReasonUnknownProvider},
		{"too large", "acme", secretNew, time.Now(), body + strings.Repeat(" ", webhook.MaxBody), http.StatusRequestEntityTooLarge,
			webhook.ReasonTooLarge},
		{"not an event", "acme", secretNew, time.Now(), `{"hello":"world"}`, http.StatusBadRequest, webhook.ReasonBadBody},
	} {
		t.Run(c.name, func(t *testing.T) {
			provider := c.provider
			if c.reason == webhook.ReasonUnknownProvider {
				provider = "unknown"
			}
			before := e.counter(t, "jobfence_webhooks_rejected_total", "provider", provider, "reason", c.reason)
			if code, _ := e.deliver(t, c.provider, c.secret, c.at, c.body); code != c.code {
				t.Fatalf("answered %d, want %d", code, c.code)
			}
			if n := e.counter(t, "jobfence_webhooks_rejected_total", "provider", provider, "reason", c.reason); n != before+1 {
				t.Fatalf("rejected{%s,%s} = %v, want %v", provider, c.reason, n, before+1)
			}
		})
	}
	if obs := receipts(t, e.st, job.ID); len(obs) != 0 {
		t.Fatalf("a refused delivery stored %+v", obs)
	}
	if _, total, _ := e.st.Unmatched(ctxFor(t), 10); total != 0 {
		t.Fatalf("a refused delivery reached the unmatched log")
	}
	if strings.Contains(e.logs.String(), "evt_bad") || strings.Contains(e.logs.String(), secretNew) {
		t.Fatalf("a body or a secret is in the logs:\n%s", e.logs.String())
	}
}

// TestNotStoredIsNotAcknowledged_R28: when the store cannot keep the event,
// the provider is answered 5xx, so that it delivers again.
func TestNotStoredIsNotAcknowledged_R28(t *testing.T) {
	e := startEndpoint(t, testdb.SQLiteBackend())
	enqueue(t, e.st, "wh-key-4")
	e.st.Close()
	code, _ := e.deliver(t, "acme", secretNew, time.Now(), refundEvent("evt_4", "refund.updated", "re_4", "succeeded", "wh-key-4"))
	if code < 500 {
		t.Fatalf("answered %d with the store closed, want 5xx", code)
	}
}
