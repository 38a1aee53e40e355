package jobfence

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// specDefaults reads this SDK's real defaults, by their names in
// defaults.json: a Worker made with nothing but its id (and no spool), a
// Client without options, and the package's constants.
func specDefaults(t *testing.T) map[string]any {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///spec", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	w, err := NewWorker(NewClient(conn), HandlerFuncs{}, WorkerOptions{WorkerID: "spec", ReceiptSpool: ReceiptSpoolOff})
	if err != nil {
		t.Fatal(err)
	}
	cfg := newConfig(nil)
	pol := w.o.Policy.orDefaults()
	msOf := func(d time.Duration) any { return d.Milliseconds() }
	out := map[string]any{
		"worker.concurrency":          w.o.Concurrency,
		"worker.provider_timeout_ms":  msOf(w.o.ProviderTimeout),
		"worker.late_answer_grace_ms": msOf(w.o.LateAnswerGrace),
		"worker.poll_interval_ms":     msOf(w.o.PollInterval),
		"worker.claim_wait_ms":        msOf(w.o.ClaimWait),
		"worker.claim_backoff_ms":     msOf(w.o.ClaimBackoff),
		"worker.max_claim_backoff_ms": msOf(w.o.MaxClaimBackoff),
		"worker.drain_timeout_ms":     msOf(w.o.DrainTimeout),
		"worker.stream":               w.session != nil,
		"worker.renew_leases":         w.renewer != nil,
		"worker.observe_retry_for_ms": msOf(observeRetryFor),

		"renew.retry_divisor": renewRetryDivisor,
		"renew.max_batch":     MaxRenewBatch,

		"stream.heartbeat_ms":    msOf(streamHeartbeat),
		"stream.max_ack_grants":  maxAckGrants,
		"stream.acknowledges":    w.session != nil && w.session.start.GetAcknowledges(),
		"client.call_timeout_ms": msOf(cfg.callTimeout),
		"client.retry_attempts":  cfg.attempts,

		"client.retry_backoff_ms":     msOf(cfg.backoff),
		"client.retry_max_backoff_ms": msOf(cfg.maxBackoff),
		"keepalive.time_ms":           msOf(dialKeepalive.Time),
		"keepalive.timeout_ms":        msOf(dialKeepalive.Timeout),
		"keepalive.without_calls":     dialKeepalive.PermitWithoutStream,

		"spool.max_receipts":            MaxSpooledReceipts,
		"spool.max_bytes":               MaxReceiptSpoolBytes,
		"spool.refile_interval_ms":      msOf(ReceiptRefileInterval),
		"spool.refile_min_gap_ms":       msOf(refileMinGap),
		"spool.final_refile_timeout_ms": msOf(finalRefileTimeout),
		"spool.lock_wait_ms":            msOf(spoolLockWait),

		"policy.same_key_resend_safe":    w.o.Policy.SameKeyResendSafe,
		"policy.resend_margin_ms":        msOf(pol.ResendMargin),
		"policy.pending_delay_ms":        msOf(pol.PendingDelay),
		"policy.unknown_delay_ms":        msOf(pol.UnknownDelay),
		"policy.not_sent_delay_ms":       msOf(pol.NotSentDelay),
		"policy.max_reschedule_delay_ms": msOf(MaxRescheduleDelay),
	}
	// The renewal interval is drawn at random: its middle gives the
	// divisor of the lease, its spread the jitter.
	lease := 3 * time.Second
	lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
	for range 20000 {
		d := w.renewer.interval(lease)
		lo, hi = min(lo, d), max(hi, d)
	}
	mid := float64(lo+hi) / 2
	round := func(f float64) float64 { return math.Round(f*100) / 100 }
	out["renew.interval_divisor"] = round(float64(lease) / mid)
	out["renew.jitter"] = round(float64(hi-lo) / 2 / mid)
	return out
}

// runDefaultVector compares one default of defaults.json with this SDK's.
func runDefaultVector(t *testing.T, raw json.RawMessage) {
	var v vectorHead
	var want struct {
		Value json.RawMessage `json:"value"`
	}
	readVector(t, raw, &v, &want)
	if want.Value == nil {
		t.Fatal("a default without a value")
	}
	got, ok := specDefaults(t)[v.Name]
	if !ok {
		t.Fatalf("this SDK has no default named %s", v.Name)
	}
	// Compare as JSON values: numbers as numbers, whatever their Go type.
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var g, w any
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(want.Value, &w); err != nil {
		t.Fatal(err)
	}
	if g != w {
		t.Errorf("%s is %s here, want %s", v.Name, b, want.Value)
	}
}
