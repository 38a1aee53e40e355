package jobfence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// specDir is the shared executable spec of the SDKs (its README.md says
// what each file pins and how a runner reads it).
const specDir = "../../spec"

// specLanguage names this SDK in a disputed vector's answers.
const specLanguage = "go"

// specRunners are the spec files this runner knows, by their "spec" field,
// with the version it was written for.
var specRunners = map[string]struct {
	version int
	run     func(t *testing.T, v json.RawMessage)
}{
	"decide":   {1, runDecideVector},
	"errors":   {1, runErrorVector},
	"spool":    {1, runSpoolVector},
	"defaults": {1, runDefaultVector},
	"stream":   {1, runStreamTranscript},
}

// TestSpec runs every vector of every file of the shared spec against this
// SDK: a vector added there fails here until the SDK follows it.
func TestSpec(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(specDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	streams, err := filepath.Glob(filepath.Join(specDir, "stream", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, streams...)
	if len(files) == 0 {
		t.Fatalf("no spec files under %s", specDir)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Spec    string            `json:"spec"`
			Version int               `json:"version"`
			About   string            `json:"about"`
			Vectors []json.RawMessage `json:"vectors"`
		}
		if err := json.Unmarshal(data, &file); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if file.Spec == "stream" {
			// A transcript file is one vector.
			file.Vectors = []json.RawMessage{data}
		} else if err := strictJSON(data, &file); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		r, ok := specRunners[file.Spec]
		switch {
		case !ok:
			t.Errorf("%s: spec %q has no runner in this SDK", f, file.Spec)
			continue
		case file.Version != r.version:
			t.Errorf("%s: spec %q is at version %d, this runner was written for %d: the spec moved, the runner did not",
				f, file.Spec, file.Version, r.version)
			continue
		case len(file.Vectors) == 0:
			t.Errorf("%s: no vectors", f)
		}
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) {
			for _, v := range file.Vectors {
				var head struct {
					Name string `json:"name"`
				}
				if err := json.Unmarshal(v, &head); err != nil || head.Name == "" {
					t.Errorf("a vector without a name: %s", v)
					continue
				}
				t.Run(head.Name, func(t *testing.T) { r.run(t, v) })
			}
		})
	}
}

// strictJSON decodes data into v, refusing fields v does not know: a
// vector that uses a field this SDK does not implement fails, never passes
// half read.
func strictJSON(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// vectorHead holds the fields every vector may have.
type vectorHead struct {
	Name    string                     `json:"name"`
	Rules   []string                   `json:"rules"`
	Note    string                     `json:"note"`
	Dispute string                     `json:"dispute"`
	Expect  json.RawMessage            `json:"expect"`
	Answers map[string]json.RawMessage `json:"answers"`
}

// expected decodes what the vector expects of this SDK into v: expect,
// overlaid field by field with this SDK's answer of a dispute.
func (h vectorHead) expected(t *testing.T, v any) {
	t.Helper()
	merged := map[string]json.RawMessage{}
	if len(h.Expect) > 0 {
		if err := json.Unmarshal(h.Expect, &merged); err != nil {
			t.Fatalf("expect: %v", err)
		}
	}
	switch {
	case h.Dispute != "" && h.Answers[specLanguage] == nil:
		t.Fatalf("a disputed vector without an answer for %s", specLanguage)
	case h.Dispute == "" && h.Answers != nil:
		t.Fatalf("answers without a dispute")
	case h.Dispute == "" && len(h.Expect) == 0:
		t.Fatalf("a vector that expects nothing")
	}
	if a := h.Answers[specLanguage]; a != nil {
		var answer map[string]json.RawMessage
		if err := json.Unmarshal(a, &answer); err != nil {
			t.Fatalf("answers.%s: %v", specLanguage, err)
		}
		for k, v := range answer {
			merged[k] = v
		}
	}
	data, err := json.Marshal(merged)
	if err != nil {
		t.Fatal(err)
	}
	if err := strictJSON(data, v); err != nil {
		t.Fatalf("expect: %v", err)
	}
}

// readVector decodes raw into v, strictly, and what it expects of this SDK
// into want.
func readVector(t *testing.T, raw json.RawMessage, v interface{ expected(*testing.T, any) }, want any) {
	t.Helper()
	if err := strictJSON(raw, v); err != nil {
		t.Fatal(err)
	}
	v.expected(t, want)
}

// specNow is "now" on the coordinator's clock for decide.json.
var specNow = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

type decideVector struct {
	vectorHead
	Step string `json:"step"`
	Job  struct {
		NextAction       string `json:"next_action"`
		Attempt          int64  `json:"attempt"`
		Takeover         bool   `json:"takeover"`
		FirstSentMs      *int64 `json:"first_sent_ms"`
		ResendDeadlineMs *int64 `json:"resend_deadline_ms"`
		CancelRequested  bool   `json:"cancel_requested"`
	} `json:"job"`
	Policy struct {
		SameKeyResendSafe bool  `json:"same_key_resend_safe"`
		ResendMarginMs    int64 `json:"resend_margin_ms"`
		PendingDelayMs    int64 `json:"pending_delay_ms"`
		UnknownDelayMs    int64 `json:"unknown_delay_ms"`
		NotSentDelayMs    int64 `json:"not_sent_delay_ms"`
	} `json:"policy"`
	Result *specResult `json:"result"`
}

// specResult is a handler's result as the spec writes it.
type specResult struct {
	Kind             string `json:"kind"`
	ProviderRefundID string `json:"provider_refund_id"`
	RetryAfterMs     int64  `json:"retry_after_ms"`
	Reason           string `json:"reason"`
	Error            string `json:"error"`
}

func (r specResult) result(t *testing.T) Result {
	t.Helper()
	kind, ok := resultKinds[r.Kind]
	if !ok {
		t.Fatalf("result.kind %q", r.Kind)
	}
	res := Result{Kind: kind, ProviderRefundID: r.ProviderRefundID, RetryAfter: ms(r.RetryAfterMs), Reason: r.Reason}
	if r.Error != "" {
		res.Err = errors.New(r.Error)
	}
	return res
}

type decideExpect struct {
	Call             string   `json:"call"`
	Decision         string   `json:"decision"`
	ProviderRefundID *string  `json:"provider_refund_id"`
	NextAction       *string  `json:"next_action"`
	DelayMs          *int64   `json:"delay_ms"`
	Reason           *string  `json:"reason"`
	ReasonIncludes   []string `json:"reason_includes"`
}

var resultKinds = map[string]ResultKind{
	"": ResultUnknown, "unknown": ResultUnknown, "succeeded": ResultSucceeded, "pending": ResultPending,
	"no_record": ResultNoRecord, "failed": ResultFailed, "not_sent": ResultNotSent, "escalate": ResultEscalate,
}

// runDecideVector runs a vector of decide.json through the Worker's own
// steps: resendRefused and sends before the handler call, DecideAt after it.
func runDecideVector(t *testing.T, raw json.RawMessage) {
	var v decideVector
	var want decideExpect
	readVector(t, raw, &v, &want)

	c := ClaimedJob{Attempt: v.Job.Attempt, NextAction: NextAction(v.Job.NextAction), Takeover: v.Job.Takeover,
		ClaimedAt: specNow, CancelRequested: v.Job.CancelRequested}
	if c.NextAction != ActionRefund && c.NextAction != ActionReconcile {
		t.Fatalf("job.next_action %q", v.Job.NextAction)
	}
	c.Job.Attempt, c.Job.NextAction = c.Attempt, c.NextAction
	if v.Job.FirstSentMs != nil {
		c.Job.FirstSentAt = c.ClaimedAt.Add(ms(*v.Job.FirstSentMs))
	}
	if v.Job.ResendDeadlineMs != nil {
		c.ResendDeadline = specNow.Add(ms(*v.Job.ResendDeadlineMs))
	}
	p := ProviderPolicy{SameKeyResendSafe: v.Policy.SameKeyResendSafe, ResendMargin: ms(v.Policy.ResendMarginMs),
		PendingDelay: ms(v.Policy.PendingDelayMs), UnknownDelay: ms(v.Policy.UnknownDelayMs),
		NotSentDelay: ms(v.Policy.NotSentDelayMs)}
	if now := c.CoordinatorNow(); !now.Equal(specNow) {
		t.Fatalf("the estimate of the coordinator's clock is %v, want the claim's time %v", now, specNow)
	}

	var got Decision
	switch v.Step {
	case "before_send":
		if v.Result != nil {
			t.Fatal("a before_send vector has no result")
		}
		d, _, refused := resendRefused(c, p, c.CoordinatorNow())
		if !refused {
			call := "reconcile"
			if sends(c) {
				call = "refund"
			}
			if want.Call == "" || call != want.Call {
				t.Fatalf("the worker calls the %s handler; want %+v", call, want)
			}
			return
		}
		if want.Call != "" {
			t.Fatalf("the worker refuses to call the %s handler (%s); want it called", want.Call, d.Reason)
		}
		got = d
	case "result":
		if v.Result == nil {
			t.Fatal("a result vector without a result")
		}
		if want.Call != "" {
			t.Fatal("a result vector expects a decision, not a call")
		}
		got = DecideAt(v.Result.result(t), c, p, c.CoordinatorNow())
	default:
		t.Fatalf("step %q", v.Step)
	}

	if got.Kind.String() != want.Decision {
		t.Errorf("decision %s (%+v), want %s", got.Kind, got, want.Decision)
	}
	if got.Kind != DecideComplete && got.Reason == "" {
		t.Errorf("decision %+v has no reason", got)
	}
	if want.ProviderRefundID != nil && got.ProviderRefundID != *want.ProviderRefundID {
		t.Errorf("provider refund id %q, want %q", got.ProviderRefundID, *want.ProviderRefundID)
	}
	if want.NextAction != nil && string(got.NextAction) != *want.NextAction {
		t.Errorf("next action %q, want %q", got.NextAction, *want.NextAction)
	}
	if want.DelayMs != nil && got.Delay != ms(*want.DelayMs) {
		t.Errorf("delay %s, want %s", got.Delay, ms(*want.DelayMs))
	}
	if want.Reason != nil && got.Reason != *want.Reason {
		t.Errorf("reason %q, want %q", got.Reason, *want.Reason)
	}
	for _, s := range want.ReasonIncludes {
		if !strings.Contains(got.Reason, s) {
			t.Errorf("reason %q does not contain %q", got.Reason, s)
		}
	}
}

type errorVector struct {
	vectorHead
	Status specStatus `json:"status"`
}

// specStatus is a gRPC status as the spec writes one: its code by name, an
// ErrorInfo when it has a reason, a BadRequest when it names fields.
type specStatus struct {
	Code            codes.Code        `json:"code"`
	Message         string            `json:"message"`
	Reason          string            `json:"reason"`
	Domain          string            `json:"domain"`
	Metadata        map[string]string `json:"metadata"`
	FieldViolations []FieldViolation  `json:"field_violations"`
}

func (s specStatus) status(t *testing.T) *status.Status {
	t.Helper()
	var details []protoadapt.MessageV1
	if s.Reason != "" {
		domain := s.Domain
		if domain == "" {
			domain = ErrorDomain
		}
		details = append(details, &errdetails.ErrorInfo{Reason: s.Reason, Domain: domain, Metadata: s.Metadata})
	} else if s.Domain != "" || s.Metadata != nil {
		t.Fatal("domain and metadata belong to an ErrorInfo: give a reason")
	}
	if s.FieldViolations != nil {
		br := &errdetails.BadRequest{}
		for _, f := range s.FieldViolations {
			br.FieldViolations = append(br.FieldViolations,
				&errdetails.BadRequest_FieldViolation{Field: f.Field, Description: f.Description})
		}
		details = append(details, br)
	}
	st := status.New(s.Code, s.Message)
	if len(details) > 0 {
		var err error
		if st, err = st.WithDetails(details...); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

type errorExpect struct {
	Kind           string   `json:"kind"`
	Reason         *string  `json:"reason"`
	Fenced         *bool    `json:"fenced"`
	Unavailable    *bool    `json:"unavailable"`
	RetryWrite     *bool    `json:"retry_write"`
	RefileLater    *bool    `json:"refile_later"`
	RefileStops    *bool    `json:"refile_stops"`
	TakenOver      *bool    `json:"taken_over"`
	JobID          *int64   `json:"job_id"`
	Attempt        *int64   `json:"attempt"`
	CurrentAttempt *int64   `json:"current_attempt"`
	CurrentState   *string  `json:"current_state"`
	Violations     []string `json:"violations"`
}

// errorKind names the kind of a decoded error as errors.json does: the
// sentinel it matches first, reasons before codes; "other" for none.
func errorKind(t *testing.T, err error) string {
	t.Helper()
	var matched []string
	for reason, sentinel := range reasonSentinels {
		if errors.Is(err, sentinel) {
			matched = append(matched, strings.ToLower(reason))
		}
	}
	if len(matched) > 1 {
		slices.Sort(matched)
		// A code-only UNAUTHENTICATED or PERMISSION_DENIED matches its one
		// sentinel; more than one reason is a decoding bug.
		t.Fatalf("%v matches the sentinels of %v", err, matched)
	}
	if len(matched) == 1 {
		return matched[0]
	}
	for _, k := range []struct {
		kind string
		err  error
	}{
		{"unavailable", ErrUnavailable},
		{"deadline_exceeded", context.DeadlineExceeded},
		{"canceled", context.Canceled},
	} {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	return "other"
}

// runErrorVector decodes the vector's status as a unary call's error is
// decoded, and checks what the Client and the Worker make of it.
func runErrorVector(t *testing.T, raw json.RawMessage) {
	var v errorVector
	var want errorExpect
	readVector(t, raw, &v, &want)
	err := decodeError(v.Status.status(t).Err())

	check := func(what string, want *bool, got bool) {
		if want != nil && got != *want {
			t.Errorf("%s = %v, want %v (%v)", what, got, *want, err)
		}
	}
	if want.Kind != "" {
		if got := errorKind(t, err); got != want.Kind {
			t.Errorf("kind %s, want %s (%v)", got, want.Kind, err)
		}
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%v (%T) is not a *Error", err, err)
	}
	if want.Reason != nil && e.Reason != *want.Reason {
		t.Errorf("reason %q, want %q", e.Reason, *want.Reason)
	}
	check("fenced", want.Fenced, errors.Is(err, ErrFenced))
	check("unavailable", want.Unavailable, errors.Is(err, ErrUnavailable))
	check("retry_write", want.RetryWrite, retryable(context.Background(), err))
	check("refile_later", want.RefileLater, refileLater(err))
	check("refile_stops", want.RefileStops, coordinatorAway(err))

	var fence *FenceError
	var stale *StaleAttemptError
	var notRunning *JobNotRunningError
	switch {
	case errors.As(err, &stale):
		fence = &stale.FenceError
		taken := stale.CurrentAttempt > stale.Attempt
		check("taken_over", want.TakenOver, taken)
		// The Go SDK shows the detail in the error's text.
		if said := strings.Contains(stale.Error(), "taken over"); said != taken {
			t.Errorf("%q says taken over: %v, want %v", stale.Error(), said, taken)
		}
	case errors.As(err, &notRunning):
		fence = &notRunning.FenceError
	}
	if want.TakenOver != nil && stale == nil {
		t.Errorf("taken_over expected of %v, which is no stale attempt", err)
	}
	for _, f := range []struct {
		what string
		want *int64
		got  func(*FenceError) int64
	}{
		{"job_id", want.JobID, func(f *FenceError) int64 { return f.JobID }},
		{"attempt", want.Attempt, func(f *FenceError) int64 { return f.Attempt }},
		{"current_attempt", want.CurrentAttempt, func(f *FenceError) int64 { return f.CurrentAttempt }},
	} {
		switch {
		case f.want == nil:
		case fence == nil:
			t.Errorf("%s expected of %v, which names no grant", f.what, err)
		case f.got(fence) != *f.want:
			t.Errorf("%s %d, want %d", f.what, f.got(fence), *f.want)
		}
	}
	if want.CurrentState != nil && (fence == nil || string(fence.CurrentState) != *want.CurrentState) {
		t.Errorf("current state of %v: want %s", err, *want.CurrentState)
	}
	if want.Violations != nil {
		var ia *InvalidArgumentError
		if !errors.As(err, &ia) {
			t.Fatalf("%v is no *InvalidArgumentError", err)
		}
		var fields []string
		for _, f := range ia.Violations {
			fields = append(fields, f.Field)
		}
		if !slices.Equal(fields, want.Violations) {
			t.Errorf("violations %v, want %v", fields, want.Violations)
		}
	}
}
