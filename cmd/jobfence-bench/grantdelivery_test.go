package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestGrantDeliveryMatchesGrantsToEnqueues: scenario H's delivery runs from
// a job's enqueue to the first WorkGrant read that carries it, matched by
// operation key whatever the order and grouping of the grants.
func TestGrantDeliveryMatchesGrantsToEnqueues(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tr := newGrantTracker()
	tr.sent("grant-0000000", at(0))
	tr.sent("grant-0000001", at(5))
	tr.sent("grant-0000002", at(10))
	// Job 1 reaches worker 3 first; jobs 0 and 2 come together to worker 7,
	// job 2 at its second attempt (its first grant was handed back unsent).
	if err := tr.grant(3, at(8), grantedJob{key: "grant-0000001", id: 11, attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if err := tr.grant(7, at(14), grantedJob{key: "grant-0000000", id: 10, attempt: 1},
		grantedJob{key: "grant-0000002", id: 12, attempt: 2}); err != nil {
		t.Fatal(err)
	}
	want := latencies{3 * time.Millisecond, 14 * time.Millisecond, 4 * time.Millisecond}
	if !slices.Equal(tr.delivery, want) {
		t.Errorf("delivery %v, want %v", tr.delivery, want)
	}
	if tr.granted != 3 || tr.later != 1 || tr.grants != 2 || tr.takeovers != 0 {
		t.Errorf("granted %d, later %d, grants %d, takeovers %d; want 3, 1, 2, 0", tr.granted, tr.later, tr.grants, tr.takeovers)
	}
	if first, last := tr.sendSpan(); !first.Equal(at(0)) || !last.Equal(at(10)) {
		t.Errorf("send span %v..%v", first, last)
	}
	tr.complete("grant-0000001", at(108), at(111))
	tr.complete("grant-0000001", at(108), at(112)) // a second answer counts once
	if !slices.Equal(tr.e2e, latencies{106 * time.Millisecond}) || tr.finished != 1 {
		t.Errorf("e2e %v, finished %d", tr.e2e, tr.finished)
	}
}

// TestGrantTwiceWithoutTakeoverFails: the streams of scenario H live through
// the run, so a job granted again is a functional failure unless the
// coordinator took it over (R6); a job the run did not enqueue is one too.
func TestGrantTwiceWithoutTakeoverFails(t *testing.T) {
	now := time.Unix(1000, 0)
	tr := newGrantTracker()
	tr.sent("grant-0000000", now)
	tr.sent("grant-0000001", now)
	if err := tr.grant(0, now, grantedJob{key: "grant-0000000", id: 10, attempt: 1}); err != nil {
		t.Fatal(err)
	}
	err := tr.grant(1, now, grantedJob{key: "grant-0000000", id: 10, attempt: 2})
	if err == nil || !strings.Contains(err.Error(), "granted twice without a takeover") {
		t.Errorf("second grant without a takeover: %v", err)
	}
	if err := tr.grant(1, now, grantedJob{key: "grant-0000000", id: 10, attempt: 3, takeover: true}); err != nil {
		t.Errorf("takeover: %v", err)
	}
	if tr.takeovers != 1 || tr.granted != 1 || len(tr.delivery) != 1 {
		t.Errorf("takeovers %d, granted %d, deliveries %d; want 1, 1, 1", tr.takeovers, tr.granted, len(tr.delivery))
	}
	if err := tr.grant(0, now, grantedJob{key: "due-00001", id: 5, attempt: 1}); err == nil ||
		!strings.Contains(err.Error(), "did not enqueue") {
		t.Errorf("a job the run did not enqueue: %v", err)
	}
}

// TestGrantStallNamesJobsNeverGranted: a run fails when no job completes for
// the stall time, naming the jobs never granted apart from those granted and
// never completed.
func TestGrantStallNamesJobsNeverGranted(t *testing.T) {
	now := time.Unix(1000, 0)
	tr := newGrantTracker()
	for _, k := range []string{"grant-0000000", "grant-0000001", "grant-0000002"} {
		tr.sent(k, now)
	}
	if err := tr.grant(0, now, grantedJob{key: "grant-0000000", id: 10, attempt: 1},
		grantedJob{key: "grant-0000001", id: 11, attempt: 1}); err != nil {
		t.Fatal(err)
	}
	tr.complete("grant-0000000", now, now)
	err := tr.waitCompleted(context.Background(), 3, 20*time.Millisecond)
	if err == nil {
		t.Fatal("no error for a stalled run")
	}
	for _, want := range []string{"1 of 3 jobs completed", "never granted 1 (grant-0000002)",
		"granted, not completed 1 (grant-0000001 (job 11 attempt 1, worker 0))"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	go func() {
		time.Sleep(5 * time.Millisecond)
		tr.complete("grant-0000001", now, now)
		if err := tr.grant(1, now, grantedJob{key: "grant-0000002", id: 12, attempt: 1}); err != nil {
			t.Error(err)
		}
		tr.complete("grant-0000002", now, now)
	}()
	if err := tr.waitCompleted(context.Background(), 3, 10*time.Second); err != nil {
		t.Errorf("every job completed: %v", err)
	}
}

// TestHeldSharesIntegrateOverTheWindow: how busy a worker was is the jobs it
// held integrated over the producer's run only, changes before it setting the
// level it starts at.
func TestHeldSharesIntegrateOverTheWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Window 0..100 ms, 2 credits: 1 held from before it until 20, none
	// until 40, 2 (no credit left) until 70, then 1 until past its end.
	changes := []heldChange{{at(-10), 1}, {at(20), -1}, {at(40), 2}, {at(70), -1}, {at(130), -1}}
	got := sharesOver(changes, at(0), at(100), 2)
	want := heldShares{mean: (20*1 + 30*2 + 30*1) / 100.0, busy: 0.8, full: 0.3}
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"mean", got.mean, want.mean}, {"busy", got.busy, want.busy}, {"full", got.full, want.full}} {
		if d := c.got - c.want; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	logs := []*heldLog{{changes: changes}, {}}
	if m := meanHeldShares(logs, at(0), at(100), 2); m.busy < 0.4-1e-9 || m.busy > 0.4+1e-9 {
		t.Errorf("busy share over two workers, one idle: %v, want 0.4", m.busy)
	}
}

// TestGrantDeliveryFlags: scenario H runs by default and in --quick (2 s of
// producer there), and its flags are checked.
func TestGrantDeliveryFlags(t *testing.T) {
	dsn := []string{"--mysql-dsn", "root@tcp(127.0.0.1:3306)/"}
	c, err := parseFlags(dsn, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.runs('h') || c.grantWorkers != 16 || c.grantCredits != 4 || c.grantDuration != 20*time.Second {
		t.Errorf("defaults: scenarios %q, workers %d, credits %d, duration %v", c.scenarios, c.grantWorkers, c.grantCredits, c.grantDuration)
	}
	if c, err = parseFlags(append(dsn, "--quick"), &strings.Builder{}); err != nil || !c.runs('h') || c.grantDuration != 2*time.Second {
		t.Errorf("--quick: scenarios %q, duration %v, %v", c.scenarios, c.grantDuration, err)
	}
	for _, bad := range [][]string{{"--grant-credits", "0"}, {"--grant-credits", "1001"}, {"--grant-hold", "0s"},
		{"--grant-hold", "30s"}, {"--grant-rate", "0"}, {"--grant-workers", "0"}, {"--grant-duration", "0s"}, {"--scenarios", "hx"}} {
		if _, err := parseFlags(append(dsn, bad...), &strings.Builder{}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestGrantDeliverySummary: the grant_delivery line reports the delivery
// percentiles, the counts and the shares under their keys.
func TestGrantDeliverySummary(t *testing.T) {
	c, err := parseFlags([]string{"--mysql-dsn", "root@tcp(127.0.0.1:3306)/"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	var delivery latencies
	for i := 1; i <= 100; i++ {
		delivery = append(delivery, time.Duration(i)*100*time.Microsecond)
	}
	r := grantResult{jobs: 100, delivery: delivery, enqueue: latencies{time.Millisecond}, granted: 100, later: 2,
		grants: 80, handoffs: 60, handedBack: 1, achieved: 199.6, held: heldShares{mean: 1.25, busy: 0.9, full: 0.01},
		cpu: []float64{1500, ratio(0, 0)}}
	line := formatLine("grant_delivery", r.summary(c)...)
	for _, want := range []string{"grant_delivery workers=16 credits=4 hold_ms=100 rate=200 jobs=100 granted=100 granted_later=2 achieved_per_s=200 ",
		" p50_ms=5.000 p95_ms=9.500 p99_ms=9.900 max_ms=10.000 ", " enqueue_p95_ms=1.000 ", " grants=80 jobs_per_grant=1.25 handoff_share=0.75 handed_back=1 ",
		" held_per_worker=1.25 busy_share=0.90 no_credit_share=0.010 ", " coordinator_cpu_us_per_job=1500.0 db_cpu_us_per_job=n/a "} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
}
