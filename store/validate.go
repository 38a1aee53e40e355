package store

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// Input limits. They bound the columns in every backend's schema.
const (
	MaxKeyLen      = 128  // operation_key, order_id, payment_id, worker_id, source
	MaxProviderLen = 64   // provider
	MaxRefIDLen    = 255  // provider_refund_id, provider_event_id
	MaxReasonLen   = 1024 // reason
	MaxDetailLen   = 4096 // observation detail
	MaxClaimBatch  = 100  // max_jobs
	MinLease       = time.Second
	MaxLease       = 15 * time.Minute
	MaxDelay       = 30 * 24 * time.Hour
)

// Timestamps a caller may give; both backends store them without surprises.
var (
	minTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// Validate reports what is wrong with an enqueue request.
func (p EnqueueParams) Validate() error {
	var v violations
	v.printable("operation_key", p.OperationKey)
	v.text("order_id", p.OrderID, 1, MaxKeyLen)
	v.text("payment_id", p.PaymentID, 1, MaxKeyLen)
	if p.AmountMinor <= 0 {
		v.add("amount_minor", "must be greater than zero, got %d", p.AmountMinor)
	}
	if !IsCurrency(p.Currency) {
		v.add("currency", "must be an ISO 4217 code such as EUR or USD, got %s", echo(p.Currency))
	}
	v.provider("provider", p.Provider, true)
	if !p.NotBefore.IsZero() {
		v.time("not_before", p.NotBefore)
	}
	return v.err()
}

// Validate reports what is wrong with a claim request.
func (p ClaimParams) Validate() error {
	var v violations
	v.text("worker_id", p.WorkerID, 1, MaxKeyLen)
	if p.MaxJobs < 1 || p.MaxJobs > MaxClaimBatch {
		v.add("max_jobs", "must be between 1 and %d, got %d", MaxClaimBatch, p.MaxJobs)
	}
	if p.Lease < MinLease || p.Lease > MaxLease {
		v.add("lease_duration", "must be between %s and %s, got %s", MinLease, MaxLease, p.Lease)
	}
	v.provider("provider", p.Provider, false)
	return v.err()
}

// Validate reports what is wrong with a write-back.
func (w Writeback) Validate() error {
	var v violations
	if w.JobID <= 0 {
		v.add("job_id", "must be greater than zero, got %d", w.JobID)
	}
	if w.Attempt <= 0 {
		v.add("attempt", "must be the attempt granted by Claim (1 or more), got %d", w.Attempt)
	}
	switch w.Kind {
	case EventCompleted:
		v.text("provider_refund_id", w.ProviderRefundID, 1, MaxRefIDLen)
	case EventRescheduled:
		if w.NextAction != ActionRefund && w.NextAction != ActionReconcile {
			v.add("next_action", "must be refund or reconcile, got %s", echo(string(w.NextAction)))
		}
		if w.At.IsZero() && (w.Delay < 0 || w.Delay > MaxDelay) {
			v.add("delay", "must be between 0 and %s, got %s", MaxDelay, w.Delay)
		}
		if !w.At.IsZero() {
			v.time("next_attempt_at", w.At)
		}
		v.text("reason", w.Reason, 0, MaxReasonLen)
	case EventEscalated:
		v.text("reason", w.Reason, 1, MaxReasonLen)
	case EventResolved:
		switch w.Resolution {
		case ResolutionRefunded:
			v.text("provider_refund_id", w.ProviderRefundID, 1, MaxRefIDLen)
		case ResolutionReconcile, ResolutionCancelled:
			if w.ProviderRefundID != "" {
				v.add("provider_refund_id", "must be empty when sending the job back to reconcile or cancelling it")
			}
		default:
			v.add("resolution", "must be REFUNDED, RECONCILE or CANCELLED, got %s", echo(string(w.Resolution)))
		}
		v.text("note", w.Reason, 1, MaxReasonLen)
		v.text("actor", w.Actor, 1, MaxKeyLen)
	default:
		v.add("kind", "must be completed, rescheduled, escalated or resolved, got %s", echo(string(w.Kind)))
	}
	if w.Kind != EventResolved && w.Actor != "" {
		v.text("actor", w.Actor, 1, MaxKeyLen)
	}
	v.token("lease_token", w.LeaseToken)
	return v.err()
}

// Validate reports what is wrong with an observation.
func (p ObservationParams) Validate() error {
	var v violations
	v.ref(p.Job)
	if p.Attempt < 0 {
		v.add("attempt", "must be 0 (none held) or the attempt held, got %d", p.Attempt)
	}
	v.token("lease_token", p.LeaseToken)
	if p.LeaseToken != "" && p.Attempt == 0 {
		v.add("lease_token", "must come with the attempt it was granted with")
	}
	v.text("source", p.Source, 1, MaxKeyLen)
	v.outcome("outcome", p.Outcome)
	v.text("provider_refund_id", p.ProviderRefundID, 0, MaxRefIDLen)
	v.text("provider_event_id", p.ProviderEventID, 0, MaxRefIDLen)
	v.multiline("detail", p.Detail, MaxDetailLen)
	v.text("reporter", p.Reporter, 0, MaxKeyLen)
	v.provider("provider", p.Provider, false)
	if p.AmountMinor < 0 {
		v.add("amount_minor", "must be 0 (not said) or greater, got %d", p.AmountMinor)
	}
	if p.Currency != "" && !IsCurrency(p.Currency) {
		v.add("currency", "must be an ISO 4217 code such as EUR or USD, or empty, got %s", echo(p.Currency))
	}
	return v.err()
}

// Mismatch says why receipt p cannot be about job ("" when it can be):
// the job of another provider than the webhook's, or of another amount or
// currency than the receipt's (R28).
func (p ObservationParams) Mismatch(job Job) string {
	switch {
	case p.Provider != "" && p.Provider != job.Provider:
		return fmt.Sprintf("job %d is a refund of provider %s, not of %s", job.ID, job.Provider, p.Provider)
	case p.AmountMinor != 0 && p.AmountMinor != job.AmountMinor, p.Currency != "" && p.Currency != job.Currency:
		return fmt.Sprintf("the receipt is for %d %s, job %d for %d %s", p.AmountMinor, p.Currency, job.ID,
			job.AmountMinor, job.Currency)
	}
	return ""
}

// Validate reports what is wrong with a job reference.
func (r JobRef) Validate() error {
	var v violations
	v.ref(r)
	return v.err()
}

// DedupeKey identifies an observation for deduplication: the provider's event id
// when given, else who saw what under which attempt. The free-text detail does
// not count, so a worker repeating a report with a new timestamp in it files it
// once.
func (p ObservationParams) DedupeKey(jobID int64) string {
	h := sha256.New()
	parts := []string{strconv.FormatInt(jobID, 10)}
	if p.ProviderEventID != "" {
		parts = append(parts, "event", p.ProviderEventID)
	} else {
		parts = append(parts, "report", strconv.FormatInt(p.Attempt, 10), p.Source,
			string(p.Outcome), p.ProviderRefundID)
	}
	for _, s := range parts {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (v *violations) ref(r JobRef) {
	switch {
	case r.ID < 0:
		v.add("job_id", "must be greater than zero, got %d", r.ID)
	case r.ID == 0 && r.OperationKey == "":
		v.add("job_id", "job_id or operation_key is required")
	case r.ID == 0:
		v.printable("operation_key", r.OperationKey)
	}
}

// outcome checks an observation's outcome: one of the four.
func (v *violations) outcome(field string, o Outcome) {
	switch o {
	case OutcomeSucceeded, OutcomePending, OutcomeFailed, OutcomeNotFound:
	default:
		v.add(field, "must be one of succeeded, pending, failed, not_found, got %s", echo(string(o)))
	}
}

// printable checks a key: 1..MaxKeyLen printable ASCII characters, no spaces.
func (v *violations) printable(field, s string) {
	if s == "" || len(s) > MaxKeyLen {
		v.add(field, "must be 1 to %d characters, got %d", MaxKeyLen, len(s))
		return
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			v.add(field, "must be printable ASCII without spaces (byte %d is 0x%02x)", i, s[i])
			return
		}
	}
}

// token checks a lease token (R25): empty, or up to MaxLeaseTokenLen
// printable ASCII characters. Whether it is the right one is the fence's
// business, not validation's.
func (v *violations) token(field string, t LeaseToken) {
	if t == "" {
		return
	}
	if len(t) > MaxLeaseTokenLen {
		v.add(field, "must be at most %d characters (the token Claim returned), got %d", MaxLeaseTokenLen, len(t))
		return
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			v.add(field, "must be the token Claim returned (printable ASCII; byte %d is 0x%02x)", i, t[i])
			return
		}
	}
}

// text checks free text: min..max bytes of UTF-8 without control characters.
func (v *violations) text(field, s string, min, max int) {
	if len(s) < min || len(s) > max {
		if min > 0 {
			v.add(field, "must be %d to %d bytes, got %d", min, max, len(s))
		} else {
			v.add(field, "must be at most %d bytes, got %d", max, len(s))
		}
		return
	}
	if !utf8.ValidString(s) {
		v.add(field, "must be valid UTF-8")
		return
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			v.add(field, "must not contain control characters")
			return
		}
	}
}

// multiline checks free text that may span lines (an observation's detail,
// a provider's answer): at most max bytes of UTF-8 whose only control
// characters are newline, carriage return and tab.
func (v *violations) multiline(field, s string, max int) {
	if len(s) > max || !utf8.ValidString(s) {
		v.add(field, "must be valid UTF-8 of at most %d bytes", max)
		return
	}
	for _, r := range s {
		if unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t' {
			v.add(field, "must not contain control characters other than newline and tab (found U+%04X)", r)
			return
		}
	}
}

// echo quotes a rejected value for an error message, cut to its first 32
// bytes: the message and the log line that carries it stay short whatever
// the request held.
func echo(s string) string {
	const keep = 32
	if len(s) <= keep {
		return strconv.Quote(s)
	}
	cut := keep
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// provider checks a provider name: [a-z0-9_-], 1..MaxProviderLen.
func (v *violations) provider(field, s string, required bool) {
	if s == "" && !required {
		return
	}
	if s == "" || len(s) > MaxProviderLen {
		v.add(field, "must be 1 to %d characters, got %d", MaxProviderLen, len(s))
		return
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			v.add(field, "must contain only a-z, 0-9, '_' and '-', got %s", echo(s))
			return
		}
	}
}

func (v *violations) time(field string, t time.Time) {
	if t.Before(minTime) || !t.Before(maxTime) {
		v.add(field, "must be between %s and %s, got %s",
			minTime.Format(time.DateOnly), maxTime.Format(time.DateOnly), t.UTC().Format(time.RFC3339Nano))
	}
}

// Valid returns the indexes of the requests of a batch that validate, and
// hands each one that does not to invalid with its error.
func Valid[T interface{ Validate() error }](reqs []T, invalid func(i int, err error)) []int {
	var valid []int
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			invalid(i, err)
		} else {
			valid = append(valid, i)
		}
	}
	return valid
}
