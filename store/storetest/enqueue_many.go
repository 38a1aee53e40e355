package storetest

import (
	"errors"
	"testing"

	"github.com/jobfence/jobfence/store"
)

// testEnqueueManyEachOnItsOwn: one batch of enqueues mixes new keys, a key
// already stored, a key repeated in the batch with the same and with other
// values, and bad input; each is answered as Enqueue would answer it (R1).
func testEnqueueManyEachOnItsOwn(t *testing.T, s store.Store) {
	stored := enqueue(t, s, refund(t))
	storedParams := refund(t)
	storedParams.OperationKey = stored.OperationKey
	storedParams.OrderID, storedParams.PaymentID = stored.OrderID, stored.PaymentID

	a, b := refund(t), refund(t)
	aAgain := a
	aOther := a
	aOther.AmountMinor++
	bad := refund(t)
	bad.Currency = "euro"
	out := s.EnqueueMany(ctxFor(t), []store.EnqueueParams{a, storedParams, aAgain, b, aOther, bad})
	if len(out) != 6 {
		t.Fatalf("%d outcomes for 6 enqueues", len(out))
	}
	if out[0].Err != nil || !out[0].Created || out[0].Job.OperationKey != a.OperationKey {
		t.Fatalf("new key: %+v", out[0])
	}
	if out[1].Err != nil || out[1].Created || out[1].Job.ID != stored.ID {
		t.Fatalf("stored key: %+v, want job %d, not created", out[1], stored.ID)
	}
	if out[2].Err != nil || out[2].Created || out[2].Job.ID != out[0].Job.ID {
		t.Fatalf("key repeated in the batch: %+v, want job %d, not created", out[2], out[0].Job.ID)
	}
	if out[3].Err != nil || !out[3].Created || out[3].Job.ID == out[0].Job.ID {
		t.Fatalf("second new key: %+v", out[3])
	}
	if !errors.Is(out[4].Err, store.ErrKeyConflict) {
		t.Fatalf("repeated key with another amount: %v, want ErrKeyConflict", out[4].Err)
	}
	wantViolation(t, out[5].Err, "currency")
	for _, o := range []store.EnqueueOutcome{out[0], out[3]} {
		d := get(t, s, o.Job.ID)
		if d.Job != o.Job || len(d.Events) != 1 || d.Events[0].Kind != store.EventEnqueued {
			t.Fatalf("enqueued job answered\n %+v\nstored\n %+v with %d events", o.Job, d.Job, len(d.Events))
		}
	}
	if _, err := s.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{OperationKey: bad.OperationKey}}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("rejected enqueue left a job: %v", err)
	}
}
