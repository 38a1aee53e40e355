package store

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The bounds on a job's observations (R15): what one answer carries and what
// one job may gather, so that a flood of receipts on one job can neither make
// a claim's answer undeliverable nor grow without end.
const (
	// MaxClaimObservations is how many receipts a claim carries per job, the
	// newest: with MaxDetailLen each, a claim of MaxClaimBatch jobs stays
	// near 2.5 MB, under gRPC's default 4 MiB for a received message.
	MaxClaimObservations = 5
	// ObservationPageSize is the page of GetJob when it names none, and
	// MaxObservationPage the largest it may name.
	ObservationPageSize = 100
	MaxObservationPage  = 500
	// MaxObservationsPerJob is how many receipts one job keeps; beyond it
	// a receipt is kept in the unmatched log instead (ObservationRoom).
	MaxObservationsPerJob = 1000
	// MaxUnverifiedObservationsPerJob is how many of them may be receipts
	// that do not carry their grant's token: the rest is room kept for
	// the job's holders, whatever others file.
	MaxUnverifiedObservationsPerJob = 800
	// MaxObservationsPerReporter is how many unverified receipts one
	// reporter (Observation.Reporter: a credential, a provider's webhook)
	// may file on one job, so that no one of them fills another's job.
	MaxObservationsPerReporter = 100
)

// ObservationRoom counts a job's receipts on file as Observe keeps room:
// all of them, those without their grant's token, and those of the
// reporter filing now that are without one.
type ObservationRoom struct {
	Total, Unverified, Reporter int64
}

// Refusal says why a new receipt has no room on the job ("" when it has):
// a receipt carrying its grant's token may fill the job's log, one without
// only its share (R28: no receipt is dropped; one without room is kept
// aside, where a person sees it).
func (r ObservationRoom) Refusal(verified bool) string {
	switch {
	case r.Total >= MaxObservationsPerJob:
		return fmt.Sprintf("the job has %d receipts on file, the most it keeps", r.Total)
	case verified:
		return ""
	case r.Unverified >= MaxUnverifiedObservationsPerJob:
		return fmt.Sprintf("the job has %d receipts without their grant's token on file, the most it keeps; "+
			"the rest is kept for its holders", r.Unverified)
	case r.Reporter >= MaxObservationsPerReporter:
		return fmt.Sprintf("this reporter filed %d receipts without their grant's token on the job, "+
			"the most one reporter may", r.Reporter)
	}
	return ""
}

// KeptAsideEvent is the unmatched-log entry of receipt p, which job had
// no room for (why, ObservationRoom.Refusal): under the job's provider,
// named by the receipt's dedupe key so that a repeat is the same entry,
// its detail saying whose receipt it was and why it is here.
func (p ObservationParams) KeptAsideEvent(job Job, verified bool, why string) UnmatchedEvent {
	held := "no grant's token"
	if verified {
		held = "its grant's token"
	}
	head := fmt.Sprintf("receipt for job %d not filed on the job: %s. Source %q, reporter %q, attempt %d with %s",
		job.ID, why, p.Source, p.Reporter, p.Attempt, held)
	if p.ProviderEventID != "" {
		head += ", provider event " + p.ProviderEventID
	}
	detail := head
	if p.Detail != "" {
		detail = TruncateText(head+": "+p.Detail, MaxDetailLen)
	}
	return UnmatchedEvent{Provider: job.Provider, ProviderEventID: KeptAsidePrefix + p.DedupeKey(job.ID),
		EventType: KeptAsideType, ProviderRefundID: p.ProviderRefundID, OperationKey: job.OperationKey,
		Outcome: p.Outcome, Detail: detail}
}

// The unmatched-log entries of receipts kept aside (KeptAsideEvent): their
// event type, and the prefix of their event id.
const (
	KeptAsideType   = "receipt.kept_aside"
	KeptAsidePrefix = "receipt:"
)

// TruncateText cuts s to at most n bytes, at a character boundary.
func TruncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Expedites reports whether a new receipt with outcome o moves a ready job
// forward (R28): success or failure says the refund exists or failed, which
// a reconcile can confirm now. Pending says nothing new (R4) and not found
// proves nothing (R14): those wait for the job's own schedule. Only a job
// that may already have been sent moves (its first send recorded), so no
// receipt brings a send forward.
func (o Outcome) Expedites() bool { return o == OutcomeSucceeded || o == OutcomeFailed }

// ExpediteEvent is the history entry of receipt o having moved job, read as
// the move left it (ready, due at its updated_at, next action reconcile):
// under the job's current attempt, named after the receipt's source, with no
// grant, at the database time of the move (R28).
func (o Observation) ExpediteEvent(job Job) Event {
	return Event{JobID: job.ID, Attempt: job.Attempt, Kind: EventExpedited, WorkerID: o.Source,
		FromState: job.State, ToState: job.State, NextAction: job.NextAction,
		Reason: fmt.Sprintf("receipt %d from %s: %s", o.ID, o.Source, o.Outcome), CreatedAt: job.UpdatedAt}
}

// ReceiptExpediteEvent is the history entry of a reschedule to reconcile
// made due now by a receipt filed during the grant (Writeback.ExpeditedBy),
// read from job as the reschedule left it: ready, due now, under the
// grant's attempt, with no grant of its own, in the reschedule's
// transaction and at its time (R28).
func ReceiptExpediteEvent(job Job) Event {
	return Event{JobID: job.ID, Attempt: job.Attempt, Kind: EventExpedited, WorkerID: ReceiptActor,
		FromState: job.State, ToState: job.State, NextAction: job.NextAction,
		Reason: fmt.Sprintf("a receipt of success or failure was filed at %s, during attempt %d",
			job.EvidenceAt.UTC().Format(time.RFC3339Nano), job.Attempt), CreatedAt: job.UpdatedAt}
}

// ReceiptActor names the coordinator in the history entry of an expedite
// that no one receipt's source can name.
const ReceiptActor = "jobfence"

// Validate reports what is wrong with a read of a job.
func (p GetParams) Validate() error {
	var v violations
	v.ref(p.JobRef)
	if p.ObservationsLimit < 0 || p.ObservationsLimit > MaxObservationPage {
		v.add("observations_page_size", "must be between 0 (%d) and %d, got %d", ObservationPageSize,
			MaxObservationPage, p.ObservationsLimit)
	}
	if _, _, err := p.observationsAfter(); err != nil {
		v.add("observations_page_token", "%v", err)
	}
	return v.err()
}

// Limit is the page size in force.
func (p GetParams) Limit() int {
	if p.ObservationsLimit == 0 {
		return ObservationPageSize
	}
	return p.ObservationsLimit
}

// ObservationsAfter is where the page starts: after the observation id of
// the token, 0 without one. The token must be of job jobID.
func (p GetParams) ObservationsAfter(jobID int64) (int64, error) {
	job, after, err := p.observationsAfter()
	if err == nil && job != 0 && job != jobID {
		err = Invalid("observations_page_token", "belongs to another job")
	}
	return after, err
}

func (p GetParams) observationsAfter() (job, after int64, err error) {
	if p.ObservationsPageToken == "" {
		return 0, 0, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(p.ObservationsPageToken)
	parts := strings.Split(string(raw), "|")
	if err != nil || len(parts) != 3 || parts[0] != "obs" {
		return 0, 0, fmt.Errorf("not a page token")
	}
	job, err1 := strconv.ParseInt(parts[1], 10, 64)
	after, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || job <= 0 || after <= 0 {
		return 0, 0, fmt.Errorf("not a page token")
	}
	return job, after, nil
}

// ObservationsToken is the token of the page after last, of job jobID.
func ObservationsToken(jobID int64, last Observation) string {
	return base64.RawURLEncoding.EncodeToString([]byte("obs|" + strconv.FormatInt(jobID, 10) + "|" +
		strconv.FormatInt(last.ID, 10)))
}
