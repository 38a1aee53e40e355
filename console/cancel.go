package console

import (
	"net/http"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// staleCancel is what a person is told when the job moved on between their
// page and their cancel.
const staleCancel = "Someone acted first: the job changed since this page showed it (a worker took it or wrote " +
	"back, or a person acted). Nothing was changed by you; here it is now: read it again before cancelling."

// cancelled is what a cancel did, in the person's words: cancelled at once,
// or a cancel request that the provider's answer decides (R32).
func cancelled(resp *pb.CancelRefundResponse, name string) string {
	p := resp.GetJob().GetProvider()
	switch {
	case resp.GetReplayed():
		return "This cancel had already been recorded; nothing new was written."
	case resp.GetCancelled():
		return "Cancelled: nothing was sent to " + p + ", and nothing will be. Recorded in the history under " +
			name + "."
	}
	return "Cancel requested: " + p + " may already have this refund, so it is not sent again; the next worker " +
		"asks " + p + " what became of it. If " + p + " has it, the refund stands and the job joins the attention " +
		"list; if not, a person decides. Recorded in the history under " + name + "."
}

// cancel stops a refund (R32), fenced by the attempt the job page showed,
// with the person's reason: a refund never sent is cancelled at once; one
// that may have been sent gets a cancel request.
func (c *Console) cancel(w http.ResponseWriter, r *http.Request, s *session) {
	id, attempt, back, ok := c.jobAction(w, r, s)
	if !ok {
		return
	}
	reason, ok := c.note(w, r, s, "reason", back)
	if !ok {
		return
	}
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	resp, err := c.api.CancelRefund(ctx, &pb.CancelRefundRequest{JobId: id, Attempt: attempt, Reason: reason})
	c.log.Info("console: cancel", "operator", s.name, "job_id", id, "attempt", attempt, "ok", err == nil,
		"cancelled", resp.GetCancelled())
	c.report(w, r, s, back, err, cancelled(resp, s.name), staleCancel)
}

// neverSent reports whether j cannot have reached its provider: no first
// send is recorded and no worker holds it (R22, R32). Cancelling it cancels
// it at once.
func neverSent(j *pb.Job) bool {
	return j.GetFirstSentAt() == nil && j.GetState() != pb.JobState_JOB_STATE_RUNNING
}

// cancellable reports whether the job page offers the cancel form for j:
// waiting or running, with no cancel requested yet (a job in review is
// cancelled by its resolution).
func cancellable(j *pb.Job) bool {
	s := j.GetState()
	return (s == pb.JobState_JOB_STATE_READY || s == pb.JobState_JOB_STATE_RUNNING) && j.GetCancelRequestedAt() == nil &&
		j.GetArchivedAt() == nil
}
