package fakeprovider

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Clock returns the current time. The simulator adds the total of its Advance
// calls on top.
type Clock func() time.Time

// DefaultKeyRetention is how long an Idempotency-Key is remembered unless
// Config says otherwise; Stripe's figure.
const DefaultKeyRetention = 24 * time.Hour

// Config configures a Provider. The zero Config is ready to use.
type Config struct {
	// KeyRetention is how long an Idempotency-Key is remembered after its
	// refund was created. Past it, a resend with the same key creates a new
	// refund (R14, R16). 0 means DefaultKeyRetention.
	KeyRetention time.Duration
	// Clock is the simulator's time source for key retention, pending and
	// lookup lag. nil means time.Now. Hangs always use wall-clock time.
	Clock Clock
	// Faults are the global faults at start.
	Faults Faults
	// Latency holds every refund creation this long, in wall-clock time,
	// before it acts, as a real provider's round trip does: a worker's call
	// is then in flight long enough for a test to catch it there. A client
	// that goes away meanwhile has nothing done. 0: none.
	Latency time.Duration
	// Logger receives one record per refund created and per fault injected;
	// nil discards them.
	Logger *slog.Logger

	// WebhookURL is the endpoint the provider sends its signed webhooks to,
	// e.g. "http://127.0.0.1:8443/webhooks/acme" (see the package
	// documentation). Empty: no webhooks are made or sent.
	WebhookURL string
	// WebhookSecret is the endpoint's signing secret; required with
	// WebhookURL.
	WebhookSecret string
	// WebhookMaxAttempts bounds the attempts at one delivery of an event; 0
	// means DefaultWebhookMaxAttempts.
	WebhookMaxAttempts int
	// WebhookRetry is the wait after a failed attempt, doubling after each
	// further one up to WebhookMaxRetry; 0 means DefaultWebhookRetry and
	// DefaultWebhookMaxRetry.
	WebhookRetry, WebhookMaxRetry time.Duration
	// WebhookClient sends the deliveries; nil means a client of the
	// provider's own that follows no redirects (a 3xx is a failed delivery)
	// and whose connections Close closes.
	WebhookClient *http.Client
}

// Validate reports what is wrong with c: a webhook URL that is not an
// absolute http or https URL, one without a secret, negative webhook
// settings.
func (c Config) Validate() error {
	if err := c.validateWebhooks(); err != nil {
		return fmt.Errorf("fakeprovider: %w", err)
	}
	return nil
}

// Provider is an in-memory payment provider with Stripe-like refund
// idempotency, fault injection and an oracle. It is an http.Handler serving
// the API described in the package documentation; its methods are the same
// admin operations for in-process use. It is safe for concurrent use. With a
// webhook URL it runs a sender, which Close stops.
type Provider struct {
	retention time.Duration
	latency   time.Duration
	clock     Clock
	log       *slog.Logger
	mux       *http.ServeMux

	mu       sync.Mutex
	offset   time.Duration // sum of Advance calls
	seq      int           // last refund number; never reset, so ids stay unique
	refunds  []*refund     // creation order
	byID     map[string]*refund
	keys     map[string]*keyRecord
	payments map[string]registeredPayment
	faults   Faults // global
	burst    int    // 503s still owed to a header's error_burst=N
	stats    Stats
	wh       *webhooks // nil: webhooks off
}

type refund struct {
	id       string
	key      string // the Idempotency-Key that created it
	params   RefundParams
	created  time.Time
	received time.Time    // when the create request that made it arrived
	settleAt time.Time    // pending until then
	final    RefundStatus // succeeded or failed
	lag      time.Duration

	webhookFaults Faults // the webhook modes of the create that made it
}

func (r *refund) status(now time.Time) RefundStatus {
	if now.Before(r.settleAt) {
		return StatusPending
	}
	return r.final
}

// visible reports whether a lookup at now sees r, given the lookup's own lag.
func (r *refund) visible(now time.Time, lookupLag time.Duration) bool {
	return !now.Before(r.created.Add(max(r.lag, lookupLag)))
}

func (r *refund) view(now time.Time) Refund {
	v := Refund{
		ID: r.id, Object: "refund", PaymentID: r.params.PaymentID, AmountMinor: r.params.AmountMinor,
		Currency: r.params.Currency, MerchantReference: r.params.MerchantReference,
		Status: r.status(now), Created: r.created,
	}
	if v.Status == StatusFailed {
		v.FailureReason = "declined"
	}
	return v
}

type keyRecord struct {
	params  RefundParams
	refund  *refund
	created time.Time
}

type registeredPayment struct {
	amountMinor int64
	currency    string
}

// New returns a Provider with no refunds. With cfg.WebhookURL set it starts
// the webhook sender; call Close when done. New panics on an invalid cfg;
// check it first with Validate.
func New(cfg Config) *Provider {
	if err := cfg.Validate(); err != nil {
		panic(err.Error())
	}
	p := &Provider{
		retention: cfg.KeyRetention,
		clock:     cfg.Clock,
		log:       cfg.Logger,
		faults:    cfg.Faults,
		latency:   cfg.Latency,
	}
	if p.retention <= 0 {
		p.retention = DefaultKeyRetention
	}
	if p.clock == nil {
		p.clock = time.Now
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if cfg.WebhookURL != "" {
		p.wh = newWebhooks(cfg)
	}
	p.resetLocked()
	p.mux = p.routes()
	if p.wh != nil {
		p.wh.wg.Add(1)
		go p.sendWebhooks()
	}
	return p
}

func (p *Provider) resetLocked() {
	p.refunds = nil
	p.byID = map[string]*refund{}
	p.keys = map[string]*keyRecord{}
	p.payments = map[string]registeredPayment{}
	p.burst = 0
	p.stats = Stats{}
	if p.wh != nil {
		p.wh.reset()
	}
}

// ServeHTTP serves the provider's HTTP API.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }

// KeyRetention returns how long an Idempotency-Key is remembered.
func (p *Provider) KeyRetention() time.Duration { return p.retention }

// Now returns the simulator's time: the Clock plus every Advance.
func (p *Provider) Now() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nowLocked()
}

func (p *Provider) nowLocked() time.Time { return p.clock().Add(p.offset).UTC() }

// now is the simulator clock.
func (p *Provider) now() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nowLocked()
}

// Advance moves the simulator clock forward by d and returns the new time. It
// panics if d is negative.
func (p *Provider) Advance(d time.Duration) time.Time {
	if d < 0 {
		panic(fmt.Sprintf("fakeprovider: Advance(%s): the clock only moves forward", d))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.offset += d
	p.log.Info("clock advanced", "by", d, "now", p.nowLocked())
	p.settleDueLocked()
	return p.nowLocked()
}

// SetFaults replaces the global faults. Errors: an invalid f (negative values).
func (p *Provider) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = f
	p.log.Info("faults set", "faults", f.String())
	return nil
}

// ClearFaults removes the global faults and any error burst still owed to a
// request header.
func (p *Provider) ClearFaults() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults, p.burst = Faults{}, 0
	p.log.Info("faults cleared")
}

// Faults returns the global faults as they stand (ErrorBurst and Times count
// down as they are used).
func (p *Provider) Faults() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// RegisterPayment records a payment's captured amount so the oracle can flag
// refunds beyond it. Refunds are not refused for exceeding it: the simulator
// exposes over-refunds rather than preventing them. Re-registering replaces
// the amount. Errors: an empty id or a non-positive amount.
func (p *Provider) RegisterPayment(paymentID string, amountMinor int64, currency string) error {
	if paymentID == "" || amountMinor <= 0 {
		return fmt.Errorf("fakeprovider: payment needs an id and a positive amount, got %q %d", paymentID, amountMinor)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.payments[paymentID] = registeredPayment{amountMinor: amountMinor, currency: currency}
	return nil
}

// Reset forgets every refund, key, payment, counter, error burst owed to a
// header and webhook event (deliveries still owed are abandoned; an attempt
// in flight ends unrecorded). The clock, the global faults and the id
// sequences stay, so refund and event ids are never reused.
func (p *Provider) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resetLocked()
	p.log.Info("state reset")
}

// admit decides, for one API request, whether it is failed by an error burst
// and which faults apply to it. key is the Idempotency-Key of a create
// request; lookups pass create=false.
func (p *Provider) admit(create bool, key string, hdr Faults) (Faults, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g := p.faults
	match := g.Key == "" || (create && g.Key == key)
	switch {
	case hdr.ErrorBurst > 0:
		p.burst += hdr.ErrorBurst - 1
	case match && g.ErrorBurst > 0:
		p.faults.ErrorBurst--
	case p.burst > 0:
		p.burst--
	default:
		eff := Faults{}
		if create && match && g.createFaults() {
			eff = g
			if g.Times > 0 {
				p.faults.Times--
				if p.faults.Times == 0 {
					p.faults = Faults{ErrorBurst: p.faults.ErrorBurst, Key: p.faults.Key}
					if p.faults.ErrorBurst == 0 {
						p.faults = Faults{}
					}
				}
			}
		}
		eff = eff.overlay(hdr)
		eff.ErrorBurst, eff.Key, eff.Times = 0, "", 0
		return eff, false
	}
	p.stats.InjectedErrors++
	return Faults{}, true
}

// create makes a refund, or answers from the idempotency store. received
// is when its request arrived.
func (p *Provider) create(key string, params RefundParams, f Faults, received time.Time) (Refund, bool, *StatusError) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settleDueLocked()
	now := p.nowLocked()
	if rec, ok := p.keys[key]; ok {
		if now.Sub(rec.created) < p.retention {
			if rec.params != params {
				p.stats.Conflicts++
				return Refund{}, false, &StatusError{
					StatusCode: http.StatusConflict, Type: "idempotency_error", Code: CodeIdempotencyKeyReused,
					Message: fmt.Sprintf("Idempotency-Key %q was used for refund %s with different parameters", key, rec.refund.id),
				}
			}
			p.stats.Replays++
			return rec.refund.view(now), true, nil
		}
		// The key has aged out: like a real provider, forget it. A resend now
		// is a new refund — the danger R14/R16 guard against.
		delete(p.keys, key)
	}
	p.seq++
	r := &refund{
		id: fmt.Sprintf("re_%06d", p.seq), key: key, params: params, created: now, received: received,
		settleAt: now.Add(f.Pending), final: StatusSucceeded, lag: f.LookupLag,
	}
	if f.Fail {
		r.final = StatusFailed
	}
	p.refunds = append(p.refunds, r)
	p.byID[r.id] = r
	p.keys[key] = &keyRecord{params: params, refund: r, created: now}
	p.stats.RefundsCreated++
	if p.wh != nil {
		p.refundMadeLocked(r, f)
	}
	p.log.Info("refund created", "refund_id", r.id, "idempotency_key", key, "payment_id", params.PaymentID,
		"amount_minor", params.AmountMinor, "currency", params.Currency, "faults", f.String())
	return r.view(now), false, nil
}

// lookup returns the visible refunds that pass keep, in creation order.
func (p *Provider) lookup(lag time.Duration, keep func(*refund) bool) []Refund {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settleDueLocked()
	now := p.nowLocked()
	out := []Refund{}
	for _, r := range p.refunds {
		if keep(r) && r.visible(now, lag) {
			out = append(out, r.view(now))
		}
	}
	return out
}

func (p *Provider) count(f func(*Stats)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.stats)
}

// Oracle reports what the provider actually did: every refund created, per
// operation (refunds sharing a merchant reference or an Idempotency-Key) and
// per payment, and how many were refunded twice. It ignores lookup lag.
func (p *Provider) Oracle() OracleReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settleDueLocked()
	now := p.nowLocked()
	rep := OracleReport{
		Now: now, KeyRetentionSeconds: p.retention.Seconds(), Stats: p.stats,
		Refunds: []Refund{}, Operations: []OperationTruth{}, Payments: []PaymentTruth{},
		Webhooks: p.webhookReportLocked(),
	}
	ops := operationsOf(p.refunds)
	opIdx := map[int]int{} // first refund of an operation → index in rep.Operations
	payIdx := map[string]int{}
	for n, r := range p.refunds {
		v := r.view(now)
		v.Received = r.received
		rep.Refunds = append(rep.Refunds, v)
		live := v.Status != StatusFailed

		i, ok := opIdx[ops[n]]
		if !ok {
			i = len(rep.Operations)
			opIdx[ops[n]] = i
			rep.Operations = append(rep.Operations, OperationTruth{MerchantReference: v.MerchantReference, Currency: v.Currency})
		}
		op := &rep.Operations[i]
		op.RefundIDs = append(op.RefundIDs, v.ID)
		if !slices.Contains(op.MerchantReferences, v.MerchantReference) {
			op.MerchantReferences = append(op.MerchantReferences, v.MerchantReference)
		}
		if !slices.Contains(op.IdempotencyKeys, r.key) {
			op.IdempotencyKeys = append(op.IdempotencyKeys, r.key)
		}
		if live {
			op.Refunds++
			op.RefundedMinor += v.AmountMinor
		} else {
			op.Failed++
		}

		j, ok := payIdx[v.PaymentID]
		if !ok {
			j = len(rep.Payments)
			payIdx[v.PaymentID] = j
			rep.Payments = append(rep.Payments, PaymentTruth{PaymentID: v.PaymentID, Currency: v.Currency,
				AmountMinor: p.payments[v.PaymentID].amountMinor})
		}
		pay := &rep.Payments[j]
		pay.RefundIDs = append(pay.RefundIDs, v.ID)
		if live {
			pay.Refunds++
			pay.RefundedMinor += v.AmountMinor
		} else {
			pay.Failed++
		}
	}
	for i := range rep.Operations {
		if op := &rep.Operations[i]; op.Refunds > 1 {
			op.Duplicate = true
			rep.DuplicateOperations++
		}
	}
	for i := range rep.Payments {
		if pay := &rep.Payments[i]; pay.AmountMinor > 0 && pay.RefundedMinor > pay.AmountMinor {
			pay.OverRefunded = true
			rep.OverRefundedPayments++
		}
	}
	rep.DoubleRefunds = rep.DuplicateOperations + rep.OverRefundedPayments
	return rep
}

// operationsOf groups refunds into operations: refunds that share a merchant
// reference or an Idempotency-Key belong to one operation, so a duplicate
// shows whether the worker kept the key and varied the reference or the other
// way round (R1, R2). It returns, per refund, the index of its operation's
// first refund.
func operationsOf(refunds []*refund) []int {
	parent := make([]int, len(refunds))
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	byRef, byKey := map[string]int{}, map[string]int{}
	for i, r := range refunds {
		parent[i] = i
		for _, g := range []struct {
			seen map[string]int
			name string
		}{{byRef, r.params.MerchantReference}, {byKey, r.key}} {
			j, ok := g.seen[g.name]
			if !ok {
				g.seen[g.name] = i
				continue
			}
			// The root is the earliest refund of the operation.
			if a, b := find(i), find(j); a != b {
				parent[max(a, b)] = min(a, b)
			}
		}
	}
	for i := range parent {
		parent[i] = find(i)
	}
	return parent
}
