package store_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/jobfence/jobfence/store"
)

// rulesHeldAs is job id running under attempt 1 of tok's grant.
func rulesHeldAs(id int64, tok store.LeaseToken) store.Job {
	return rulesWith(rulesHeld(), func(j *store.Job) {
		j.ID, j.OperationKey, j.Attempt, j.Grant = id, "refund-op-"+string(rune('a'+id)), 1, tok.Hash()
	})
}

func rulesOn(id int64, w store.Writeback) store.Writeback {
	w.JobID = id
	return w
}

// R9: a batch is planned as if its writes ran one after another, in order,
// each fenced against the row as the earlier ones left it.
func TestPlanBatchAppliesWritesInOrder_R9(t *testing.T) {
	tokA, tokB, tokC := store.LeaseToken("grant-of-job-one_00000"), store.LeaseToken("grant-of-job-two_00000"),
		store.LeaseToken("grant-of-job-three_000")
	current := map[int64]store.Job{1: rulesHeldAs(1, tokA), 2: rulesHeldAs(2, tokB), 3: rulesHeldAs(3, tokC)}
	snapshot := map[int64]store.Job{1: current[1], 2: current[2], 3: current[3]}
	ws := []store.Writeback{
		rulesOn(2, rulesReschedule(1, tokB, store.ActionReconcile)),
		rulesOn(1, rulesComplete(1, tokA, "re_1")),
		rulesOn(3, rulesComplete(1, rulesOtherTok, "re_3")), // a stale writer between two holders
		rulesOn(3, rulesEscalate(1, tokC)),
	}
	p := store.PlanBatch(ws, []int{0, 1, 2, 3}, current, rulesNow)

	if want := []int{0, 1, 3}; !slices.Equal(p.Apply, want) {
		t.Fatalf("Apply = %v, want %v", p.Apply, want)
	}
	for _, i := range p.Apply {
		before := snapshot[ws[i].JobID]
		if want := ws[i].Apply(before, rulesNow); p.After[i] != want {
			t.Errorf("After[%d] = %+v, want the row as its write leaves it %+v", i, p.After[i], want)
		}
		if o := p.Outcome(i); o.Err != nil || o.Result.Replayed || o.Result.Job != p.After[i] {
			t.Errorf("Outcome(%d) = %+v, want the written row, not a replay", i, o)
		}
	}
	if p.After[2] != snapshot[3] {
		t.Errorf("After[2] = %+v, want the row as it stood when the stale write came", p.After[2])
	}
	o := p.Outcome(2)
	var fe *store.FenceError
	if !errors.Is(o.Err, store.ErrStaleAttempt) || !errors.As(o.Err, &fe) || fe.Current != snapshot[3] {
		t.Fatalf("Outcome(2) = %+v, want ErrStaleAttempt carrying the job", o)
	}
	if len(p.Events) != 3 {
		t.Fatalf("%d events, want one per applied write", len(p.Events))
	}
	for k, i := range p.Apply {
		if e := p.Events[k]; e.JobID != ws[i].JobID || e.Kind != ws[i].Kind {
			t.Errorf("Events[%d] = job %d %s, want job %d %s (in Apply's order)", k, e.JobID, e.Kind, ws[i].JobID, ws[i].Kind)
		}
	}
	for id, j := range snapshot {
		if current[id] != j {
			t.Fatalf("PlanBatch changed the caller's row %d", id)
		}
	}
}

// R21: a job written twice in one batch is applied once; the repeat is
// settled against the row as the first write left it, as one call later.
func TestPlanBatchSettlesARepeatAgainstTheWrittenRow_R21(t *testing.T) {
	held := rulesHeld()
	complete := rulesComplete(3, rulesHolderTok, "re_1")
	cases := []struct {
		name      string
		ws        []store.Writeback
		wantApply []int
		wantErr   []error // per index; nil with replayed[i] for a replay
		replayed  []bool
	}{
		{"the same completion twice", []store.Writeback{complete, complete}, []int{0},
			[]error{nil, nil}, []bool{false, true}},
		{"a completion, then a reschedule of the same grant",
			[]store.Writeback{complete, rulesReschedule(3, rulesHolderTok, store.ActionReconcile)}, []int{0},
			[]error{nil, store.ErrNotRunning}, []bool{false, false}},
		{"a completion, then another completion of the same grant",
			[]store.Writeback{complete, rulesComplete(3, rulesHolderTok, "re_2")}, []int{0},
			[]error{nil, store.ErrNotRunning}, []bool{false, false}},
		{"a reschedule, then a completion", []store.Writeback{rulesReschedule(3, rulesHolderTok, store.ActionRefund), complete},
			[]int{0}, []error{nil, store.ErrNotRunning}, []bool{false, false}},
		{"an escalation three times", []store.Writeback{rulesEscalate(3, rulesHolderTok), rulesEscalate(3, rulesHolderTok),
			rulesEscalate(3, rulesHolderTok)}, []int{0}, []error{nil, nil, nil}, []bool{false, true, true}},
		{"a stale writer, then the holder", []store.Writeback{rulesComplete(3, rulesOtherTok, "re_x"), complete},
			[]int{1}, []error{store.ErrStaleAttempt, nil}, []bool{false, false}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			idx := make([]int, len(c.ws))
			for i := range idx {
				idx[i] = i
			}
			p := store.PlanBatch(c.ws, idx, map[int64]store.Job{7: held}, rulesNow)
			if !slices.Equal(p.Apply, c.wantApply) {
				t.Fatalf("Apply = %v, want %v: a job is written at most once per batch", p.Apply, c.wantApply)
			}
			if len(p.Events) != len(c.wantApply) {
				t.Fatalf("%d events for %d applied writes", len(p.Events), len(c.wantApply))
			}
			written := p.After[c.wantApply[0]]
			for i := range c.ws {
				o := p.Outcome(i)
				switch {
				case c.wantErr[i] != nil:
					if !errors.Is(o.Err, c.wantErr[i]) {
						t.Errorf("Outcome(%d) error = %v, want %v", i, o.Err, c.wantErr[i])
					}
				case o.Err != nil || o.Result.Replayed != c.replayed[i]:
					t.Errorf("Outcome(%d) = %+v, want replayed=%v", i, o, c.replayed[i])
				case o.Result.Job != written:
					t.Errorf("Outcome(%d) answers %+v, want the written row %+v", i, o.Result.Job, written)
				}
			}
		})
	}
}

// R10: a write for a job that is not there answers ErrNotFound, and the
// others of the batch are unaffected; indexes left out of idx (invalid
// requests) are not planned.
func TestPlanBatchAnswersNotFoundForAMissingJob_R10(t *testing.T) {
	ws := []store.Writeback{
		rulesOn(99, rulesComplete(3, rulesHolderTok, "re_1")),
		rulesComplete(3, rulesHolderTok, "re_1"),
		rulesOn(7, store.Writeback{}), // invalid: left out by the caller
	}
	p := store.PlanBatch(ws, []int{0, 1}, map[int64]store.Job{7: rulesHeld()}, rulesNow)
	if o := p.Outcome(0); !errors.Is(o.Err, store.ErrNotFound) || o.Result != (store.WriteResult{}) {
		t.Fatalf("Outcome of a missing job = %+v, want ErrNotFound", o)
	}
	if _, ok := p.After[0]; ok {
		t.Fatal("a missing job has an After row")
	}
	if !slices.Equal(p.Apply, []int{1}) || p.Outcome(1).Err != nil {
		t.Fatalf("Apply = %v, Outcome(1) = %+v: the other write must go through", p.Apply, p.Outcome(1))
	}
	if _, ok := p.After[2]; ok {
		t.Fatal("an index outside idx was planned")
	}
}

// R25, R3: the history of a batch names each writer's grant and actor.
func TestPlanBatchEventsCarryTheWritersGrantAndActor_R3_R25(t *testing.T) {
	tokA, tokB := store.LeaseToken("grant-of-job-one_00000"), store.LeaseToken("grant-of-job-two_00000")
	withActor := rulesOn(2, rulesComplete(1, tokB, "re_2"))
	withActor.Actor = "svc-refunds"
	ws := []store.Writeback{rulesOn(1, rulesEscalate(1, tokA)), withActor}
	current := map[int64]store.Job{1: rulesHeldAs(1, tokA), 2: rulesHeldAs(2, tokB)}
	p := store.PlanBatch(ws, []int{0, 1}, current, rulesNow)
	if len(p.Events) != 2 {
		t.Fatalf("%d events, want 2", len(p.Events))
	}
	want := []struct {
		grant  store.TokenHash
		worker string
	}{{tokA.Hash(), "worker-a"}, {tokB.Hash(), "svc-refunds"}}
	for k, e := range p.Events {
		if e.Grant != want[k].grant || e.WorkerID != want[k].worker || e.Attempt != 1 || !e.CreatedAt.Equal(rulesNow) {
			t.Errorf("Events[%d] = grant %s worker %q attempt %d at %v, want grant %s worker %q attempt 1 at now",
				k, e.Grant.Fingerprint(), e.WorkerID, e.Attempt, e.CreatedAt, want[k].grant.Fingerprint(), want[k].worker)
		}
	}
}

// R10: Applied picks the applied writes that need more than the row (the
// ledger), in order; JobIDs names the rows to lock, each once, in order.
func TestPlanBatchAppliedAndJobIDs_R10(t *testing.T) {
	ws := []store.Writeback{
		rulesOn(3, rulesComplete(3, rulesHolderTok, "re_3")),
		rulesOn(1, rulesReschedule(3, rulesHolderTok, store.ActionReconcile)),
		rulesOn(3, rulesComplete(3, rulesHolderTok, "re_3")), // a replay: not applied, not ledgered again
		rulesOn(2, rulesComplete(3, rulesHolderTok, "re_2")),
		rulesOn(4, rulesComplete(3, rulesOtherTok, "re_4")), // stale: never ledgered
	}
	if got := store.JobIDs(ws, []int{0, 1, 2, 3, 4}); !slices.Equal(got, []int64{3, 1, 2, 4}) {
		t.Fatalf("JobIDs = %v, want [3 1 2 4]", got)
	}
	if got := store.JobIDs(ws, []int{3, 2}); !slices.Equal(got, []int64{2, 3}) {
		t.Fatalf("JobIDs of [3 2] = %v, want [2 3]", got)
	}
	current := map[int64]store.Job{}
	for id := int64(1); id <= 4; id++ {
		current[id] = rulesWith(rulesHeld(), func(j *store.Job) { j.ID = id })
	}
	p := store.PlanBatch(ws, []int{0, 1, 2, 3, 4}, current, rulesNow)
	if got := p.Applied(store.Writeback.Ledgered); !slices.Equal(got, []int{0, 3}) {
		t.Fatalf("Applied(Ledgered) = %v, want [0 3]", got)
	}
	if got := p.Applied(func(store.Writeback) bool { return true }); !slices.Equal(got, p.Apply) {
		t.Fatalf("Applied(all) = %v, want Apply %v", got, p.Apply)
	}
	if o := p.Outcome(2); o.Err != nil || !o.Result.Replayed {
		t.Fatalf("Outcome(2) = %+v, want a replay", o)
	}
}
