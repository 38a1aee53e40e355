package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// latencies is a set of measured durations.
type latencies []time.Duration

// percentile returns the nearest-rank percentile p (0 < p ≤ 1); zero when empty.
func (l latencies) percentile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	rank := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(rank, len(s)-1))]
}

// ms formats d in milliseconds with microsecond resolution.
// overRef is the key=value pairs comparing lat with ref, the same
// measurement on the reference copy timed in turn with it; none without ref.
func overRef(lat, ref latencies) []any {
	if len(ref) == 0 {
		return nil
	}
	return []any{"ref_p95_ms", ms(ref.percentile(0.95)),
		"p95_over_ref", num(ratio(float64(lat.percentile(0.95)), float64(ref.percentile(0.95))), 2)}
}

// historyRatio is the key=value pairs of a history ratio: p95 at the last
// history size over p95 at the first (under firstKey). With ref, the first
// size's latencies timed in turn with the last's on its copy, the ratio uses
// those, and the ratio to first (measured minutes before) is kept as
// history_ratio_sequential.
func historyRatio(last, first latencies, ref latencies, firstKey string) []any {
	p95last, p95first := float64(last.percentile(0.95)), first.percentile(0.95)
	if len(ref) == 0 {
		return []any{firstKey, ms(p95first), "history_ratio", num(ratio(p95last, float64(p95first)), 2)}
	}
	p95ref := ref.percentile(0.95)
	return []any{firstKey, ms(p95ref), "history_ratio", num(ratio(p95last, float64(p95ref)), 2),
		"history_ratio_sequential", num(ratio(p95last, float64(p95first)), 2)}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }

// us formats d in whole microseconds.
func us(d time.Duration) string { return fmt.Sprintf("%d", d.Microseconds()) }

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

// formatLine renders "name k=v k=v …" from alternating keys and values.
func formatLine(name string, kv ...any) string {
	var sb strings.Builder
	sb.WriteString(name)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&sb, " %v=%v", kv[i], kv[i+1])
	}
	return sb.String()
}

// parallel runs fn for workers 0..n-1 and returns the first error; the others
// see their context cancelled.
func parallel(ctx context.Context, n int, fn func(ctx context.Context, worker int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := fn(ctx, i); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && err != context.Canceled {
		return err
	}
	return ctx.Err()
}
