package store_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// Each lookup walks its own index (order, then payment, then provider refund
// id); the created range and the reason prefix never choose one.
func TestListLookupsChooseTheirOrder_Q7(t *testing.T) {
	at := time.Date(2025, 3, 14, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		p    store.ListParams
		want store.ListOrder
	}{
		{store.ListParams{PaymentID: "pay-1", State: store.StateReady}, store.ByPayment},
		{store.ListParams{ProviderRefundID: "re_1", State: store.StateManualReview}, store.ByRefundID},
		{store.ListParams{OrderID: "o", ReasonPrefix: "x", CreatedAfter: at}, store.ByOrder},
		{store.ListParams{State: store.StateManualReview, ReasonPrefix: "x", CreatedBefore: at}, store.ByState},
		{store.ListParams{ReasonPrefix: "x", CreatedAfter: at, CreatedBefore: at.Add(time.Hour)}, store.ByID},
	}
	for _, c := range cases {
		if got := c.p.Order(); got != c.want {
			t.Errorf("Order(%+v) = %s, want %s", c.p, got, c.want)
		}
	}
}

// Q4: the new orders' tokens round-trip: by payment (created_at, id), by
// provider refund id the id alone.
func TestListLookupTokensRoundTrip_Q4(t *testing.T) {
	at := time.Date(2025, 3, 14, 9, 26, 53, 589793238, time.UTC)
	last := store.Job{ID: 4711, CreatedAt: at, NextAttemptAt: at.Add(time.Hour)}
	for _, c := range []struct {
		p    store.ListParams
		want store.Cursor
	}{
		{store.ListParams{PaymentID: "pay-1", ReasonPrefix: "no record", Limit: 5},
			store.Cursor{At: at.Truncate(time.Microsecond), ID: 4711}},
		{store.ListParams{ProviderRefundID: "re_1", CreatedAfter: at, Limit: 5}, store.Cursor{ID: 4711}},
	} {
		next := c.p
		next.PageToken = c.p.NextToken(last)
		cur, ok, err := next.Cursor()
		if !ok || err != nil || !cur.At.Equal(c.want.At) || cur.ID != c.want.ID {
			t.Fatalf("%s: Cursor = %+v, %v, %v; want %+v", c.p.Order(), cur, ok, err, c.want)
		}
		if err := next.Validate(); err != nil {
			t.Fatalf("%s: Validate with its own token: %v", c.p.Order(), err)
		}
	}
}

// Q4: a token is bound to every filter: changing any one refuses it.
func TestListTokenBoundToEveryFilter_Q4(t *testing.T) {
	at := time.Date(2025, 3, 14, 9, 0, 0, 0, time.UTC)
	base := store.ListParams{State: store.StateManualReview, Provider: "acme", ReasonPrefix: "no record",
		CreatedAfter: at, CreatedBefore: at.Add(24 * time.Hour), Limit: 10}
	tok := base.NextToken(store.Job{ID: 5, NextAttemptAt: at})
	with := func(f func(*store.ListParams)) store.ListParams { p := base; f(&p); p.PageToken = tok; return p }
	for name, p := range map[string]store.ListParams{
		"another reason prefix":  with(func(p *store.ListParams) { p.ReasonPrefix = "no record at" }),
		"no reason prefix":       with(func(p *store.ListParams) { p.ReasonPrefix = "" }),
		"another created_after":  with(func(p *store.ListParams) { p.CreatedAfter = at.Add(time.Microsecond) }),
		"no created_after":       with(func(p *store.ListParams) { p.CreatedAfter = time.Time{} }),
		"another created_before": with(func(p *store.ListParams) { p.CreatedBefore = at.Add(time.Hour) }),
		"no created_before":      with(func(p *store.ListParams) { p.CreatedBefore = time.Time{} }),
		"another state":          with(func(p *store.ListParams) { p.State = store.StateReady }),
		"another provider":       with(func(p *store.ListParams) { p.Provider = "globex" }),
	} {
		t.Run(name, func(t *testing.T) { rulesOnlyField(t, p.Validate(), "page_token") })
	}
	if err := with(func(*store.ListParams) {}).Validate(); err != nil {
		t.Fatalf("the token's own filters: %v", err)
	}
	// The same range to the microsecond both backends store is the same
	// listing.
	if err := with(func(p *store.ListParams) { p.CreatedAfter = at.Add(-time.Nanosecond) }).Validate(); err != nil {
		t.Fatalf("a range equal at the microsecond: %v", err)
	}

	lookups := map[string]store.ListParams{
		"payment":            {PaymentID: "pay-1", Limit: 10},
		"provider refund id": {ProviderRefundID: "re_1", Limit: 10},
	}
	for name, p := range lookups {
		tok := p.NextToken(store.Job{ID: 5, CreatedAt: at})
		other := p
		other.PaymentID, other.ProviderRefundID = strings.Replace(p.PaymentID, "1", "2", 1),
			strings.Replace(p.ProviderRefundID, "1", "2", 1)
		other.PageToken = tok
		t.Run("another "+name, func(t *testing.T) { rulesOnlyField(t, other.Validate(), "page_token") })
	}
}

// Tokens made before the lookups and the review filters existed (state,
// provider and order only) still continue their listing after an upgrade.
func TestListTokensOfEarlierListingsStillValid_Q4(t *testing.T) {
	p := store.ListParams{State: store.StateReady, Provider: "acme", Limit: 10}
	sum := sha256.Sum256([]byte("ready\x00acme\x00"))
	p.PageToken = base64.RawURLEncoding.EncodeToString([]byte(hex.EncodeToString(sum[:6]) + "|state|1735689600000000|5"))
	if cur, ok, err := p.Cursor(); !ok || err != nil || cur.ID != 5 {
		t.Fatalf("an earlier release's token: %+v, %v, %v", cur, ok, err)
	}
}

// The new filters' limits, each named by its wire field; created_after must
// come before created_before.
func TestValidateListFilters(t *testing.T) {
	at := time.Date(2025, 3, 14, 9, 0, 0, 0, time.UTC)
	ok := []store.ListParams{
		{PaymentID: strings.Repeat("p", store.MaxKeyLen), Limit: 1},
		{ProviderRefundID: strings.Repeat("r", store.MaxRefIDLen), Limit: 1},
		{State: store.StateManualReview, ReasonPrefix: strings.Repeat("r", store.MaxReasonLen), Limit: 1},
		{State: store.StateReady, ReasonPrefix: "50% off_", Limit: 1},
		{State: store.StateRunning, CreatedAfter: at, CreatedBefore: at.Add(time.Nanosecond), Limit: 1},
		{OrderID: "o", CreatedAfter: at, Limit: 1},
		{PaymentID: "p", CreatedBefore: at, Limit: 1},
		{ProviderRefundID: "re_1", ReasonPrefix: "x", Limit: 1},
	}
	for _, p := range ok {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%.80v): %v", p, err)
		}
	}
	for _, c := range []struct {
		name  string
		p     store.ListParams
		field string
	}{
		{"payment_id too long", store.ListParams{PaymentID: strings.Repeat("p", store.MaxKeyLen+1), Limit: 1}, "payment_id"},
		{"provider_refund_id too long", store.ListParams{ProviderRefundID: strings.Repeat("r", store.MaxRefIDLen+1), Limit: 1},
			"provider_refund_id"},
		{"reason_prefix too long", store.ListParams{State: store.StateManualReview, ReasonPrefix: strings.Repeat("r", store.MaxReasonLen+1), Limit: 1},
			"reason_prefix"},
		{"reason_prefix with a control character", store.ListParams{State: store.StateManualReview, ReasonPrefix: "a\x00", Limit: 1}, "reason_prefix"},
		{"payment_id not UTF-8", store.ListParams{PaymentID: "\xff", Limit: 1}, "payment_id"},
		{"an empty range", store.ListParams{State: store.StateManualReview, CreatedAfter: at, CreatedBefore: at, Limit: 1}, "created_after"},
		{"a range backwards", store.ListParams{State: store.StateManualReview, CreatedAfter: at, CreatedBefore: at.Add(-time.Hour), Limit: 1}, "created_after"},
		{"created_after before 2000", store.ListParams{State: store.StateManualReview, CreatedAfter: time.Unix(0, 0), Limit: 1}, "created_after"},
		{"created_before past 9000", store.ListParams{State: store.StateManualReview, CreatedBefore: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), Limit: 1},
			"created_before"},
		// Q3: the reason and created filters need a walk the history does
		// not grow: an unfinished state or a lookup.
		{"reason_prefix alone", store.ListParams{ReasonPrefix: "x", Limit: 1}, "reason_prefix"},
		{"reason_prefix with a provider only", store.ListParams{Provider: "acme", ReasonPrefix: "x", Limit: 1}, "reason_prefix"},
		{"created_after over succeeded", store.ListParams{State: store.StateSucceeded, CreatedAfter: at, Limit: 1},
			"created_after"},
		{"created_before alone", store.ListParams{CreatedBefore: at, Limit: 1}, "created_before"},
		// One lookup at a time; the violation names the second one given.
		{"order and payment", store.ListParams{OrderID: "o", PaymentID: "p", Limit: 1}, "payment_id"},
		{"order and refund id", store.ListParams{OrderID: "o", ProviderRefundID: "re_1", Limit: 1}, "provider_refund_id"},
		{"payment and refund id", store.ListParams{PaymentID: "p", ProviderRefundID: "re_1", Limit: 1}, "provider_refund_id"},
	} {
		t.Run(c.name, func(t *testing.T) { rulesOnlyField(t, c.p.Validate(), c.field) })
	}
	// All three: the second and the third are each refused.
	got := rulesFields(t, store.ListParams{OrderID: "o", PaymentID: "p", ProviderRefundID: "re_1", Limit: 1}.Validate())
	if len(got) != 2 || got[0] != "payment_id" || got[1] != "provider_refund_id" {
		t.Fatalf("all three lookups: violations %v, want payment_id and provider_refund_id", got)
	}
}

// The created range is kept at the stored microsecond: a bound between two
// microseconds is rounded up, so created_after keeps exactly the times at or
// after it and created_before exactly those before it.
func TestListCreatedRangeRoundsUpToTheMicrosecond(t *testing.T) {
	at := time.Date(2025, 3, 14, 9, 0, 0, 0, time.UTC)
	for _, c := range []struct{ after, before, wantFrom, wantTo time.Time }{
		{at, at.Add(time.Second), at, at.Add(time.Second)},
		{at.Add(time.Nanosecond), at.Add(time.Second + 999*time.Nanosecond), at.Add(time.Microsecond),
			at.Add(time.Second + time.Microsecond)},
		{at.Add(-time.Nanosecond), time.Time{}, at, time.Time{}},
		{time.Time{}, at.In(time.FixedZone("CET", 3600)), time.Time{}, at},
	} {
		from, to := store.ListParams{CreatedAfter: c.after, CreatedBefore: c.before}.CreatedRange()
		if !from.Equal(c.wantFrom) || !to.Equal(c.wantTo) || from.IsZero() != c.wantFrom.IsZero() ||
			to.IsZero() != c.wantTo.IsZero() {
			t.Errorf("CreatedRange(%v, %v) = %v, %v; want %v, %v", c.after, c.before, from, to, c.wantFrom, c.wantTo)
		}
	}
}
