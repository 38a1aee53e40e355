package fakeprovider

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The event types the provider sends, Stripe's names.
const (
	EventRefundCreated  = "refund.created"  // a refund was made, with its status then
	EventRefundUpdated  = "refund.updated"  // a pending refund succeeded
	EventRefundFailed   = "refund.failed"   // a refund failed, at once or after pending
	EventChargeRefunded = "charge.refunded" // a refund of the charge (payment) succeeded
)

// SignatureHeader carries a delivery's signature, Stripe's scheme:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>" under the secret>".
const SignatureHeader = "Stripe-Signature"

// Webhook delivery defaults.
const (
	DefaultWebhookMaxAttempts = 10
	DefaultWebhookRetry       = 100 * time.Millisecond
	DefaultWebhookMaxRetry    = 5 * time.Second
)

const (
	// webhookTimeout bounds one delivery attempt: a receiver that hangs
	// longer has failed it.
	webhookTimeout = 10 * time.Second
	// webhookParallel bounds the deliveries in flight at once, across
	// refunds; one refund's events go one at a time.
	webhookParallel = 16
	// webhookOldTimestamp is how far in the past webhook_old_timestamp signs:
	// twice the 5 minutes receivers commonly tolerate.
	webhookOldTimestamp = 10 * time.Minute
	// settlePoll bounds how long the sender sleeps while a refund is pending
	// on a clock it cannot wait for (the Clock may be fixed; Advance wakes it).
	settlePoll = time.Second
)

// validateWebhooks reports what is wrong with the webhook part of c.
func (c Config) validateWebhooks() error {
	if c.WebhookURL == "" {
		return nil
	}
	u, err := url.Parse(c.WebhookURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("webhook URL %q is not an absolute http or https URL", c.WebhookURL)
	}
	if c.WebhookSecret == "" {
		return errors.New("a webhook URL needs a signing secret")
	}
	for _, v := range []struct {
		name string
		bad  bool
	}{
		{"webhook max attempts", c.WebhookMaxAttempts < 0},
		{"webhook retry", c.WebhookRetry < 0},
		{"webhook max retry", c.WebhookMaxRetry < 0},
	} {
		if v.bad {
			return fmt.Errorf("%s must not be negative", v.name)
		}
	}
	return nil
}

// webhooks is a Provider's webhook sender: every event it makes, and the
// deliveries still owed. Deliveries are asynchronous and at least once; a
// refund's events go one at a time, in order, so that webhook_reorder means
// something. The Provider's mu guards its state; the configuration never
// changes, and wake, ctx and wg are safe on their own.
type webhooks struct {
	url         string
	secret      []byte
	hc          *http.Client
	ownClient   bool // hc is ours: Close closes its idle connections
	maxAttempts int
	retry       time.Duration
	maxRetry    time.Duration

	seq       int                 // last event number; never reset, so ids stay unique (receivers dedupe by them)
	events    []*event            // every event since start or Reset, in order of creation (the oracle's)
	chains    map[string][]*event // by refund id: its events still owed, in delivery order
	order     []string            // refund ids with a chain, oldest first: who is served first
	unsettled []*refund           // pending refunds whose settling events are not out yet
	byPayment map[string][]*refund
	inFlight  int

	wake   chan struct{} // capacity 1: something changed, look again
	ctx    context.Context
	cancel context.CancelFunc // ends attempts in flight (Close)
	wg     sync.WaitGroup     // the loop and every attempt
}

// event is one webhook event and its delivery state.
type event struct {
	truth  WebhookEvent // the oracle's record; Attempts grows
	body   []byte       // frozen at creation: a redelivery is the same event
	faults Faults       // the webhook modes of the refund's create
	due    time.Time    // wall clock: no attempt before
	owed   int          // deliveries still owed: 1, 2 under webhook_duplicate
	tries  int          // failed attempts at the current delivery
	busy   bool         // an attempt is in flight
	held   bool         // webhook_reorder: waits for its refund's last event
}

func (e *event) pending() bool { return e.owed > 0 && !e.truth.GaveUp && !e.truth.Dropped }

func newWebhooks(cfg Config) *webhooks {
	wh := &webhooks{
		url: cfg.WebhookURL, secret: []byte(cfg.WebhookSecret), hc: cfg.WebhookClient,
		maxAttempts: cfg.WebhookMaxAttempts, retry: cfg.WebhookRetry, maxRetry: cfg.WebhookMaxRetry,
		wake: make(chan struct{}, 1),
	}
	if wh.hc == nil {
		// A client of its own, so that Close can close its connections, and
		// no redirects: as at Stripe, a 3xx is a failed delivery.
		wh.hc = &http.Client{
			Transport:     http.DefaultTransport.(*http.Transport).Clone(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
		wh.ownClient = true
	}
	if wh.maxAttempts == 0 {
		wh.maxAttempts = DefaultWebhookMaxAttempts
	}
	if wh.retry == 0 {
		wh.retry = DefaultWebhookRetry
	}
	if wh.maxRetry == 0 {
		wh.maxRetry = DefaultWebhookMaxRetry
	}
	wh.maxRetry = max(wh.maxRetry, wh.retry)
	wh.ctx, wh.cancel = context.WithCancel(context.Background())
	wh.reset()
	return wh
}

func (wh *webhooks) reset() {
	wh.events, wh.order, wh.unsettled = nil, nil, nil
	wh.chains = map[string][]*event{}
	wh.byPayment = map[string][]*refund{}
}

func (wh *webhooks) poke() {
	select {
	case wh.wake <- struct{}{}:
	default:
	}
}

// backoff is the wait after the n-th failed attempt: retry, doubling, at
// most maxRetry.
func (wh *webhooks) backoff(n int) time.Duration {
	d := wh.retry
	for i := 1; i < n && d < wh.maxRetry; i++ {
		d *= 2
	}
	return min(d, wh.maxRetry)
}

// Close stops the webhook sender: attempts in flight are cancelled and
// waited for, and nothing more is sent. Events made afterwards are still
// recorded in the oracle, undelivered. Close is safe to call more than once
// and does nothing when webhooks are off; the API keeps serving.
func (p *Provider) Close() {
	wh := p.wh
	if wh == nil {
		return
	}
	wh.cancel()
	wh.wg.Wait()
	if wh.ownClient {
		wh.hc.CloseIdleConnections()
	}
}

// refundMadeLocked queues the events of a new refund: refund.created with its
// status at creation, and, when it is final at once, those of its settling.
func (p *Provider) refundMadeLocked(r *refund, f Faults) {
	wh := p.wh
	r.webhookFaults = f.webhookModes()
	wh.byPayment[r.params.PaymentID] = append(wh.byPayment[r.params.PaymentID], r)
	p.emitLocked(r, EventRefundCreated, r.created, stripeRefundOf(r.view(r.created)))
	if r.settleAt.After(r.created) {
		wh.unsettled = append(wh.unsettled, r)
		return
	}
	p.settledLocked(r)
}

// settleDueLocked emits the events of every pending refund that has settled
// by the simulator clock. Whatever reads the clock calls it first, so that a
// refund is never seen settled before its events exist.
func (p *Provider) settleDueLocked() {
	wh := p.wh
	if wh == nil || len(wh.unsettled) == 0 {
		return
	}
	now := p.nowLocked()
	keep := wh.unsettled[:0]
	for _, r := range wh.unsettled {
		if now.Before(r.settleAt) {
			keep = append(keep, r)
			continue
		}
		p.settledLocked(r)
	}
	clear(wh.unsettled[len(keep):])
	wh.unsettled = keep
}

// settledLocked emits the events of r's final status: refund.failed, or
// refund.updated (when it was pending) and charge.refunded. Their created is
// the simulator's time of settling.
func (p *Provider) settledLocked(r *refund) {
	at := r.settleAt
	v := r.view(at)
	sr := stripeRefundOf(v)
	switch {
	case v.Status == StatusFailed:
		p.emitLocked(r, EventRefundFailed, at, sr)
	default:
		if at.After(r.created) {
			p.emitLocked(r, EventRefundUpdated, at, sr)
		}
		// The charge with every refund of the payment as it stood then,
		// newest first, as Stripe lists them.
		refunds := p.wh.byPayment[r.params.PaymentID]
		ch := stripeCharge{ID: r.params.PaymentID, Object: "charge", Refunds: stripeList{Object: "list", Data: []stripeRefund{}}}
		for _, o := range slices.Backward(refunds) {
			if !o.created.After(at) {
				ch.Refunds.Data = append(ch.Refunds.Data, stripeRefundOf(o.view(at)))
			}
		}
		p.emitLocked(r, EventChargeRefunded, at, ch)
	}
	if r.webhookFaults.WebhookReorder {
		p.releaseReorderedLocked(r)
	}
}

// emitLocked makes one event about r and queues its delivery.
func (p *Provider) emitLocked(r *refund, typ string, created time.Time, object any) {
	wh := p.wh
	wh.seq++
	f := r.webhookFaults
	ev := &event{
		truth: WebhookEvent{
			ID: fmt.Sprintf("evt_%06d", wh.seq), Type: typ, RefundID: r.id, OperationKey: r.params.MerchantReference,
			IdempotencyKey: r.key, Status: r.view(created).Status, Faults: f.String(), Attempts: []WebhookAttempt{},
		},
		faults: f, due: time.Now().Add(f.WebhookDelay), owed: 1, held: f.WebhookReorder,
	}
	if f.WebhookDuplicate {
		ev.owed = 2
	}
	body, err := json.Marshal(stripeEvent{
		ID: ev.truth.ID, Object: "event", Type: typ, Created: created.Unix(),
		Data:    stripeData{Object: object},
		Request: stripeRequest{ID: "req_" + strings.TrimPrefix(r.id, "re_"), IdempotencyKey: r.key},
	})
	if err != nil {
		panic(fmt.Sprintf("fakeprovider: encoding event %s: %v", ev.truth.ID, err)) // plain strings and numbers only
	}
	ev.body = body
	wh.events = append(wh.events, ev)
	if f.WebhookDrop {
		ev.truth.Dropped = true
		p.log.Info("fault: webhook dropped", "event_id", ev.truth.ID, "type", typ, "refund_id", r.id)
		return
	}
	if f.WebhookDelay > 0 {
		p.log.Info("fault: webhook delayed", "event_id", ev.truth.ID, "type", typ, "for", f.WebhookDelay)
	}
	if _, ok := wh.chains[r.id]; !ok {
		wh.order = append(wh.order, r.id)
	}
	wh.chains[r.id] = append(wh.chains[r.id], ev)
	wh.poke()
}

// releaseReorderedLocked turns r's held events loose, newest first.
func (p *Provider) releaseReorderedLocked(r *refund) {
	chain := p.wh.chains[r.id]
	slices.Reverse(chain)
	for _, ev := range chain {
		ev.held = false
	}
	if len(chain) > 0 {
		p.log.Info("fault: webhooks reordered", "refund_id", r.id, "first", chain[0].truth.Type)
	}
	p.wh.poke()
}

// sendWebhooks is the sender's loop: it starts every due attempt (one per
// refund at a time, at most webhookParallel at once) and sleeps until the
// next is due, a pending refund may have settled, or something changes.
func (p *Provider) sendWebhooks() {
	wh := p.wh
	defer wh.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		if wh.ctx.Err() != nil { // closed: start nothing more
			p.mu.Unlock()
			return
		}
		p.settleDueLocked()
		wait := p.startDueLocked(time.Now())
		p.mu.Unlock()

		timer.Reset(wait)
		select {
		case <-wh.ctx.Done():
			return
		case <-wh.wake:
		case <-timer.C:
		}
	}
}

// startDueLocked starts the attempts due at now and returns how long the
// loop may sleep.
func (p *Provider) startDueLocked(now time.Time) time.Duration {
	wh := p.wh
	wait := time.Hour
	if len(wh.unsettled) > 0 {
		next := wh.unsettled[0].settleAt
		for _, r := range wh.unsettled[1:] {
			if r.settleAt.Before(next) {
				next = r.settleAt
			}
		}
		wait = min(max(next.Sub(p.nowLocked()), 10*time.Millisecond), settlePoll)
	}
	live := wh.order[:0]
	for _, id := range wh.order {
		chain := wh.chains[id]
		if len(chain) == 0 {
			delete(wh.chains, id)
			continue
		}
		live = append(live, id)
		ev := chain[0]
		switch {
		case ev.busy || ev.held:
		case ev.due.After(now):
			wait = min(wait, ev.due.Sub(now))
		case wh.inFlight < webhookParallel:
			ev.busy = true
			wh.inFlight++
			wh.wg.Add(1)
			go p.attempt(ev, len(ev.truth.Attempts) == 0)
		}
	}
	clear(wh.order[len(live):])
	wh.order = live
	return wait
}

// attempt makes one delivery attempt of ev, signed afresh, and records it.
// first is whether it is the event's first attempt, which the signature
// faults spoil.
func (p *Provider) attempt(ev *event, first bool) {
	wh := p.wh
	defer wh.wg.Done()
	signedAt, secret, fault := time.Now(), wh.secret, ""
	if first && ev.faults.WebhookOldTimestamp {
		signedAt, fault = signedAt.Add(-webhookOldTimestamp), "webhook_old_timestamp"
	}
	if first && ev.faults.WebhookBadSignature {
		secret, fault = append([]byte("wrong:"), wh.secret...), strings.TrimPrefix(fault+",webhook_bad_signature", ",")
	}
	if fault != "" {
		p.log.Info("fault: webhook spoiled", "event_id", ev.truth.ID, "fault", fault)
	}
	a := WebhookAttempt{At: time.Now().UTC(), Timestamp: signedAt.Unix(), Fault: fault}
	var err error
	a.Status, err = wh.post(ev.body, sign(secret, signedAt.Unix(), ev.body))
	if err != nil {
		a.Error = err.Error()
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	ev.truth.Attempts = append(ev.truth.Attempts, a)
	ev.busy = false
	wh.inFlight--
	defer wh.poke()
	if a.Status >= 200 && a.Status < 300 {
		ev.truth.Deliveries++
		ev.truth.Delivered = true
		ev.owed--
		ev.tries = 0
		if ev.owed > 0 {
			p.log.Info("fault: webhook duplicated", "event_id", ev.truth.ID)
		}
	} else {
		ev.tries++
		if ev.tries >= wh.maxAttempts {
			ev.truth.GaveUp = true
			p.log.Warn("webhook given up", "event_id", ev.truth.ID, "type", ev.truth.Type, "attempts", ev.tries,
				"status", a.Status, "err", a.Error)
		} else {
			ev.due = time.Now().Add(wh.backoff(ev.tries))
			p.log.Info("webhook attempt failed", "event_id", ev.truth.ID, "status", a.Status, "err", a.Error,
				"retry_in", wh.backoff(ev.tries))
		}
	}
	if !ev.pending() {
		// The head of its refund's chain is done; after a Reset the chain is
		// gone and ev with it.
		if chain := wh.chains[ev.truth.RefundID]; len(chain) > 0 && chain[0] == ev {
			wh.chains[ev.truth.RefundID] = chain[1:]
		}
	}
}

// post sends one signed delivery and returns the HTTP status.
func (wh *webhooks) post(body []byte, signature string) (int, error) {
	ctx, cancel := context.WithTimeout(wh.ctx, webhookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, wh.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "fakeprovider (Stripe-compatible webhooks)")
	req.Header.Set(SignatureHeader, signature)
	resp, err := wh.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection can be reused
	return resp.StatusCode, nil
}

// sign returns the Stripe-Signature value for body signed at t.
func sign(secret []byte, t int64, body []byte) string {
	ts := strconv.FormatInt(t, 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// webhookReportLocked is the oracle's webhooks section.
func (p *Provider) webhookReportLocked() WebhookReport {
	rep := WebhookReport{Events: []WebhookEvent{}}
	wh := p.wh
	if wh == nil {
		return rep
	}
	rep.Enabled = true
	for _, ev := range wh.events {
		t := ev.truth
		t.Attempts = slices.Clone(t.Attempts)
		rep.Events = append(rep.Events, t)
		switch {
		case ev.pending():
			rep.Pending++
		case !t.Delivered:
			rep.Undelivered++
		}
	}
	return rep
}

// The events' JSON, Stripe's shape.
type stripeEvent struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"` // "event"
	Type    string        `json:"type"`
	Created int64         `json:"created"` // the simulator clock, unix seconds
	Data    stripeData    `json:"data"`
	Request stripeRequest `json:"request"`
}

type stripeData struct {
	Object any `json:"object"` // a stripeRefund or a stripeCharge
}

// stripeRequest names the API request behind the event: the create that
// made the refund, for every event of that refund.
type stripeRequest struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key"`
}

type stripeRefund struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"` // "refund"
	Amount        int64             `json:"amount"`
	Currency      string            `json:"currency"` // lower case, as at Stripe
	Status        RefundStatus      `json:"status"`
	PaymentIntent string            `json:"payment_intent"`
	FailureReason string            `json:"failure_reason,omitempty"`
	Created       int64             `json:"created"`
	Metadata      map[string]string `json:"metadata"`
}

type stripeCharge struct {
	ID      string     `json:"id"`
	Object  string     `json:"object"` // "charge"
	Refunds stripeList `json:"refunds"`
}

type stripeList struct {
	Object string         `json:"object"` // "list"
	Data   []stripeRefund `json:"data"`
}

// stripeRefundOf is v as a Stripe refund object; metadata.operation_key is
// the merchant reference, which a worker sets to its operation key.
func stripeRefundOf(v Refund) stripeRefund {
	return stripeRefund{
		ID: v.ID, Object: "refund", Amount: v.AmountMinor, Currency: strings.ToLower(v.Currency), Status: v.Status,
		PaymentIntent: v.PaymentID, FailureReason: v.FailureReason, Created: v.Created.Unix(),
		Metadata: map[string]string{"operation_key": v.MerchantReference},
	}
}
