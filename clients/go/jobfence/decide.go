package jobfence

import (
	"fmt"
	"time"
)

// ResultKind says what a handler learned from the payment provider.
type ResultKind int

// The result kinds. The zero value is ResultUnknown, so a handler that
// returns an empty Result leaves the job to a reconcile, never to a resend.
const (
	// ResultUnknown: the request may or may not have reached the provider
	// (timeout, cut connection, crash): reconcile next (R14).
	ResultUnknown ResultKind = iota
	// ResultSucceeded: the provider says the refund was made.
	ResultSucceeded
	// ResultPending: the provider accepted the refund but has not finished;
	// not a success (R4).
	ResultPending
	// ResultNoRecord: the provider has no record of the operation key, which
	// does not prove that nothing happened (replica lag, queued request, R14).
	ResultNoRecord
	// ResultFailed: the provider rejected the refund for good.
	ResultFailed
	// ResultNotSent: the request provably never reached the provider
	// (refused locally, rate limited before sending): the same action may run
	// again.
	ResultNotSent
	// ResultEscalate: the handler wants a person to decide.
	ResultEscalate
)

// String names the kind.
func (k ResultKind) String() string {
	switch k {
	case ResultUnknown:
		return "unknown"
	case ResultSucceeded:
		return "succeeded"
	case ResultPending:
		return "pending"
	case ResultNoRecord:
		return "no_record"
	case ResultFailed:
		return "failed"
	case ResultNotSent:
		return "not_sent"
	case ResultEscalate:
		return "escalate"
	}
	return fmt.Sprintf("ResultKind(%d)", int(k))
}

// Result is what a Refund or Reconcile handler learned from the provider,
// asked with the job's operation key (R1, R14). Build it with Succeeded,
// Pending, NoRecord, Failed, NotSent, Unknown or Escalate.
type Result struct {
	Kind ResultKind
	// ProviderRefundID is the provider's refund id (required for
	// ResultSucceeded, welcome for the others).
	ProviderRefundID string
	// ProviderEventID identifies the provider's answer, when it has one; it
	// deduplicates the observation filed from it (R15).
	ProviderEventID string
	// RetryAfter is when to ask again (ResultPending, ResultNotSent); zero:
	// the policy's delay.
	RetryAfter time.Duration
	// Reason says why (ResultFailed, ResultNotSent, ResultEscalate); kept in
	// the job's history.
	Reason string
	// Err is what went wrong (ResultUnknown).
	Err error
}

// Succeeded reports a refund the provider made, with its id:
// Succeeded(refund.ID). The Worker completes the job with that id; an empty
// id escalates instead (there is nothing to record).
func Succeeded(providerRefundID string) Result {
	return Result{Kind: ResultSucceeded, ProviderRefundID: providerRefundID}
}

// Pending reports that the provider answered and holds the refund, not
// finished yet (status "pending", "processing" and the like). Pending is not
// a success (R4): the Worker reschedules a reconcile after retryAfter, or
// after ProviderPolicy.PendingDelay when retryAfter is zero.
//
//	jobfence.Pending(refund.ID, 0)              // reconcile after the policy's PendingDelay
//	jobfence.Pending(refund.ID, 2*time.Minute)  // the provider said when to look again
//
// providerRefundID is the provider's id of the pending refund, "" when the
// answer carried none; it goes with the receipt the Worker files if its
// write-back is fenced off (R15). retryAfter is a time.Duration: a bare 30
// is 30 nanoseconds, not seconds.
//
// Pending is an answer; Unknown is the absence of one. When no answer came
// (a timeout, a cut connection, a 5xx that promises nothing) return
// Unknown(err): the request may or may not have reached the provider, and
// only a reconcile can tell. Both lead to a reconcile, but only Pending is
// evidence that the refund exists.
func Pending(providerRefundID string, retryAfter time.Duration) Result {
	return Result{Kind: ResultPending, ProviderRefundID: providerRefundID, RetryAfter: retryAfter}
}

// NoRecord reports that the provider has no record of the operation key.
func NoRecord() Result { return Result{Kind: ResultNoRecord} }

// Failed reports that the provider answered and refused the refund for good:
// a refund object in status "failed", a declined refund, a 4xx that stored
// nothing. The Worker escalates the job to manual review with reason in its
// history, since the API has no failed state: a person decides.
//
// Both arguments are strings: the refund id comes first, then the reason.
//
//	jobfence.Failed(refund.ID, refund.FailureReason)  // a refund the provider made, then failed
//	jobfence.Failed("", "402 card_declined: …")       // refused before it made any refund
//
// providerRefundID is the provider's id of the failed refund, "" when it
// made none; reason is the provider's words, for the person who reviews the
// job. Failed is not NoRecord (the provider knows nothing under the key: a
// reconcile's answer, which may lead to a same-key resend) and not NotSent
// (the request provably never left this process, and is repeated).
func Failed(providerRefundID, reason string) Result {
	return Result{Kind: ResultFailed, ProviderRefundID: providerRefundID, Reason: reason}
}

// NotSent reports a request that provably never reached the provider;
// retryAfter zero means the policy's NotSentDelay.
func NotSent(reason string, retryAfter time.Duration) Result {
	return Result{Kind: ResultNotSent, Reason: reason, RetryAfter: retryAfter}
}

// Unknown reports a call whose outcome is unknown.
func Unknown(err error) Result { return Result{Kind: ResultUnknown, Err: err} }

// Escalate asks for a person to decide.
func Escalate(reason string) Result { return Result{Kind: ResultEscalate, Reason: reason} }

// observed returns the outcome a provider answer is evidence of (R15), or
// false when the result carries no word from the provider.
func (r Result) observed() (Outcome, bool) {
	switch r.Kind {
	case ResultSucceeded:
		return OutcomeSucceeded, true
	case ResultPending:
		return OutcomePending, true
	case ResultFailed:
		return OutcomeFailed, true
	case ResultNoRecord:
		return OutcomeNotFound, true
	}
	return OutcomeUnspecified, false
}

// Policy defaults.
const (
	DefaultResendMargin = 5 * time.Minute
	DefaultPendingDelay = 30 * time.Second
	DefaultUnknownDelay = 5 * time.Second
	DefaultNotSentDelay = 5 * time.Second
	// MaxRescheduleDelay is the longest delay Reschedule accepts.
	MaxRescheduleDelay = 30 * 24 * time.Hour
)

// ProviderPolicy is what the decision table needs to know about one payment
// provider. The idempotency-key retention window itself is not here: the
// coordinator keeps it per provider and hands every claim its
// ResendDeadline (R22), so no worker keeps its own clock for it.
type ProviderPolicy struct {
	// SameKeyResendSafe: the provider guarantees that a request resent with
	// the same Idempotency-Key and the same body, inside its retention
	// window, returns the first result instead of refunding again (R14).
	// Without it, "no record" always escalates (R16).
	SameKeyResendSafe bool
	// ResendMargin: no same-key resend is started closer than this to the
	// job's ResendDeadline. It absorbs the gap between the coordinator's and
	// the provider's clocks and the time the request takes to arrive.
	// Zero: DefaultResendMargin.
	ResendMargin time.Duration
	// PendingDelay: when to reconcile a pending refund again, unless the
	// answer says. Zero: DefaultPendingDelay.
	PendingDelay time.Duration
	// UnknownDelay: when to reconcile after an unknown outcome. Zero:
	// DefaultUnknownDelay.
	UnknownDelay time.Duration
	// NotSentDelay: when to repeat an action whose request was not sent,
	// unless the result says. Zero: DefaultNotSentDelay.
	NotSentDelay time.Duration
}

func (p ProviderPolicy) orDefaults() ProviderPolicy {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&p.ResendMargin, DefaultResendMargin)
	def(&p.PendingDelay, DefaultPendingDelay)
	def(&p.UnknownDelay, DefaultUnknownDelay)
	def(&p.NotSentDelay, DefaultNotSentDelay)
	return p
}

// ResendAllowed reports whether a same-key resend of c's refund may start at
// now, a time on the coordinator's clock (see ClaimedJob.CoordinatorNow), and
// if not, why (R14, R16, R22). It is never allowed once a cancel was requested
// (R32). Otherwise it is allowed when the operation key never went out
// (ResendDeadline is zero: sending is a first send), or when the provider
// guarantees same-key resends and now lies more than ResendMargin before
// c.ResendDeadline.
func (p ProviderPolicy) ResendAllowed(c ClaimedJob, now time.Time) (bool, string) {
	p = p.orDefaults()
	switch {
	case cancelRequested(c):
		return false, "a cancel was requested (R32)"
	case c.ResendDeadline.IsZero():
		return true, "the operation key was never sent"
	case !p.SameKeyResendSafe:
		return false, "the provider does not guarantee that same-key resends are safe"
	case !now.Add(p.ResendMargin).Before(c.ResendDeadline):
		return false, fmt.Sprintf("the provider's idempotency-key window closes at %s (margin %s)",
			c.ResendDeadline.UTC().Format(time.RFC3339), p.ResendMargin)
	}
	return true, fmt.Sprintf("inside the provider's idempotency-key window until %s",
		c.ResendDeadline.UTC().Format(time.RFC3339))
}

// DecisionKind is the fenced write-back a Decision asks for.
type DecisionKind int

// The write-backs.
const (
	DecideReschedule DecisionKind = iota // back to ready, with NextAction and Delay
	DecideComplete                       // succeeded, with ProviderRefundID
	DecideEscalate                       // manual_review, with Reason
)

// String names the kind.
func (k DecisionKind) String() string {
	switch k {
	case DecideReschedule:
		return "reschedule"
	case DecideComplete:
		return "complete"
	case DecideEscalate:
		return "escalate"
	}
	return fmt.Sprintf("DecisionKind(%d)", int(k))
}

// Decision is the write-back to make, under the claimed attempt, for one
// provider answer.
type Decision struct {
	Kind             DecisionKind
	ProviderRefundID string        // DecideComplete
	NextAction       NextAction    // DecideReschedule
	Delay            time.Duration // DecideReschedule
	Reason           string        // DecideReschedule, DecideEscalate
}

// Decide turns a provider answer about claimed job c into its fenced
// write-back, by the decision table of R14 and R16, using
// c.CoordinatorNow() as the time. See DecideAt.
func Decide(r Result, c ClaimedJob, p ProviderPolicy) Decision {
	return DecideAt(r, c, p, c.CoordinatorNow())
}

// DecideAt turns a provider answer about claimed job c into its fenced
// write-back, with now on the coordinator's clock:
//
//	provider says                  write-back
//	refunded (id)                  Complete with the refund id
//	refunded, no id                Escalate: nothing to record
//	pending                        Reschedule reconcile after RetryAfter or PendingDelay (R4)
//	no record, resend allowed      Reschedule refund now: a same-key resend (R14)
//	no record, otherwise           Escalate to manual_review (R14, R16)
//	rejected                       Escalate: the API has no failed state, a person decides
//	not sent                       Reschedule the claimed action after RetryAfter or NotSentDelay
//	outcome unknown                Reschedule reconcile after UnknownDelay (R14)
//	handler asks to escalate       Escalate
//
// A job whose cancel was requested (ClaimedJob.CancelRequested, R32) is never
// sent again, whatever the provider says and whatever the policy allows:
//
//	refunded (id)                  Complete: the cancel came too late (the coordinator records it)
//	pending, outcome unknown       as above: Reschedule reconcile
//	no record                      Escalate, even inside the resend window: only a person
//	                               may close a maybe-sent refund as cancelled
//	rejected                       Escalate: a person closes it as cancelled
//	anything else                  as above, but a Reschedule to refund becomes one to reconcile
//
// "Resend allowed" is ProviderPolicy.ResendAllowed. It never consults this
// machine's wall clock and has no side effects; the caller writes the
// decision with c.Attempt.
func DecideAt(r Result, c ClaimedJob, p ProviderPolicy, now time.Time) Decision {
	if !cancelRequested(c) {
		return decideTable(r, c, p, now)
	}
	// R32: no record and a rejection, which the table may answer with a
	// resend or leave to a person as a failure, are for a person to close
	// as cancelled; whatever else it answers never sends.
	switch r.Kind {
	case ResultNoRecord:
		reason := "cancel requested (R32): reconcile found no record at the provider; the refund may still " +
			"have been sent, so it is never sent again: only a person may close it as cancelled"
		if r.Reason != "" {
			reason += ": " + r.Reason
		}
		return Decision{Kind: DecideEscalate, Reason: reason}
	case ResultFailed:
		return Decision{Kind: DecideEscalate, Reason: "cancel requested (R32): provider rejected the refund: " +
			or(r.Reason, "no reason given") + "; a person closes it as cancelled"}
	}
	d := decideTable(r, c, p, now)
	if d.Kind == DecideReschedule && d.NextAction == ActionRefund {
		d.NextAction = ActionReconcile
		d.Reason += "; cancel requested (R32): reconcile, never send"
	}
	return d
}

// decideTable is DecideAt's table for a job whose cancel was not requested.
func decideTable(r Result, c ClaimedJob, p ProviderPolicy, now time.Time) Decision {
	p = p.orDefaults()
	detail := func(s string) string {
		if r.Reason != "" {
			return s + ": " + r.Reason
		}
		return s
	}
	switch r.Kind {
	case ResultSucceeded:
		if r.ProviderRefundID == "" {
			return Decision{Kind: DecideEscalate, Reason: "provider reported the refund made but gave no refund id"}
		}
		return Decision{Kind: DecideComplete, ProviderRefundID: r.ProviderRefundID}
	case ResultPending:
		return Decision{Kind: DecideReschedule, NextAction: ActionReconcile, Delay: delay(r.RetryAfter, p.PendingDelay),
			Reason: detail("provider: refund pending (R4)")}
	case ResultNoRecord:
		ok, why := p.ResendAllowed(c, now)
		if ok {
			return Decision{Kind: DecideReschedule, NextAction: ActionRefund,
				Reason: detail("reconcile: no record at the provider; same-key resend, " + why + " (R14)")}
		}
		return Decision{Kind: DecideEscalate, Reason: detail("reconcile: no record at the provider and " + why + " (R14, R16)")}
	case ResultFailed:
		return Decision{Kind: DecideEscalate, Reason: "provider rejected the refund: " + or(r.Reason, "no reason given")}
	case ResultNotSent:
		action := ActionReconcile
		if c.NextAction == ActionRefund {
			action = ActionRefund
		}
		return Decision{Kind: DecideReschedule, NextAction: action, Delay: delay(r.RetryAfter, p.NotSentDelay),
			Reason: "request not sent: " + or(r.Reason, "no reason given")}
	case ResultEscalate:
		return Decision{Kind: DecideEscalate, Reason: or(r.Reason, "escalated by the handler")}
	}
	why := "outcome unknown"
	if r.Err != nil {
		why += ": " + r.Err.Error()
	}
	return Decision{Kind: DecideReschedule, NextAction: ActionReconcile, Delay: p.UnknownDelay, Reason: why + " (R14)"}
}

// resendRefused is the check a Worker makes before it calls a handler for c
// (R14, R16, R22): a same-key resend that p trusts is checked against c's
// window again at now, since time may have passed since the reconcile that
// chose it; past the window or within the margin it is refused, and the
// escalation returned is written instead of calling any handler; why says
// what ResendAllowed found. A job whose cancel was requested sends nothing
// (R32: sends), so there is nothing to refuse: it is reconciled.
func resendRefused(c ClaimedJob, p ProviderPolicy, now time.Time) (d Decision, why string, refused bool) {
	if !sends(c) || !c.SendsAgain() || !p.SameKeyResendSafe {
		return Decision{}, "", false
	}
	ok, why := p.ResendAllowed(c, now)
	if ok {
		return Decision{}, why, false
	}
	return Decision{Kind: DecideEscalate, Reason: "same-key resend refused before sending: " + why + " (R14, R16)"}, why, true
}

// sends reports whether c's handler call is Refund, the one that sends;
// anything but a refund action asks the provider first with Reconcile (R14),
// and so does a job whose cancel was requested, whatever its grant's action
// says (R32: no grant of it should carry refund).
func sends(c ClaimedJob) bool { return c.NextAction == ActionRefund && !cancelRequested(c) }

// cancelRequested reports whether a cancel was requested of c's job (R32):
// the grant says so, or the job carries the request's time.
func cancelRequested(c ClaimedJob) bool {
	return c.CancelRequested || !c.Job.CancelRequestedAt.IsZero()
}

func delay(d, def time.Duration) time.Duration {
	if d <= 0 {
		d = def
	}
	return min(d, MaxRescheduleDelay)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
