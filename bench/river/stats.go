package main

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// latencies is a set of measured durations.
type latencies []time.Duration

// percentile returns the nearest-rank percentile p (0 < p ≤ 1), as
// cmd/jobfence-bench computes it; zero when empty.
func (l latencies) percentile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	rank := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(rank, len(s)-1))]
}

// halves splits the latencies of a run's jobs, in the order they were
// enqueued, into its first and its second half. A consumer keeping up has
// about the same p99 in both; one falling behind, a higher one in the second.
func (l latencies) halves() (first, second latencies) {
	h := len(l) / 2
	return l[:h], l[h:]
}

// ms formats d in milliseconds with microsecond resolution.
func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }

// num formats a float with the given decimals; "n/a" when it is not a number.
func num(x float64, decimals int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.*f", decimals, x)
}

// ratio is a/b, NaN when b is zero.
func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// formatLine renders "name k=v k=v …" from alternating keys and values, the
// summary format of cmd/jobfence-bench.
func formatLine(name string, kv ...any) string {
	var sb strings.Builder
	sb.WriteString(name)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&sb, " %v=%v", kv[i], kv[i+1])
	}
	return sb.String()
}

// quote makes a value with spaces one token of a summary line.
func quote(s string) string { return fmt.Sprintf("%q", s) }

// loadAvg is the machine's 1, 5 and 15 minute load averages, "n/a" when
// unreadable.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], ",")
}
