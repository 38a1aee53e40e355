package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// forgeryKind is what is wrong with a forged webhook event. Its signature
// is always right; what it says cannot be about the job it names, so it
// must move nothing and be kept in the unmatched log (R28).
type forgeryKind string

const (
	// Signed with otherProviderName's secret, delivered to its endpoint,
	// naming a job of providerName by its operation key, with a made-up
	// refund id, for 1 minor unit.
	forgedOtherProviderAmount1 forgeryKind = "other-provider-amount-1"
	// The same, for the job's own amount and currency: only R28's "a
	// webhook of provider P touches only P's jobs" keeps it off the job.
	forgedOtherProvider forgeryKind = "other-provider-own-amount"
	// Signed with providerName's own secret, for another amount than the
	// job's, or in another currency.
	forgedAmount   forgeryKind = "own-provider-other-amount"
	forgedCurrency forgeryKind = "own-provider-other-currency"
)

// forgeryKinds are the kinds the forger draws, with their weights.
var forgeryKinds = []struct {
	kind   forgeryKind
	weight int
}{{forgedOtherProviderAmount1, 3}, {forgedOtherProvider, 3}, {forgedAmount, 2}, {forgedCurrency, 2}}

// The forger's targets: a future-dated job before its not_before (due
// within the campaign, or beyond it), or any other acknowledged job.
const (
	targetSoon   = "soon"
	targetBeyond = "beyond"
	targetDue    = "due"
)

// forgedEvent is one event the forger sent, and what became of its
// delivery.
type forgedEvent struct {
	// ID is the provider_event_id a coordinator keeps it under: the event's
	// id, and for charge.refunded ':' and the refund's.
	ID       string
	Kind     forgeryKind
	Provider string // whose secret signed it, and whose endpoint it was delivered to
	Type     string
	Key      string // the operation key it names
	RefundID string // made up
	Outcome  string // succeeded or failed
	// AmountMinor and Currency are what it says; JobAmount and JobCurrency
	// the named job's.
	AmountMinor, JobAmount int64
	Currency, JobCurrency  string
	// Target is whom it was aimed at (targetSoon, targetBeyond, targetDue);
	// NotBefore the job's not_before when it has one.
	Target    string
	NotBefore time.Time
	SentAt    time.Time // when the forger made it, just before its first attempt
	Attempts  int
	// Status is the last answer (0: none came, Err says why); StoredAt is
	// when the attempt answered 2xx was sent, zero when none was.
	Status   int
	Err      string
	StoredAt time.Time
}

// stored reports whether a coordinator answered it 2xx: it was stored,
// filed on a job or kept in the unmatched log.
func (e forgedEvent) stored() bool { return !e.StoredAt.IsZero() }

// early reports whether it was sent while its job's not_before was ahead.
func (e forgedEvent) early() bool { return !e.NotBefore.IsZero() && e.SentAt.Before(e.NotBefore) }

// describe names the event for the checks' details.
func (e forgedEvent) describe() string {
	return fmt.Sprintf("forged event %s (%s, %s signed, %s %s for %d %s, key %s, sent at %s)", e.ID, e.Kind, e.Provider,
		e.Type, e.Outcome, e.AmountMinor, e.Currency, e.Key, e.SentAt.Format("15:04:05.000"))
}

// Pacing and delivery of the forger.
const (
	forgeGapMin   = 150 * time.Millisecond
	forgeGapMax   = 450 * time.Millisecond
	forgeAttempts = 6                      // replicas tried per event, a killed one answering nothing
	forgeRetry    = 200 * time.Millisecond // between two attempts
	// forgeEarlyShare of the events are aimed at future-dated jobs before
	// their not_before, while there are any.
	forgeEarlyShare = 0.75
)

// forger sends correctly signed webhook events that must move nothing,
// straight to the replicas' webhook listeners in turn (a forged event
// comes from outside the provider, not through its retries; the forger
// tries the next replica while one answers nothing).
type forger struct {
	keys     webhookKeys
	replicas []*replica
	specs    map[string]refundSpec
	hc       *http.Client
	rng      *rand.Rand
	next     int
	seq      int

	mu     sync.Mutex
	events []forgedEvent
}

// forge runs the forger until ctx ends (the fault window) and returns what
// it sent. Its choices come from seed on a stream of their own; which jobs
// are there to aim at depends on the producer's timing.
func (s *system) forge(ctx context.Context, seed uint64, specs []refundSpec) []forgedEvent {
	h := fnv.New64a()
	h.Write([]byte("forger"))
	f := &forger{keys: s.keys, replicas: s.replicas, specs: map[string]refundSpec{},
		hc: &http.Client{Timeout: 10 * time.Second}, rng: rand.New(rand.NewPCG(seed, h.Sum64()))}
	defer f.hc.CloseIdleConnections()
	for _, sp := range specs {
		f.specs[sp.Key] = sp
	}
	for {
		gap := forgeGapMin + time.Duration(f.rng.Int64N(int64(forgeGapMax-forgeGapMin)+1))
		if !sleepCtx(ctx, gap) {
			break
		}
		prod := s.prod.Load()
		if prod == nil {
			continue
		}
		ev, body, ok := f.draw(prod, time.Now())
		if !ok {
			continue
		}
		f.deliver(ctx, &ev, body)
		f.mu.Lock()
		f.events = append(f.events, ev)
		f.mu.Unlock()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events)
}

// draw picks a target among the acknowledged enqueues (a future-dated job
// before its not_before forgeEarlyShare of the time, while there is one:
// half of those due within the campaign when both kinds wait) and a kind
// of forgery, and makes the event. ok is false while nothing was
// acknowledged.
func (f *forger) draw(prod *production, now time.Time) (ev forgedEvent, body []byte, ok bool) {
	var soon, beyond, all []string
	prod.mu.Lock()
	for k := range prod.acked {
		all = append(all, k)
		if nb, dated := prod.notBefore[k]; dated && now.Before(nb) {
			if f.specs[k].Beyond {
				beyond = append(beyond, k)
			} else {
				soon = append(soon, k)
			}
		}
	}
	prod.mu.Unlock()
	if len(all) == 0 {
		return ev, nil, false
	}
	// Map order is random; the seed's choices are made on sorted lists.
	slices.Sort(all)
	slices.Sort(soon)
	slices.Sort(beyond)
	pool, target := all, targetDue
	if f.rng.Float64() < forgeEarlyShare && len(soon)+len(beyond) > 0 {
		pool, target = beyond, targetBeyond
		if len(soon) > 0 && (len(beyond) == 0 || f.rng.IntN(2) == 0) {
			pool, target = soon, targetSoon
		}
	}
	key := pool[f.rng.IntN(len(pool))]
	sp := f.specs[key]
	ev.NotBefore, _ = prod.notBeforeOf(key)
	total := 0
	for _, k := range forgeryKinds {
		total += k.weight
	}
	pick := f.rng.IntN(total)
	for _, k := range forgeryKinds {
		if pick < k.weight {
			ev.Kind = k.kind
			break
		}
		pick -= k.weight
	}
	f.seq++
	ev.Target, ev.Key, ev.JobAmount, ev.JobCurrency, ev.SentAt = target, key, sp.AmountMinor, "EUR", now
	ev.Provider, ev.AmountMinor, ev.Currency = providerName, sp.AmountMinor, "EUR"
	switch ev.Kind {
	case forgedOtherProviderAmount1:
		ev.Provider, ev.AmountMinor = otherProviderName, 1
	case forgedOtherProvider:
		ev.Provider = otherProviderName
	case forgedAmount:
		ev.AmountMinor = sp.AmountMinor + 1 + f.rng.Int64N(sp.AmountMinor)
	case forgedCurrency:
		ev.Currency = "USD"
	}
	ev.Outcome, ev.Type = "succeeded", []string{"refund.created", "refund.updated", "charge.refunded"}[f.rng.IntN(3)]
	if f.rng.IntN(3) == 0 {
		ev.Outcome, ev.Type = "failed", []string{"refund.failed", "refund.updated"}[f.rng.IntN(2)]
	}
	ev.RefundID = fmt.Sprintf("re_forged_%06d", f.seq)
	eventID := fmt.Sprintf("evt_forged_%06d", f.seq)
	ev.ID = eventID
	if ev.Type == "charge.refunded" {
		ev.ID += ":" + ev.RefundID
	}
	return ev, forgedBody(eventID, ev, sp.Payment, now), true
}

// forgedBody is ev as a Stripe event, in the shape the provider sends
// (fakeprovider's events): the refund names the job's operation key in its
// metadata and the request's idempotency key.
func forgedBody(eventID string, ev forgedEvent, payment string, now time.Time) []byte {
	refund := map[string]any{"id": ev.RefundID, "object": "refund", "amount": ev.AmountMinor,
		"currency": strings.ToLower(ev.Currency), "status": ev.Outcome, "payment_intent": payment, "created": now.Unix(),
		"metadata": map[string]string{"operation_key": ev.Key}}
	if ev.Outcome == "failed" {
		refund["failure_reason"] = "declined"
	}
	var object any = refund
	if ev.Type == "charge.refunded" {
		object = map[string]any{"id": "ch_" + strings.TrimPrefix(eventID, "evt_"), "object": "charge",
			"refunds": map[string]any{"object": "list", "data": []any{refund}}}
	}
	body, err := json.Marshal(map[string]any{"id": eventID, "object": "event", "type": ev.Type, "created": now.Unix(),
		"data":    map[string]any{"object": object},
		"request": map[string]string{"id": "req_" + strings.TrimPrefix(eventID, "evt_"), "idempotency_key": ev.Key}})
	if err != nil {
		panic(fmt.Sprintf("forged event %s: %v", eventID, err)) // plain strings and numbers only
	}
	return body
}

// stripeSignature is the Stripe-Signature value for body signed with
// secret at t: "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">".
func stripeSignature(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// deliver posts ev to the next replica's webhook listener, signed now with
// its provider's secret, until one answers 2xx (stored) or 4xx (refused),
// at most forgeAttempts times or until ctx ends.
func (f *forger) deliver(ctx context.Context, ev *forgedEvent, body []byte) {
	secret := f.keys.own
	if ev.Provider == otherProviderName {
		secret = f.keys.other
	}
	for range forgeAttempts {
		r := f.replicas[f.next%len(f.replicas)]
		f.next++
		at := time.Now()
		url := "http://" + r.webhookListen + "/webhooks/" + ev.Provider
		status, err := f.post(ctx, url, stripeSignature(secret, at, body), body)
		ev.Attempts++
		ev.Status, ev.Err = status, ""
		if err != nil {
			ev.Err = err.Error()
		}
		switch {
		case status >= 200 && status < 300:
			ev.StoredAt = at
			return
		case status >= 400 && status < 500:
			return
		}
		if !sleepCtx(ctx, forgeRetry) {
			return
		}
	}
}

// post sends one delivery and returns the HTTP status (0 with no answer).
func (f *forger) post(ctx context.Context, url, signature string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("Stripe-Signature", signature)
	resp, err := f.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}

// forgerySummary is the campaign's line about the forger: how many events
// of each kind, aimed at whom, and how the coordinators answered.
func forgerySummary(events []forgedEvent) string {
	kinds, targets, answers := map[string]int{}, map[string]int{}, map[string]int{}
	early := 0
	for _, e := range events {
		kinds[string(e.Kind)]++
		targets[e.Target]++
		if e.early() {
			early++
		}
		switch {
		case e.stored():
			answers["2xx"]++
		case e.Status != 0:
			answers[strconv.Itoa(e.Status)]++
		default:
			answers["none"]++
		}
	}
	return fmt.Sprintf("forged webhooks: %d events, correctly signed (%s); aimed at (%s), %d of them at a job before "+
		"its not_before; answered: %s", len(events), formatCounts(kinds), formatCounts(targets), early, formatCounts(answers))
}
