package console

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// activityOf is an answer of minutes minutes ending at end, with the
// counts of each minute's index from set.
func activityOf(end time.Time, minutes int, set map[int]*pb.ActivityMinute) *pb.GetActivityResponse {
	a := &pb.GetActivityResponse{Now: timestamppb.New(end)}
	first := end.Truncate(time.Minute).Add(-time.Duration(minutes-1) * time.Minute)
	for i := range minutes {
		m := &pb.ActivityMinute{}
		if s, ok := set[i]; ok {
			m = s
		}
		m.Start = timestamppb.New(first.Add(time.Duration(i) * time.Minute))
		a.Minutes = append(a.Minutes, m)
	}
	a.CountedSince = a.Minutes[0].Start
	return a
}

var (
	barRe     = regexp.MustCompile(`<g class="finishes" data-minute="(\d\d:\d\d)">`)
	segmentRe = regexp.MustCompile(`<rect class="bar (\w+)"`)
	timeRe    = regexp.MustCompile(`<text class="time"[^>]*>(\d\d:\d\d)</text>`)
	maxRe     = regexp.MustCompile(`<text class="y max"[^>]*>(\d+)</text>`)
)

// The chart draws one stacked bar per minute in which jobs finished, with a
// segment per outcome, bottom first; its axes name round times of the
// window in UTC and each panel's largest value; the minutes without activity
// are left out of the table.
func TestChartDrawsTheMinutes(t *testing.T) {
	end := time.Date(2026, 12, 5, 9, 14, 30, 0, time.UTC)
	a := activityOf(end, 180, map[int]*pb.ActivityMinute{
		10:  {Succeeded: 4, ManualReview: 1},
		100: {Succeeded: 9, Cancelled: 2, Receipts: 30},
		179: {ManualReview: 1, Takeovers: 3},
		150: {ReviewsResolved: 5},
	})
	c := chartOf(a, 180)
	svg := string(c.SVG)
	bars := barRe.FindAllStringSubmatch(svg, -1)
	if len(bars) != 3 || bars[0][1] != "06:25" || bars[1][1] != "07:55" || bars[2][1] != "09:14" {
		t.Fatalf("bars %v, want 06:25, 07:55 and 09:14", bars)
	}
	var segments []string
	for _, m := range segmentRe.FindAllStringSubmatch(svg, -1) {
		segments = append(segments, m[1])
	}
	if got := strings.Join(segments, " "); got != "succeeded review succeeded cancelled review" {
		t.Fatalf("segments %q", got)
	}
	var peaks []string
	for _, m := range maxRe.FindAllStringSubmatch(svg, -1) {
		peaks = append(peaks, m[1])
	}
	if got := strings.Join(peaks, " "); got != "11 3 5 30" {
		t.Fatalf("the panels' largest values %q, want 11 (finished in a minute), 3, 5 and 30", got)
	}
	times := timeRe.FindAllStringSubmatch(svg, -1)
	if len(times) != 4*6 || times[0][1] != "06:30" || times[5][1] != "09:00" {
		t.Fatalf("time labels %v, want 06:30 to 09:00 every half hour under each of the 4 panels", times)
	}
	if len(c.Minutes) != 4 || c.Total.GetSucceeded() != 13 || c.Total.GetReceipts() != 30 {
		t.Fatalf("table minutes %d, totals %v", len(c.Minutes), c.Total)
	}
	if strings.Contains(svg, "uncounted") || strings.Contains(svg, "style=") {
		t.Fatal("an untruncated chart shades a part, or a style attribute slipped in")
	}
	if !strings.Contains(svg, `<desc id="activity-desc">Jobs finished: 13 succeeded, 2 to manual review, 2 cancelled; `+
		`the most in one minute, 11, at 07:55.`) {
		t.Fatalf("the description:\n%s", svg)
	}
}

// A truncated answer shades the part not counted in full on every panel
// and says so in the description; an empty window says "none".
func TestChartShadesWhatWasNotCounted(t *testing.T) {
	end := time.Date(2026, 12, 5, 9, 14, 30, 0, time.UTC)
	a := activityOf(end, 60, map[int]*pb.ActivityMinute{50: {Succeeded: 1}})
	a.Truncated = true
	a.CountedSince = timestamppb.New(end.Add(-20 * time.Minute))
	c := chartOf(a, 60)
	svg := string(c.SVG)
	if n := strings.Count(svg, `<rect class="uncounted"`); n != 4 {
		t.Fatalf("%d shaded parts, want one per panel", n)
	}
	if !strings.Contains(svg, "before 08:54 the counts are partial") {
		t.Fatalf("the description does not say what was not counted:\n%s", svg)
	}
	if n := strings.Count(svg, "none in this window"); n != 3 {
		t.Fatalf("%d panels say none, want the three empty ones", n)
	}
}
