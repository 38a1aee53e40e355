package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The verdict compares the mean of each series over the last third of the
// windows with its mean over the first third, leaving out the windows the
// run's start and its restarts disturb (see exclude). A series grew when
//
//	last > ratio × first   and   last − first > slack
//
// The ratio (--growth-ratio, 1.5) catches a series that grows with time:
// one that grows linearly from the start is about five times larger in the
// last third than in the first, and one that adds half its steady size over
// the run is caught too. The slack is the noise a flat series shows between
// two thirds; below it a ratio means nothing (ten rows against five is 2×):
//
//   - working rows: the archive runs every --archive-interval, so between
//     two runs refund_jobs rises by rate × interval and falls back, and a
//     count taken at a window's end lands anywhere on that saw-tooth; a run
//     that starts a second late on a busy machine adds rate × 1 s more.
//     Slack: rate × (interval + 1 s) jobs, times the rows each job has in
//     the table (history events per job; one receipt per job).
//   - RSS: a Go heap doubles between collections (GOGC=100) and returns
//     freed pages lazily, so a coordinator's RSS moves by tens of MiB at a
//     steady load. Slack: rssSlack.
//   - goroutines: each call in flight holds one, and the number in flight
//     follows the load's jitter. Slack: goroutineSlack.
//   - p99 enqueue→completed: the median of the windows' p99s in each third
//     (see medianP99); a shared two-core machine's scheduling adds tens of
//     milliseconds now and then. Slack: --latency-slack.

const (
	// rssSlack is the RSS noise of a flat coordinator (see above).
	rssSlack = 32 << 20
	// goroutineSlack is the goroutine noise of a flat coordinator.
	goroutineSlack = 64
)

// thresholds say when a series grew.
type thresholds struct {
	Ratio          float64
	RowSlack       [3]float64 // per working table, rows
	RSSSlack       float64    // bytes
	GoroutineSlack float64
	LatencySlack   time.Duration
}

// workingKeys name the working tables' comparisons in the summary line.
var workingKeys = []string{"working_jobs", "working_events", "working_receipts"}

// span is a stretch of the producer's clock [From, To).
type span struct{ From, To time.Duration }

// exclude marks the windows the verdict leaves out: those overlapping the
// warm-up [0, warmup), while the working set fills up to its steady size
// (retention plus two archive runs) and connections open, and those
// overlapping a restart's span, from its SIGTERM until the new coordinator
// has served long enough for the archive to catch up and the workers to
// reconnect. A job completed in an excluded window had its latency measured
// across the restart; a window before the SIGTERM is not disturbed, since
// latencies are counted in the window of the completion.
func exclude(ws []window, warmup time.Duration, restarts []span) {
	for i := range ws {
		w := &ws[i]
		w.Excluded = ""
		if w.Start < warmup {
			w.Excluded = "warm-up"
		}
		for _, r := range restarts {
			if w.Start < r.To && r.From < w.End {
				w.Excluded = "restart"
			}
		}
	}
}

// comparison is one series' first and last third.
type comparison struct {
	Name        string
	Key         string // in the summary line
	First, Last float64
	Slack       float64
	Grew        bool
	// Missing names the third without a reading, when one has none.
	Missing string
	format  func(float64) string
}

func (c comparison) describe(ratio float64, first, last []int) string {
	if c.Missing != "" {
		return fmt.Sprintf("%s: no reading in the %s third", c.Name, c.Missing)
	}
	return fmt.Sprintf("%s grew: %s in the last third (windows %s) against %s in the first (windows %s), over %s× "+
		"and more than %s above it", c.Name, c.format(c.Last), windowList(last), c.format(c.First), windowList(first),
		strconv.FormatFloat(ratio, 'f', -1, 64), c.format(c.Slack))
}

// verdict is the outcome of judge.
type verdict struct {
	First, Last []int // the window numbers compared
	Compared    []comparison
	// PooledP99 is the p99 of all the jobs completed in the first and in
	// the last third, for the record: one burst of another process's load
	// sets it (see medianP99).
	PooledP99 [2]time.Duration
	Reasons   []string // empty: passed
}

// judge compares the first and the last third of the windows not excluded.
// It fails with fewer than three such windows: no verdict without both
// thirds.
func judge(ws []window, th thresholds) verdict {
	var v verdict
	var kept []window
	for _, w := range ws {
		if w.Excluded == "" {
			kept = append(kept, w)
		}
	}
	k := len(kept) / 3
	if k == 0 {
		v.Reasons = append(v.Reasons, fmt.Sprintf("too few windows to judge: %d outside the warm-up and the "+
			"restarts, at least 3 needed (a longer --duration or a shorter --sample)", len(kept)))
		return v
	}
	first, last := kept[:k], kept[len(kept)-k:]
	for _, w := range first {
		v.First = append(v.First, w.N)
	}
	for _, w := range last {
		v.Last = append(v.Last, w.N)
	}
	rows := func(x float64) string { return fmt.Sprintf("%.0f rows", x) }
	for i, t := range workingTables {
		v.Compared = append(v.Compared, compare("working set "+t, workingKeys[i], first, last, th.Ratio, th.RowSlack[i],
			rows, func(w window) float64 { return float64(w.Working[i]) }))
	}
	v.Compared = append(v.Compared,
		compare("coordinator RSS", "rss_mib", first, last, th.Ratio, th.RSSSlack,
			func(x float64) string { return fmt.Sprintf("%.1f MiB", x/(1<<20)) },
			func(w window) float64 { return w.RSS }),
		compare("coordinator goroutines", "goroutines", first, last, th.Ratio, th.GoroutineSlack,
			func(x float64) string { return fmt.Sprintf("%.0f", x) },
			func(w window) float64 { return w.Goroutines }))
	p99 := comparison{Name: "enqueue→completed p99", Key: "p99_ms_thirds", Slack: float64(th.LatencySlack),
		format: func(x float64) string { return msec(time.Duration(x)) + " ms" }}
	var ok1, ok2 bool
	p99.First, ok1 = medianP99(first)
	p99.Last, ok2 = medianP99(last)
	switch {
	case !ok1:
		p99.Missing = "first"
	case !ok2:
		p99.Missing = "last"
	default:
		p99.Grew = grew(p99.First, p99.Last, th.Ratio, p99.Slack)
	}
	v.PooledP99 = [2]time.Duration{pooled(first).percentile(0.99), pooled(last).percentile(0.99)}
	v.Compared = append(v.Compared, p99)
	for _, c := range v.Compared {
		if c.Grew || c.Missing != "" {
			v.Reasons = append(v.Reasons, c.describe(th.Ratio, v.First, v.Last))
		}
	}
	return v
}

// grew is the rule: last over ratio × first, and over first by more than
// slack.
func grew(first, last, ratio, slack float64) bool {
	return last > ratio*first && last-first > slack
}

// compare is series' comparison between the means of two thirds, readings
// that are not numbers (a metric not read) left out.
func compare(name, key string, first, last []window, ratio, slack float64, format func(float64) string,
	series func(window) float64) comparison {
	c := comparison{Name: name, Key: key, Slack: slack, format: format}
	var ok1, ok2 bool
	c.First, ok1 = mean(first, series)
	c.Last, ok2 = mean(last, series)
	switch {
	case !ok1:
		c.Missing = "first"
	case !ok2:
		c.Missing = "last"
	default:
		c.Grew = grew(c.First, c.Last, ratio, slack)
	}
	return c
}

func mean(ws []window, series func(window) float64) (float64, bool) {
	var sum float64
	n := 0
	for _, w := range ws {
		if x := series(w); !math.IsNaN(x) {
			sum += x
			n++
		}
	}
	if n == 0 {
		return math.NaN(), false
	}
	return sum / float64(n), true
}

// medianP99 is the median of the windows' p99s, over the windows in which
// jobs completed. The verdict compares it rather than the p99 of all the
// jobs of a third: on a shared machine a burst of another process's work
// lands in one window and makes that window's tail the third's p99, while
// a coordinator that slows down as it runs (a growing heap, a growing
// table) raises the p99 of every window.
func medianP99(ws []window) (float64, bool) {
	var p99s []float64
	for _, w := range ws {
		if len(w.lat) > 0 {
			p99s = append(p99s, float64(w.lat.percentile(0.99)))
		}
	}
	if len(p99s) == 0 {
		return math.NaN(), false
	}
	slices.Sort(p99s)
	if n := len(p99s); n%2 == 0 {
		return (p99s[n/2-1] + p99s[n/2]) / 2, true
	}
	return p99s[len(p99s)/2], true
}

// pooled is every latency of ws.
func pooled(ws []window) latencies {
	var out latencies
	for _, w := range ws {
		out = append(out, w.lat...)
	}
	return out
}

// windowList is "2-4" for consecutive numbers, "2,3,7" otherwise.
func windowList(ns []int) string {
	if len(ns) == 0 {
		return "none"
	}
	if ns[len(ns)-1]-ns[0] == len(ns)-1 {
		if len(ns) == 1 {
			return strconv.Itoa(ns[0])
		}
		return fmt.Sprintf("%d-%d", ns[0], ns[len(ns)-1])
	}
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}
