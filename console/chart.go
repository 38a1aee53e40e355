package console

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// The activity chart is drawn here, on the server, as inline SVG: the pages
// run no script (their CSP), and inline SVG is markup like any other. Colours
// and type come from classes in console.css, never from style attributes,
// which the CSP forbids.

// activityWindows are the windows the overview offers, in minutes, and the
// one it shows unless asked for another.
var activityWindows = []int32{60, 180, 360}

const defaultActivityWindow = 180

// windowLink is a window the overview offers, for its link.
type windowLink struct {
	Minutes int32
	Label   string
	Here    bool
}

// windowLinks lists the windows the overview offers, shortest first, marking
// the one shown.
func windowLinks(shown int32) []windowLink {
	var links []windowLink
	for _, m := range activityWindows {
		links = append(links, windowLink{Minutes: m, Label: fmt.Sprintf("%d h", m/60), Here: m == shown})
	}
	return links
}

// activityWindow is the window a query asks for (activity=minutes), when it
// is one the page offers; else the default.
func activityWindow(q string) int32 {
	for _, w := range activityWindows {
		if q == fmt.Sprint(w) {
			return w
		}
	}
	return defaultActivityWindow
}

// chart geometry, in the SVG's own units (it scales to the page's width).
const (
	chartWidth   = 960
	chartLeft    = 48 // room for the y labels
	chartRight   = 8
	chartTitle   = 18 // a panel's title line
	chartAxis    = 16 // a panel's time labels
	chartGap     = 10 // between panels
	barsHeight   = 130
	linesHeight  = 48
	chartPlotW   = chartWidth - chartLeft - chartRight
	timeLayout   = "15:04"
	maxTimeTicks = 7
)

// activityChart is what the overview shows of GetActivity's answer.
type activityChart struct {
	// SVG is the chart; Minutes the minutes with anything in them, for the
	// table under it.
	SVG     template.HTML
	Minutes []*pb.ActivityMinute
	// From and To bound the window (UTC); Total adds it up.
	From, To time.Time
	Total    *pb.ActivityMinute
	// Truncated: the oldest part was not counted in full, before
	// CountedSince.
	Truncated    bool
	CountedSince time.Time
	// Window is the window in minutes; Windows those the page offers.
	Window  int32
	Windows []windowLink
	// Error says why there is no chart (the coordinator refused the read, or
	// does not have it).
	Error string
}

// series is one line panel of the chart.
type series struct {
	class, title string
	value        func(*pb.ActivityMinute) int64
}

var lineSeries = []series{
	{"takeovers", "Takeovers", (*pb.ActivityMinute).GetTakeovers},
	{"resolved", "Reviews resolved by people", (*pb.ActivityMinute).GetReviewsResolved},
	{"receipts", "Receipts filed", (*pb.ActivityMinute).GetReceipts},
}

// outcomes are the stacked segments of a minute's bar, bottom first.
var outcomes = []series{
	{"succeeded", "succeeded", (*pb.ActivityMinute).GetSucceeded},
	{"review", "to manual review", (*pb.ActivityMinute).GetManualReview},
	{"cancelled", "cancelled", (*pb.ActivityMinute).GetCancelled},
}

func finished(m *pb.ActivityMinute) int64 {
	return m.GetSucceeded() + m.GetManualReview() + m.GetCancelled()
}

// chartOf draws a, an answer for window minutes: one stacked bar a minute
// for the jobs finished by outcome, then one small panel with its own scale
// for each of takeovers, resolutions and receipts, each with the window's
// times (UTC) and its largest value on its axes, an accessible title and
// description, and the part not counted in full shaded.
func chartOf(a *pb.GetActivityResponse, window int32) activityChart {
	ms := a.GetMinutes()
	c := activityChart{Window: window, Windows: windowLinks(window), Total: &pb.ActivityMinute{},
		Truncated: a.GetTruncated(), CountedSince: a.GetCountedSince().AsTime()}
	if len(ms) == 0 {
		c.Error = "The coordinator answered no minutes."
		return c
	}
	c.From, c.To = ms[0].GetStart().AsTime(), ms[len(ms)-1].GetStart().AsTime().Add(time.Minute)
	var peak *pb.ActivityMinute
	for _, m := range ms {
		c.Total.Succeeded += m.GetSucceeded()
		c.Total.ManualReview += m.GetManualReview()
		c.Total.Cancelled += m.GetCancelled()
		c.Total.Takeovers += m.GetTakeovers()
		c.Total.ReviewsResolved += m.GetReviewsResolved()
		c.Total.Receipts += m.GetReceipts()
		if finished(m)+m.GetTakeovers()+m.GetReviewsResolved()+m.GetReceipts() > 0 {
			c.Minutes = append(c.Minutes, m)
		}
		if peak == nil || finished(m) > finished(peak) {
			peak = m
		}
	}

	var b strings.Builder
	d := drawing{b: &b, ms: ms, step: float64(chartPlotW) / float64(len(ms))}
	height := chartTitle + barsHeight + chartAxis + len(lineSeries)*(chartGap+chartTitle+linesHeight+chartAxis)
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="activity" id="activity-chart" viewBox="0 0 %d %d" `+
		`role="img" aria-labelledby="activity-title activity-desc">`, chartWidth, height)
	fmt.Fprintf(&b, `<title id="activity-title">%s</title>`, esc(fmt.Sprintf("Activity per minute, %s to %s UTC",
		c.From.Format(timeLayout), c.To.Format(timeLayout))))
	desc := fmt.Sprintf("Jobs finished: %d succeeded, %d to manual review, %d cancelled; the most in one minute, %d, "+
		"at %s. Takeovers: %d. Reviews resolved by people: %d. Receipts filed: %d.", c.Total.Succeeded,
		c.Total.ManualReview, c.Total.Cancelled, finished(peak), peak.GetStart().AsTime().Format(timeLayout),
		c.Total.Takeovers, c.Total.ReviewsResolved, c.Total.Receipts)
	if c.Truncated {
		desc += " Only the newest activity was counted: before " + c.CountedSince.Format(timeLayout) +
			" the counts are partial."
	}
	fmt.Fprintf(&b, `<desc id="activity-desc">%s</desc>`, esc(desc))

	y := 0
	// The jobs finished, stacked by outcome, with a legend in the title line.
	maxFinished := int64(0)
	for _, m := range ms {
		maxFinished = max(maxFinished, finished(m))
	}
	d.panel(y, barsHeight, "Jobs finished per minute", maxFinished, c)
	x := chartLeft + 190
	for _, o := range outcomes {
		fmt.Fprintf(&b, `<rect class="swatch %s" x="%d" y="%d" width="10" height="10"/>`, o.class, x, y+4)
		fmt.Fprintf(&b, `<text class="legend" x="%d" y="%d">%s</text>`, x+14, y+13, esc(o.title))
		x += 14 + 8*len(o.title) + 16
	}
	top := y + chartTitle
	for i, m := range ms {
		if finished(m) == 0 {
			continue
		}
		fmt.Fprintf(&b, `<g class="finishes" data-minute="%s"><title>%s</title>`,
			m.GetStart().AsTime().Format(timeLayout), esc(minuteWords(m)))
		base := float64(top + barsHeight)
		for _, o := range outcomes {
			v := o.value(m)
			if v == 0 {
				continue
			}
			h := float64(v) / float64(maxFinished) * barsHeight
			base -= h
			fmt.Fprintf(&b, `<rect class="bar %s" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, o.class, d.x(i),
				base, d.barWidth(), h)
		}
		b.WriteString(`</g>`)
	}
	y = top + barsHeight + chartAxis

	// The other series, each in a small panel of its own scale.
	for _, s := range lineSeries {
		y += chartGap
		peak := int64(0)
		for _, m := range ms {
			peak = max(peak, s.value(m))
		}
		d.panel(y, linesHeight, s.title+" per minute", peak, c)
		top := y + chartTitle
		points := make([]string, len(ms))
		for i, m := range ms {
			v := float64(0)
			if peak > 0 {
				v = float64(s.value(m)) / float64(peak) * linesHeight
			}
			points[i] = fmt.Sprintf("%.1f,%.1f", d.x(i)+d.step/2, float64(top+linesHeight)-v)
		}
		fmt.Fprintf(&b, `<polyline class="line %s" points="%s"/>`, s.class, strings.Join(points, " "))
		y = top + linesHeight + chartAxis
	}
	b.WriteString(`</svg>`)
	c.SVG = template.HTML(b.String()) //nolint:gosec // numbers, and text through esc
	return c
}

// drawing places a window's minutes on the chart's x axis.
type drawing struct {
	b    *strings.Builder
	ms   []*pb.ActivityMinute
	step float64 // the width of a minute
}

// x is where minute i starts.
func (d drawing) x(i int) float64 { return chartLeft + float64(i)*d.step }

// barWidth leaves a gap between bars wide enough to see one.
func (d drawing) barWidth() float64 {
	if d.step >= 3 {
		return d.step * 0.8
	}
	return d.step
}

// panel draws a panel's frame at y, plot height h: its title, its y axis (0
// and the largest value), its time ticks and labels below, and the part of
// the window not counted in full, shaded.
func (d drawing) panel(y, h int, title string, peak int64, c activityChart) {
	b := d.b
	top, bottom := y+chartTitle, y+chartTitle+h
	fmt.Fprintf(b, `<text class="panel-title" x="%d" y="%d">%s</text>`, chartLeft, y+13, esc(title))
	if c.Truncated {
		cut := c.CountedSince.Sub(c.From).Minutes() * d.step
		if cut > 0 {
			fmt.Fprintf(b, `<rect class="uncounted" x="%d" y="%d" width="%.1f" height="%d"><title>not counted in full</title></rect>`,
				chartLeft, top, min(cut, chartPlotW), h)
		}
	}
	fmt.Fprintf(b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d"/>`, chartLeft, bottom, chartWidth-chartRight, bottom)
	fmt.Fprintf(b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d"/>`, chartLeft, top, chartLeft, bottom)
	fmt.Fprintf(b, `<line class="grid" x1="%d" y1="%d" x2="%d" y2="%d"/>`, chartLeft, top, chartWidth-chartRight, top)
	if peak > 0 {
		fmt.Fprintf(b, `<text class="y max" x="%d" y="%d">%d</text>`, chartLeft-4, top+9, peak)
	} else {
		fmt.Fprintf(b, `<text class="none" x="%d" y="%d">none in this window</text>`, chartLeft+6, bottom-6)
	}
	fmt.Fprintf(b, `<text class="y" x="%d" y="%d">0</text>`, chartLeft-4, bottom)
	every := tickEvery(len(d.ms))
	for i, m := range d.ms {
		t := m.GetStart().AsTime().UTC()
		if (t.Hour()*60+t.Minute())%every != 0 {
			continue
		}
		x := d.x(i)
		fmt.Fprintf(b, `<line class="grid" x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`, x, top, x, bottom)
		fmt.Fprintf(b, `<text class="time" x="%.1f" y="%d">%s</text>`, x, bottom+12, t.Format(timeLayout))
	}
}

// tickEvery is the minutes between time labels: a round number that gives
// at most maxTimeTicks of them.
func tickEvery(minutes int) int {
	for _, every := range []int{1, 5, 10, 15, 30, 60, 120} {
		if minutes/every <= maxTimeTicks {
			return every
		}
	}
	return 180
}

// minuteWords is a minute's counts in words, for its bar's tooltip.
func minuteWords(m *pb.ActivityMinute) string {
	parts := []string{}
	for _, o := range outcomes {
		if v := o.value(m); v > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", v, o.title))
		}
	}
	return m.GetStart().AsTime().Format(timeLayout) + " UTC: " + strings.Join(parts, ", ")
}

// esc escapes text for the SVG's markup.
func esc(s string) string { return template.HTMLEscapeString(s) }
