package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// HistoryAger is the test seam that puts a job's past where a test wants it:
// the times of its history and receipts moved d into the past, as if it had
// happened then. Tests age jobs oldest first, so that ids still grow with
// time, as they do in a live database.
type HistoryAger interface {
	AgeHistory(ctx context.Context, jobID int64, d time.Duration) error
}

func age(t *testing.T, s store.Store, id int64, d time.Duration) {
	t.Helper()
	a, ok := s.(HistoryAger)
	if !ok {
		t.Fatalf("storetest: %T cannot age a job's history (no AgeHistory)", s)
	}
	if err := a.AgeHistory(ctxFor(t), id, d); err != nil {
		t.Fatalf("AgeHistory(%d, %s): %v", id, d, err)
	}
}

func activity(t *testing.T, s store.Store, minutes, maxRows int) store.Activity {
	t.Helper()
	a, err := s.Activity(ctxFor(t), store.ActivityParams{Minutes: minutes, MaxRows: maxRows})
	if err != nil {
		t.Fatalf("Activity(%d minutes, %d rows): %v", minutes, maxRows, err)
	}
	if len(a.Minutes) != minutes {
		t.Fatalf("Activity(%d minutes) listed %d minutes", minutes, len(a.Minutes))
	}
	last := a.Now.Truncate(time.Minute)
	for i, m := range a.Minutes {
		if want := last.Add(-time.Duration(minutes-1-i) * time.Minute); !m.Start.Equal(want) {
			t.Fatalf("minute %d starts %v, want %v (the window ends in the minute of now, %v)", i, m.Start, want, a.Now)
		}
	}
	return a
}

// expectedActivity counts, in a's window, what the history and receipts of
// jobs say happened, as DESIGN's activity read must: transitions that
// changed the state to succeeded, manual_review or cancelled, takeovers,
// resolutions, receipts.
func expectedActivity(t *testing.T, s store.Store, a store.Activity, jobs ...int64) []store.ActivityMinute {
	t.Helper()
	want := make([]store.ActivityMinute, len(a.Minutes))
	for i := range want {
		want[i].Start = a.Minutes[i].Start
	}
	at := func(ts time.Time) *store.ActivityMinute {
		i := int(ts.Sub(want[0].Start) / time.Minute)
		if ts.Before(want[0].Start) || i >= len(want) {
			return nil
		}
		return &want[i]
	}
	for _, id := range jobs {
		d := get(t, s, id)
		for _, e := range d.Events {
			m := at(e.CreatedAt)
			if m == nil {
				continue
			}
			changed := e.FromState != e.ToState
			switch {
			case changed && e.ToState == store.StateSucceeded:
				m.Succeeded++
			case changed && e.ToState == store.StateManualReview:
				m.ManualReview++
			case changed && e.ToState == "cancelled":
				m.Cancelled++
			}
			switch e.Kind {
			case store.EventTakenOver:
				m.Takeovers++
			case store.EventResolved:
				m.ReviewsResolved++
			}
		}
		for _, o := range d.Observations {
			if m := at(o.CreatedAt); m != nil {
				m.Receipts++
			}
		}
	}
	return want
}

// sum adds up the minutes.
func sum(ms []store.ActivityMinute) store.ActivityMinute {
	var total store.ActivityMinute
	for _, m := range ms {
		total.Succeeded += m.Succeeded
		total.ManualReview += m.ManualReview
		total.Cancelled += m.Cancelled
		total.Takeovers += m.Takeovers
		total.ReviewsResolved += m.ReviewsResolved
		total.Receipts += m.Receipts
	}
	return total
}

func nonZero(ms []store.ActivityMinute) string {
	var out string
	for _, m := range ms {
		c := m
		c.Start = time.Time{}
		if c != (store.ActivityMinute{}) {
			out += fmt.Sprintf("\n  %s %+v", m.Start.Format("15:04"), c)
		}
	}
	return out
}

// testActivityCountsPerMinute_M1_Q3: the activity read counts each minute's
// finishes by outcome (a cancel at once among them, a cancel request not,
// R32), takeovers, resolutions and receipts of the window,
// from the history's and the receipts' id ranges the search of their
// primary keys finds (Q3: nothing before the window is read, which a
// bound of exactly the window's rows shows), and at most the rows it is
// allowed, the newest, saying so.
func testActivityCountsPerMinute_M1_Q3(t *testing.T, s store.Store) {
	empty := activity(t, s, store.DefaultActivityMinutes, 0)
	if empty.Truncated || !empty.CountedSince.Equal(empty.Minutes[0].Start) || sum(empty.Minutes) != (store.ActivityMinute{}) {
		t.Fatalf("an empty store's activity: truncated %v, counted since %v (window from %v), %s", empty.Truncated,
			empty.CountedSince, empty.Minutes[0].Start, nonZero(empty.Minutes))
	}

	// Oldest first, so that ids grow with time. A: completed 200 minutes
	// ago, before the window.
	a := enqueue(t, s, refund(t))
	write(t, s, complete(of(claimOne(t, s, "A", a.ID)), "re_a"))
	age(t, s, a.ID, 200*time.Minute)
	// B: escalated 100 minutes ago.
	b, _ := escalated(t, s)
	age(t, s, b.ID, 100*time.Minute)
	// C: taken over, a late receipt from its first holder, completed; 30
	// minutes ago.
	c := enqueue(t, s, refund(t))
	first := claimOne(t, s, "A", c.ID)
	expire(t, s, c.ID)
	second := claimOne(t, s, "B", c.ID)
	observe(t, s, store.ObservationParams{Job: store.JobRef{ID: c.ID}, Attempt: first.Job.Attempt, Source: "A",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_c"}, false)
	write(t, s, complete(of(second), "re_c"))
	age(t, s, c.ID, 30*time.Minute)
	// D: escalated and resolved as refunded, E completed: now.
	d := enqueue(t, s, refund(t))
	dc := claimOne(t, s, "A", d.ID)
	write(t, s, escalate(of(dc)))
	write(t, s, resolve(d.ID, dc.Job.Attempt, store.ResolutionRefunded, "re_d"))
	e := enqueue(t, s, refund(t))
	write(t, s, complete(of(claimOne(t, s, "A", e.ID)), "re_e"))
	// F: cancelled before it was sent; G: a cancel requested while a worker
	// held it, which takes the job from it (no takeover, no finish): now, last.
	f := enqueue(t, s, refund(t))
	cancel(t, s, cancelOf(f.ID, 0, "customer withdrew"))
	g := enqueue(t, s, refund(t))
	held := claimOne(t, s, "A", g.ID)
	cancel(t, s, cancelOf(g.ID, held.Job.Attempt, "duplicate"))

	got := activity(t, s, store.DefaultActivityMinutes, 0)
	want := expectedActivity(t, s, got, a.ID, b.ID, c.ID, f.ID, g.ID, d.ID, e.ID)
	if !slices.Equal(got.Minutes, want) || got.Truncated {
		t.Fatalf("activity (truncated %v):%s\nwant:%s", got.Truncated, nonZero(got.Minutes), nonZero(want))
	}
	total := store.ActivityMinute{Succeeded: 3, ManualReview: 2, Cancelled: 1, Takeovers: 1, ReviewsResolved: 1,
		Receipts: 1}
	if sum(got.Minutes) != total {
		t.Fatalf("activity of the window adds up to %+v, want %+v", sum(got.Minutes), total)
	}
	if last := sum(activity(t, s, 60, 0).Minutes); last.ManualReview != 1 || last.Succeeded != 3 {
		t.Fatalf("the last hour's activity %+v: want D's review and the three completions, not B's review", last)
	}

	// The window's rows are B's to E's; A's lie before it. Bounded by
	// exactly the window's rows the read is whole: it starts at B's first,
	// never at A's.
	var rows int
	for _, id := range []int64{b.ID, c.ID, f.ID, g.ID, d.ID, e.ID} {
		rows += len(get(t, s, id).Events)
	}
	if exact := activity(t, s, store.DefaultActivityMinutes, rows); exact.Truncated ||
		!slices.Equal(exact.Minutes, expectedActivity(t, s, exact, a.ID, b.ID, c.ID, f.ID, g.ID, d.ID, e.ID)) {
		t.Fatalf("bounded by the window's %d rows: truncated %v,%s", rows, exact.Truncated, nonZero(exact.Minutes))
	}
	if short := activity(t, s, store.DefaultActivityMinutes, rows-1); !short.Truncated {
		t.Fatalf("bounded by %d of the window's %d rows: not truncated", rows-1, rows)
	}
	// Bounded by five rows: F's two and G's three are counted, from F's
	// enqueue on, and the read says so.
	newest := activity(t, s, store.DefaultActivityMinutes, 5)
	enqueued := get(t, s, f.ID).Events[0].CreatedAt
	if n := sum(newest.Minutes); !newest.Truncated || !newest.CountedSince.Equal(enqueued) || n.Cancelled != 1 ||
		n.Succeeded != 0 || n.ManualReview != 0 || n.ReviewsResolved != 0 || n.Takeovers != 0 {
		t.Fatalf("bounded by 5 rows: truncated %v, counted since %v (F enqueued %v), %+v; want F's cancel only",
			newest.Truncated, newest.CountedSince, enqueued, n)
	}

	for _, minutes := range []int{0, -1, store.MaxActivityMinutes + 1} {
		_, err := s.Activity(ctxFor(t), store.ActivityParams{Minutes: minutes})
		wantViolation(t, err, "minutes")
	}
	_, err := s.Activity(ctxFor(t), store.ActivityParams{Minutes: 1, MaxRows: -1})
	wantViolation(t, err, "max_rows")
}
