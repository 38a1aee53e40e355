package main

import (
	"io"
	"slices"
	"testing"
	"time"
)

func TestPercentileIsNearestRank(t *testing.T) {
	var l latencies
	for i := 100; i >= 1; i-- { // unsorted on purpose
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	orig := slices.Clone(l)
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.50, 50 * time.Millisecond}, {0.95, 95 * time.Millisecond}, {0.99, 99 * time.Millisecond},
		{1, 100 * time.Millisecond}, {0.001, time.Millisecond}} {
		if got := l.percentile(c.p); got != c.want {
			t.Errorf("percentile(%v) = %s, want %s", c.p, got, c.want)
		}
	}
	if !slices.Equal(l, orig) {
		t.Error("percentile reordered its input")
	}
	if got := (latencies{}).percentile(0.5); got != 0 {
		t.Errorf("empty percentile = %s, want 0", got)
	}
	if got := (latencies{7 * time.Millisecond}).percentile(0.99); got != 7*time.Millisecond {
		t.Errorf("one-element p99 = %s, want 7ms", got)
	}
}

func TestFormatLineMatchesTheJobfenceBench(t *testing.T) {
	got := formatLine("river burn", "jobs", 100000, "jobs_per_s", num(24321.4, 0), "cpu_us_per_job_pg", num(ratio(1, 0), 1))
	if want := "river burn jobs=100000 jobs_per_s=24321 cpu_us_per_job_pg=n/a"; got != want {
		t.Fatalf("formatLine = %q, want %q", got, want)
	}
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.burn || !c.steady || c.jobs != 100000 || !slices.Equal(c.rates, []int{100, 1000}) || c.duration != 20*time.Second ||
		c.workers != 1000 || c.fetchCooldown != 2*time.Millisecond || c.fetchPollInterval != 20*time.Millisecond {
		t.Fatalf("defaults = %+v, want burn and steady, 100000 jobs, rates 100,1000 for 20s, 1000 workers, 2ms/20ms", c)
	}
	c, err = parseFlags([]string{"--modes", "steady", "--rates", "50"}, io.Discard)
	if err != nil || c.burn || !c.steady || !slices.Equal(c.rates, []int{50}) {
		t.Fatalf("--modes steady --rates 50: %+v, %v", c, err)
	}
	for _, bad := range [][]string{
		{"--modes", "drain"}, {"--rates", "100,x"}, {"--rates", "0"}, {"--workers", "0"},
		{"--workers", "20000"}, {"--duration", "0s"}, {"extra"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): no error", bad)
		}
	}
}

func TestHalvesSplitsByEnqueueOrder(t *testing.T) {
	// Jobs enqueued in this order; a consumer falling behind makes the later
	// ones slower.
	l := latencies{1, 2, 3, 10, 20, 30, 40}
	first, second := l.halves()
	if !slices.Equal(first, latencies{1, 2, 3}) || !slices.Equal(second, latencies{10, 20, 30, 40}) {
		t.Fatalf("halves = %v, %v", first, second)
	}
	if first.percentile(0.99) != 3 || second.percentile(0.99) != 40 {
		t.Fatalf("p99 of the halves = %v, %v, want 3 and 40", first.percentile(0.99), second.percentile(0.99))
	}
	if a, b := (latencies{}).halves(); len(a) != 0 || len(b) != 0 {
		t.Fatalf("halves of nothing = %v, %v", a, b)
	}
}
