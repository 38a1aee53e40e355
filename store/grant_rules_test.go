package store_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// rulesReady is a job enqueued and never claimed: attempt 0, next action
// refund, never sent.
func rulesReady() store.Job {
	return rulesWith(rulesHeld(), func(j *store.Job) {
		j.State, j.Attempt, j.LeaseUntil, j.WorkerID, j.FirstSentAt, j.Grant =
			store.StateReady, 0, time.Time{}, "", time.Time{}, store.TokenHash{}
	})
}

// R2, R5, R25: a claim bumps the attempt by one, takes the job for the lease
// from now, and mints a fresh token whose hash is on the row and the event.
func TestGrantBumpsTheAttemptAndMintsAToken_R2_R5_R25(t *testing.T) {
	p := store.ClaimParams{WorkerID: "worker-b", MaxJobs: 1, Lease: 30 * time.Second}
	before := rulesReady()
	c, e := p.Grant(before, rulesNow)

	if c.LeaseToken == "" || len(c.LeaseToken) != 22 {
		t.Fatalf("LeaseToken = %q, want a fresh 22-character token", c.LeaseToken)
	}
	if c.Job.Grant != c.LeaseToken.Hash() || c.Job.Grant.IsZero() {
		t.Fatalf("job's Grant %s is not the token's hash %s", c.Job.Grant.Fingerprint(), c.LeaseToken.Hash().Fingerprint())
	}
	want := rulesWith(before, func(j *store.Job) {
		j.State, j.Attempt, j.WorkerID, j.UpdatedAt, j.Grant = store.StateRunning, 1, "worker-b", rulesNow, c.LeaseToken.Hash()
		j.LeaseUntil = time.Date(2025, 3, 14, 9, 27, 23, 589793000, time.UTC) // now + 30 s, in microseconds
		j.NextAttemptAt = j.LeaseUntil                                        // due at its lease end (R6)
		j.FirstSentAt = rulesNow                                              // R22
	})
	if c.Job != want || c.Takeover {
		t.Fatalf("Grant =\n %+v (takeover %v)\nwant\n %+v", c.Job, c.Takeover, want)
	}
	wantEvent := store.Event{JobID: 7, Attempt: 1, Kind: store.EventClaimed, WorkerID: "worker-b",
		FromState: store.StateReady, ToState: store.StateRunning, NextAction: store.ActionRefund,
		CreatedAt: rulesNow, Grant: c.LeaseToken.Hash()}
	if e != wantEvent {
		t.Fatalf("claim event =\n %+v\nwant\n %+v", e, wantEvent)
	}

	// The attempt counts every claim, never resets (R2); every grant has
	// its own token.
	again := rulesWith(c.Job, func(j *store.Job) { j.State, j.LeaseUntil = store.StateReady, time.Time{} })
	c2, _ := p.Grant(again, rulesNow.Add(time.Minute))
	if c2.Job.Attempt != 2 || c2.LeaseToken == c.LeaseToken || c2.Job.Grant == c.Job.Grant {
		t.Fatalf("second claim: attempt %d, same token %v; want attempt 2 and a new token",
			c2.Job.Attempt, c2.LeaseToken == c.LeaseToken)
	}
	if !rulesComplete(2, c2.LeaseToken, "re_1").Fenced(c2.Job) {
		t.Fatal("the claimer's own write-back is not fenced by its grant")
	}
}

// R6, R8, R25: a takeover of an expired lease is the same bump, forces
// next_action reconcile, is recorded as taken_over, and from its moment on
// the previous holder cannot write.
func TestGrantTakeoverForcesReconcileAndFencesTheOldHolder_R6_R8_R25(t *testing.T) {
	expired := rulesWith(rulesHeld(), func(j *store.Job) { j.LeaseUntil = rulesNow.Add(-time.Second) })
	old := rulesComplete(3, rulesHolderTok, "re_1")
	if !old.Fenced(expired) {
		t.Fatal("the holder may write after its lease ran out while nobody took over (R8)")
	}
	c, e := store.ClaimParams{WorkerID: "worker-b", MaxJobs: 1, Lease: time.Minute}.Grant(expired, rulesNow)
	if !c.Takeover || e.Kind != store.EventTakenOver || e.FromState != store.StateRunning {
		t.Fatalf("takeover: Takeover %v, event %s from %s; want true, taken_over from running", c.Takeover, e.Kind, e.FromState)
	}
	if c.Job.Attempt != 4 || c.Job.NextAction != store.ActionReconcile || e.NextAction != store.ActionReconcile {
		t.Fatalf("takeover: attempt %d next_action %s (event %s), want 4 reconcile", c.Job.Attempt, c.Job.NextAction, e.NextAction)
	}
	if c.Job.Grant == expired.Grant || e.Grant != c.LeaseToken.Hash() || c.Job.WorkerID != "worker-b" {
		t.Fatalf("takeover: grant %s event grant %s worker %s; want a new grant on both and worker-b",
			c.Job.Grant.Fingerprint(), e.Grant.Fingerprint(), c.Job.WorkerID)
	}
	if !c.Job.FirstSentAt.Equal(expired.FirstSentAt) {
		t.Fatalf("takeover moved first_sent_at to %v (R22: the window belongs to the job)", c.Job.FirstSentAt)
	}
	if want := rulesNow.Add(time.Minute).Truncate(time.Microsecond); !c.Job.LeaseUntil.Equal(want) {
		t.Fatalf("takeover lease_until = %v, want %v (from now)", c.Job.LeaseUntil, want)
	}
	if old.Fenced(c.Job) {
		t.Fatal("the old holder's write is still fenced after the takeover")
	}
	if !rulesComplete(4, c.LeaseToken, "re_1").Fenced(c.Job) {
		t.Fatal("the new holder's write is not fenced")
	}
	if rulesComplete(4, rulesHolderTok, "re_1").Fenced(c.Job) {
		t.Fatal("the old holder's token with the new attempt is fenced: knowing the attempt must not suffice")
	}
}

// R22: first_sent_at is set by the first claim that may send the refund
// (next action refund), and by nothing else.
func TestGrantRecordsFirstSentAtOnlyOnAFirstRefundClaim_R22(t *testing.T) {
	earlier := rulesNow.Add(-3 * time.Hour)
	cases := []struct {
		name   string
		before store.Job
		want   time.Time
	}{
		{"first claim to refund", rulesReady(), rulesNow},
		{"first claim to reconcile", rulesWith(rulesReady(), func(j *store.Job) { j.NextAction = store.ActionReconcile }), time.Time{}},
		{"later claim to refund", rulesWith(rulesReady(), func(j *store.Job) { j.Attempt, j.FirstSentAt = 2, earlier }), earlier},
		{"takeover of a job never sent", rulesWith(rulesHeld(), func(j *store.Job) { j.FirstSentAt = time.Time{} }), time.Time{}},
		{"takeover of a job sent before", rulesWith(rulesHeld(), func(j *store.Job) { j.FirstSentAt = earlier }), earlier},
	}
	for _, c := range cases {
		got, _ := store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: time.Second}.Grant(c.before, rulesNow)
		if !got.Job.FirstSentAt.Equal(c.want) {
			t.Errorf("%s: first_sent_at = %v, want %v", c.name, got.Job.FirstSentAt, c.want)
		}
	}
}

// R25: a token is 128 bits from crypto/rand as 22 characters of unpadded
// base64url, and no two are alike.
func TestLeaseTokenIs128BitsOfBase64URL_R25(t *testing.T) {
	seen := map[store.LeaseToken]bool{}
	for range 1000 {
		tok := store.NewLeaseToken()
		if len(tok) != 22 {
			t.Fatalf("token %q has %d characters, want 22", tok, len(tok))
		}
		raw, err := base64.RawURLEncoding.DecodeString(string(tok))
		if err != nil || len(raw) != 16 {
			t.Fatalf("token %q decodes to %d bytes (%v), want 16", tok, len(raw), err)
		}
		if seen[tok] {
			t.Fatalf("token %q minted twice", tok)
		}
		seen[tok] = true
	}
}

// R25: the row keeps the token's SHA-256, zero for no token; its fingerprint
// names a grant in logs without letting anyone write.
func TestTokenHashIsTheTokensSHA256_R25(t *testing.T) {
	if h := store.LeaseToken("").Hash(); !h.IsZero() || h.Fingerprint() != "" {
		t.Fatalf("the empty token hashes to %x (fingerprint %q), want zero and \"\"", h, h.Fingerprint())
	}
	tok := store.LeaseToken("hOLDER-token_000000000")
	h := tok.Hash()
	if sum := sha256.Sum256([]byte(tok)); h != store.TokenHash(sum) || h.IsZero() {
		t.Fatalf("Hash = %x, want the SHA-256 of the token %x", h, sum)
	}
	if fp := h.Fingerprint(); fp != hex.EncodeToString(h[:6]) || len(fp) != 12 {
		t.Fatalf("Fingerprint = %q, want the first 6 bytes in hex", fp)
	}
	if store.LeaseToken("hOLDER-token_000000001").Hash() == h {
		t.Fatal("two tokens hash alike")
	}
}

// R25: the hash is stored as 32 bytes, or as the empty byte string (never
// NULL, which the fence's '=' never meets), and scans back.
func TestTokenHashValueAndScanRoundTrip_R25(t *testing.T) {
	for _, h := range []store.TokenHash{{}, store.LeaseToken("hOLDER-token_000000000").Hash()} {
		v, err := h.Value()
		if err != nil {
			t.Fatalf("Value: %v", err)
		}
		b, ok := v.([]byte)
		if !ok || b == nil {
			t.Fatalf("Value = %#v, want a non-nil []byte", v)
		}
		if h.IsZero() && len(b) != 0 || !h.IsZero() && !bytes.Equal(b, h[:]) {
			t.Fatalf("Value of %s = %x", h.Fingerprint(), b)
		}
		for _, src := range []any{b, string(b)} {
			var back store.TokenHash
			back[0] = 0xff // Scan must overwrite, also with zero
			if err := back.Scan(src); err != nil || back != h {
				t.Fatalf("Scan(%T %x) = %x, %v; want %x", src, b, back, err, h)
			}
		}
	}
	var h store.TokenHash
	if err := h.Scan(nil); err != nil || !h.IsZero() {
		t.Fatalf("Scan(nil) = %x, %v; want zero", h, err)
	}
	for _, bad := range []any{make([]byte, 16), make([]byte, 33), "short", 42} {
		if err := h.Scan(bad); err == nil {
			t.Errorf("Scan(%T of %v) accepted", bad, bad)
		}
	}
}
