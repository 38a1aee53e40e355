package store

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxPageSize bounds ListParams.Limit.
const MaxPageSize = 500

// ListOrder is the order a listing walks, chosen by its filters so that each
// walks an index: by order (order_id, created_at, id) and by payment
// (payment_id, created_at, id) newest first, by provider refund id the jobs'
// (provider_refund_id) and the receipts' (provider_refund_id, job_id) newest
// id first, by state (state, next_attempt_at, id) oldest due first, else by
// id newest first.
type ListOrder string

// The listing orders.
const (
	ByOrder    ListOrder = "order"
	ByPayment  ListOrder = "payment"
	ByRefundID ListOrder = "refund"
	ByState    ListOrder = "state"
	ByID       ListOrder = "id"
	// ByAttention: the attention list (R34), longest listed first, on
	// (attention_since, id).
	ByAttention ListOrder = "attention"
)

// Order is the order p's listing walks.
func (p ListParams) Order() ListOrder {
	switch {
	case p.Attention:
		return ByAttention
	case p.OrderID != "":
		return ByOrder
	case p.PaymentID != "":
		return ByPayment
	case p.ProviderRefundID != "":
		return ByRefundID
	case p.State != "":
		return ByState
	default:
		return ByID
	}
}

// Cursor is where a page ends: the last job's sort key.
type Cursor struct {
	At time.Time // created_at (ByOrder, ByPayment), next_attempt_at (ByState) or attention_since (ByAttention)
	ID int64
}

// timed reports whether the order's cursor holds a time beside the id.
func (o ListOrder) timed() bool {
	return o == ByOrder || o == ByPayment || o == ByState || o == ByAttention
}

// Filtered reports whether the listing filters the rows its walk reads
// (a reason prefix, a creation range): such a page may read every row of
// its state or lookup to find none, where any other reads at most its
// page size.
func (p ListParams) Filtered() bool {
	return p.ReasonPrefix != "" || !p.CreatedAfter.IsZero() || !p.CreatedBefore.IsZero()
}

// Validate reports what is wrong with a listing request.
func (p ListParams) Validate() error {
	var v violations
	switch p.State {
	case "", StateReady, StateRunning, StateSucceeded, StateManualReview, StateCancelled:
	default:
		v.add("state", "unknown state %q", p.State)
	}
	v.provider("provider", p.Provider, false)
	v.text("order_id", p.OrderID, 0, MaxKeyLen)
	v.text("payment_id", p.PaymentID, 0, MaxKeyLen)
	v.text("provider_refund_id", p.ProviderRefundID, 0, MaxRefIDLen)
	// Each lookup walks its own index; two of them would walk one and
	// filter by the other, which no answer needs.
	var lookup string
	for _, l := range []struct{ field, value string }{
		{"order_id", p.OrderID}, {"payment_id", p.PaymentID}, {"provider_refund_id", p.ProviderRefundID},
	} {
		switch {
		case l.value == "":
		case lookup == "":
			lookup = l.field
		default:
			v.add(l.field, "must be empty when %s is given: one lookup at a time", lookup)
		}
	}
	v.text("reason_prefix", p.ReasonPrefix, 0, MaxReasonLen)
	if !p.CreatedAfter.IsZero() {
		v.time("created_after", p.CreatedAfter)
	}
	if !p.CreatedBefore.IsZero() {
		v.time("created_before", p.CreatedBefore)
	}
	if !p.CreatedAfter.IsZero() && !p.CreatedBefore.IsZero() && !p.CreatedAfter.Before(p.CreatedBefore) {
		v.add("created_after", "must be before created_before (%s), got %s",
			p.CreatedBefore.UTC().Format(time.RFC3339Nano), p.CreatedAfter.UTC().Format(time.RFC3339Nano))
	}
	// The reason and created filters apply on the walk the other filters
	// choose: only an unfinished state or a lookup bounds it by something
	// other than the history (Q3), so alone, with a provider or with
	// succeeded they are refused rather than left to walk millions of rows.
	if (p.ReasonPrefix != "" || !p.CreatedAfter.IsZero() || !p.CreatedBefore.IsZero()) && lookup == "" &&
		(p.State == "" || p.State == StateSucceeded) {
		field := "reason_prefix"
		if p.ReasonPrefix == "" {
			field = "created_after"
			if p.CreatedAfter.IsZero() {
				field = "created_before"
			}
		}
		v.add(field, "needs state ready, running or manual_review, or one of order_id, payment_id, "+
			"provider_refund_id: without them it would walk the whole history")
	}
	if p.Attention && (p.State != "" || p.Provider != "" || lookup != "" || p.Filtered()) {
		v.add("attention", "lists the attention list alone: no other filter goes with it")
	}
	if p.Limit < 1 || p.Limit > MaxPageSize {
		v.add("page_size", "must be between 1 and %d, got %d", MaxPageSize, p.Limit)
	}
	if _, _, err := p.Cursor(); err != nil {
		v.add("page_token", "%v", err)
	}
	return v.err()
}

// CreatedRange is the range of created_at the listing keeps, at the
// microsecond resolution both backends store: from (inclusive) and to
// (exclusive), each zero when unbounded. Both are rounded up to the
// microsecond, so that a stored time t is kept exactly when
// CreatedAfter <= t < CreatedBefore.
func (p ListParams) CreatedRange() (from, to time.Time) {
	return ceilMicro(p.CreatedAfter), ceilMicro(p.CreatedBefore)
}

func ceilMicro(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	t = t.UTC()
	if c := t.Truncate(time.Microsecond); !c.Equal(t) {
		return c.Add(time.Microsecond)
	}
	return t
}

// Cursor decodes the page token; false when there is none.
func (p ListParams) Cursor() (Cursor, bool, error) {
	if p.PageToken == "" {
		return Cursor{}, false, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(p.PageToken)
	if err != nil {
		return Cursor{}, false, fmt.Errorf("not a page token")
	}
	parts := strings.Split(string(raw), "|")
	if len(parts) != 4 || parts[0] != p.fingerprint() {
		return Cursor{}, false, fmt.Errorf("belongs to another listing (filters changed?)")
	}
	at, err1 := strconv.ParseInt(parts[2], 10, 64)
	id, err2 := strconv.ParseInt(parts[3], 10, 64)
	if err1 != nil || err2 != nil || parts[1] != string(p.Order()) {
		return Cursor{}, false, fmt.Errorf("not a page token")
	}
	c := Cursor{ID: id}
	if p.Order().timed() {
		// A real token holds a stored time; a forged one must not reach the
		// database as a time it cannot represent.
		if c.At = time.UnixMicro(at).UTC(); c.At.Before(minTime) || !c.At.Before(maxTime) {
			return Cursor{}, false, fmt.Errorf("not a page token")
		}
	}
	return c, true, nil
}

// NextToken is the token of the page after one that ended with last.
func (p ListParams) NextToken(last Job) string {
	var at int64
	switch p.Order() {
	case ByOrder, ByPayment:
		at = last.CreatedAt.UnixMicro()
	case ByState:
		at = last.NextAttemptAt.UnixMicro()
	case ByAttention:
		at = last.AttentionSince.UnixMicro()
	}
	raw := strings.Join([]string{p.fingerprint(), string(p.Order()), strconv.FormatInt(at, 10),
		strconv.FormatInt(last.ID, 10)}, "|")
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// fingerprint ties a token to the filters it was made for, every one of
// them. A listing with none of the later filters keeps the fingerprint it
// had before they existed, so that tokens in flight survive an upgrade.
// Text filters hold no control characters (Validate), so NUL separates them.
func (p ListParams) fingerprint() string {
	s := string(p.State) + "\x00" + p.Provider + "\x00" + p.OrderID
	if p.Attention {
		return s + "\x00attention"
	}
	from, to := p.CreatedRange()
	if p.PaymentID != "" || p.ProviderRefundID != "" || p.ReasonPrefix != "" || !from.IsZero() || !to.IsZero() {
		s += "\x00" + p.PaymentID + "\x00" + p.ProviderRefundID + "\x00" + p.ReasonPrefix +
			"\x00" + microsOrEmpty(from) + "\x00" + microsOrEmpty(to)
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}

func microsOrEmpty(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}
