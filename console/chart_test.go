package console_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/browser"
	"github.com/jobfence/jobfence/internal/testdb"
)

// finish enqueues a refund and has a worker complete it (refundID) or, with
// refundID empty, escalate it.
func (e *env) finish(t *testing.T, key, refundID string) {
	t.Helper()
	if refundID == "" {
		e.toReview(t, key, "acme", "no record outside the window")
		return
	}
	if _, err := e.api.EnqueueRefund(as(t, tokShop), &pb.EnqueueRefundRequest{OperationKey: key, OrderId: "order-" + key,
		PaymentId: "pay-" + key, AmountMinor: 1999, Currency: "EUR", Provider: "acme"}); err != nil {
		t.Fatal(err)
	}
	got, err := e.api.Claim(as(t, tokWorker), &pb.ClaimRequest{WorkerId: "w", MaxJobs: 1, Provider: "acme"})
	if err != nil || len(got.GetJobs()) != 1 {
		t.Fatalf("claim %s: %v %v", key, got, err)
	}
	c := got.GetJobs()[0]
	if _, err := e.api.Complete(as(t, tokWorker), &pb.CompleteRequest{JobId: c.GetJob().GetId(), Attempt: c.GetAttempt(),
		LeaseToken: c.GetLeaseToken(), ProviderRefundId: refundID}); err != nil {
		t.Fatal(err)
	}
}

// pageErrors leaves out of errors the browser logged the HTTP statuses it
// reports as errors: pages answered 4xx on purpose (a refused form), and the
// favicon every browser asks for, which the console does not serve. What
// stays is what no page should cause: a CSP violation, a broken resource.
func pageErrors(errors []string) []string {
	var out []string
	for _, e := range errors {
		if !strings.HasPrefix(e, "network: Failed to load resource: the server responded with a status of 4") {
			out = append(out, e)
		}
	}
	return out
}

// eval evaluates a script in s's page.
func eval[T any](t *testing.T, s *browser.Session, script string) T {
	t.Helper()
	var v T
	if err := s.Run(chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		var err error
		v, err = chromedp.Evaluate[T](script)(ctx, tg)
		return err
	})); err != nil {
		t.Fatalf("evaluate %s: %v", script, err)
	}
	return v
}

// The overview draws the last hours' activity as inline SVG, in a real
// headless Chromium: a chart element the browser lays out, one stacked bar
// for each minute in which jobs finished and one segment per outcome,
// coloured by the stylesheet (no style attribute: the CSP forbids them, and
// the browser logs no violation), the times and largest values on the axes,
// a title and description a screen reader reads, and the numbers in a table
// under it. A reader sees it too.
func TestActivityChartInABrowser_M1(t *testing.T) {
	e := start(t, testdb.MySQLBackend())
	for i := range 3 {
		e.finish(t, fmt.Sprintf("chart-ok-%d", i), fmt.Sprintf("re_chart_%d", i))
	}
	e.finish(t, "chart-review", "")
	// The coordinator keeps this answer for a while: the page draws it.
	a, err := e.api.GetActivity(as(t, tokAlice), &pb.GetActivityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	bars, segments, busy := 0, 0, 0
	var total pb.ActivityMinute
	for _, m := range a.GetMinutes() {
		for _, v := range []int64{m.GetSucceeded(), m.GetManualReview(), m.GetCancelled()} {
			if v > 0 {
				segments++
			}
		}
		if m.GetSucceeded()+m.GetManualReview()+m.GetCancelled() > 0 {
			bars++
		}
		if m.GetSucceeded()+m.GetManualReview()+m.GetCancelled()+m.GetTakeovers()+m.GetReviewsResolved()+m.GetReceipts() > 0 {
			busy++
		}
		total.Succeeded += m.GetSucceeded()
		total.ManualReview += m.GetManualReview()
	}
	if total.Succeeded != 3 || total.ManualReview != 1 || bars == 0 {
		t.Fatalf("the coordinator's activity: %d succeeded, %d to review in %d minutes; want 3 and 1", total.Succeeded,
			total.ManualReview, bars)
	}

	b := browser.Start(t)
	s := b.NewSession(t)
	logged := s.WatchLog()
	s.Navigate(e.web.URL + "/")
	s.Fill("#token", tokAlice)
	s.Submit("#signin")
	if !eval[bool](t, s, `document.querySelector('#activity-chart') instanceof SVGSVGElement`) {
		t.Fatal("the overview has no SVG chart")
	}
	if w := eval[float64](t, s, `document.querySelector('#activity-chart').getBoundingClientRect().width`); w < 600 {
		t.Fatalf("the chart is %.0f px wide", w)
	}
	if got := eval[int](t, s, `document.querySelectorAll('#activity-chart g.finishes').length`); got != bars {
		t.Fatalf("%d bars, want one per minute in which jobs finished: %d", got, bars)
	}
	if got := eval[int](t, s, `document.querySelectorAll('#activity-chart g.finishes rect.bar').length`); got != segments {
		t.Fatalf("%d bar segments, want one per outcome and minute: %d", got, segments)
	}
	if got := eval[string](t, s, `getComputedStyle(document.querySelector('#activity-chart rect.bar.succeeded')).fill`); got != "rgb(23, 105, 58)" {
		t.Fatalf("a succeeded segment is filled %q, want the stylesheet's green", got)
	}
	if n := eval[int](t, s, `document.querySelectorAll('[style]').length`); n != 0 {
		t.Fatalf("%d elements carry a style attribute, which the CSP forbids", n)
	}
	title := eval[string](t, s, `document.querySelector('#activity-title').textContent`)
	desc := eval[string](t, s, `document.querySelector('#activity-desc').textContent`)
	if !strings.HasPrefix(title, "Activity per minute") || !strings.Contains(desc, "3 succeeded, 1 to manual review") {
		t.Fatalf("the chart's title %q and description %q", title, desc)
	}
	labels := eval[string](t, s, `[...document.querySelectorAll('#activity-chart text')].map(e => e.textContent).join(' ')`)
	last := a.GetMinutes()[len(a.GetMinutes())-1].GetStart().AsTime().Format("15:04")
	if !strings.Contains(labels, "Jobs finished per minute") || !strings.Contains(labels, "Receipts filed per minute") ||
		!strings.Contains(labels, last[:2]+":") {
		t.Fatalf("the chart's labels lack a panel or the times (the last minute %s):\n%s", last, labels)
	}
	if got := eval[int](t, s, `document.querySelectorAll('#activity-numbers tr.minute').length`); got != busy {
		t.Fatalf("the table lists %d minutes, want the %d with activity", got, busy)
	}
	if got := eval[string](t, s, `document.querySelector('#activity-total').textContent`); !strings.Contains(got, "3") {
		t.Fatalf("the table's total row %q", got)
	}
	if shots := os.Getenv(envScreenshots); shots != "" {
		s.Screenshot(filepath.Join(shots, "console-activity.png"))
	}
	if errs := pageErrors(logged()); len(errs) != 0 {
		t.Fatalf("the browser logged errors on the overview:\n%s", strings.Join(errs, "\n"))
	}

	rita := e.person(t)
	rita.signIn(tokRita)
	mustContain(t, rita.get("/?activity=60"), `id="activity-chart"`, `class="here">1 h</a>`)
}
