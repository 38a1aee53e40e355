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
// walks an index: by order (order_id, created_at, id) newest first, by state
// (state, next_attempt_at, id) oldest due first, else by id newest first.
type ListOrder string

// The listing orders.
const (
	ByOrder ListOrder = "order"
	ByState ListOrder = "state"
	ByID    ListOrder = "id"
)

// Order is the order p's listing walks.
func (p ListParams) Order() ListOrder {
	switch {
	case p.OrderID != "":
		return ByOrder
	case p.State != "":
		return ByState
	default:
		return ByID
	}
}

// Cursor is where a page ends: the last job's sort key.
type Cursor struct {
	At time.Time // created_at (ByOrder) or next_attempt_at (ByState)
	ID int64
}

// Validate reports what is wrong with a listing request.
func (p ListParams) Validate() error {
	var v violations
	switch p.State {
	case "", StateReady, StateRunning, StateSucceeded, StateManualReview:
	default:
		v.add("state", "unknown state %q", p.State)
	}
	v.provider("provider", p.Provider, false)
	v.text("order_id", p.OrderID, 0, MaxKeyLen)
	if p.Limit < 1 || p.Limit > MaxPageSize {
		v.add("page_size", "must be between 1 and %d, got %d", MaxPageSize, p.Limit)
	}
	if _, _, err := p.Cursor(); err != nil {
		v.add("page_token", "%v", err)
	}
	return v.err()
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
	if p.Order() != ByID {
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
	case ByOrder:
		at = last.CreatedAt.UnixMicro()
	case ByState:
		at = last.NextAttemptAt.UnixMicro()
	}
	raw := strings.Join([]string{p.fingerprint(), string(p.Order()), strconv.FormatInt(at, 10),
		strconv.FormatInt(last.ID, 10)}, "|")
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// fingerprint ties a token to the filters it was made for.
func (p ListParams) fingerprint() string {
	sum := sha256.Sum256([]byte(string(p.State) + "\x00" + p.Provider + "\x00" + p.OrderID))
	return hex.EncodeToString(sum[:6])
}
