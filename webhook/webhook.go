// Package webhook receives payment providers' signed webhooks and files each
// refund event as an observation of its job (R15, R28): evidence, never a
// change of state. A verified event that names no job is kept in the
// unmatched log, never dropped. The provider is answered 2xx only once the
// event is durably stored, so that it delivers again otherwise.
//
// A signature scheme is one small type (Scheme); Stripe's, which most
// providers copy, is the first.
package webhook

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobfence/jobfence/store"
)

// MetadataKey is the refund metadata field that carries the job's
// operation_key: send it with the refund (as well as the Idempotency-Key)
// and its webhooks find their job by it.
const MetadataKey = "operation_key"

// MaxBody bounds a delivery's body: a refund event is a few KiB.
const MaxBody = 256 << 10

// MaxEventsPerDelivery bounds the refund events one delivery files, each a
// lookup and a write: a delivery naming more (a charge with more refunds
// than a provider embeds in one event) is kept whole, as one entry of the
// unmatched log for a person, and files nothing on any job.
const MaxEventsPerDelivery = 100

// DefaultTolerance is how far a signature's timestamp may be from now
// (Stripe's default).
const DefaultTolerance = 5 * time.Minute

// Scheme verifies and reads one kind of provider delivery.
type Scheme interface {
	// Name is the scheme's name in the secrets file.
	Name() string
	// Verify checks the delivery's signature over the raw body, before
	// anything parses it, against each of the provider's secrets, at now.
	// Errors: *RejectError.
	Verify(h http.Header, body []byte, secrets [][]byte, now time.Time) error
	// Parse returns the refund events of a verified body; none for an event
	// type that carries no refund outcome. Errors: a malformed body.
	Parse(body []byte) ([]Event, error)
}

// Event is one refund outcome a provider reported.
type Event struct {
	// ID is the provider's event id: a redelivery has the same, and files
	// nothing new.
	ID       string
	Type     string
	RefundID string
	// OperationKey is the job's key as the provider echoes it (metadata, the
	// request's idempotency key); empty when it does not.
	OperationKey string
	Outcome      store.Outcome
	// AmountMinor and Currency are what the provider says the refund is
	// for, in minor units and upper case; 0 and "" when it does not say.
	// A receipt for another amount than its job's moves nothing (R28).
	AmountMinor int64
	Currency    string
	Detail      string
}

// Reasons a delivery is refused, the label of jobfence_webhooks_rejected_total.
const (
	ReasonUnknownProvider = "unknown_provider"
	ReasonTooLarge        = "too_large"
	ReasonNoSignature     = "no_signature"
	ReasonMalformed       = "malformed"
	ReasonBadSignature    = "bad_signature"
	ReasonStaleTimestamp  = "stale_timestamp"
	ReasonBadBody         = "bad_body"
)

// RejectError is a delivery refused before anything was stored.
type RejectError struct {
	Reason string
	Err    error
}

func (e *RejectError) Error() string { return e.Reason + ": " + e.Err.Error() }

// Provider is one provider's endpoint: its scheme and its secrets (two while
// a secret is being rotated).
type Provider struct {
	Scheme  Scheme
	Secrets [][]byte
}

var providerName = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// LoadSecrets reads a webhook secrets file: one secret per line,
//
//	<provider> <scheme> <secret>
//
// with '#' comments; a provider may have two lines while its secret is
// rotated. The only scheme is "stripe". The file should be readable by the
// coordinator alone; the secrets are never logged.
func LoadSecrets(path string, tolerance time.Duration) (map[string]*Provider, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]*Provider{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			return nil, fmt.Errorf("%s:%d: want <provider> <scheme> <secret>", path, n)
		}
		name, scheme, secret := fields[0], fields[1], fields[2]
		if !providerName.MatchString(name) {
			return nil, fmt.Errorf("%s:%d: provider %q is not 1..64 characters of [a-z0-9_-]", path, n, name)
		}
		if scheme != "stripe" {
			return nil, fmt.Errorf("%s:%d: unknown scheme %q (stripe)", path, n, scheme)
		}
		if len(secret) < 16 {
			return nil, fmt.Errorf("%s:%d: the secret of %s is shorter than 16 characters", path, n, name)
		}
		p := out[name]
		if p == nil {
			p = &Provider{Scheme: Stripe{Tolerance: tolerance}}
			out[name] = p
		}
		if len(p.Secrets) == 2 {
			return nil, fmt.Errorf("%s:%d: %s has a third secret: two at most (the old and the new while rotating)", path, n, name)
		}
		p.Secrets = append(p.Secrets, []byte(secret))
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no secrets", path)
	}
	return out, nil
}

// Filer is what the handler needs of the store: filing receipts, finding a
// job by a provider refund id, and keeping what matches no job.
type Filer interface {
	Observe(ctx context.Context, p store.ObservationParams) (store.Observation, bool, error)
	List(ctx context.Context, p store.ListParams) (store.JobPage, error)
	KeepUnmatched(ctx context.Context, e store.UnmatchedEvent) (store.UnmatchedEvent, bool, error)
}

// Metrics count deliveries; register them once.
type Metrics struct {
	received  *prometheus.CounterVec
	rejected  *prometheus.CounterVec
	unmatched *prometheus.CounterVec
	filed     *prometheus.CounterVec
}

// NewMetrics registers the webhook counters on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jobfence_webhooks_received_total",
			Help: "Webhook deliveries verified and stored, by provider."}, []string{"provider"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jobfence_webhooks_rejected_total",
			Help: "Webhook deliveries refused before anything was stored, by provider and reason."}, []string{"provider", "reason"}),
		unmatched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jobfence_webhook_events_unmatched_total",
			Help: "Verified refund events that named no job, kept in the unmatched log."}, []string{"provider"}),
		filed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jobfence_webhook_events_filed_total",
			Help: "Refund events filed as observations, by provider and whether they were new."}, []string{"provider", "new"}),
	}
	reg.MustRegister(m.received, m.rejected, m.unmatched, m.filed)
	return m
}

// Handler serves POST /webhooks/{provider} and nothing else.
type Handler struct {
	providers map[string]*Provider
	filer     Filer
	metrics   *Metrics
	log       *slog.Logger
	now       func() time.Time
	mux       *http.ServeMux
}

// NewHandler returns the webhook endpoint of providers, filing into filer.
// A nil logger is slog.Default(); nil metrics are kept on a private
// registry.
func NewHandler(providers map[string]*Provider, filer Filer, metrics *Metrics, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	if metrics == nil {
		metrics = NewMetrics(prometheus.NewRegistry())
	}
	h := &Handler{providers: providers, filer: filer, metrics: metrics, log: log, now: time.Now, mux: http.NewServeMux()}
	h.mux.HandleFunc("POST /webhooks/{provider}", h.deliver)
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// deliver verifies one delivery on its raw body, files its events, and
// answers 200 only once every one of them is stored.
func (h *Handler) deliver(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("provider")
	p, ok := h.providers[name]
	if !ok {
		h.reject(w, "unknown", http.StatusNotFound, &RejectError{Reason: ReasonUnknownProvider,
			Err: fmt.Errorf("no webhook secret for provider %q", name)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		h.reject(w, name, http.StatusRequestEntityTooLarge, &RejectError{Reason: ReasonTooLarge, Err: err})
		return
	}
	if err := p.Scheme.Verify(r.Header, body, p.Secrets, h.now()); err != nil {
		var rej *RejectError
		if !errors.As(err, &rej) {
			rej = &RejectError{Reason: ReasonBadSignature, Err: err}
		}
		h.reject(w, name, http.StatusBadRequest, rej)
		return
	}
	events, err := p.Scheme.Parse(body)
	if err != nil {
		h.reject(w, name, http.StatusBadRequest, &RejectError{Reason: ReasonBadBody, Err: err})
		return
	}
	if len(events) > MaxEventsPerDelivery {
		if err := h.keepDelivery(r.Context(), name, events); err != nil {
			h.log.Warn("webhook delivery not stored; the provider will deliver it again", "provider", name,
				"event_id", events[0].ID, "error", err.Error())
			http.Error(w, "not stored, deliver again", http.StatusServiceUnavailable)
			return
		}
		events = nil
	}
	for _, e := range events {
		if err := h.file(r.Context(), name, e); err != nil {
			// Not stored: the provider delivers again (it retries for days).
			h.log.Warn("webhook event not stored; the provider will deliver it again", "provider", name,
				"event_id", e.ID, "error", err.Error())
			http.Error(w, "not stored, deliver again", http.StatusServiceUnavailable)
			return
		}
	}
	h.metrics.received.WithLabelValues(name).Inc()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"received\":%d}\n", len(events))
}

func (h *Handler) reject(w http.ResponseWriter, provider string, status int, rej *RejectError) {
	h.metrics.rejected.WithLabelValues(provider, rej.Reason).Inc()
	// The body is never logged: it is the provider's, and unverified.
	h.log.Warn("webhook refused", "provider", provider, "reason", rej.Reason, "error", rej.Err.Error())
	http.Error(w, rej.Reason, status)
}

// keepDelivery keeps a delivery of more than MaxEventsPerDelivery refund
// events as one entry of the unmatched log: its first event's id names it,
// its detail counts them and names the first refunds. Errors: not stored.
func (h *Handler) keepDelivery(ctx context.Context, provider string, events []Event) error {
	first := events[0]
	id, _, _ := strings.Cut(first.ID, ":") // a charge's events are named <event>:<refund>
	detail := fmt.Sprintf("one delivery named %d refunds, more than the %d one delivery may file: none was filed "+
		"on its job; look them up with the provider. The first: ", len(events), MaxEventsPerDelivery)
	for i, e := range events {
		if len(detail)+len(e.RefundID)+2 > store.MaxDetailLen-16 {
			detail += fmt.Sprintf("… and %d more", len(events)-i)
			break
		}
		if i > 0 {
			detail += ", "
		}
		detail += e.RefundID
	}
	_, dup, err := h.filer.KeepUnmatched(ctx, store.UnmatchedEvent{Provider: provider, ProviderEventID: id,
		EventType: first.Type, Outcome: store.OutcomeNotFound, Detail: detail})
	if err == nil && !dup {
		h.metrics.unmatched.WithLabelValues(provider).Inc()
		h.log.Warn("webhook delivery kept whole in the unmatched log: too many refunds in one delivery",
			"provider", provider, "event_id", id, "refunds", len(events))
	}
	return err
}

// file stores e as an observation of its job, or else in the unmatched log.
// Errors: the event is not stored.
func (h *Handler) file(ctx context.Context, provider string, e Event) error {
	// R28: the webhook of provider P speaks for P's refunds only, for the
	// amount and currency it names.
	p := store.ObservationParams{Source: "webhook:" + provider, Reporter: "webhook:" + provider, Provider: provider,
		AmountMinor: e.AmountMinor, Currency: e.Currency, Outcome: e.Outcome, ProviderRefundID: e.RefundID,
		ProviderEventID: e.ID, Detail: e.Detail}
	why, err := h.fileOnJob(ctx, provider, e, p)
	if err != nil || why == "" {
		return err
	}
	_, dup, err := h.filer.KeepUnmatched(ctx, store.UnmatchedEvent{Provider: provider, ProviderEventID: e.ID,
		EventType: e.Type, ProviderRefundID: e.RefundID, OperationKey: e.OperationKey, Outcome: e.Outcome,
		Detail: e.Detail + " (" + why + ")"})
	if err == nil && !dup {
		h.metrics.unmatched.WithLabelValues(provider).Inc()
		h.log.Warn("webhook event kept in the unmatched log", "provider", provider, "event_id", e.ID,
			"provider_refund_id", e.RefundID, "operation_key", e.OperationKey, "why", why)
	}
	return err
}

// noJob is why an event matched no job.
const noJob = "no job has its operation key or refund id"

// fileOnJob files p on e's job: the one of the operation key e echoes, else
// the one job of this provider its refund id names (the job's own, or a
// receipt's). It says why when it could not ("" once filed): no such job,
// or one the event cannot be about (another provider's, another amount).
func (h *Handler) fileOnJob(ctx context.Context, provider string, e Event, p store.ObservationParams) (string, error) {
	if e.OperationKey != "" {
		why, err := h.observe(ctx, provider, p, store.JobRef{OperationKey: e.OperationKey})
		if err != nil || why != noJob {
			return why, err
		}
	}
	if e.RefundID == "" || len(e.RefundID) > store.MaxRefIDLen {
		return noJob, nil
	}
	page, err := h.filer.List(ctx, store.ListParams{ProviderRefundID: e.RefundID, Provider: provider, Limit: 2})
	if err != nil {
		return "", err
	}
	switch len(page.Jobs) {
	case 0:
		return noJob, nil
	case 1:
		return h.observe(ctx, provider, p, store.JobRef{ID: page.Jobs[0].ID})
	default:
		return "several jobs name refund " + e.RefundID, nil
	}
}

// observe files p on ref's job; it says why it could not ("" once filed).
func (h *Handler) observe(ctx context.Context, provider string, p store.ObservationParams, ref store.JobRef) (string, error) {
	p.Job = ref
	obs, dup, err := h.filer.Observe(ctx, p)
	var invalid *store.ValidationError
	switch {
	case err == nil:
		h.metrics.filed.WithLabelValues(provider, fmt.Sprint(!dup)).Inc()
		if !dup {
			// A receipt the job had no room for is in the unmatched log
			// already (KeptAside), in the same transaction: stored.
			h.log.Info("webhook event filed", "provider", provider, "event_id", p.ProviderEventID, "job_id", obs.JobID,
				"operation_key", obs.OperationKey, "outcome", string(p.Outcome), "expedited", obs.Expedited,
				"kept_aside", obs.KeptAside != nil)
			if obs.Attention {
				h.log.Warn("a succeeded refund needs a person: on the attention list (R34)", "provider", provider,
					"event_id", p.ProviderEventID, "job_id", obs.JobID, "operation_key", obs.OperationKey,
					"outcome", string(p.Outcome), "provider_refund_id", p.ProviderRefundID)
			}
		}
		return "", nil
	case errors.Is(err, store.ErrNotFound):
		return noJob, nil
	case errors.Is(err, store.ErrReceiptMismatch), errors.As(err, &invalid):
		return "not filed on its job: " + err.Error(), nil // kept where a person sees it
	default:
		return "", err
	}
}
