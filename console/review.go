package console

import (
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// review is what the job page tells the person deciding a manual review:
// what happened, what the provider's answers on file say, and which
// resolution fits them (R14, R16, R22, R29). It is read from the job's
// history, its receipts and its resend window; the page words it.
type review struct {
	Provider string
	// Sent: the operation key may have reached the provider (R22).
	Sent bool
	// Unanswered counts the provider calls whose answer never came (the
	// worker rescheduled a reconcile, R14).
	Unanswered int
	// Takeovers counts the takeovers in the history: a holder's lease ran out
	// and the next holder asked the provider first (R6, R14).
	Takeovers int
	// Resolutions are earlier reviews' resolutions, oldest first.
	Resolutions []*pb.JobEvent
	// Escalation is the transition that put the job in review.
	Escalation *pb.JobEvent
	// Cause is why the worker stopped, as far as its reason says: noRecord,
	// rejected, noRefundID or other.
	Cause string
	// ResendsNotTrusted: the worker's reason says it does not rely on the
	// provider to deduplicate a same-key resend (R16), so it never resends.
	ResendsNotTrusted bool
	// Window is the resend window (R22): none (nothing sent), open or
	// closed, until or since Deadline.
	Window   string
	Deadline *timestamppb.Timestamp

	// What the receipts on this page say.
	Receipts  int // on this page
	Total     int64
	Made      []madeRefund
	Pending   int
	Failed    []*pb.Observation
	NoRecords int
	// Fit names the resolution the evidence calls for; see fitOf.
	Fit string
	// CancelRequested is when a cancel was requested (R32): since then no
	// worker sends the refund, and only a person cancels it.
	CancelRequested *timestamppb.Timestamp
}

// madeRefund is one refund id the provider reported made, with its
// receipts.
type madeRefund struct {
	ID       string
	Receipts int
	// Late: one of them came from a holder that had already lost the job
	// (R15): it could not close the job itself, but it is the provider's
	// answer all the same.
	Late   bool
	Latest *timestamppb.Timestamp
}

// The causes of an escalation, read from the reasons the SDKs give
// (clients/*/decide).
const (
	causeNoRecord   = "noRecord"
	causeRejected   = "rejected"
	causeNoRefundID = "noRefundID"
	causeOther      = "other"
)

// The resolutions a review's evidence calls for.
const (
	// fitRefunded: the provider reported one refund made: mark it refunded
	// with that id.
	fitRefunded = "refunded"
	// fitTwice: the provider reported more than one refund id.
	fitTwice = "twice"
	// fitMixed: the provider reported the refund made and also failed.
	fitMixed = "mixed"
	// fitPending: accepted, not finished: send back to reconcile.
	fitPending = "pending"
	// fitFailed: the provider rejected it: settle it at the provider.
	fitFailed = "failed"
	// fitNoRefundID: made, says the provider, without an id to record.
	fitNoRefundID = "noRefundID"
	// fitSend: no refund shown, and a same-key resend is safe (nothing was
	// sent, or the window is open): send back to reconcile; nothing by hand.
	fitSend = "send"
	// fitCheck: no refund shown and the window closed: no worker sends it
	// again; the person checks the provider and, if no refund was made,
	// makes it there.
	fitCheck = "check"
	// fitCancel: a cancel was requested and no refund is shown, made or
	// pending: once the provider's dashboard shows none, cancel (R32).
	fitCancel = "cancel"
)

// reviewOf reads d, a job in manual review.
func reviewOf(d *pb.GetJobResponse, windowOpen bool) *review {
	j := d.GetJob()
	rv := &review{Provider: j.GetProvider(), Sent: j.GetFirstSentAt() != nil, Deadline: d.GetResendDeadline(),
		Receipts: len(d.GetObservations()), Total: d.GetObservationCount(), Cause: causeOther,
		CancelRequested: j.GetCancelRequestedAt()}
	for _, e := range d.GetEvents() {
		switch {
		case e.GetKind() == "taken_over":
			rv.Takeovers++
		case e.GetKind() == "rescheduled" && strings.HasPrefix(e.GetReason(), "outcome unknown"):
			rv.Unanswered++
		case e.GetKind() == "resolved" && e.GetToState() != pb.JobState_JOB_STATE_MANUAL_REVIEW:
			rv.Resolutions = append(rv.Resolutions, e)
		}
		if e.GetToState() == pb.JobState_JOB_STATE_MANUAL_REVIEW && e.GetFromState() != pb.JobState_JOB_STATE_MANUAL_REVIEW {
			rv.Escalation = e
		}
	}
	reason := j.GetLastReason()
	if rv.Escalation != nil {
		reason = rv.Escalation.GetReason()
	}
	switch {
	case strings.HasPrefix(reason, "reconcile: no record at"):
		rv.Cause = causeNoRecord
	case strings.HasPrefix(reason, "provider rejected the refund"):
		rv.Cause = causeRejected
	case strings.HasPrefix(reason, "provider reported the refund made but gave no refund id"):
		rv.Cause = causeNoRefundID
	}
	rv.ResendsNotTrusted = strings.Contains(reason, "does not guarantee")
	switch {
	case rv.Deadline == nil:
		rv.Window = "none"
	case windowOpen:
		rv.Window = "open"
	default:
		rv.Window = "closed"
	}
	for _, o := range d.GetObservations() {
		switch o.GetOutcome() {
		case pb.ObservationOutcome_OBSERVATION_OUTCOME_SUCCEEDED:
			if o.GetProviderRefundId() == "" {
				continue
			}
			i := slices.IndexFunc(rv.Made, func(m madeRefund) bool { return m.ID == o.GetProviderRefundId() })
			if i < 0 {
				rv.Made = append(rv.Made, madeRefund{ID: o.GetProviderRefundId()})
				i = len(rv.Made) - 1
			}
			m := &rv.Made[i]
			m.Receipts++
			m.Late = m.Late || isLate(o)
			m.Latest = o.GetCreatedAt()
		case pb.ObservationOutcome_OBSERVATION_OUTCOME_PENDING:
			rv.Pending++
		case pb.ObservationOutcome_OBSERVATION_OUTCOME_FAILED:
			rv.Failed = append(rv.Failed, o)
		case pb.ObservationOutcome_OBSERVATION_OUTCOME_NOT_FOUND:
			rv.NoRecords++
		}
	}
	rv.Fit = rv.fitOf()
	return rv
}

// fitOf is the resolution the evidence calls for: the provider's answers
// first (a refund it reports made is the final truth), then the window.
func (rv *review) fitOf() string {
	switch {
	case len(rv.Made) > 1:
		return fitTwice
	case len(rv.Made) == 1 && len(rv.Failed) > 0:
		return fitMixed
	case len(rv.Made) == 1:
		return fitRefunded
	case rv.CancelRequested != nil && rv.Pending == 0:
		return fitCancel
	case len(rv.Failed) > 0 || rv.Cause == causeRejected:
		return fitFailed
	case rv.Pending > 0:
		return fitPending
	case rv.Cause == causeNoRefundID:
		return fitNoRefundID
	case rv.Window != "closed":
		return fitSend
	}
	return fitCheck
}

// RefundID is the refund id to fill in when the evidence names one.
func (rv *review) RefundID() string {
	if rv.Fit == fitRefunded {
		return rv.Made[0].ID
	}
	return ""
}

// Fits reports whether the evidence calls for the resolution form named
// ("refunded", "reconcile" or "cancelled").
func (rv *review) Fits(form string) bool {
	switch rv.Fit {
	case fitRefunded:
		return form == "refunded"
	case fitPending, fitSend:
		return form == "reconcile"
	case fitCancel:
		return form == "cancelled"
	}
	return false
}

// isLate reports whether o came from an attempt the job had left when it
// was filed (R15).
func isLate(o *pb.Observation) bool {
	return o.GetReportedAttempt() != 0 && o.GetReportedAttempt() < o.GetJobAttempt()
}

// ruleIDs matches the rule ids workers append to their reasons, e.g.
// " (R14, R16)": they are for engineers, and pages leave them out.
var ruleIDs = regexp.MustCompile(`\s*\((?:[RQTM]\d+(?:,\s*)?)+\)`)

// plain is a reason as a person reads it: without rule ids.
func plain(reason string) string {
	return strings.TrimSpace(ruleIDs.ReplaceAllString(reason, ""))
}
