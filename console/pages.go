package console

import (
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// pageSize is how many jobs a list page shows.
const pageSize = 50

// overview shows what operators watch (M1), from one GetOverview.
func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	o, err := c.api.GetOverview(ctx, &pb.GetOverviewRequest{Limit: 10})
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	v := overviewView{GetOverviewResponse: o, Webhooks: c.opts.Webhooks}
	window := activityWindow(r.URL.Query().Get("activity"))
	if a, err := c.api.GetActivity(ctx, &pb.GetActivityRequest{Minutes: window}); err == nil {
		v.Activity = chartOf(a, window)
	} else {
		// The rest of the overview stands without the chart.
		e := explain(err)
		if e.reason == pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED {
			c.failAPI(w, r, s, err)
			return
		}
		v.Activity = activityChart{Window: window, Windows: windowLinks(window), Error: e.text}
		if status.Code(err) == codes.Unimplemented {
			v.Activity.Error = "This coordinator does not count activity yet (an earlier release): no chart."
		}
	}
	c.render(w, http.StatusOK, "overview", c.view(r, s, "Overview", v))
}

// overviewView is the overview's data: the coordinator's answer, whether
// webhooks are received at all (their panel is left out when not, unless
// some unmatched events were kept), and the activity chart.
type overviewView struct {
	*pb.GetOverviewResponse
	Webhooks bool
	Activity activityChart
}

// reviewFilter is the review queue's filters, as the query string has them,
// and the bulk actions'.
type reviewFilter struct {
	Provider string
	Reason   string // a prefix of the job's last reason
	From, To string // created on or after From, on or before To: dates, YYYY-MM-DD, UTC
	// State is the state listed: manual review when unset (the queue's,
	// and bulk reconcile's); bulk cancel chooses.
	State pb.JobState
}

func reviewFilterOf(q url.Values) reviewFilter {
	return reviewFilter{Provider: strings.TrimSpace(q.Get("provider")), Reason: q.Get("reason"),
		From: strings.TrimSpace(q.Get("from")), To: strings.TrimSpace(q.Get("to"))}
}

// request is the ListJobs request of the filter: manual_review jobs,
// longest waiting first. Errors name the bad field.
func (f reviewFilter) request(page string, size int32) (*pb.ListJobsRequest, error) {
	req := &pb.ListJobsRequest{State: f.State, Provider: f.Provider, ReasonPrefix: f.Reason, PageSize: size,
		PageToken: page}
	if req.State == pb.JobState_JOB_STATE_UNSPECIFIED {
		req.State = pb.JobState_JOB_STATE_MANUAL_REVIEW
	}
	day := func(field, v string) (time.Time, error) {
		t, err := time.Parse(time.DateOnly, v)
		if err != nil {
			return t, fmt.Errorf("%s: %q is not a date (YYYY-MM-DD)", field, v)
		}
		return t, nil
	}
	if f.From != "" {
		t, err := day("created from", f.From)
		if err != nil {
			return nil, err
		}
		req.CreatedAfter = timestamppb.New(t)
	}
	if f.To != "" {
		t, err := day("created to", f.To)
		if err != nil {
			return nil, err
		}
		req.CreatedBefore = timestamppb.New(t.AddDate(0, 0, 1)) // the whole day To
	}
	return req, nil
}

// Query is the filter as a query string, for links: typed as a URL part so
// that html/template keeps its '=' and '&' (each value is encoded here).
func (f reviewFilter) Query() template.URL {
	q := url.Values{}
	for k, v := range map[string]string{"provider": f.Provider, "reason": f.Reason, "from": f.From, "to": f.To} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.State != pb.JobState_JOB_STATE_UNSPECIFIED && f.State != pb.JobState_JOB_STATE_MANUAL_REVIEW {
		q.Set("state", f.State.String())
	}
	return template.URL(q.Encode()) //nolint:gosec // url.Values.Encode escapes every value
}

// Any reports whether any filter but the state is set.
func (f reviewFilter) Any() bool { f.State = 0; return f != reviewFilter{} }

// StateName is the state listed, in words.
func (f reviewFilter) StateName() string {
	if f.State == pb.JobState_JOB_STATE_UNSPECIFIED {
		return "manual review"
	}
	return enumWord(f.State.String(), "JOB_STATE_")
}

type listView struct {
	Filter reviewFilter
	Jobs   []*pb.Job
	// Observations counts each job's receipts.
	Observations map[int64]int64
	Next         string
	Error        string
	// For search results.
	By, Q string
}

// reviews is the review queue: jobs in manual review, longest waiting first,
// one keyset page at a time.
func (c *Console) reviews(w http.ResponseWriter, r *http.Request, s *session) {
	f := reviewFilterOf(r.URL.Query())
	lv := listView{Filter: f}
	req, err := f.request(r.URL.Query().Get("page"), pageSize)
	if err != nil {
		lv.Error = err.Error()
		c.render(w, http.StatusBadRequest, "reviews", c.view(r, s, "Review queue", lv))
		return
	}
	c.listPage(w, r, s, "reviews", "Review queue", req, lv)
}

// listPage renders page with the jobs req lists: a request the coordinator
// refuses as invalid is shown on the page with the filters, any other error
// on the error page.
func (c *Console) listPage(w http.ResponseWriter, r *http.Request, s *session, page, title string, req *pb.ListJobsRequest,
	lv listView) {
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	resp, err := c.api.ListJobs(ctx, req)
	if err != nil {
		e := explain(err)
		if e.httpStatus != http.StatusBadRequest {
			c.failAPI(w, r, s, err)
			return
		}
		lv.Error = e.text
		c.render(w, http.StatusBadRequest, page, c.view(r, s, title, lv))
		return
	}
	lv.Jobs, lv.Observations, lv.Next = resp.GetJobs(), resp.GetObservationCounts(), resp.GetNextPageToken()
	c.render(w, http.StatusOK, page, c.view(r, s, title, lv))
}

// searchFields are what a person may search by, each a lookup on its own
// index.
var searchFields = []string{"order_id", "payment_id", "operation_key", "provider_refund_id", "job_id"}

// search finds jobs by a business id: an operation key or job id opens the
// job; an order, payment or provider refund id lists its jobs.
func (c *Console) search(w http.ResponseWriter, r *http.Request, s *session) {
	by, q := r.URL.Query().Get("by"), strings.TrimSpace(r.URL.Query().Get("q"))
	lv := listView{By: by, Q: q}
	if q == "" {
		c.render(w, http.StatusOK, "search", c.view(r, s, "Search", lv))
		return
	}
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	req := &pb.ListJobsRequest{PageSize: pageSize, PageToken: r.URL.Query().Get("page")}
	switch by {
	case "job_id":
		id, err := strconv.ParseInt(q, 10, 64)
		if err != nil || id <= 0 {
			lv.Error = "A job id is a positive number."
			c.render(w, http.StatusBadRequest, "search", c.view(r, s, "Search", lv))
			return
		}
		http.Redirect(w, r, "/jobs/"+strconv.FormatInt(id, 10), http.StatusSeeOther)
		return
	case "operation_key":
		got, err := c.api.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_OperationKey{OperationKey: q},
			ObservationsPageSize: 1})
		if err != nil {
			e := explain(err)
			if e.reason != pb.ErrorReason_ERROR_REASON_NOT_FOUND && e.httpStatus != http.StatusBadRequest {
				c.failAPI(w, r, s, err)
				return
			}
			c.render(w, http.StatusOK, "search", c.view(r, s, "Search", lv)) // no job: an empty result
			return
		}
		http.Redirect(w, r, "/jobs/"+strconv.FormatInt(got.GetJob().GetId(), 10), http.StatusSeeOther)
		return
	case "order_id":
		req.OrderId = q
	case "payment_id":
		req.PaymentId = q
	case "provider_refund_id":
		req.ProviderRefundId = q
	default:
		lv.Error = "Search by one of: " + strings.Join(searchFields, ", ") + "."
		c.render(w, http.StatusBadRequest, "search", c.view(r, s, "Search", lv))
		return
	}
	c.listPage(w, r, s, "search", "Search", req, lv)
}

type jobView struct {
	*pb.GetJobResponse
	// ResendOpen says whether a same-key resend is still inside the
	// provider's key retention (R22), on the database's clock.
	ResendOpen bool
	// InReview: the job is in manual review; CanResolve: and the person is
	// an operator.
	InReview, CanResolve bool
	// CanCancel: the person is an operator and the job may be cancelled
	// from its page (cancellable); NeverSent: cancelling it cancels it at
	// once, nothing having reached the provider (R32).
	CanCancel, NeverSent bool
	// CanAct: the person is an operator (the attention list's
	// acknowledgement).
	CanAct bool
	// Review is what the page tells the person deciding, for a job in
	// review.
	Review *review
	// TraceID is the enqueue's trace id (R35), TraceURL its link in the
	// trace viewer (Options.TraceLinkTemplate); empty when none.
	TraceID, TraceURL string
}

// Ready, Running and Succeeded say which of the fields that depend on the
// state apply: a holder and a lease only while running, a next action and
// a due time only while waiting or running.
func (v jobView) Ready() bool     { return v.GetJob().GetState() == pb.JobState_JOB_STATE_READY }
func (v jobView) Running() bool   { return v.GetJob().GetState() == pb.JobState_JOB_STATE_RUNNING }
func (v jobView) Succeeded() bool { return v.GetJob().GetState() == pb.JobState_JOB_STATE_SUCCEEDED }
func (v jobView) Cancelled() bool { return v.GetJob().GetState() == pb.JobState_JOB_STATE_CANCELLED }

// job shows one job: every field, its history, its receipts, its ledger row,
// and, for an operator while it is in review, the two resolutions.
func (c *Console) job(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		c.fail(w, r, s, http.StatusNotFound, "No such job.")
		return
	}
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	obsPage := r.URL.Query().Get("obs")
	d, err := c.api.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: id}, ObservationsPageSize: 100,
		ObservationsPageToken: obsPage})
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	v := jobView{GetJobResponse: d, InReview: d.GetJob().GetState() == pb.JobState_JOB_STATE_MANUAL_REVIEW}
	v.CanResolve = v.InReview && s.canAct
	v.CanAct, v.CanCancel, v.NeverSent = s.canAct, s.canAct && cancellable(d.GetJob()), neverSent(d.GetJob())
	if dl := d.GetResendDeadline(); dl != nil && d.GetNow() != nil {
		v.ResendOpen = d.GetNow().AsTime().Before(dl.AsTime())
	}
	if v.InReview {
		v.Review = reviewOf(d, v.ResendOpen)
	}
	v.TraceID, v.TraceURL = traceLink(d.GetJob().GetTraceparent(), c.opts.TraceLinkTemplate)
	c.render(w, http.StatusOK, "job", c.view(r, s, fmt.Sprintf("Job %d", id), v))
}

// resolve closes a review as the person decided, fenced by the attempt the
// page showed (R29): when someone acted first, the person is told so and
// sees the job as it is now.
func (c *Console) resolve(w http.ResponseWriter, r *http.Request, s *session) {
	id, attempt, back, ok := c.jobAction(w, r, s)
	if !ok {
		return
	}
	refundID := strings.TrimSpace(r.PostFormValue("provider_refund_id"))
	req := &pb.ResolveReviewRequest{JobId: id, Attempt: attempt}
	var done string
	switch r.PostFormValue("resolution") {
	case "refunded":
		req.Resolution, req.ProviderRefundId = pb.ReviewResolution_REVIEW_RESOLUTION_REFUNDED, refundID
		done = "Marked refunded with provider refund id " + refundID
		if refundID == "" {
			s.setFlash("error", "Marking refunded needs the provider's refund id. Nothing was changed.")
			http.Redirect(w, r, back, http.StatusSeeOther)
			return
		}
	case "reconcile":
		req.Resolution = pb.ReviewResolution_REVIEW_RESOLUTION_RECONCILE
		done = "Sent back to reconcile: a worker asks the provider first"
	case "cancelled":
		req.Resolution = pb.ReviewResolution_REVIEW_RESOLUTION_CANCELLED
		done = "Cancelled: recorded that no refund happened, and none will be sent"
	default:
		c.fail(w, r, s, http.StatusBadRequest, "Choose a resolution.")
		return
	}
	if req.Note, ok = c.note(w, r, s, "note", back); !ok {
		return
	}
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	resp, err := c.api.ResolveReview(ctx, req)
	c.log.Info("console: resolve", "operator", s.name, "job_id", id, "attempt", attempt,
		"resolution", req.GetResolution().String(), "ok", err == nil)
	if err == nil {
		done += "; recorded in the history under " + s.name + "."
		if resp.GetReplayed() {
			done = "This resolution had already been recorded; nothing new was written."
		}
	}
	c.report(w, r, s, back, err, done, "")
}
