package main

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"time"
)

// warmup is the start the verdict leaves out: the working set fills up to
// its steady size within the retention and two archive runs.
func (c config) warmup() time.Duration { return c.retain + 2*c.archiveInterval }

// restartRecovery is how long after a restarted coordinator serves its
// effects last: the archive had stopped with the old one, and its first run
// on the new one is an interval away, and the jobs completed meanwhile are
// due a retention later; the workers reconnect within reconnectAllowance.
func (c config) restartRecovery() time.Duration {
	return c.retain + 2*c.archiveInterval + reconnectAllowance
}

// thresholds are the verdict's, for eventsPerJob history rows per job.
func (c config) thresholds(eventsPerJob float64) thresholds {
	jobs := float64(c.rate) * (c.archiveInterval + time.Second).Seconds()
	return thresholds{Ratio: c.growthRatio, RowSlack: [3]float64{jobs, jobs * max(eventsPerJob, 1), jobs},
		RSSSlack: rssSlack, GoroutineSlack: goroutineSlack, LatencySlack: c.latencySlack}
}

// report judges the windows, prints the table and the summary line on
// stdout, and returns the reasons the run failed, if any.
func (s *soak) report(st settled, f final) error {
	var spans []span
	var down []string
	for _, r := range s.restarts {
		spans = append(spans, span{From: r.Stop - s.produceStart, To: r.Serving - s.produceStart + s.cfg.restartRecovery()})
		down = append(down, fmt.Sprintf("%.2f", (r.Serving-r.Stop).Seconds()))
	}
	exclude(s.windows, s.cfg.warmup(), spans)
	jobRows := f.exact[workingTables[0]] + f.exact[archiveTables[0]]
	eventsPerJob := ratio(float64(f.exact[workingTables[1]]+f.exact[archiveTables[1]]), float64(jobRows))
	th := s.cfg.thresholds(eventsPerJob)
	v := judge(s.windows, th)
	s.printTable(v)

	all := s.settleTail.lat
	var maxLag time.Duration
	hll, behind := int64(0), math.NaN()
	var cpuSum float64
	cpuN := 0
	for _, w := range s.windows {
		if !math.IsNaN(w.CoordCPU) {
			cpuSum += w.CoordCPU
			cpuN++
		}
		all = append(all, w.lat...)
		maxLag = max(maxLag, w.MaxLag)
		hll = max(hll, w.HistoryLen)
		if !math.IsNaN(w.Behind) && (math.IsNaN(behind) || w.Behind > behind) {
			behind = w.Behind
		}
	}
	failures, first := s.functionalFailures()
	coordWarnings := 0
	for _, c := range s.procs {
		for msg, n := range c.warningCounts() {
			coordWarnings += n
			s.logf("coordinator pid %d logged %d× %s", c.pid(), n, msg)
		}
	}
	verdict := "pass"
	if len(v.Reasons) > 0 || failures > 0 {
		verdict = "fail"
	}
	kv := []any{"verdict", verdict, "duration_s", int(s.cfg.duration.Seconds()), "rate", s.cfg.rate,
		"jobs", s.prod.n, "answered", s.prod.acked.Load(), "completed", s.prod.completed.Load(),
		"archived", f.exact[archiveTables[0]], "left_working", f.exact[workingTables[0]],
		"lost", f.lost, "keys_two_jobs", f.twoJobs, "functional_failures", failures,
		"retain_s", num(s.cfg.retain.Seconds(), 0), "archive_interval_s", num(s.cfg.archiveInterval.Seconds(), 0),
		"workers", s.cfg.workers, "slots", s.cfg.slots, "provider_ms", msec(s.cfg.providerTime),
		"restarts", len(s.restarts), "restart_down_s", listOrNone(down), "enqueue_retries", s.prod.retries.Load(),
		"stream_reopens", s.fleet.streamEnds.Load(), "stale_after_restart", s.fleet.staleAfterRestart.Load(),
		"takeovers", s.fleet.takeovers.Load(),
		"reconciles", s.fleet.reconciles.Load(),
		"windows", len(s.windows), "first_third", windowList(v.First), "last_third", windowList(v.Last)}
	for _, c := range v.Compared {
		kv = append(kv, c.Key, c.formatPlain(c.First)+"/"+c.formatPlain(c.Last))
	}
	kv = append(kv, "p99_pooled_ms_thirds", msec(v.PooledP99[0])+"/"+msec(v.PooledP99[1]),
		"p50_ms", msec(all.percentile(0.5)), "p99_ms", msec(all.percentile(0.99)), "max_ms", msec(all.percentile(1)),
		"producer_lag_max_ms", msec(maxLag),
		"history_len_max", hll, "archive_behind_max_s", num(behind, 1),
		"completed_after_s", num(st.completedAfter.Seconds(), 2), "drained_after_s", drained(st.drainedAfter),
		"keys_estimate_err", estimateErr(f, keyTable), "archive_estimate_err", estimateErr(f, archiveTables[0]),
		"archive_events_estimate_err", estimateErr(f, archiveTables[1]),
		"exact_count_ms", msec(f.countTook),
		"coordinator_cpu_us_per_job", num(1e6*ratio(cpuSum, float64(cpuN))/float64(s.cfg.rate), 0),
		"soak_cpu_us_per_job", num(float64(selfCPU().Microseconds())/float64(s.prod.n), 0),
		"coordinator_warnings", coordWarnings,
		"nproc", runtime.NumCPU(), "loadavg", loadAvg())
	fmt.Fprintln(s.stdout, formatLine("soak", kv...))

	if verdict == "pass" {
		return nil
	}
	var reasons []string
	if failures > 0 {
		reasons = append(reasons, fmt.Sprintf("%d functional failure(s), the first: %s", failures,
			strings.Join(first[:min(len(first), 5)], "; ")))
	}
	reasons = append(reasons, v.Reasons...)
	return errors.New("verdict fail: " + strings.Join(reasons, "; "))
}

// printTable prints the windows as a Markdown table.
func (s *soak) printTable(v verdict) {
	third := map[int]string{}
	for _, n := range v.First {
		third[n] = "first third"
	}
	for _, n := range v.Last {
		third[n] = "last third"
	}
	var b strings.Builder
	b.WriteString("| window | end s | compared | enqueued | completed | p50 ms | p99 ms | refund_jobs | events | receipts " +
		"| archived jobs ~ | archived events ~ | keys ~ | RSS MiB | goroutines | coordinator CPU % | history len | behind s " +
		"| load |\n")
	b.WriteString("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: " +
		"| ---: | ---: | ---: | ---: |\n")
	for _, w := range s.windows {
		note := third[w.N]
		if w.Excluded != "" {
			note = "no: " + w.Excluded
		}
		fmt.Fprintf(&b, "| %d | %.0f | %s | %d | %d | %s | %s | %d | %d | %d | %d | %d | %d | %s | %s | %s | %d | %s | %s |\n",
			w.N, w.End.Seconds(), note, w.Enqueued, w.Completed, msec(w.P50), msec(w.P99), w.Working[0], w.Working[1],
			w.Working[2], w.Archive[0], w.Archive[1], w.Keys, num(w.RSS/(1<<20), 1), num(w.Goroutines, 0),
			num(100*w.CoordCPU, 0), w.HistoryLen, num(w.Behind, 1), w.Load)
	}
	fmt.Fprint(s.stdout, b.String())
}

// formatPlain is x in the comparison's unit, without the unit.
func (c comparison) formatPlain(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	s := c.format(x)
	if i := strings.IndexByte(s, ' '); i >= 0 {
		s = s[:i]
	}
	return s
}

func drained(d time.Duration) string {
	if d < 0 {
		return "n/a"
	}
	return num(d.Seconds(), 2)
}

// estimateErr is how far InnoDB's estimate of table was from its exact
// count at the end, in per cent.
func estimateErr(f final, table string) string {
	e := 100 * ratio(float64(f.estimate[table]-f.exact[table]), float64(f.exact[table]))
	if math.IsNaN(e) {
		return "n/a"
	}
	return num(e, 1) + "%"
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ",")
}

// ratio is a/b, NaN when b is zero.
func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// formatLine renders "name k=v k=v …" from alternating keys and values.
func formatLine(name string, kv ...any) string {
	var sb strings.Builder
	sb.WriteString(name)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&sb, " %v=%v", kv[i], kv[i+1])
	}
	return sb.String()
}
