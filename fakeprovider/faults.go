package fakeprovider

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// FaultHeader is the request header that injects faults into that one request.
// Its value has the syntax of ParseFaults, e.g. "hang_after=5,cut_reply".
const FaultHeader = "X-Fake-Fault"

// Faults is a set of fault modes. The zero value injects nothing.
//
// Global faults (SetFaults) apply to create requests (POST /v1/refunds);
// only ErrorBurst also applies to lookups. Faults in a request's X-Fake-Fault
// header apply to that request, whatever its endpoint, on top of the global
// ones; where both give a duration, the header's wins.
type Faults struct {
	// HangBefore holds the request this long, in wall-clock time, before
	// anything happens. A cancelled request ends the hang: nothing was done.
	HangBefore time.Duration
	// HangAfter does the work (creates the refund), then holds the reply this
	// long in wall-clock time. A cancelled request ends the hang; the work
	// stays done.
	HangAfter time.Duration
	// CutReply does the work, then closes the connection without a reply (T3).
	CutReply bool
	// Pending keeps new refunds pending this long by the simulator clock
	// before they succeed (or fail).
	Pending time.Duration
	// LookupLag hides a refund from lookups for this long after it was
	// created, by the simulator clock (replica lag). In a global setting or on
	// a create request it is stamped on the new refund; on a lookup request it
	// hides refunds younger than this from that lookup. Idempotent replays
	// always see the refund.
	LookupLag time.Duration
	// ErrorBurst makes this many requests answer 503 without doing anything.
	// Globally it counts down with every matching request; in a header,
	// "error_burst=N" fails that request and the next N-1 API requests.
	ErrorBurst int
	// Fail makes new refunds end failed (failure_reason "declined") instead
	// of succeeded, after Pending if set.
	Fail bool

	// The webhook modes act on the events of the refund a create makes (see
	// the package documentation); without a webhook URL they do nothing.

	// WebhookDelay holds each event this long, in wall-clock time, before
	// its first delivery attempt.
	WebhookDelay time.Duration
	// WebhookDuplicate delivers each event twice: once more after its first
	// 2xx, same id, same body.
	WebhookDuplicate bool
	// WebhookReorder holds the refund's events until its last one is made,
	// then delivers them newest first (refund.updated before refund.created).
	WebhookReorder bool
	// WebhookBadSignature signs each event's first attempt with a wrong
	// secret; the retries are signed right.
	WebhookBadSignature bool
	// WebhookOldTimestamp signs each event's first attempt with a t 10
	// minutes in the past; the retries carry the time they are sent.
	WebhookOldTimestamp bool
	// WebhookDrop never delivers the events; the oracle still lists them.
	WebhookDrop bool

	// Key limits global faults to create requests with this Idempotency-Key;
	// lookups then match none of them. Only for global faults.
	Key string
	// Times applies the global faults other than ErrorBurst to this many
	// matching create requests, then clears them; 0 means until cleared.
	// Requests failed by ErrorBurst do not count. Only for global faults.
	Times int
}

// IsZero reports whether f injects nothing.
func (f Faults) IsZero() bool { return f == Faults{} }

// createFaults reports whether f has a mode other than ErrorBurst.
func (f Faults) createFaults() bool {
	f.ErrorBurst, f.Key, f.Times = 0, "", 0
	return !f.IsZero()
}

// webhookModes returns the webhook modes of f alone.
func (f Faults) webhookModes() Faults {
	return Faults{WebhookDelay: f.WebhookDelay, WebhookDuplicate: f.WebhookDuplicate, WebhookReorder: f.WebhookReorder,
		WebhookBadSignature: f.WebhookBadSignature, WebhookOldTimestamp: f.WebhookOldTimestamp, WebhookDrop: f.WebhookDrop}
}

// overlay returns f with every mode that h sets taken from h.
func (f Faults) overlay(h Faults) Faults {
	if h.HangBefore > 0 {
		f.HangBefore = h.HangBefore
	}
	if h.HangAfter > 0 {
		f.HangAfter = h.HangAfter
	}
	if h.Pending > 0 {
		f.Pending = h.Pending
	}
	if h.LookupLag > 0 {
		f.LookupLag = h.LookupLag
	}
	if h.WebhookDelay > 0 {
		f.WebhookDelay = h.WebhookDelay
	}
	f.CutReply = f.CutReply || h.CutReply
	f.Fail = f.Fail || h.Fail
	f.WebhookDuplicate = f.WebhookDuplicate || h.WebhookDuplicate
	f.WebhookReorder = f.WebhookReorder || h.WebhookReorder
	f.WebhookBadSignature = f.WebhookBadSignature || h.WebhookBadSignature
	f.WebhookOldTimestamp = f.WebhookOldTimestamp || h.WebhookOldTimestamp
	f.WebhookDrop = f.WebhookDrop || h.WebhookDrop
	return f
}

// Validate reports what is wrong with f.
func (f Faults) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"hang_before", f.HangBefore}, {"hang_after", f.HangAfter}, {"pending", f.Pending}, {"lookup_lag", f.LookupLag},
		{"webhook_delay", f.WebhookDelay}} {
		if d.v < 0 {
			return fmt.Errorf("%s must not be negative, got %s", d.name, d.v)
		}
	}
	if f.ErrorBurst < 0 {
		return fmt.Errorf("error_burst must not be negative, got %d", f.ErrorBurst)
	}
	if f.Times < 0 {
		return fmt.Errorf("times must not be negative, got %d", f.Times)
	}
	return nil
}

// ParseFaults parses a comma-separated list of fault modes, the syntax of the
// X-Fake-Fault header and of the command's --faults flag:
//
//	hang_before=N   hang_after=N   cut_reply   pending=N   lookup_lag=N
//	error_burst[=N] (N defaults to 1)          fail
//	webhook_delay=N webhook_duplicate          webhook_reorder
//	webhook_bad_signature                      webhook_old_timestamp
//	webhook_drop
//	key=K           times=N        (global faults only)
//
// A duration N is seconds, decimals allowed ("0.25"), or a Go duration
// ("250ms", "24h"). Spaces around items are ignored; an empty spec is the zero
// Faults. Errors name the offending item.
func ParseFaults(spec string) (Faults, error) {
	var f Faults
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		mode, val, hasVal := strings.Cut(item, "=")
		mode, val = strings.TrimSpace(mode), strings.TrimSpace(val)
		var err error
		switch mode {
		case "hang_before":
			f.HangBefore, err = parseSeconds(val, hasVal)
		case "hang_after":
			f.HangAfter, err = parseSeconds(val, hasVal)
		case "pending":
			f.Pending, err = parseSeconds(val, hasVal)
		case "lookup_lag":
			f.LookupLag, err = parseSeconds(val, hasVal)
		case "cut_reply":
			f.CutReply, err = parseFlag(val, hasVal)
		case "fail":
			f.Fail, err = parseFlag(val, hasVal)
		case "webhook_delay":
			f.WebhookDelay, err = parseSeconds(val, hasVal)
		case "webhook_duplicate":
			f.WebhookDuplicate, err = parseFlag(val, hasVal)
		case "webhook_reorder":
			f.WebhookReorder, err = parseFlag(val, hasVal)
		case "webhook_bad_signature":
			f.WebhookBadSignature, err = parseFlag(val, hasVal)
		case "webhook_old_timestamp":
			f.WebhookOldTimestamp, err = parseFlag(val, hasVal)
		case "webhook_drop":
			f.WebhookDrop, err = parseFlag(val, hasVal)
		case "error_burst":
			f.ErrorBurst = 1
			if hasVal {
				f.ErrorBurst, err = parseCount(val)
			}
		case "times":
			if !hasVal {
				err = errors.New("needs a count")
			} else {
				f.Times, err = parseCount(val)
			}
		case "key":
			if val == "" {
				err = errors.New("needs a value")
			}
			f.Key = val
		default:
			err = errors.New("unknown fault mode")
		}
		if err != nil {
			return Faults{}, fmt.Errorf("fault %q: %w", item, err)
		}
	}
	return f, nil
}

func parseSeconds(val string, hasVal bool) (time.Duration, error) {
	if !hasVal || val == "" {
		return 0, errors.New("needs a duration in seconds")
	}
	if s, err := strconv.ParseFloat(val, 64); err == nil {
		return secondsToDuration(s)
	}
	d, err := time.ParseDuration(val)
	if err != nil || d < 0 {
		return 0, errors.New("not a duration: give seconds (2.5) or a Go duration (2500ms)")
	}
	return d, nil
}

func parseFlag(val string, hasVal bool) (bool, error) {
	if !hasVal {
		return true, nil
	}
	b, err := strconv.ParseBool(val)
	if err != nil {
		return false, errors.New("not a boolean")
	}
	return b, nil
}

func parseCount(val string) (int, error) {
	n, err := strconv.Atoi(val)
	if err != nil || n < 0 {
		return 0, errors.New("not a count")
	}
	return n, nil
}

// String returns f in the syntax of ParseFaults; the zero Faults is "".
func (f Faults) String() string {
	var parts []string
	secs := func(name string, d time.Duration) {
		if d > 0 {
			parts = append(parts, name+"="+strconv.FormatFloat(d.Seconds(), 'f', -1, 64))
		}
	}
	secs("hang_before", f.HangBefore)
	secs("hang_after", f.HangAfter)
	if f.CutReply {
		parts = append(parts, "cut_reply")
	}
	secs("pending", f.Pending)
	secs("lookup_lag", f.LookupLag)
	if f.ErrorBurst > 0 {
		parts = append(parts, "error_burst="+strconv.Itoa(f.ErrorBurst))
	}
	if f.Fail {
		parts = append(parts, "fail")
	}
	secs("webhook_delay", f.WebhookDelay)
	for _, m := range []struct {
		name string
		on   bool
	}{
		{"webhook_duplicate", f.WebhookDuplicate}, {"webhook_reorder", f.WebhookReorder},
		{"webhook_bad_signature", f.WebhookBadSignature}, {"webhook_old_timestamp", f.WebhookOldTimestamp},
		{"webhook_drop", f.WebhookDrop},
	} {
		if m.on {
			parts = append(parts, m.name)
		}
	}
	if f.Key != "" {
		parts = append(parts, "key="+f.Key)
	}
	if f.Times > 0 {
		parts = append(parts, "times="+strconv.Itoa(f.Times))
	}
	return strings.Join(parts, ",")
}

// faultsJSON is the wire form of Faults: durations in seconds.
type faultsJSON struct {
	HangBefore float64 `json:"hang_before"`
	HangAfter  float64 `json:"hang_after"`
	CutReply   bool    `json:"cut_reply"`
	Pending    float64 `json:"pending"`
	LookupLag  float64 `json:"lookup_lag"`
	ErrorBurst int     `json:"error_burst"`
	Fail       bool    `json:"fail"`

	WebhookDelay        float64 `json:"webhook_delay"`
	WebhookDuplicate    bool    `json:"webhook_duplicate"`
	WebhookReorder      bool    `json:"webhook_reorder"`
	WebhookBadSignature bool    `json:"webhook_bad_signature"`
	WebhookOldTimestamp bool    `json:"webhook_old_timestamp"`
	WebhookDrop         bool    `json:"webhook_drop"`

	Key   string `json:"key,omitempty"`
	Times int    `json:"times,omitempty"`
}

// MarshalJSON encodes f with durations as seconds:
//
//	{"hang_before":0,"hang_after":0,"cut_reply":false,"pending":0,
//	 "lookup_lag":0,"error_burst":0,"fail":false,
//	 "webhook_delay":0,"webhook_duplicate":false,"webhook_reorder":false,
//	 "webhook_bad_signature":false,"webhook_old_timestamp":false,"webhook_drop":false,
//	 "key":"op-1","times":1}
func (f Faults) MarshalJSON() ([]byte, error) {
	return json.Marshal(faultsJSON{
		HangBefore: f.HangBefore.Seconds(), HangAfter: f.HangAfter.Seconds(), CutReply: f.CutReply,
		Pending: f.Pending.Seconds(), LookupLag: f.LookupLag.Seconds(), ErrorBurst: f.ErrorBurst,
		Fail: f.Fail, WebhookDelay: f.WebhookDelay.Seconds(), WebhookDuplicate: f.WebhookDuplicate,
		WebhookReorder: f.WebhookReorder, WebhookBadSignature: f.WebhookBadSignature,
		WebhookOldTimestamp: f.WebhookOldTimestamp, WebhookDrop: f.WebhookDrop, Key: f.Key, Times: f.Times,
	})
}

// UnmarshalJSON decodes the form MarshalJSON writes; missing fields are zero
// and unknown fields are an error.
func (f *Faults) UnmarshalJSON(b []byte) error {
	var w faultsJSON
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return err
	}
	var err error
	out := Faults{CutReply: w.CutReply, ErrorBurst: w.ErrorBurst, Fail: w.Fail,
		WebhookDuplicate: w.WebhookDuplicate, WebhookReorder: w.WebhookReorder, WebhookBadSignature: w.WebhookBadSignature,
		WebhookOldTimestamp: w.WebhookOldTimestamp, WebhookDrop: w.WebhookDrop, Key: w.Key, Times: w.Times}
	for _, d := range []struct {
		dst  *time.Duration
		name string
		v    float64
	}{
		{&out.HangBefore, "hang_before", w.HangBefore}, {&out.HangAfter, "hang_after", w.HangAfter},
		{&out.Pending, "pending", w.Pending}, {&out.LookupLag, "lookup_lag", w.LookupLag},
		{&out.WebhookDelay, "webhook_delay", w.WebhookDelay},
	} {
		if *d.dst, err = secondsToDuration(d.v); err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
	}
	*f = out
	return nil
}

func secondsToDuration(s float64) (time.Duration, error) {
	if s < 0 || math.IsNaN(s) || s > math.MaxInt64/float64(time.Second) {
		return 0, fmt.Errorf("%v seconds is out of range", s)
	}
	return time.Duration(s * float64(time.Second)), nil
}
