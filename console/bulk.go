package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// Bounds of a bulk reconcile.
const (
	// bulkMax is the most jobs one bulk action moves; a larger selection is
	// moved in several (each preview says how many matched).
	bulkMax = 5000
	// previewLifetime is how long a preview may be confirmed: past it the
	// person previews again and sees what matches then.
	previewLifetime = 15 * time.Minute
	// previewsPerSession bounds the previews one session keeps.
	previewsPerSession = 4
	// bulkParallel is how many resolutions one bulk action has in flight.
	bulkParallel = 4
)

// target is one job of a preview: its id and the attempt the preview saw,
// which fences its resolution (R29).
type target struct {
	ID      int64
	Attempt int64
}

// bulkPreview is the exact set of jobs a person previewed; confirming moves
// these and no others.
type bulkPreview struct {
	ID      string
	Filter  reviewFilter
	Targets []target
	// More is true when more than bulkMax jobs matched.
	More    bool
	Sample  []*pb.Job // the first few, for the person to check
	Created time.Time
}

// bulkForm shows the filters a bulk reconcile will select by.
func (c *Console) bulkForm(w http.ResponseWriter, r *http.Request, s *session) {
	c.render(w, http.StatusOK, "bulk", c.view(r, s, "Bulk reconcile", listView{Filter: reviewFilterOf(r.URL.Query())}))
}

// bulkPreview lists every manual-review job the filter matches now (up to
// bulkMax), keeps that list in the session and asks for a typed
// confirmation.
func (c *Console) bulkPreview(w http.ResponseWriter, r *http.Request, s *session) {
	f := reviewFilterOf(r.PostForm)
	p := &bulkPreview{ID: randomID(), Filter: f, Created: time.Now()}
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	page := ""
	for {
		req, err := f.request(page, 500)
		if err != nil {
			c.render(w, http.StatusBadRequest, "bulk", c.view(r, s, "Bulk reconcile", listView{Filter: f, Error: err.Error()}))
			return
		}
		resp, err := c.api.ListJobs(ctx, req)
		if err != nil {
			e := explain(err)
			if e.httpStatus != http.StatusBadRequest {
				c.failAPI(w, r, s, err)
				return
			}
			c.render(w, http.StatusBadRequest, "bulk", c.view(r, s, "Bulk reconcile", listView{Filter: f, Error: e.text}))
			return
		}
		for _, j := range resp.GetJobs() {
			if len(p.Targets) == bulkMax {
				p.More = true
				break
			}
			p.Targets = append(p.Targets, target{ID: j.GetId(), Attempt: j.GetAttempt()})
			if len(p.Sample) < 20 {
				p.Sample = append(p.Sample, j)
			}
		}
		if page = resp.GetNextPageToken(); page == "" || p.More {
			break
		}
	}
	s.mu.Lock()
	for id, old := range s.previews {
		if time.Since(old.Created) > previewLifetime || len(s.previews) >= previewsPerSession {
			delete(s.previews, id)
		}
	}
	s.previews[p.ID] = p
	s.mu.Unlock()
	c.render(w, http.StatusOK, "bulk_preview", c.view(r, s, "Bulk reconcile: confirm", p))
}

// bulkResult is what a bulk action did, job by job counted.
type bulkResult struct {
	Filter    reviewFilter
	Reason    string
	Previewed int
	Moved     int
	Replayed  int
	// Changed lists the jobs someone acted on between the preview and the
	// confirmation: no longer in review under the attempt previewed.
	Changed []int64
	// Failed lists the jobs whose resolution failed for another reason
	// (unavailable, timeout): they may be retried.
	Failed []string
}

// NotTried counts the previewed jobs left alone because the action stopped
// (the coordinator stopped accepting the credential).
func (b bulkResult) NotTried() int {
	return b.Previewed - b.Moved - b.Replayed - len(b.Changed) - len(b.Failed)
}

// bulkApply moves exactly the previewed jobs back to reconcile, each fenced
// by the attempt the preview saw and recorded in its history under the
// person's name with their reason (R29).
func (c *Console) bulkApply(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PostFormValue("preview")
	s.mu.Lock()
	p := s.previews[id]
	delete(s.previews, id) // a confirmation is used once
	s.mu.Unlock()
	if p == nil || time.Since(p.Created) > previewLifetime {
		c.fail(w, r, s, http.StatusConflict, "This preview expired or was already used. Preview again: nothing was changed.")
		return
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if r.PostFormValue("confirm") != strconv.Itoa(len(p.Targets)) || reason == "" || len(reason) > maxNote {
		s.mu.Lock()
		s.previews[p.ID] = p // give the person another go at typing it
		s.mu.Unlock()
		v := c.view(r, s, "Bulk reconcile: confirm", p)
		v.Message = fmt.Sprintf("Type %d to confirm, and give a reason (up to %d characters). Nothing was changed.",
			len(p.Targets), maxNote)
		c.render(w, http.StatusBadRequest, "bulk_preview", v)
		return
	}
	res := c.reconcileAll(r, s, p.Targets, reason)
	res.Filter = p.Filter
	c.log.Info("console: bulk reconcile", "operator", s.name, "previewed", len(p.Targets), "moved", res.Moved,
		"replayed", res.Replayed, "changed", len(res.Changed), "failed", len(res.Failed))
	c.render(w, http.StatusOK, "bulk_done", c.view(r, s, "Bulk reconcile: done", res))
}

// reconcileAll resolves each target as RECONCILE, bulkParallel at a time. A
// credential the coordinator no longer accepts stops the rest.
func (c *Console) reconcileAll(r *http.Request, s *session, targets []target, reason string) bulkResult {
	res := bulkResult{Reason: reason, Previewed: len(targets)}
	var mu sync.Mutex
	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	work := make(chan target)
	var wg sync.WaitGroup
	for range bulkParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				cctx, cancel := c.call(r.WithContext(ctx), s.token)
				resp, err := c.api.ResolveReview(cctx, &pb.ResolveReviewRequest{JobId: t.ID, Attempt: t.Attempt,
					Resolution: pb.ReviewResolution_REVIEW_RESOLUTION_RECONCILE, Note: reason})
				cancel()
				mu.Lock()
				switch e := explain(err); {
				case err == nil && resp.GetReplayed():
					res.Replayed++
				case err == nil:
					res.Moved++
				case conflict(err) || e.reason == pb.ErrorReason_ERROR_REASON_NOT_FOUND:
					res.Changed = append(res.Changed, t.ID)
				default:
					res.Failed = append(res.Failed, fmt.Sprintf("job %d: %s", t.ID, e.text))
					if e.reason == pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED ||
						e.reason == pb.ErrorReason_ERROR_REASON_PERMISSION_DENIED {
						stop()
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, t := range targets {
		select {
		case work <- t:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	return res
}
