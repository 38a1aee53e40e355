package store_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jobfence/jobfence/store"
)

// R24, R25: a lease token is validated for shape only (empty, or up to 64
// printable ASCII characters); whether it is the right one is the fence's
// business. Violations are named lease_token.
func TestValidateLeaseTokenShape_R24_R25(t *testing.T) {
	cases := []struct {
		name string
		tok  store.LeaseToken
		ok   bool
	}{
		{"none (a pre-token grant)", "", true},
		{"one this coordinator minted", store.NewLeaseToken(), true},
		{"64 characters", store.LeaseToken(strings.Repeat("a", store.MaxLeaseTokenLen)), true},
		{"a wrong but well-formed token", rulesOtherTok, true},
		{"65 characters", store.LeaseToken(strings.Repeat("a", store.MaxLeaseTokenLen+1)), false},
		{"60,000 characters", store.LeaseToken(strings.Repeat("a", 60000)), false},
		{"a space", "abc def", false},
		{"a NUL", "abc\x00def", false},
		{"a newline", "abcdef\n", false},
		{"DEL", "abc\x7f", false},
		{"non-ASCII", "tokén", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := store.Writeback{Kind: store.EventCompleted, JobID: 7, Attempt: 3, LeaseToken: c.tok, ProviderRefundID: "re_1"}
			o := store.ObservationParams{Job: store.JobRef{ID: 7}, Attempt: 3, LeaseToken: c.tok, Source: "worker-a",
				Outcome: store.OutcomeSucceeded}
			for _, err := range []error{w.Validate(), o.Validate()} {
				if c.ok {
					if err != nil {
						t.Fatalf("refused: %v", err)
					}
					continue
				}
				rulesOnlyField(t, err, "lease_token")
				if msg := err.Error(); len(msg) > 200 {
					t.Fatalf("message of %d bytes echoes the token: %.80q…", len(msg), msg)
				}
			}
		})
	}
}

// R25, R15: an observation's token proves the attempt it names; a token
// without an attempt proves nothing and is refused, as lease_token.
func TestValidateObservationTokenNeedsItsAttempt_R15_R25(t *testing.T) {
	o := store.ObservationParams{Job: store.JobRef{ID: 7}, LeaseToken: rulesHolderTok, Source: "webhook",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_1"}
	rulesOnlyField(t, o.Validate(), "lease_token")
	o.Attempt = 3
	if err := o.Validate(); err != nil {
		t.Fatalf("token with its attempt refused: %v", err)
	}
	o.LeaseToken = ""
	o.Attempt = 0
	if err := o.Validate(); err != nil {
		t.Fatalf("a receipt without token or attempt refused (R15 files it all the same): %v", err)
	}
	o.Attempt = -1
	rulesOnlyField(t, o.Validate(), "attempt")
}

// R15: an observation's detail may span lines (a provider's answer), but no
// other control character reaches the logs and consoles that show it.
func TestValidateObservationDetailIsMultilineText_R15(t *testing.T) {
	cases := []struct {
		name   string
		detail string
		ok     bool
	}{
		{"empty", "", true},
		{"lines, carriage returns and tabs", "HTTP 200\r\n{\n\t\"status\": \"succeeded\"\n}", true},
		{"non-ASCII text", "退款成功 — 已入帳", true},
		{"the limit", strings.Repeat("x", store.MaxDetailLen), true},
		{"NUL", "status\x00ok", false},
		{"ESC (terminal colours)", "\x1b[31mfailed\x1b[0m", false},
		{"bell", "ding\a", false},
		{"a C1 control", "next\u0085line", false},
		{"invalid UTF-8", "caf\xe9", false},
		{"over the limit", strings.Repeat("x", store.MaxDetailLen+1), false},
	}
	for _, c := range cases {
		o := store.ObservationParams{Job: store.JobRef{ID: 7}, Attempt: 3, Source: "worker-a",
			Outcome: store.OutcomeFailed, Detail: c.detail}
		err := o.Validate()
		if c.ok {
			if err != nil {
				t.Errorf("%s: refused: %v", c.name, err)
			}
			continue
		}
		t.Run(c.name, func(t *testing.T) { rulesOnlyField(t, err, "detail") })
	}
}

// R24: a rejected value is echoed cut short, so a 60,000-byte field cannot
// swell the error and the log line that carries it, and the cut never splits
// a character.
func TestValidateEchoesARejectedValueShort_R1_R24(t *testing.T) {
	for _, currency := range []string{strings.Repeat("A", 60000), strings.Repeat("€", 20000)} {
		p := store.EnqueueParams{OperationKey: "refund-op-7", OrderID: "order-1", PaymentID: "pay-1",
			AmountMinor: 1250, Currency: currency, Provider: "acme"}
		err := p.Validate()
		rulesOnlyField(t, err, "currency")
		d := err.(*store.ValidationError).Violations[0].Description
		if len(d) > 110 || !utf8.ValidString(d) || !strings.Contains(d, "60000 bytes") {
			t.Fatalf("currency description of %d bytes (valid UTF-8 %v): %q; want at most ~100 bytes naming the size",
				len(d), utf8.ValidString(d), d)
		}
	}
	p := store.EnqueueParams{OperationKey: "refund-op-7", OrderID: "order-1", PaymentID: "pay-1",
		AmountMinor: 1250, Currency: "eur", Provider: "acme"}
	rulesOnlyField(t, p.Validate(), "currency") // ISO 4217 codes are upper case
	p.Currency = "EUR"
	if err := p.Validate(); err != nil {
		t.Fatalf("a valid enqueue refused: %v", err)
	}
}

// R2, R9, R24, R29: spot checks that each write-back names the field it got
// wrong.
func TestValidateWritebackNamesTheField_R2_R9_R24_R29(t *testing.T) {
	ok := store.Writeback{Kind: store.EventRescheduled, JobID: 7, Attempt: 3, LeaseToken: rulesHolderTok,
		NextAction: store.ActionReconcile, Delay: time.Minute}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a valid reschedule refused: %v", err)
	}
	cases := []struct {
		name  string
		w     store.Writeback
		field string
	}{
		{"attempt 0 (never granted, R2)", rulesWith2(ok, func(w *store.Writeback) { w.Attempt = 0 }), "attempt"},
		{"no job", rulesWith2(ok, func(w *store.Writeback) { w.JobID = 0 }), "job_id"},
		{"unknown next action", rulesWith2(ok, func(w *store.Writeback) { w.NextAction = "resend" }), "next_action"},
		{"delay over 30 days", rulesWith2(ok, func(w *store.Writeback) { w.Delay = store.MaxDelay + time.Second }), "delay"},
		{"negative delay", rulesWith2(ok, func(w *store.Writeback) { w.Delay = -time.Second }), "delay"},
		{"next attempt in 1999", rulesWith2(ok, func(w *store.Writeback) {
			w.At = time.Date(1999, 12, 31, 0, 0, 0, 0, time.UTC)
		}), "next_attempt_at"},
		{"escalation without a reason", store.Writeback{Kind: store.EventEscalated, JobID: 7, Attempt: 3}, "reason"},
		{"completion without a refund id", store.Writeback{Kind: store.EventCompleted, JobID: 7, Attempt: 3}, "provider_refund_id"},
		{"resolution without an actor (R29)", store.Writeback{Kind: store.EventResolved, JobID: 7, Attempt: 3,
			Resolution: store.ResolutionReconcile, Reason: "again"}, "actor"},
		{"resolution without a note (R29)", store.Writeback{Kind: store.EventResolved, JobID: 7, Attempt: 3,
			Resolution: store.ResolutionReconcile, Actor: "alice@ops"}, "note"},
		{"reconcile with a refund id", store.Writeback{Kind: store.EventResolved, JobID: 7, Attempt: 3,
			Resolution: store.ResolutionReconcile, ProviderRefundID: "re_1", Reason: "n", Actor: "alice@ops"}, "provider_refund_id"},
		{"unknown kind", store.Writeback{Kind: store.EventClaimed, JobID: 7, Attempt: 3}, "kind"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { rulesOnlyField(t, c.w.Validate(), c.field) })
	}
}

// R15: a receipt is deduplicated by the provider's event id, else by who saw
// what under which attempt; its free-text detail does not count.
func TestObservationDedupeKeyIgnoresTheDetail_R15(t *testing.T) {
	o := store.ObservationParams{Attempt: 3, Source: "worker-a", Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_1",
		Detail: "at 09:26:53"}
	again := o
	again.Detail = "at 09:27:10"
	if o.DedupeKey(7) != again.DedupeKey(7) {
		t.Fatal("a repeated report with a new detail is filed twice")
	}
	if o.DedupeKey(7) == o.DedupeKey(8) {
		t.Fatal("the same report on two jobs deduplicates")
	}
	other := o
	other.Attempt = 4
	if o.DedupeKey(7) == other.DedupeKey(7) {
		t.Fatal("reports of two attempts deduplicate")
	}
	ev1, ev2 := o, other
	ev1.ProviderEventID, ev2.ProviderEventID = "evt_1", "evt_1"
	if ev1.DedupeKey(7) != ev2.DedupeKey(7) {
		t.Fatal("one provider event filed twice")
	}
	// Length-prefixed parts: shifting a separator makes another key.
	a := store.ObservationParams{Source: "ab", Outcome: "c"}
	b := store.ObservationParams{Source: "a", Outcome: "bc"}
	if a.DedupeKey(7) == b.DedupeKey(7) {
		t.Fatal("parts are not delimited in the dedupe key")
	}
}

// R1: an existing job is the same refund when order, payment, amount,
// currency and provider agree; the schedule does not count.
func TestSameRefundIgnoresTheSchedule_R1(t *testing.T) {
	job := rulesHeld()
	p := store.EnqueueParams{OperationKey: job.OperationKey, OrderID: job.OrderID, PaymentID: job.PaymentID,
		AmountMinor: job.AmountMinor, Currency: job.Currency, Provider: job.Provider, NotBefore: rulesNow.Add(time.Hour)}
	if !store.SameRefund(job, p) {
		t.Fatal("the same refund with another schedule is a conflict")
	}
	for name, change := range map[string]func(*store.EnqueueParams){
		"order":    func(p *store.EnqueueParams) { p.OrderID = "order-2" },
		"payment":  func(p *store.EnqueueParams) { p.PaymentID = "pay-2" },
		"amount":   func(p *store.EnqueueParams) { p.AmountMinor++ },
		"currency": func(p *store.EnqueueParams) { p.Currency = "USD" },
		"provider": func(p *store.EnqueueParams) { p.Provider = "other" },
	} {
		q := p
		change(&q)
		if store.SameRefund(job, q) {
			t.Errorf("another %s is the same refund", name)
		}
	}
}
