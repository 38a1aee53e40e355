package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// Bounds of a bulk action.
const (
	// bulkMax is the most jobs one bulk action moves; a larger selection is
	// moved in several (each preview says how many matched).
	bulkMax = 5000
	// previewLifetime is how long a preview may be confirmed: past it the
	// person previews again and sees what matches then.
	previewLifetime = 15 * time.Minute
	// previewsPerSession bounds the previews one session keeps.
	previewsPerSession = 4
	// bulkParallel is how many calls one bulk action has in flight.
	bulkParallel = 4
)

// bulkKind is one kind of bulk action: what it selects and what it does to
// each job it previewed.
type bulkKind struct {
	// Name is the kind's value in forms; Title its pages' title; Path its
	// form's page.
	Name, Title, Path string
	// States are the states its filter may select, the first by default.
	States []pb.JobState
	// do is the action on one previewed job, fenced by the attempt the
	// preview saw, with the person's reason.
	do func(ctx context.Context, api pb.CoordinatorClient, t target, reason string) (outcome, error)
}

// The bulk actions.
var (
	bulkReconcile = &bulkKind{Name: "reconcile", Title: "Bulk reconcile", Path: "/bulk",
		States: []pb.JobState{pb.JobState_JOB_STATE_MANUAL_REVIEW},
		do: func(ctx context.Context, api pb.CoordinatorClient, t target, reason string) (outcome, error) {
			resp, err := api.ResolveReview(ctx, &pb.ResolveReviewRequest{JobId: t.ID, Attempt: t.Attempt,
				Resolution: pb.ReviewResolution_REVIEW_RESOLUTION_RECONCILE, Note: reason})
			if resp.GetReplayed() {
				return outcomeReplayed, err
			}
			return outcomeDone, err
		}}
	bulkCancel = &bulkKind{Name: "cancel", Title: "Bulk cancel", Path: "/bulk/cancel",
		States: []pb.JobState{pb.JobState_JOB_STATE_READY, pb.JobState_JOB_STATE_RUNNING},
		do: func(ctx context.Context, api pb.CoordinatorClient, t target, reason string) (outcome, error) {
			resp, err := api.CancelRefund(ctx, &pb.CancelRefundRequest{JobId: t.ID, Attempt: t.Attempt, Reason: reason})
			switch {
			case resp.GetReplayed():
				return outcomeReplayed, err
			case resp.GetCancelled():
				return outcomeDone, err
			}
			return outcomeRequested, err
		}}
	bulkKinds = []*bulkKind{bulkReconcile, bulkCancel}
)

// kindOf is the bulk action a form names; reconcile when it names none.
func kindOf(name string) *bulkKind {
	for _, k := range bulkKinds {
		if k.Name == name {
			return k
		}
	}
	return bulkReconcile
}

// Cancel reports whether this is the bulk cancel, for the templates.
func (k *bulkKind) Cancel() bool { return k == bulkCancel }

// filterOf is the kind's filter from q: the state one of the kind's.
func (k *bulkKind) filterOf(q url.Values) reviewFilter {
	f := reviewFilterOf(q)
	f.State = k.States[0]
	if v, ok := pb.JobState_value[q.Get("state")]; ok && slices.Contains(k.States, pb.JobState(v)) {
		f.State = pb.JobState(v)
	}
	return f
}

// target is one job of a preview: its id and the attempt the preview saw,
// which fences the action on it (R29).
type target struct {
	ID      int64
	Attempt int64
}

// bulkPreview is the exact set of jobs a person previewed; confirming acts
// on these and no others.
type bulkPreview struct {
	ID      string
	Kind    *bulkKind
	Filter  reviewFilter
	Targets []target
	// More is true when more than bulkMax jobs matched.
	More    bool
	Sample  []*pb.Job // the first few, for the person to check
	Created time.Time
}

// bulkForm is a bulk action's filter form.
type bulkForm struct {
	Kind   *bulkKind
	Filter reviewFilter
	Error  string
}

// bulkReconcileForm and bulkCancelForm show the filters a bulk action will
// select by.
func (c *Console) bulkReconcileForm(w http.ResponseWriter, r *http.Request, s *session) {
	c.bulkFormOf(w, r, s, bulkReconcile)
}

func (c *Console) bulkCancelForm(w http.ResponseWriter, r *http.Request, s *session) {
	c.bulkFormOf(w, r, s, bulkCancel)
}

func (c *Console) bulkFormOf(w http.ResponseWriter, r *http.Request, s *session, k *bulkKind) {
	c.render(w, http.StatusOK, "bulk", c.view(r, s, k.Title, bulkForm{Kind: k, Filter: k.filterOf(r.URL.Query())}))
}

// bulkPreview lists every job the filter matches now (up to bulkMax) with
// the attempt it is at, keeps that list in the session and asks for a typed
// confirmation.
func (c *Console) bulkPreview(w http.ResponseWriter, r *http.Request, s *session) {
	k := kindOf(r.PostFormValue("kind"))
	f := k.filterOf(r.PostForm)
	p := &bulkPreview{ID: randomID(), Kind: k, Filter: f, Created: time.Now()}
	refused := func(status int, text string) {
		c.render(w, status, "bulk", c.view(r, s, k.Title, bulkForm{Kind: k, Filter: f, Error: text}))
	}
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	page := ""
	for {
		req, err := f.request(page, 500)
		if err != nil {
			refused(http.StatusBadRequest, err.Error())
			return
		}
		resp, err := c.api.ListJobs(ctx, req)
		if err != nil {
			e := explain(err)
			if e.httpStatus != http.StatusBadRequest {
				c.failAPI(w, r, s, err)
				return
			}
			refused(http.StatusBadRequest, e.text)
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
	c.render(w, http.StatusOK, "bulk_preview", c.view(r, s, k.Title+": confirm", p))
}

// outcome is what a bulk action came to for one job.
type outcome string

const (
	outcomeDone      outcome = "done"      // moved back to reconcile; cancelled
	outcomeRequested outcome = "requested" // a cancel request: the provider decides (R32)
	outcomeReplayed  outcome = "replayed"  // already done so: nothing new written
	outcomeChanged   outcome = "changed"   // someone acted first: not under the attempt previewed
	outcomeRefused   outcome = "refused"   // the job cannot take the action (a cancel of a refund made)
	outcomeFailed    outcome = "failed"    // unavailable, timeout: may be tried again
)

// jobResult is one previewed job's outcome, and why when it was refused or
// failed.
type jobResult struct {
	ID      int64
	Outcome outcome
	Why     string
}

// bulkResult is what a bulk action did, job by job.
type bulkResult struct {
	Kind      *bulkKind
	Filter    reviewFilter
	Reason    string
	Previewed int
	Jobs      []jobResult // in the preview's order; the jobs tried only
}

// Of lists the jobs whose outcome is o ("done", "changed", …).
func (b bulkResult) Of(o string) []jobResult {
	var out []jobResult
	for _, j := range b.Jobs {
		if j.Outcome == outcome(o) {
			out = append(out, j)
		}
	}
	return out
}

// Count counts the jobs whose outcome is o.
func (b bulkResult) Count(o string) int { return len(b.Of(o)) }

// NotTried counts the previewed jobs left alone because the action stopped
// (the coordinator stopped accepting the credential).
func (b bulkResult) NotTried() int { return b.Previewed - len(b.Jobs) }

// bulkApply acts on exactly the previewed jobs, each fenced by the attempt
// the preview saw and recorded in its history under the person's name with
// their reason (R29).
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
		v := c.view(r, s, p.Kind.Title+": confirm", p)
		v.Message = fmt.Sprintf("Type %d to confirm, and give a reason (up to %d characters). Nothing was changed.",
			len(p.Targets), maxNote)
		c.render(w, http.StatusBadRequest, "bulk_preview", v)
		return
	}
	res := bulkResult{Kind: p.Kind, Filter: p.Filter, Reason: reason, Previewed: len(p.Targets),
		Jobs: c.each(r, s, p.Targets, reason, p.Kind.do)}
	c.log.Info("console: bulk "+p.Kind.Name, "operator", s.name, "previewed", len(p.Targets), "done", res.Count("done"),
		"requested", res.Count("requested"), "replayed", res.Count("replayed"), "changed", res.Count("changed"),
		"refused", res.Count("refused"), "failed", res.Count("failed"))
	c.render(w, http.StatusOK, "bulk_done", c.view(r, s, p.Kind.Title+": done", res))
}

// each runs do on every target, bulkParallel at a time, and returns each
// one's outcome in the targets' order. A credential the coordinator no
// longer accepts stops the rest, which are left out.
func (c *Console) each(r *http.Request, s *session, targets []target, reason string,
	do func(context.Context, pb.CoordinatorClient, target, string) (outcome, error)) []jobResult {
	results := make([]*jobResult, len(targets))
	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	work := make(chan int)
	var wg sync.WaitGroup
	for range bulkParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				t := targets[i]
				cctx, cancel := c.call(r.WithContext(ctx), s.token)
				o, err := do(cctx, c.api, t, reason)
				cancel()
				res := &jobResult{ID: t.ID, Outcome: o}
				switch e := explain(err); {
				case err == nil:
				case conflict(err) || e.reason == pb.ErrorReason_ERROR_REASON_NOT_FOUND:
					res.Outcome = outcomeChanged
				case e.reason == pb.ErrorReason_ERROR_REASON_JOB_NOT_CANCELLABLE:
					res.Outcome, res.Why = outcomeRefused, notCancellable(e.metadata["current_state"])
				default:
					res.Outcome, res.Why = outcomeFailed, e.text
					if e.reason == pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED ||
						e.reason == pb.ErrorReason_ERROR_REASON_PERMISSION_DENIED {
						stop()
					}
				}
				results[i] = res
			}
		}()
	}
	for i := range targets {
		select {
		case work <- i:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	var out []jobResult
	for _, res := range results {
		if res != nil {
			out = append(out, *res)
		}
	}
	return out
}
