package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

const testSample = 10 * time.Second

// flatWindow is window n of a steady run: a working set of about 1,300
// jobs (two events each) that moves with the archive's saw-tooth, a
// coordinator of about 40 MiB and 130 goroutines, and latencies of
// 20-60 ms, each value jittered by n so that no two windows are alike.
func flatWindow(n int) window {
	j := float64((n*37)%11) - 5 // -5..5
	w := window{N: n, Start: time.Duration(n-1) * testSample, End: time.Duration(n) * testSample,
		Working: [3]int64{int64(1300 + 30*j), int64(2600 + 60*j), 0},
		RSS:     (40 + j/2) * (1 << 20), Goroutines: 130 + 2*j}
	for k := range 200 {
		w.lat = append(w.lat, time.Duration(20+k%7+int(j))*time.Millisecond)
	}
	w.lat = append(w.lat, 60*time.Millisecond)
	return w
}

func flatRun(n int) []window {
	ws := make([]window, n)
	for i := range ws {
		ws[i] = flatWindow(i + 1)
	}
	return ws
}

// testThresholds are the soak's at 200 jobs/s, a 1 s archive interval and
// two events per job.
func testThresholds() thresholds {
	return config{rate: 200, archiveInterval: time.Second, growthRatio: 1.5, latencySlack: 25 * time.Millisecond}.
		thresholds(2)
}

func reasonsAbout(v verdict, what string) bool {
	for _, r := range v.Reasons {
		if strings.Contains(r, what) {
			return true
		}
	}
	return false
}

func TestFlatRunPasses(t *testing.T) {
	ws := flatRun(12)
	exclude(ws, 7*time.Second, nil)
	v := judge(ws, testThresholds())
	if len(v.Reasons) > 0 {
		t.Fatalf("a flat run failed: %q", v.Reasons)
	}
	if windowList(v.First) != "2-4" || windowList(v.Last) != "10-12" {
		t.Errorf("compared windows %v and %v, want 2-4 and 10-12 (window 1 is the warm-up)", v.First, v.Last)
	}
	if ws[0].Excluded != "warm-up" || ws[1].Excluded != "" {
		t.Errorf("exclusions %q %q, want the first window only", ws[0].Excluded, ws[1].Excluded)
	}
}

// TestGrowingWorkingSetFails: with the archive off, refund_jobs grows by
// the rate every second; the verdict names the working set.
func TestGrowingWorkingSetFails(t *testing.T) {
	ws := flatRun(12)
	for i := range ws {
		jobs := int64(200 * ws[i].End.Seconds())
		ws[i].Working[0], ws[i].Working[1] = jobs, 2*jobs
	}
	exclude(ws, 7*time.Second, nil)
	v := judge(ws, testThresholds())
	for _, table := range []string{"working set refund_jobs grew", "working set refund_job_events grew"} {
		if !reasonsAbout(v, table) {
			t.Errorf("no reason %q in %q", table, v.Reasons)
		}
	}
	if reasonsAbout(v, "RSS") || reasonsAbout(v, "p99") || reasonsAbout(v, "goroutines") {
		t.Errorf("flat series blamed too: %q", v.Reasons)
	}
}

// TestSlowLeakFails: a working set that keeps its steady 1,300 jobs but
// leaks 1 job a second more is caught in half an hour.
func TestSlowLeakFails(t *testing.T) {
	ws := make([]window, 30)
	for i := range ws {
		ws[i] = flatWindow(i + 1)
		ws[i].Start, ws[i].End = time.Duration(i)*time.Minute, time.Duration(i+1)*time.Minute
		ws[i].Working[0] += int64(ws[i].End.Seconds())
	}
	exclude(ws, 7*time.Second, nil)
	if v := judge(ws, testThresholds()); !reasonsAbout(v, "working set refund_jobs grew") {
		t.Errorf("a leak of 1 job/s over 30 minutes passed: %q", v.Reasons)
	}
}

func TestRSSAndGoroutineGrowthFail(t *testing.T) {
	ws := flatRun(12)
	for i := range ws {
		ws[i].RSS = float64(40+10*i) * (1 << 20)
		ws[i].Goroutines = float64(130 + 40*i)
	}
	exclude(ws, 7*time.Second, nil)
	v := judge(ws, testThresholds())
	if !reasonsAbout(v, "coordinator RSS grew") || !reasonsAbout(v, "coordinator goroutines grew") {
		t.Errorf("reasons %q, want RSS and goroutines", v.Reasons)
	}
}

func TestP99GrowthFails(t *testing.T) {
	ws := flatRun(12)
	for i := 9; i < 12; i++ {
		for k := range ws[i].lat {
			if k%50 == 0 {
				ws[i].lat[k] = 200 * time.Millisecond
			}
		}
	}
	exclude(ws, 7*time.Second, nil)
	if v := judge(ws, testThresholds()); !reasonsAbout(v, "enqueue→completed p99 grew") {
		t.Errorf("reasons %q, want p99", v.Reasons)
	}
}

// TestOneNoisyWindowIsNotGrowth: a burst of another process's load in one
// window of the last third raises that window's p99 only; in two of its
// three windows it is the third's typical p99, and fails.
func TestOneNoisyWindowIsNotGrowth(t *testing.T) {
	for _, c := range []struct {
		noisy []int
		grew  bool
	}{{[]int{11}, false}, {[]int{10, 12}, true}} {
		ws := flatRun(12)
		for _, n := range c.noisy {
			for k := range 10 {
				ws[n-1].lat[k] = 700 * time.Millisecond
			}
		}
		exclude(ws, 7*time.Second, nil)
		v := judge(ws, testThresholds())
		if got := reasonsAbout(v, "p99 grew"); got != c.grew {
			t.Errorf("noisy windows %v: p99 grew %v, want %v (reasons %q)", c.noisy, got, c.grew, v.Reasons)
		}
		if v.PooledP99[1] != 700*time.Millisecond {
			t.Errorf("noisy windows %v: pooled p99 of the last third %s, want 700ms", c.noisy, v.PooledP99[1])
		}
	}
}

// TestRestartSpikeExcluded: a restart in the last third leaves its windows
// with a latency spike and a working set the archive has yet to catch up
// with; excluded as a restart's they fail nothing, compared they would.
func TestRestartSpikeExcluded(t *testing.T) {
	spiked := func() []window {
		ws := flatRun(12)
		for _, i := range []int{9, 10} { // windows 10 and 11
			ws[i].Working[0], ws[i].Working[1] = 4000, 8000
			ws[i].RSS, ws[i].Goroutines = math.NaN(), math.NaN() // not read while it restarted
			for k := range 20 {
				ws[i].lat[k] = 2 * time.Second
			}
		}
		return ws
	}
	restart := span{From: 92 * time.Second, To: 92*time.Second + 12*time.Second}
	ws := spiked()
	exclude(ws, 7*time.Second, []span{restart})
	if ws[8].Excluded != "" || ws[9].Excluded != "restart" || ws[10].Excluded != "restart" || ws[11].Excluded != "" {
		t.Fatalf("exclusions of windows 9-12: %q %q %q %q", ws[8].Excluded, ws[9].Excluded, ws[10].Excluded, ws[11].Excluded)
	}
	if v := judge(ws, testThresholds()); len(v.Reasons) > 0 {
		t.Errorf("the restart's windows were judged: %q (last third %v)", v.Reasons, v.Last)
	}
	ws = spiked()
	exclude(ws, 7*time.Second, nil)
	v := judge(ws, testThresholds())
	if !reasonsAbout(v, "working set refund_jobs grew") || !reasonsAbout(v, "p99 grew") {
		t.Errorf("the same spike not excluded: reasons %q", v.Reasons)
	}
}

// TestNoiseWithinSlack: a small working set that doubles, or a large one
// that moves by less than the ratio, is noise; beyond both it is growth.
func TestNoiseWithinSlack(t *testing.T) {
	th := testThresholds()
	if th.RowSlack[0] != 400 || th.RowSlack[1] != 800 {
		t.Fatalf("row slack %v, want 400 jobs and 800 events at 200 jobs/s and a 1 s interval", th.RowSlack)
	}
	for _, c := range []struct {
		first, last float64
		grew        bool
	}{{10, 25, false}, {300, 650, false}, {1300, 1900, false}, {1300, 2000, true}, {0, 401, true}, {0, 399, false}} {
		ws := flatRun(12)
		for i := range ws {
			ws[i].Working[0] = int64(c.first)
			if i >= 9 {
				ws[i].Working[0] = int64(c.last)
			}
		}
		exclude(ws, 7*time.Second, nil)
		if got := reasonsAbout(judge(ws, th), "refund_jobs grew"); got != c.grew {
			t.Errorf("%v → %v rows: grew %v, want %v", c.first, c.last, got, c.grew)
		}
	}
}

func TestTooFewWindowsFails(t *testing.T) {
	ws := flatRun(4)
	exclude(ws, 7*time.Second, []span{{From: 25 * time.Second, To: 35 * time.Second}})
	v := judge(ws, testThresholds())
	if !reasonsAbout(v, "too few windows") {
		t.Errorf("reasons %q, want too few windows", v.Reasons)
	}
}

// TestMissingReadingFails: a third in which the coordinator's metrics were
// never read gives no verdict on them, and says so.
func TestMissingReadingFails(t *testing.T) {
	ws := flatRun(12)
	for i := 9; i < 12; i++ {
		ws[i].RSS = math.NaN()
	}
	exclude(ws, 7*time.Second, nil)
	if v := judge(ws, testThresholds()); !reasonsAbout(v, "coordinator RSS: no reading in the last third") {
		t.Errorf("reasons %q", v.Reasons)
	}
}

func TestWindowList(t *testing.T) {
	for _, c := range []struct {
		ns   []int
		want string
	}{{nil, "none"}, {[]int{3}, "3"}, {[]int{2, 3, 4}, "2-4"}, {[]int{8, 9, 12}, "8,9,12"}} {
		if got := windowList(c.ns); got != c.want {
			t.Errorf("windowList(%v) = %q, want %q", c.ns, got, c.want)
		}
	}
}
