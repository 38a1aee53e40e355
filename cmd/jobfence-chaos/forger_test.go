package main

import (
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/webhook"
)

// testForger is a forger of specs, its choices drawn from seed, with the
// campaign's two secrets.
func testForger(specs []refundSpec, seed uint64) *forger {
	keys := webhookKeys{own: []byte("whsec_chaos_own_0123456789"), other: []byte("whsec_chaos_other_0123456789")}
	f := &forger{keys: keys, specs: map[string]refundSpec{}, rng: rand.New(rand.NewPCG(seed, 1))}
	for _, sp := range specs {
		f.specs[sp.Key] = sp
	}
	return f
}

// Every forged event is one the coordinators take as genuine: signed right
// with its provider's secret, and parsed into the key, amount, currency
// and outcome the forger meant, none of them the job's own in every
// respect (R28).
func TestForgedEventsAreSignedRightAndSayWhatTheForgerMeant_R28(t *testing.T) {
	specs := refundSpecs(9, 4)
	f := testForger(specs, 9)
	prod := &production{acked: map[string]int64{}, notBefore: map[string]time.Time{}}
	for i, sp := range specs {
		prod.acked[sp.Key] = int64(i + 1)
	}
	now := time.Now()
	secrets := map[string][]byte{providerName: f.keys.own, otherProviderName: f.keys.other}
	kinds := map[forgeryKind]int{}
	for range 200 {
		ev, body, ok := f.draw(prod, now)
		if !ok {
			t.Fatal("nothing drawn with four jobs acknowledged")
		}
		kinds[ev.Kind]++
		h := http.Header{}
		h.Set(webhook.StripeSignatureHeader, stripeSignature(secrets[ev.Provider], now, body))
		scheme := webhook.Stripe{Tolerance: 5 * time.Minute}
		if err := scheme.Verify(h, body, [][]byte{secrets[ev.Provider]}, now); err != nil {
			t.Fatalf("%s does not verify under %s's secret: %v", ev.describe(), ev.Provider, err)
		}
		other := otherProviderName
		if ev.Provider == otherProviderName {
			other = providerName
		}
		if err := scheme.Verify(h, body, [][]byte{secrets[other]}, now); err == nil {
			t.Fatalf("%s verifies under %s's secret too", ev.describe(), other)
		}
		events, err := scheme.Parse(body)
		if err != nil || len(events) != 1 {
			t.Fatalf("%s parsed as %+v, %v", ev.describe(), events, err)
		}
		got := events[0]
		if got.ID != ev.ID || got.OperationKey != ev.Key || got.RefundID != ev.RefundID ||
			got.AmountMinor != ev.AmountMinor || got.Currency != ev.Currency || string(got.Outcome) != ev.Outcome ||
			got.Type != ev.Type {
			t.Fatalf("%s parsed as %+v", ev.describe(), got)
		}
		sameJob := ev.Provider == providerName && ev.AmountMinor == ev.JobAmount && ev.Currency == ev.JobCurrency
		switch {
		case sameJob:
			t.Fatalf("%s could be about its job: its provider's, for its amount and currency", ev.describe())
		case (ev.Kind == forgedOtherProvider || ev.Kind == forgedOtherProviderAmount1) != (ev.Provider == otherProviderName):
			t.Fatalf("%s is signed by %s", ev.describe(), ev.Provider)
		case ev.Kind == forgedOtherProviderAmount1 && ev.AmountMinor != 1:
			t.Fatalf("%s is for %d", ev.describe(), ev.AmountMinor)
		case ev.Kind == forgedOtherProvider && (ev.AmountMinor != ev.JobAmount || ev.Currency != ev.JobCurrency):
			t.Fatalf("%s is not for the job's own amount and currency", ev.describe())
		case !strings.HasPrefix(ev.RefundID, "re_forged_"):
			t.Fatalf("%s names refund %s, which may be real", ev.describe(), ev.RefundID)
		}
	}
	for _, k := range forgeryKinds {
		if kinds[k.kind] == 0 {
			t.Errorf("200 events and none of kind %s: %v", k.kind, kinds)
		}
	}
}

// The forger aims at the future-dated jobs before their not_before above
// all, and at the others too.
func TestForgerAimsAtFutureDatedJobsAboveAll(t *testing.T) {
	specs := refundSpecs(9, 20)
	specs[3].NotBeforeIn = 20 * time.Second
	specs[7].NotBeforeIn, specs[7].Beyond = futureBeyond, true
	f := testForger(specs, 9)
	now := time.Now()
	prod := &production{acked: map[string]int64{}, notBefore: map[string]time.Time{
		specs[3].Key: now.Add(time.Second), specs[7].Key: now.Add(futureBeyond), specs[9].Key: now.Add(-time.Second)}}
	for i, sp := range specs {
		prod.acked[sp.Key] = int64(i + 1)
	}
	targets := map[string]int{}
	for range 400 {
		ev, _, _ := f.draw(prod, now)
		targets[ev.Target]++
		if ev.Target == targetSoon && ev.Key != specs[3].Key || ev.Target == targetBeyond && ev.Key != specs[7].Key {
			t.Fatalf("%s aimed at %s", ev.describe(), ev.Target)
		}
		if ev.early() != (ev.Key == specs[3].Key || ev.Key == specs[7].Key) {
			t.Fatalf("%s early=%v, not_before %s", ev.describe(), ev.early(), ev.NotBefore)
		}
	}
	if early := targets[targetSoon] + targets[targetBeyond]; early < 250 || targets[targetSoon] < 100 ||
		targets[targetBeyond] < 100 || targets[targetDue] < 50 {
		t.Fatalf("aimed at %v: want about three quarters at the two jobs before their not_before, half each", targets)
	}
	// Nothing acknowledged yet: nothing to aim at.
	if _, _, ok := testForger(specs, 9).draw(&production{acked: map[string]int64{}}, now); ok {
		t.Fatal("an event drawn with no job acknowledged")
	}
}
