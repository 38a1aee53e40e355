package store_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// rulesFields returns the field names of err's violations, or fails.
func rulesFields(t *testing.T, err error) []string {
	t.Helper()
	var ve *store.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
	}
	fields := make([]string, len(ve.Violations))
	for i, v := range ve.Violations {
		fields[i] = v.Field
	}
	return fields
}

// rulesOnlyField checks err names exactly field.
func rulesOnlyField(t *testing.T, err error, field string) {
	t.Helper()
	if got := rulesFields(t, err); len(got) != 1 || got[0] != field {
		t.Fatalf("violations %v (%v), want only %s", got, err, field)
	}
}

// Q4, Q7: a page token continues the listing it was made for from the last
// job's sort key (keyset, never OFFSET), whatever the page size.
func TestListPageTokenRoundTrips_Q4_Q7(t *testing.T) {
	at := time.Date(2025, 3, 14, 9, 26, 53, 589793238, time.UTC)
	last := store.Job{ID: 4711, CreatedAt: at.Add(-time.Hour), NextAttemptAt: at}
	cases := []struct {
		name  string
		p     store.ListParams
		order store.ListOrder
		want  store.Cursor
	}{
		{"by id", store.ListParams{Limit: 50}, store.ByID, store.Cursor{ID: 4711}},
		{"by state (Q4: next_attempt_at, id)", store.ListParams{State: store.StateReady, Provider: "acme", Limit: 50}, store.ByState,
			store.Cursor{At: at.Truncate(time.Microsecond), ID: 4711}},
		{"by order (Q7: created_at, id)", store.ListParams{OrderID: "order-1", State: store.StateSucceeded, Limit: 50}, store.ByOrder,
			store.Cursor{At: at.Add(-time.Hour).Truncate(time.Microsecond), ID: 4711}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.p.Order(); got != c.order {
				t.Fatalf("Order = %s, want %s", got, c.order)
			}
			if cur, ok, err := c.p.Cursor(); ok || err != nil || cur != (store.Cursor{}) {
				t.Fatalf("Cursor without a token = %+v, %v, %v; want none", cur, ok, err)
			}
			next := c.p
			next.PageToken = c.p.NextToken(last)
			next.Limit = 500 // the page size is not part of the listing
			cur, ok, err := next.Cursor()
			if !ok || err != nil || !cur.At.Equal(c.want.At) || cur.ID != c.want.ID {
				t.Fatalf("Cursor = %+v, %v, %v; want %+v", cur, ok, err, c.want)
			}
			if err := next.Validate(); err != nil {
				t.Fatalf("Validate with its own token: %v", err)
			}
		})
	}
}

// Q4: identical next_attempt_at values are told apart by id, so a page of
// equal times never repeats or skips a job.
func TestListPageTokenOrdersEqualTimesByID_Q4(t *testing.T) {
	p := store.ListParams{State: store.StateReady, Limit: 2}
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := p, p
	a.PageToken = p.NextToken(store.Job{ID: 10, NextAttemptAt: at})
	b.PageToken = p.NextToken(store.Job{ID: 11, NextAttemptAt: at})
	ca, _, _ := a.Cursor()
	cb, _, _ := b.Cursor()
	if a.PageToken == b.PageToken || !ca.At.Equal(cb.At) || ca.ID != 10 || cb.ID != 11 {
		t.Fatalf("cursors of equal times %+v and %+v, want the same time and ids 10 and 11", ca, cb)
	}
}

// Q4: a token belongs to the filters it was made for; a changed filter, a
// forged time or garbage is refused as page_token.
func TestListPageTokenRefusedForOtherFiltersAndForgeries_Q4(t *testing.T) {
	base := store.ListParams{State: store.StateReady, Provider: "acme", Limit: 10}
	tok := base.NextToken(store.Job{ID: 5, NextAttemptAt: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)})
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		t.Fatal(err)
	}
	fingerprint := strings.Split(string(raw), "|")[0]
	forge := func(parts ...string) string {
		return base64.RawURLEncoding.EncodeToString([]byte(strings.Join(parts, "|")))
	}
	in := func(p store.ListParams, token string) store.ListParams { p.PageToken = token; return p }

	cases := []struct {
		name string
		p    store.ListParams
	}{
		{"another state", in(store.ListParams{State: store.StateRunning, Provider: "acme", Limit: 10}, tok)},
		{"another provider", in(store.ListParams{State: store.StateReady, Provider: "other", Limit: 10}, tok)},
		{"no provider", in(store.ListParams{State: store.StateReady, Limit: 10}, tok)},
		{"an order added", in(store.ListParams{State: store.StateReady, Provider: "acme", OrderID: "o", Limit: 10}, tok)},
		{"not base64", in(base, "!!not a token!!")},
		{"too few parts", in(base, forge(fingerprint, "state", "1"))},
		{"another order", in(base, forge(fingerprint, "id", "0", "5"))},
		{"non-numeric id", in(base, forge(fingerprint, "state", "1735689600000000", "five"))},
		{"time before 2000", in(base, forge(fingerprint, "state", "0", "5"))},
		{"time past 9000", in(base, forge(fingerprint, "state", "9223372036854775807", "5"))},
		{"negative time", in(base, forge(fingerprint, "state", "-62135596800000000", "5"))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if cur, ok, err := c.p.Cursor(); err == nil || ok {
				t.Fatalf("Cursor = %+v, %v, %v; want refused", cur, ok, err)
			}
			rulesOnlyField(t, c.p.Validate(), "page_token")
		})
	}
	// The forger's tool itself is sound: the same parts with a stored time pass.
	if _, ok, err := in(base, forge(fingerprint, "state", "1735689600000000", "5")).Cursor(); !ok || err != nil {
		t.Fatalf("a well-formed token is refused: %v", err)
	}
}

// R15: a job's observations page on by their id; a token of another job is
// refused, and the page size is named observations_page_size.
func TestObservationPageTokens_R15(t *testing.T) {
	tok := store.ObservationsToken(7, store.Observation{ID: 99})
	p := store.GetParams{JobRef: store.JobRef{ID: 7}, ObservationsPageToken: tok}
	if err := p.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if after, err := p.ObservationsAfter(7); after != 99 || err != nil {
		t.Fatalf("ObservationsAfter(7) = %d, %v; want 99", after, err)
	}
	_, err := p.ObservationsAfter(8)
	rulesOnlyField(t, err, "observations_page_token")
	if after, err := (store.GetParams{JobRef: store.JobRef{ID: 7}}).ObservationsAfter(7); after != 0 || err != nil {
		t.Fatalf("ObservationsAfter without a token = %d, %v; want 0", after, err)
	}
	// By operation key the job's id is not known yet; the token still parses.
	byKey := store.GetParams{JobRef: store.JobRef{OperationKey: "refund-op-7"}, ObservationsPageToken: tok}
	if err := byKey.Validate(); err != nil {
		t.Fatalf("Validate by key: %v", err)
	}

	obs := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, bad := range []string{"%%%", obs("obs|7"), obs("list|7|99"), obs("obs|0|99"), obs("obs|7|0"),
		obs("obs|-7|99"), obs("obs|7|x")} {
		p := store.GetParams{JobRef: store.JobRef{ID: 7}, ObservationsPageToken: bad}
		rulesOnlyField(t, p.Validate(), "observations_page_token")
	}

	for _, c := range []struct {
		limit, want int
		ok          bool
	}{{0, store.ObservationPageSize, true}, {1, 1, true}, {37, 37, true}, {store.MaxObservationPage, store.MaxObservationPage, true},
		{-1, 0, false}, {store.MaxObservationPage + 1, 0, false}} {
		p := store.GetParams{JobRef: store.JobRef{ID: 7}, ObservationsLimit: c.limit}
		err := p.Validate()
		if c.ok {
			if err != nil || p.Limit() != c.want {
				t.Errorf("limit %d: Validate %v, Limit %d; want ok and %d", c.limit, err, p.Limit(), c.want)
			}
			continue
		}
		rulesOnlyField(t, err, "observations_page_size")
	}
}
