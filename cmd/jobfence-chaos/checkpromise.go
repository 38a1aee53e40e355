package main

// The promise itself, on the provider's records and the database: every
// refund at most once per operation key (invariant 1), and every enqueued
// job present and final (invariant 2).

import (
	"fmt"
	"slices"
	"strings"

	"github.com/jobfence/jobfence/fakeprovider"
)

// liveRefunds are the provider's refunds of an operation key that did not
// fail (pending or succeeded).
func liveRefunds(o fakeprovider.OracleReport, key string) []fakeprovider.Refund {
	op, _ := o.Operation(key)
	var out []fakeprovider.Refund
	for _, r := range o.Refunds {
		if slices.Contains(op.RefundIDs, r.ID) && r.Status != fakeprovider.StatusFailed {
			out = append(out, r)
		}
	}
	return out
}

// checkOncePerKey is invariant 1, the promise itself (R1, R14, R16, T3), on
// the provider's own records: no operation with more than one live refund,
// more than one reference or more than one key, no payment refunded beyond
// its amount, no refund for a key the campaign never enqueued, and the
// oracle's double_refunds 0. doubleRefunds is the larger of the oracle's
// count and the operations found doubled.
func checkOncePerKey(o fakeprovider.OracleReport, x *checkFacts) (i1 *invariant, doubleRefunds int) {
	i1 = &invariant{N: 1, Name: "every refund happened at most once per operation key (R1, R14, T3)"}
	dups := 0
	for _, op := range o.Operations {
		if _, ours := x.specByKey[op.MerchantReference]; !ours {
			i1.fail("operation %q at the provider is not one of the campaign's refunds", op.MerchantReference)
		}
		if op.Refunds > 1 || len(op.MerchantReferences) > 1 || len(op.IdempotencyKeys) > 1 {
			dups++
			i1.fail("operation %s: %d live refunds %v (references %v, keys %v)%s", op.MerchantReference, op.Refunds,
				op.RefundIDs, op.MerchantReferences, op.IdempotencyKeys, x.historyOf(x.jobByKey[op.MerchantReference]))
		}
	}
	for _, p := range o.Payments {
		if p.OverRefunded {
			i1.fail("payment %s over-refunded: %d of %d minor units in %v", p.PaymentID, p.RefundedMinor, p.AmountMinor, p.RefundIDs)
		}
	}
	if o.DoubleRefunds > 0 {
		i1.Failed = true
	}
	i1.Summary = fmt.Sprintf("%d refunds at the provider for %d operations; oracle double_refunds=%d",
		len(o.Refunds), len(o.Operations), o.DoubleRefunds)
	return i1, max(o.DoubleRefunds, dups)
}

// jobTally is how the jobs ended, for the verdict.
type jobTally struct {
	Succeeded, Review int
	Cancelled         int // cancelled (R32): never sent, or resolved so by a person
	Pending           int // unfinished, but the provider still says pending (R4)
	NotDue            int // dated beyond the campaign, ready, not due
	Lost              int // acknowledged and missing, or unfinished without a pending refund
	EnqueuesLost      int // acknowledged enqueues the failover lost (re-driven)
}

// checkPresentAndFinal is invariant 2, the other half of the promise:
// nothing dropped, nothing stuck. Every acknowledged enqueue has its row
// under its acknowledged id, every row is a refund the campaign enqueued,
// and every row is final (succeeded, manual_review or, cancelled by the
// canceller, cancelled, R32) or legitimately
// pending: the provider still reports its refund pending (R4), counted and
// listed apart; or dated beyond the campaign, still ready under attempt 0
// and not due (invariant 11 holds it to what it was enqueued as), counted
// apart. After a failover the acknowledged enqueues it lost are
// counted (re-driven by the producer, so they are among the acknowledged
// above); a lossless (semi-sync) failover must lose none.
func checkPresentAndFinal(acked map[string]int64, db dbState, o fakeprovider.OracleReport, fo *failoverInput,
	enqueuesLost []string, x *checkFacts) (i2 *invariant, t jobTally) {
	i2 = &invariant{N: 2, Name: "every enqueued job is present and final (succeeded, manual_review or cancelled), or " +
		"dated beyond the campaign and not due"}
	unacked, archived := 0, 0
	for _, j := range db.Jobs {
		if j.ArchivedAt.Valid {
			archived++
		}
		if _, ours := x.specByKey[j.Key]; !ours {
			i2.fail("job %d has operation key %q, which the campaign never enqueued", j.ID, j.Key)
		}
		if _, ok := acked[j.Key]; !ok {
			unacked++
		}
	}
	missing := 0
	for key, id := range acked {
		j, ok := x.jobByKey[key]
		switch {
		case !ok:
			missing++
			i2.fail("LOST: job %d (%s) was enqueued and acknowledged but is neither in refund_jobs nor in its archive", id,
				key)
		case j.ID != id:
			i2.fail("job for %s: acknowledged as %d, stored as %d", key, id, j.ID)
		}
	}
	unfinished := 0
	for _, j := range db.Jobs {
		switch j.State {
		case "succeeded":
			t.Succeeded++
			continue
		case "manual_review":
			t.Review++
			continue
		case "cancelled":
			t.Cancelled++
			continue
		}
		if x.specByKey[j.Key].Beyond && j.State == "ready" && j.Attempt == 0 && j.NextAttemptAt.After(db.Now) {
			t.NotDue++
			continue
		}
		unfinished++
		refunds := liveRefunds(o, j.Key)
		pendingAtProvider := slices.ContainsFunc(refunds, func(r fakeprovider.Refund) bool { return r.Status == fakeprovider.StatusPending })
		desc := fmt.Sprintf("job %d (%s) is %s, next_action %s at %s, lease_until %s, last reason %q; provider: %s%s",
			j.ID, j.Key, j.State, j.NextAction, j.NextAttemptAt.Format("15:04:05.000"), nullTime(j.LeaseUntil),
			j.LastReason, describeRefunds(refunds), x.historyOf(j))
		if pendingAtProvider {
			t.Pending++
			i2.note("pending (R4, the provider still says pending): %s", desc)
		} else {
			i2.fail("NOT FINAL: %s", desc)
		}
	}
	t.Lost = missing + unfinished - t.Pending
	i2.Summary = fmt.Sprintf("%d acknowledged, %d rows (%d of them archived, %d enqueued without acknowledgement); %d "+
		"succeeded, %d manual_review, %d cancelled, %d legitimately pending, %d dated beyond the campaign (ready, not "+
		"due: invariant 11), %d missing, %d not final", len(acked), len(db.Jobs), archived, unacked, t.Succeeded,
		t.Review, t.Cancelled, t.Pending, t.NotDue, missing, unfinished-t.Pending)
	if fo != nil {
		// Acknowledged enqueues the old primary committed last are gone with
		// it; the producer enqueued every acknowledged one again (R1), so
		// they are above among the acknowledged, present and final.
		t.EnqueuesLost = len(enqueuesLost)
		i2.Summary += fmt.Sprintf("; %d acknowledged enqueues lost in the failover and re-driven", t.EnqueuesLost)
		for _, k := range enqueuesLost {
			if fo.lossless() {
				i2.fail("LOST IN A LOSSLESS FAILOVER: the acknowledged enqueue of %s was not on the new primary", k)
			} else {
				i2.note("enqueue of %s lost in the failover (acknowledged by the old primary), re-driven", k)
			}
		}
	}
	return i2, t
}

func describeRefunds(rs []fakeprovider.Refund) string {
	if len(rs) == 0 {
		return "no live refund"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.ID + " " + string(r.Status)
	}
	return strings.Join(parts, ", ")
}
