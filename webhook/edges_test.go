package webhook_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/webhook"
)

// secretGlobex signs the webhooks of provider globex.
const secretGlobex = "whsec_globex_0123456789abcdef"

// unmatchedWith returns the unmatched-log entry of event id, failing when
// there is none.
func unmatchedWith(t *testing.T, e *endpoint, id string) store.UnmatchedEvent {
	t.Helper()
	got, _, err := e.st.Unmatched(ctxFor(t), store.MaxOverviewLimit)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range got {
		if u.ProviderEventID == id {
			return u
		}
	}
	t.Fatalf("event %s is not in the unmatched log: %+v", id, got)
	return store.UnmatchedEvent{}
}

// TestWebhookNeverMovesMoneyEarly_R28: a refund scheduled for next year is
// not brought forward by any webhook. Another provider's signed event naming
// its operation key, or the refund id of one of its refunds, touches
// nothing and is kept in the unmatched log saying why; its own provider's
// event for another amount likewise; its own provider's event for its
// amount is filed on it, and moves nothing, since the refund was never
// sent. Nothing here may make a claim hand it out.
func TestWebhookNeverMovesMoneyEarly_R28(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *endpoint) {
		future := enqueueAt(t, e.st, "wh-future", time.Now().Add(180*24*time.Hour))
		paid := enqueue(t, e.st, "wh-paid")
		c, err := e.st.Claim(ctxFor(t), store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: time.Minute})
		if err != nil || len(c) != 1 || c[0].Job.ID != paid.ID {
			t.Fatalf("claim = %+v, %v", c, err)
		}
		if _, err := e.st.Write(ctxFor(t), store.Writeback{Kind: store.EventCompleted, JobID: paid.ID,
			Attempt: c[0].Job.Attempt, LeaseToken: c[0].LeaseToken, ProviderRefundID: "re_acme_paid"}); err != nil {
			t.Fatal(err)
		}
		misdirected := strings.Replace(refundEvent("evt_globex_key", "refund.updated", "re_made_up", "failed", "wh-future"),
			`"amount":4250`, `"amount":1`, 1)
		byRefundID := refundEvent("evt_globex_refund", "refund.updated", "re_acme_paid", "failed", "no-such-key")
		misSized := strings.Replace(refundEvent("evt_acme_1", "refund.updated", "re_x", "succeeded", "wh-future"),
			`"amount":4250`, `"amount":1`, 1)
		otherCurrency := strings.Replace(refundEvent("evt_acme_usd", "refund.updated", "re_y", "succeeded", "wh-future"),
			`"currency":"eur"`, `"currency":"usd"`, 1)
		matching := refundEvent("evt_acme_ok", "refund.updated", "re_z", "succeeded", "wh-future")
		for _, d := range []struct{ provider, secret, body string }{
			{"globex", secretGlobex, misdirected}, {"globex", secretGlobex, byRefundID},
			{"acme", secretNew, misSized}, {"acme", secretNew, otherCurrency}, {"acme", secretNew, matching},
		} {
			if code, resp := e.deliver(t, d.provider, d.secret, time.Now(), d.body); code != http.StatusOK {
				t.Fatalf("delivery to %s: %d %s", d.provider, code, resp)
			}
		}
		if u := unmatchedWith(t, e, "evt_globex_key"); u.Provider != "globex" || !strings.Contains(u.Detail, "provider acme") {
			t.Fatalf("the misdirected event was kept as %+v, want globex's, saying the job is acme's", u)
		}
		if u := unmatchedWith(t, e, "evt_globex_refund"); u.Provider != "globex" || u.ProviderRefundID != "re_acme_paid" {
			t.Fatalf("the event naming acme's refund was kept as %+v", u)
		}
		for _, id := range []string{"evt_acme_1", "evt_acme_usd"} {
			if u := unmatchedWith(t, e, id); !strings.Contains(u.Detail, "job") || u.Provider != "acme" {
				t.Fatalf("the mis-sized event %s was kept as %+v", id, u)
			}
		}
		if obs := receipts(t, e.st, paid.ID); len(obs) != 0 {
			t.Fatalf("another provider's webhook filed %+v on acme's job", obs)
		}
		obs := receipts(t, e.st, future.ID)
		if len(obs) != 1 || obs[0].ProviderEventID != "evt_acme_ok" || obs[0].Reporter != "webhook:acme" {
			t.Fatalf("receipts of the scheduled refund: %+v, want only its own provider's matching one", obs)
		}
		d, err := e.st.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{ID: future.ID}})
		if err != nil || d.Job.State != store.StateReady || d.Job.NextAction != store.ActionRefund ||
			!d.Job.NextAttemptAt.Equal(future.NextAttemptAt) || len(d.Events) != 1 {
			t.Fatalf("the scheduled refund after the webhooks: %+v %v (%v), want it as it was: %+v", d.Job, d.Events, err, future)
		}
		if got, err := e.st.Claim(ctxFor(t), store.ClaimParams{WorkerID: "w", MaxJobs: 10, Lease: time.Minute}); err != nil ||
			len(got) != 0 {
			t.Fatalf("claim after the webhooks = %+v, %v; want nothing due", got, err)
		}
	})
}

// chargeRefunded is a charge.refunded event naming n refunds.
func chargeRefunded(id string, n int) string {
	refunds := make([]string, n)
	for i := range refunds {
		refunds[i] = fmt.Sprintf(`{"id":"re_many_%d","object":"refund","amount":100,"currency":"eur","status":"succeeded",`+
			`"metadata":{"operation_key":"many-%d"}}`, i, i)
	}
	return fmt.Sprintf(`{"id":%q,"object":"event","type":"charge.refunded","created":1780000000,"data":{"object":`+
		`{"object":"charge","refunds":{"data":[%s]}}},"request":{"id":"req_1"}}`, id, strings.Join(refunds, ","))
}

// TestWebhookDeliveryOfTooManyRefundsKeptWhole_R28: a delivery naming more
// refunds than one delivery may file is kept as one entry of the unmatched
// log, once however often it comes, and files nothing; one at the bound
// files each of its refunds.
func TestWebhookDeliveryOfTooManyRefundsKeptWhole_R28(t *testing.T) {
	e := startEndpoint(t, testdb.SQLiteBackend())
	job := enqueue(t, e.st, "many-0")
	for range 2 {
		if code, resp := e.deliver(t, "acme", secretNew, time.Now(), chargeRefunded("evt_many", webhook.MaxEventsPerDelivery+1)); code != http.StatusOK {
			t.Fatalf("delivery: %d %s", code, resp)
		}
	}
	got, total, err := e.st.Unmatched(ctxFor(t), 10)
	if err != nil || total != 1 || got[0].ProviderEventID != "evt_many" ||
		!strings.Contains(got[0].Detail, fmt.Sprintf("%d refunds", webhook.MaxEventsPerDelivery+1)) ||
		!strings.Contains(got[0].Detail, "re_many_0") {
		t.Fatalf("unmatched log: %+v (%d), %v; want the delivery kept whole, once", got, total, err)
	}
	if obs := receipts(t, e.st, job.ID); len(obs) != 0 {
		t.Fatalf("an oversized delivery filed %+v", obs)
	}
	if code, _ := e.deliver(t, "acme", secretNew, time.Now(), chargeRefunded("evt_bound", webhook.MaxEventsPerDelivery)); code != http.StatusOK {
		t.Fatalf("a delivery at the bound: %d", code)
	}
	if obs := receipts(t, e.st, job.ID); len(obs) != 0 {
		t.Fatalf("a 1.00 EUR receipt was filed on a 42.50 EUR job: %+v", obs)
	}
	if _, total, _ := e.st.Unmatched(ctxFor(t), 10); total != 1+webhook.MaxEventsPerDelivery {
		t.Fatalf("%d unmatched entries, want the kept delivery and one per refund at the bound", total)
	}
}
