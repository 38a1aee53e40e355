package storetest

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// listAll pages through a listing and returns the job ids in order.
func listAll(t *testing.T, s store.Store, p store.ListParams) []int64 {
	t.Helper()
	var ids []int64
	for pages := 0; ; pages++ {
		page, err := s.List(ctxFor(t), p)
		if err != nil {
			t.Fatalf("List(%+v): %v", p, err)
		}
		if len(page.Jobs) > p.Limit || pages > 100 {
			t.Fatalf("page of %d jobs for limit %d", len(page.Jobs), p.Limit)
		}
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		if page.NextPageToken == "" {
			return ids
		}
		p.PageToken = page.NextPageToken
	}
}

// testListJobsKeyset: every filter walks its order page by page (keyset,
// never OFFSET), without gaps or repeats, even across equal timestamps (Q4, Q7).
func testListJobsKeyset(t *testing.T, s store.Store) {
	var all, orderX, globex []int64
	for i := 0; i < 9; i++ {
		p := refund(t)
		if i%3 == 0 {
			p.OrderID = "order-X"
		}
		if i%2 == 0 {
			p.Provider = "globex"
		}
		j := enqueue(t, s, p)
		all = append(all, j.ID)
		if p.OrderID == "order-X" {
			orderX = append(orderX, j.ID)
		}
		if p.Provider == "globex" {
			globex = append(globex, j.ID)
		}
	}
	running := claim(t, s, "A", 2)
	newest := func(ids []int64) []int64 { out := slices.Clone(ids); slices.Reverse(out); return out }

	if got := listAll(t, s, store.ListParams{Limit: 4}); !slices.Equal(got, newest(all)) {
		t.Fatalf("all jobs = %v, want %v (newest first)", got, newest(all))
	}
	if got := listAll(t, s, store.ListParams{OrderID: "order-X", Limit: 2}); !slices.Equal(got, newest(orderX)) {
		t.Fatalf("order-X = %v, want %v (newest first)", got, newest(orderX))
	}
	if got := listAll(t, s, store.ListParams{Provider: "globex", Limit: 2}); !slices.Equal(got, newest(globex)) {
		t.Fatalf("globex = %v, want %v", got, newest(globex))
	}
	wantReady := slices.DeleteFunc(slices.Clone(all), func(id int64) bool { return slices.Contains(ids(running), id) })
	if got := listAll(t, s, store.ListParams{State: store.StateReady, Limit: 3}); !slices.Equal(got, wantReady) {
		t.Fatalf("ready = %v, want %v (oldest due first)", got, wantReady)
	}
	if got := listAll(t, s, store.ListParams{State: store.StateRunning, Limit: 1}); !slices.Equal(got, ids(running)) {
		t.Fatalf("running = %v, want %v", got, ids(running))
	}

	page, err := s.List(ctxFor(t), store.ListParams{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	for field, p := range map[string]store.ListParams{
		"page_size":  {Limit: 0},
		"state":      {Limit: 1, State: "lost"},
		"provider":   {Limit: 1, Provider: "Not A Provider"},
		"page_token": {Limit: 2, PageToken: "bm90LWEtdG9rZW4"},
	} {
		_, err := s.List(ctxFor(t), p)
		wantViolation(t, err, field)
	}
	// A forged token whose time no column can hold is refused, not passed on.
	forged := store.ListParams{Limit: 2, OrderID: "order-X"}
	forged.PageToken = forged.NextToken(store.Job{ID: 1, CreatedAt: time.UnixMicro(math.MaxInt64)})
	_, err = s.List(ctxFor(t), forged)
	wantViolation(t, err, "page_token")
	// A token is bound to its filters.
	_, err = s.List(ctxFor(t), store.ListParams{Limit: 2, Provider: "globex", PageToken: page.NextPageToken})
	wantViolation(t, err, "page_token")
}
