package main

import (
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// datedCampaign is campaign() with job 2 enqueued with a not_before: its
// claim came 2 ms after it on the database's clock and the provider made
// its refund 40 ms after it, as a refund that waited for its time is.
func datedCampaign() (checkInput, time.Time) {
	in := campaign()
	nb := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	k2 := in.Specs[1].Key
	in.Specs[1].NotBeforeIn = 20 * time.Second
	in.NotBefore = map[string]time.Time{k2: nb}
	for i := range in.DB.Events {
		if e := &in.DB.Events[i]; e.JobID == 2 {
			e.At = nb.Add(-20*time.Second + time.Duration(i)*time.Millisecond) // the enqueue
			if e.Kind != "enqueued" {
				e.At = nb.Add(time.Duration(i) * time.Millisecond)
			}
		}
	}
	in.Oracle.Refunds[1].Created = nb.Add(40 * time.Millisecond)
	return in, nb
}

func TestCheckPassesRefundsMadeAtOrAfterTheirNotBefore_R28(t *testing.T) {
	in, nb := datedCampaign()
	v := check(in)
	if v.Failed() || v.FutureDated != 1 || v.EarlyRefunds != 0 {
		t.Fatalf("a refund made after its not_before judged: future_dated=%d early_refunds=%d\n%s", v.FutureDated,
			v.EarlyRefunds, verdictText(v))
	}
	if got := v.Invariants[10].Summary; !strings.Contains(got, "1 refunds of them at the provider, 0 created before the "+
		"not_before (refunds made 40ms to 40ms after it") {
		t.Errorf("invariant 11: %s", got)
	}
	// At the not_before to the microsecond is not before it.
	in.Oracle.Refunds[1].Created = nb
	if v := check(in); v.Failed() {
		t.Fatalf("a refund made at its not_before judged:\n%s", verdictText(v))
	}
}

// R28: a receipt that made the job due early (another provider's, one for
// another amount) shows as a refund the provider made before the job's
// not_before, and as the claim that sent it.
func TestCheckFindsARefundMadeBeforeItsNotBefore_R28(t *testing.T) {
	in, nb := datedCampaign()
	in.Oracle.Refunds[1].Created = nb.Add(-18 * time.Second)
	v := check(in)
	if !v.Invariants[10].Failed || v.EarlyRefunds != 1 {
		t.Fatalf("a refund made 18s before its not_before passed: early_refunds=%d\n%s", v.EarlyRefunds, verdictText(v))
	}
	got := verdictText(v)
	for _, want := range []string{"EARLY REFUND: refund re_2 (succeeded, key " + in.Specs[1].Key + ", job 2) was " +
		"created " +
		"at the provider at 2026-12-05 02:59:42.000000, 18s before its job's not_before 2026-12-05 03:00:00.000000",
		"event 21 at 03:00:00.004000: claimed"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if line := v.summaryLine(1, 2, 0, "", 0); !strings.Contains(line, "future_dated=1 early_refunds=1") {
		t.Errorf("summary line: %s", line)
	}

	// The claim itself before the not_before, on the database's clock.
	in, nb = datedCampaign()
	in.DB.Events[4].At = nb.Add(-time.Microsecond)
	v = check(in)
	if !v.Invariants[10].Failed || v.EarlyRefunds != 1 ||
		!strings.Contains(verdictText(v), "CLAIMED BEFORE ITS NOT_BEFORE: job 2 ("+in.Specs[1].Key+"): event 21") {
		t.Fatalf("a claim a microsecond before the not_before passed:\n%s", verdictText(v))
	}
}

// beyondCampaign is campaign() with job 2 dated a year ahead: it stands
// as it was enqueued, ready under attempt 0, and the provider never heard
// of it.
func beyondCampaign() checkInput {
	in := campaign()
	k2 := in.Specs[1].Key
	nb := in.DB.Now.Add(futureBeyond).Truncate(time.Microsecond)
	in.Specs[1].NotBeforeIn, in.Specs[1].Beyond = futureBeyond, true
	in.NotBefore = map[string]time.Time{k2: nb}
	in.DB.Jobs[1] = jobRow{ID: 2, Key: k2, State: "ready", NextAction: "refund", NextAttemptAt: nb}
	in.DB.Events = in.DB.Events[:4]
	in.DB.Ledger = in.DB.Ledger[:1]
	in.Oracle.Refunds = in.Oracle.Refunds[:1]
	in.Oracle.Operations = in.Oracle.Operations[:1]
	return in
}

func TestCheckAcceptsAJobDatedBeyondTheCampaignAsNotDue_R28(t *testing.T) {
	v := check(beyondCampaign())
	if v.Failed() || v.Lost != 0 {
		t.Fatalf("a job dated beyond the campaign, as enqueued, judged: lost=%d\n%s", v.Lost, verdictText(v))
	}
	if got := v.Invariants[1].Summary; !strings.Contains(got,
		"1 dated beyond the campaign (ready, not due: invariant 11), 0 missing, 0 not final") {
		t.Errorf("invariant 2: %s", got)
	}
	if got := v.Invariants[10].Summary; !strings.Contains(got, "1 of the 1 dated beyond the campaign as enqueued") {
		t.Errorf("invariant 11: %s", got)
	}
}

func TestCheckFindsAJobDatedBeyondTheCampaignTouched_R28(t *testing.T) {
	k2 := beyondCampaign().Specs[1].Key
	for name, c := range map[string]struct {
		change func(in *checkInput)
		want   string
	}{
		"refunded": {func(in *checkInput) {
			in.Oracle.Refunds = append(in.Oracle.Refunds, fakeprovider.Refund{ID: "re_2", MerchantReference: k2,
				Status: fakeprovider.StatusSucceeded, Created: in.DB.Now})
		}, "EARLY REFUND: refund re_2"},
		"refunded, the history clean": {func(in *checkInput) {
			in.Oracle.Refunds = append(in.Oracle.Refunds, fakeprovider.Refund{ID: "re_2", MerchantReference: k2,
				Status: fakeprovider.StatusSucceeded, Created: in.NotBefore[k2].Add(-futureBeyond + time.Second)})
		}, "364d23h59m59s before its job's not_before"},
		"expedited": {func(in *checkInput) {
			in.DB.Jobs[1].NextAttemptAt, in.DB.Jobs[1].NextAction = in.DB.Now, "reconcile"
			in.DB.Events = append(in.DB.Events, eventRow{ID: 21, JobID: 2, Kind: "expedited",
				WorkerID: "webhook:" + otherProviderName, FromState: "ready", ToState: "ready", NextAction: "reconcile",
				At: in.DB.Now})
		}, "EXPEDITED BEFORE ITS NOT_BEFORE: job 2"},
		"claimed": {func(in *checkInput) {
			in.DB.Jobs[1].State, in.DB.Jobs[1].Attempt = "running", 1
			in.DB.Jobs[1].FirstSentAt.Time, in.DB.Jobs[1].FirstSentAt.Valid = in.DB.Now, true
			in.DB.Events = append(in.DB.Events, eventRow{ID: 21, JobID: 2, Attempt: 1, Kind: "claimed", FromState: "ready",
				ToState: "running", NextAction: "refund", At: in.DB.Now})
		}, "TOUCHED: job 2 (" + k2 + "), dated beyond the campaign"},
	} {
		in := beyondCampaign()
		c.change(&in)
		v := check(in)
		if !v.Invariants[10].Failed || !strings.Contains(verdictText(v), c.want) {
			t.Errorf("%s: passed, or without %q:\n%s", name, c.want, verdictText(v))
		}
	}
}

// forgedCampaign is webhookCampaign() with the forger's events: one signed
// by the other provider, naming job 2's key, and one signed by the job's
// own provider for another amount, each answered 2xx and kept in the
// unmatched log under its signer; and one no coordinator answered.
func forgedCampaign() checkInput {
	in := webhookCampaign()
	k2 := in.Specs[1].Key
	at := time.Now()
	in.Forger = true
	in.Forged = []forgedEvent{
		{ID: "evt_forged_000001", Kind: forgedOtherProvider, Provider: otherProviderName, Type: "refund.updated",
			Key: k2, RefundID: "re_forged_000001", Outcome: "succeeded", AmountMinor: 537, Currency: "EUR", SentAt: at,
			Attempts: 1, Status: 200, StoredAt: at},
		{ID: "evt_forged_000002:re_forged_000002", Kind: forgedAmount, Provider: providerName, Type: "charge.refunded",
			Key: k2, RefundID: "re_forged_000002", Outcome: "succeeded", AmountMinor: 900, Currency: "EUR", SentAt: at,
			Attempts: 2, Status: 200, StoredAt: at},
		{ID: "evt_forged_000003", Kind: forgedCurrency, Provider: providerName, Type: "refund.failed", Key: k2,
			RefundID: "re_forged_000003", Outcome: "failed", AmountMinor: 537, Currency: "USD", SentAt: at, Attempts: 6},
	}
	in.DB.Unmatched = []unmatchedRow{
		{ID: 1, Provider: otherProviderName, ProviderEventID: "evt_forged_000001", EventType: "refund.updated",
			ProviderRefundID: "re_forged_000001", Key: k2, Outcome: "succeeded"},
		{ID: 2, Provider: providerName, ProviderEventID: "evt_forged_000002:re_forged_000002", EventType: "charge.refunded",
			ProviderRefundID: "re_forged_000002", Key: k2, Outcome: "succeeded"},
	}
	return in
}

func TestCheckPassesForgedWebhooksKeptInTheUnmatchedLog_R28(t *testing.T) {
	v := check(forgedCampaign())
	if v.Failed() || v.ForgedWebhooks != 3 || v.ForgedFiled != 0 {
		t.Fatalf("forged events kept apart judged: forged_webhooks=%d forged_filed=%d\n%s", v.ForgedWebhooks, v.ForgedFiled,
			verdictText(v))
	}
	if got := v.Invariants[10].Summary; !strings.Contains(got, "forged webhooks: 3 sent (0 while their job's not_before "+
		"was ahead), 2 answered 2xx, 2 in the unmatched log under the provider that signed them, 0 filed on a job, 1 never "+
		"answered 2xx") {
		t.Errorf("invariant 11: %s", got)
	}
	if got := v.Invariants[8].Summary; !strings.Contains(got,
		"0 events in the unmatched log (and 2 forged ones, invariant 11)") {
		t.Errorf("invariant 9: %s", got)
	}
}

// R28: a webhook of provider P touches only P's jobs, and a receipt for
// another amount moves nothing; one filed on a job, one answered and not
// kept, one refused, and one kept under another provider all fail.
func TestCheckFindsAForgedWebhookFiledOrDropped_R28(t *testing.T) {
	in := forgedCampaign()
	in.DB.Unmatched = in.DB.Unmatched[1:]
	in.DB.Observations = append(in.DB.Observations, observationRow{ID: 9, JobID: 2, Key: in.Specs[1].Key,
		Source: "webhook:" + otherProviderName, Outcome: "succeeded", ProviderRefundID: "re_forged_000001",
		ProviderEventID: "evt_forged_000001"})
	v := check(in)
	if !v.Invariants[10].Failed || v.ForgedFiled != 1 || !strings.Contains(verdictText(v),
		"FORGED RECEIPT FILED: forged event evt_forged_000001 (other-provider-own-amount, globex signed") {
		t.Fatalf("a forged event filed on its job passed: forged_filed=%d\n%s", v.ForgedFiled, verdictText(v))
	}
	if v.Invariants[8].Failed {
		t.Errorf("invariant 9 judged a forged event, which is 11's:\n%s", verdictText(v))
	}

	for name, c := range map[string]struct {
		change func(in *checkInput)
		want   string
	}{
		"dropped": {func(in *checkInput) { in.DB.Unmatched = in.DB.Unmatched[1:] },
			"FORGED EVENT NOT KEPT: forged event evt_forged_000001"},
		"refused": {func(in *checkInput) { in.Forged[2].Status = 400 },
			"FORGED EVENT REFUSED: forged event evt_forged_000003"},
		"as another's": {func(in *checkInput) { in.DB.Unmatched[1].Provider = otherProviderName },
			"FORGED EVENT KEPT AS ANOTHER'S"},
		"none sent": {func(in *checkInput) { in.Forged, in.DB.Unmatched = nil, nil }, "the forger sent no event"},
	} {
		in := forgedCampaign()
		c.change(&in)
		if v := check(in); !v.Invariants[10].Failed || !strings.Contains(verdictText(v), c.want) {
			t.Errorf("%s: passed, or without %q:\n%s", name, c.want, verdictText(v))
		}
	}
}

// After an async failover a forged event answered before the repoint may
// have been kept by the old primary only.
func TestCheckForgedEventsKeptByTheOldPrimaryOnly_R26(t *testing.T) {
	in := forgedCampaign()
	in.DB.Unmatched = in.DB.Unmatched[1:]
	in.Failover = asyncFailover(in.Forged[0].StoredAt.Add(-5 * time.Second)) // repointed 6s after it was answered
	if v := check(in); v.Invariants[10].Failed {
		t.Fatalf("a forged event answered before an async failover's repoint judged lost:\n%s", verdictText(v))
	}
	in.Failover = asyncFailover(in.Forged[0].StoredAt.Add(-time.Minute))
	if v := check(in); !v.Invariants[10].Failed {
		t.Fatalf("a forged event answered after the repoint and not kept passed:\n%s", verdictText(v))
	}
}

func TestDateSomeInTheFuture(t *testing.T) {
	const window, spread = 60 * time.Second, 48 * time.Second
	specs := refundSpecs(3, 1000)
	soon, beyond := dateSomeInTheFuture(3, specs, 0.1, spread, window)
	if soon+beyond < 70 || soon+beyond > 130 || soon < 30 || beyond < 30 {
		t.Fatalf("a share of 0.1 of 1000 dated %d soon and %d beyond", soon, beyond)
	}
	again := refundSpecs(3, 1000)
	if s2, b2 := dateSomeInTheFuture(3, again, 0.1, spread, window); s2 != soon || b2 != beyond {
		t.Fatalf("the same seed dated %d and %d, then %d and %d", soon, beyond, s2, b2)
	}
	for i, sp := range specs {
		if sp != again[i] {
			t.Fatalf("spec %d: %+v, then %+v", i, sp, again[i])
		}
		at := spread * time.Duration(i) / time.Duration(len(specs))
		switch {
		case sp.Beyond && sp.NotBeforeIn != futureBeyond:
			t.Errorf("spec %d beyond the campaign is due in %s", i, sp.NotBeforeIn)
		case !sp.Beyond && sp.NotBeforeIn != 0 && (sp.NotBeforeIn < futureSoonMin || at+sp.NotBeforeIn > window*9/10):
			t.Errorf("spec %d, enqueued at %s, is due %s later: not within the window", i, at, sp.NotBeforeIn)
		}
	}
	if s, b := dateSomeInTheFuture(3, refundSpecs(3, 100), 0, spread, window); s+b != 0 {
		t.Errorf("a share of 0 dated %d", s+b)
	}
	// A short window scales the delays down.
	short := refundSpecs(4, 200)
	dateSomeInTheFuture(4, short, 0.5, 8*time.Second, 10*time.Second)
	for i, sp := range short {
		if !sp.Beyond && sp.NotBeforeIn > 5*time.Second {
			t.Errorf("spec %d in a 10s window is due %s after its enqueue", i, sp.NotBeforeIn)
		}
	}
}
