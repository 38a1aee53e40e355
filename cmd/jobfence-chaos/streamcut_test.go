package main

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// handBackCampaign is grantedCampaign with job 1's first grant handed back
// by the coordinator (its worker stream was cut before the grant went
// out): w1 was granted attempt 1 and never logged it, the coordinator
// rescheduled it in w1's name under its grant, w2 claimed attempt 2 and
// completed it.
func handBackCampaign() checkInput {
	in := grantedCampaign()
	k1 := in.Specs[0].Key
	for i := range in.DB.Events {
		if e := &in.DB.Events[i]; e.Kind != "enqueued" {
			e.WorkerID = "w1"
		}
	}
	handBack := eventRow{ID: 12, JobID: 1, Attempt: 1, Kind: "rescheduled", WorkerID: "w1", FromState: "running",
		ToState: "ready", NextAction: "refund", Grant: "aaaa00000001", Reason: "worker stream: the grant could not be sent"}
	reclaim := eventRow{ID: 13, JobID: 1, Attempt: 2, Kind: "claimed", WorkerID: "w2", FromState: "ready",
		ToState: "running", NextAction: "refund", Grant: "bbbb00000001"}
	done := eventRow{ID: 14, JobID: 1, Attempt: 2, Kind: "completed", WorkerID: "w2", FromState: "running",
		ToState: "succeeded", NextAction: "refund", ProviderRefundID: "re_1", Grant: "bbbb00000001"}
	in.DB.Events = append([]eventRow{in.DB.Events[0], in.DB.Events[1], handBack, reclaim, done}, in.DB.Events[3:]...)
	in.DB.Jobs[0].Attempt, in.DB.Ledger[0].Attempt = 2, 2
	in.Grants[0] = grantLog{Worker: "w2", Key: k1, JobID: 1, Attempt: 2, Grant: "bbbb00000001"}
	in.Acks[0] = ack{Worker: "w2", Key: k1, JobID: 1, Attempt: 2, Kind: "completed", Grant: "bbbb00000001"}
	return in
}

// A grant the coordinator could not deliver is handed back: a fenced
// Reschedule under the grant's attempt and token, in its holder's name, to
// ready with the grant's next action. It is a legitimate change of the job
// (invariants 3, 4, 7, 8), counted as handed_back; one that names another
// worker or changes the next action is not.
func TestCheckAcceptsAHandBackOfAGrantNotDelivered(t *testing.T) {
	v := check(handBackCampaign())
	if v.Failed() || v.HandedBack != 1 || v.StaleWritesAccepted != 0 {
		t.Fatalf("a hand-back judged: failed %v, handed_back=%d\n%s", failedInvariants(v), v.HandedBack, verdictText(v))
	}
	if line := v.summaryLine(1, 2, 0, "", 0); !strings.Contains(line, "false_takeovers=0 handed_back=1 ") {
		t.Errorf("summary line: %s", line)
	}
	if s := v.Invariants[7].Summary; !strings.Contains(s, "1 of them the coordinators' hand-backs of grants they could "+
		"not deliver, 0 of grants their holder had logged") {
		t.Errorf("invariant 8: %s", s)
	}

	// The claim abandoned by a long-polling caller is handed back alike.
	in := handBackCampaign()
	in.DB.Events[2].Reason = "claim abandoned by its caller before the answer"
	if v := check(in); v.Failed() || v.HandedBack != 1 {
		t.Fatalf("an abandoned claim's hand-back judged: failed %v, handed_back=%d\n%s", failedInvariants(v),
			v.HandedBack, verdictText(v))
	}

	// gRPC cannot rule out that a grant it handed to the transport just
	// before the cut reached the worker: listed, not failed (the hand-back
	// ended its token, R25).
	in = handBackCampaign()
	in.Grants = append(in.Grants, grantLog{Worker: "w1", Key: in.Specs[0].Key, JobID: 1, Attempt: 1, Grant: "aaaa00000001",
		Seen: time.Now()})
	v = check(in)
	if v.Failed() || !strings.Contains(verdictText(v), "hand-back 12 (\"worker stream: the grant could not be sent\") of "+
		"attempt 1, a grant w1 had logged") || !strings.Contains(v.Invariants[7].Summary, "1 of grants their holder had logged") {
		t.Fatalf("a hand-back of a grant its holder logged:\n%s", verdictText(v))
	}

	for name, edit := range map[string]func(e *eventRow){
		"in another worker's name": func(e *eventRow) { e.WorkerID = "w2" },
		"with another next action": func(e *eventRow) { e.NextAction = "reconcile" },
	} {
		in := handBackCampaign()
		edit(&in.DB.Events[2])
		v := check(in)
		if !slices.Equal(failedInvariants(v), []int{8}) || !strings.Contains(verdictText(v), "hand-back 12 (") {
			t.Errorf("a hand-back %s: failed %v\n%s", name, failedInvariants(v), verdictText(v))
		}
	}
	// A worker's own reschedule is no hand-back, whatever it names.
	in = handBackCampaign()
	in.DB.Events[2].Reason, in.DB.Events[2].WorkerID = "provider pending", "w2"
	if v := check(in); v.HandedBack != 0 || v.Invariants[7].Failed {
		t.Errorf("a worker's reschedule counted as a hand-back: handed_back=%d\n%s", v.HandedBack, verdictText(v))
	}
}

// The stream workers' lines: the Go SDK's "worker stream ended; opening it
// again" (warn, with the error), the Node.js and Python SDKs' alike (the
// Node one also at info, without an error, for a stream the coordinator
// ended cleanly), and the Node.js worker's write-back repeated after a cut
// (a call about a held grant that failed, as refundworker's "repeating
// call" of a write-back is). Lines the campaign does not know, or of
// unexpected shapes, are left out or read as naming their job, never a
// failure.
func TestParseWorkerLinesOfStreamWorkers(t *testing.T) {
	seen := time.Now()
	recs := []map[string]any{
		{"msg": "worker stream ended; opening it again", "worker_id": "chaos-w1", "backoff": 2e8,
			"error": "jobfence: Unavailable: error reading from server: EOF", seenKey: seen},
		{"msg": "worker stream ended; opening it again", "retry_in_ms": 400.0, "error": "14 UNAVAILABLE: Connection dropped",
			"code": 14.0, seenKey: seen},
		{"msg": "worker stream ended; opening it again", "retry_in_ms": 400.0, seenKey: seen},
		{"msg": "worker stream opened", "credits": 2.0},
		{"msg": "write-back repeated after UNAVAILABLE (R21)", "job_id": "8", "operation_key": "k8", "attempt": "3",
			"retry": 1.0, "error": "worker stream ended before the answer", seenKey: seen},
		{"msg": "a line nobody logs yet", "job_id": 7.0, "operation_key": "k7", "attempt": 2.0},
		{"msg": "a line nobody logs yet either"},
		{"msg": 42.0, "job_id": map[string]any{"x": 1.0}, "attempt": []any{"2"}},
		{},
	}
	want := []workerLine{
		streamEndedLine{Error: "jobfence: Unavailable: error reading from server: EOF", Seen: seen},
		streamEndedLine{Error: "14 UNAVAILABLE: Connection dropped", Seen: seen},
		streamEndedLine{Seen: seen},
		callFailedLine{jobRef: jobRef{Key: "k8", JobID: 8, Attempt: 3}, Seen: seen},
		keyLine{jobRef{Key: "k7", JobID: 7, Attempt: 2}},
	}
	if got := parseWorkerLines(recs); !slices.Equal(got, want) {
		t.Fatalf("stream workers' lines:\n got %+v\nwant %+v", got, want)
	}
	// Only the ends with an error are the stream's failures (a grant on its
	// way lost with it, invariant 10).
	var in checkInput
	in.addWorkerLog(logOf("chaos-node-w4", nodeWorker, false, recs))
	if got := in.StreamEnds["chaos-node-w4"]; len(got) != 2 {
		t.Errorf("stream ends read: %v, want the two with an error", got)
	}
}

// Invariant 10 after a stream cut: a holder that could not renew while its
// connections were cut, its log showing its renewals failing, is an
// explained takeover (R27), one whose log shows none is not; and a grant
// the holder never logged is lost with a stream that ended as it was made
// (R6), or else a grant its holder never learnt of (R7), both explained.
func TestCheckExcusesTakeoversAfterAStreamCut_R27(t *testing.T) {
	base := time.Now()
	s := func(d float64) time.Time { return base.Add(time.Duration(d * float64(time.Second))) }
	cut := func(replica string, from, to float64) func(in *checkInput) {
		return func(in *checkInput) {
			in.Takeovers.Outages = append(in.Takeovers.Outages, outage{What: string(faultCoordinatorStreamCut), N: 7,
				Replica: replica, From: s(from), To: s(to)})
		}
	}
	renewalsFailing := func(at ...float64) func(in *checkInput) {
		return func(in *checkInput) {
			for _, a := range at {
				in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
					{"msg": "jobfence: repeating call", "method": "RenewLeases", "try": 2.0, seenKey: s(a)},
				}))
			}
		}
	}
	streamEnded := func(at float64) func(in *checkInput) {
		return func(in *checkInput) {
			in.addWorkerLog(logOf("chaos-w1", goWorker, false, []map[string]any{
				{"msg": "worker stream ended; opening it again", "error": "EOF", seenKey: s(at)},
			}))
		}
	}
	neverLogged := func(in *checkInput) { in.Grants = nil }
	// The grant at 0 s, the takeover at 10 s, the lease 4 s.
	for _, c := range []struct {
		name  string
		edits []func(in *checkInput)
		false int
		why   string
	}{
		{"its connections cut, its renewals failing", []func(in *checkInput){cut("replica-a", 5, 6.5),
			renewalsFailing(5.5, 6.8, 7.2)}, 0, "stream-cut=1"},
		{"its connections cut, no renewal failing", []func(in *checkInput){cut("replica-a", 5, 6.5)}, 1, ""},
		{"its connections cut, only its stream ending", []func(in *checkInput){cut("replica-a", 5, 6.5),
			streamEnded(5)}, 1, ""},
		{"the other replica's connections cut", []func(in *checkInput){cut("replica-b", 5, 6.5),
			renewalsFailing(5.5, 6.8)}, 1, ""},
		{"a grant lost with its stream", []func(in *checkInput){neverLogged, streamEnded(0.2)}, 0,
			"grant-lost-with-stream-R6=1"},
		{"a grant never logged, the stream ending later", []func(in *checkInput){neverLogged, streamEnded(3)}, 0,
			"grant-unknown-R7=1"},
	} {
		in := takeoverCampaign(base)
		for _, edit := range c.edits {
			edit(&in)
		}
		v := check(in)
		if v.FalseTakeovers != c.false || (c.false > 0) != v.Invariants[9].Failed ||
			!strings.Contains(v.Invariants[9].Summary, c.why) {
			t.Errorf("%s: false_takeovers=%d, want %d (%s); failed %v\n%s", c.name, v.FalseTakeovers, c.false, c.why,
				failedInvariants(v), verdictText(v))
		}
	}
}

// coordinator-stream-cut has a lane per replica of its own: the other
// lanes' plans are what they were without it, each cut refuses new
// connections for 20 ms to 2 s, and at most one cue is drawn.
func TestPlanStreamCutLanes(t *testing.T) {
	all, _ := parseFaultKinds("all")
	coordinator, err := parseFaultKinds("coordinator")
	if err != nil || !coordinator[faultCoordinatorStreamCut] || !all[faultCoordinatorStreamCut] {
		t.Fatalf("coordinator-stream-cut is not in the coordinator group and all: %v %v", coordinator, err)
	}
	without := map[faultKind]bool{}
	for k := range all {
		if k != faultCoordinatorStreamCut {
			without[k] = true
		}
	}
	p := testParams(all)
	fs := plan(11, p)
	lanes := map[string]int{}
	for _, f := range fs {
		if f.Kind != faultCoordinatorStreamCut {
			continue
		}
		lanes[f.Target]++
		if f.For < 20*time.Millisecond || f.For > 2*time.Second || (f.AfterRefund && f.AtEnqueue) ||
			(f.Delay > 0) != (f.AfterRefund || f.AtEnqueue) || f.Target != replicaName(f.Slot)+workersTargetSuffix {
			t.Errorf("stream cut %+v", f)
		}
		if !strings.Contains(f.String(), replicaName(f.Slot)+"'s worker connections cut") ||
			!strings.Contains(f.String(), "new ones refused for") {
			t.Errorf("timeline line: %s", f)
		}
	}
	if lanes["replica-a-workers"] == 0 || lanes["replica-b-workers"] == 0 || len(lanes) != 2 {
		t.Errorf("stream cuts by lane in a one-minute plan: %v", lanes)
	}
	p.Kinds = without
	var before, after []fault
	for _, f := range plan(11, p) {
		f.N = 0
		before = append(before, f)
	}
	for _, f := range fs {
		if f.Kind != faultCoordinatorStreamCut {
			f.N = 0
			after = append(after, f)
		}
	}
	if !reflect.DeepEqual(before, after) {
		t.Error("adding the stream cuts changed the other lanes' faults")
	}
}

// A cut armed on a replica's enqueues fires on the producer's next enqueue
// through that replica, only once, and never blocks the producer.
func TestEnqueueCues(t *testing.T) {
	var c enqueueCues
	c.fire(0, "k0") // nothing armed: nothing happens
	done := make(chan string)
	go func() {
		key, _ := c.wait(context.Background(), 1, 5*time.Second)
		done <- key
	}()
	for {
		c.mu.Lock()
		armed := c.armed[1] != nil
		c.mu.Unlock()
		if armed {
			break
		}
		time.Sleep(time.Millisecond)
	}
	fired := make(chan struct{})
	go func() {
		c.fire(0, "k-other-replica")
		for _, k := range []string{"k1", "k2", "k3"} {
			c.fire(1, k)
		}
		close(fired)
	}()
	select {
	case <-fired:
	case <-time.After(time.Second):
		t.Fatal("the producer blocked on a cue")
	}
	if key := <-done; key != "k1" {
		t.Fatalf("the cue fired with %q, want k1", key)
	}
	if key, ok := c.wait(context.Background(), 1, 10*time.Millisecond); ok {
		t.Fatalf("a cue fired with %q with no enqueue after it was armed", key)
	}
}

func TestStreamCutSummary(t *testing.T) {
	var c streamCutTally
	if c.summary() != "" {
		t.Fatal("a summary without cuts")
	}
	c.add([]workerKind{goWorker, pythonWorker}, []bool{true, false}, "write-back replayed")
	c.add([]workerKind{goWorker}, []bool{true}, "grant handed back")
	c.add([]workerKind{goWorker}, []bool{false}, "")
	want := "worker streams cut: 3 cuts, 1 on a write-back in flight and 1 at an enqueue (what became of it: grant " +
		"handed back=1, write-back replayed=1); workers whose log showed their stream ending at a cut: Go 2 of 3, Python 0 of 1"
	if got := c.summary(); got != want {
		t.Errorf("summary:\n got %s\nwant %s", got, want)
	}
}
