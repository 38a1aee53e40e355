package fakeprovider

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// RefundStatus is where a refund stands at the provider.
type RefundStatus string

// The refund statuses. Pending is not success (R4): money is on its way and the
// refund may still fail.
const (
	StatusPending   RefundStatus = "pending"
	StatusSucceeded RefundStatus = "succeeded"
	StatusFailed    RefundStatus = "failed"
)

// RefundParams is the body of POST /v1/refunds. Two requests under one
// Idempotency-Key are "the same" when all four fields are equal.
type RefundParams struct {
	PaymentID         string `json:"payment_id"`
	AmountMinor       int64  `json:"amount_minor"`
	Currency          string `json:"currency"`
	MerchantReference string `json:"merchant_reference"`
}

// Refund is a refund as the provider reports it.
type Refund struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"` // always "refund"
	PaymentID         string       `json:"payment_id"`
	AmountMinor       int64        `json:"amount_minor"`
	Currency          string       `json:"currency"`
	MerchantReference string       `json:"merchant_reference"`
	Status            RefundStatus `json:"status"`
	FailureReason     string       `json:"failure_reason,omitempty"`
	Created           time.Time    `json:"created"`
	// Received is when the create request that made the refund arrived,
	// before any latency or hang held it (the simulator clock). Only the
	// oracle reports it: a request sent before some moment may be acted on
	// after it, and only its arrival says which side of it the sender was
	// on.
	Received time.Time `json:"received,omitzero"`

	// Replayed is set by Client.CreateRefund when the provider answered from its
	// idempotency store (header Idempotent-Replayed: true): no new refund was
	// made. It is not part of the JSON body.
	Replayed bool `json:"-"`
}

// Error codes in the "code" field of an error reply. Clients branch on these,
// never on the message.
const (
	CodeIdempotencyKeyMissing = "idempotency_key_missing" // 400
	CodeIdempotencyKeyReused  = "idempotency_key_reused"  // 409: same key, different parameters
	CodeParameterMissing      = "parameter_missing"       // 400
	CodeParameterInvalid      = "parameter_invalid"       // 400
	CodeInvalidFault          = "invalid_fault"           // 400: bad X-Fake-Fault header or fault settings
	CodeResourceMissing       = "resource_missing"        // 404
	CodeServiceUnavailable    = "service_unavailable"     // 503: injected by error_burst, nothing was done
)

// Sentinel errors returned by Client. Match them with errors.Is; a
// *StatusError carries the details.
var (
	// ErrIdempotencyConflict: the Idempotency-Key was already used, inside the
	// retention window, for different parameters. Nothing was created.
	ErrIdempotencyConflict = errors.New("fakeprovider: idempotency key reused with different parameters")
	// ErrNotFound: no refund with that id is visible. Under lookup lag this does
	// not prove the refund does not exist (R14).
	ErrNotFound = errors.New("fakeprovider: refund not found")
	// ErrUnavailable: the provider answered 503. The simulator did nothing for
	// such a request; a real provider makes no such promise.
	ErrUnavailable = errors.New("fakeprovider: service unavailable")
	// ErrNoReply: no HTTP reply was received (connection cut, timeout,
	// cancellation). The request may or may not have been processed: the
	// outcome is unknown (T3). It wraps the transport or context error.
	ErrNoReply = errors.New("fakeprovider: no reply, outcome unknown")
)

// StatusError is an error reply from the provider. It matches
// ErrIdempotencyConflict, ErrNotFound or ErrUnavailable with errors.Is where
// the code or status says so.
type StatusError struct {
	StatusCode int    // HTTP status
	Type       string // e.g. invalid_request_error, idempotency_error, api_error
	Code       string // one of the Code* constants
	Message    string // for humans
	Param      string // the offending parameter, when there is one
}

// Error returns the status, code, parameter and message.
func (e *StatusError) Error() string {
	s := fmt.Sprintf("fakeprovider: %d %s", e.StatusCode, e.Code)
	if e.Param != "" {
		s += " (" + e.Param + ")"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Is reports whether e is the kind of failure target names.
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrIdempotencyConflict:
		return e.Code == CodeIdempotencyKeyReused
	case ErrNotFound:
		return e.StatusCode == 404
	case ErrUnavailable:
		return e.StatusCode == 503
	}
	return false
}

// errorBody is the JSON of an error reply.
type errorBody struct {
	Error struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
		Param   string `json:"param,omitempty"`
	} `json:"error"`
}

// listBody is the JSON of a list reply.
type listBody struct {
	Object string   `json:"object"` // "list"
	Data   []Refund `json:"data"`
}

// OracleReport is the provider's truth: what it actually did, regardless of
// lookup lag or of what any worker believes. Tests assert on it.
type OracleReport struct {
	Now                 time.Time `json:"now"` // the simulator clock
	KeyRetentionSeconds float64   `json:"key_retention_seconds"`

	// Refunds lists every refund created, in creation order, with its true
	// current status.
	Refunds    []Refund         `json:"refunds"`
	Operations []OperationTruth `json:"operations"` // in order of first refund
	Payments   []PaymentTruth   `json:"payments"`   // by payment, in order of first refund

	// DuplicateOperations counts operations with more than one live (pending
	// or succeeded) refund.
	DuplicateOperations int `json:"duplicate_operations"`
	// OverRefundedPayments counts registered payments whose live refunds exceed
	// the registered amount.
	OverRefundedPayments int `json:"over_refunded_payments"`
	// DoubleRefunds is DuplicateOperations + OverRefundedPayments: zero when
	// nobody was refunded twice. One incident may count in both.
	DoubleRefunds int `json:"double_refunds"`

	// Webhooks is every webhook event made and every attempt to deliver it.
	Webhooks WebhookReport `json:"webhooks"`

	Stats Stats `json:"stats"`
}

// Operation returns the operation that has this merchant reference or
// Idempotency-Key.
func (o OracleReport) Operation(referenceOrKey string) (OperationTruth, bool) {
	for _, op := range o.Operations {
		if slices.Contains(op.MerchantReferences, referenceOrKey) || slices.Contains(op.IdempotencyKeys, referenceOrKey) {
			return op, true
		}
	}
	return OperationTruth{}, false
}

// Payment returns the truth about one payment.
func (o OracleReport) Payment(paymentID string) (PaymentTruth, bool) {
	for _, p := range o.Payments {
		if p.PaymentID == paymentID {
			return p, true
		}
	}
	return PaymentTruth{}, false
}

// OperationTruth is what happened to one refund operation (R1). Refunds that
// share a merchant reference or an Idempotency-Key belong to one operation; a
// well-behaved worker uses one operation key as both, so an operation normally
// has one reference, one key and at most one live refund.
type OperationTruth struct {
	MerchantReference  string   `json:"merchant_reference"`  // of its first refund
	MerchantReferences []string `json:"merchant_references"` // every distinct reference
	IdempotencyKeys    []string `json:"idempotency_keys"`    // every distinct key
	RefundIDs          []string `json:"refund_ids"`          // every refund, failed ones too
	Refunds            int      `json:"refunds"`             // live refunds: pending or succeeded
	Failed             int      `json:"failed"`
	RefundedMinor      int64    `json:"refunded_minor"` // sum of live refunds
	Currency           string   `json:"currency"`       // of the first refund
	Duplicate          bool     `json:"duplicate"`      // more than one live refund
}

// PaymentTruth is what happened to one payment.
type PaymentTruth struct {
	PaymentID     string   `json:"payment_id"`
	RefundIDs     []string `json:"refund_ids"`
	Refunds       int      `json:"refunds"` // live refunds: pending or succeeded
	Failed        int      `json:"failed"`
	RefundedMinor int64    `json:"refunded_minor"`
	Currency      string   `json:"currency"`
	// AmountMinor is the registered payment amount (RegisterPayment); 0 when
	// the payment was never registered.
	AmountMinor  int64 `json:"amount_minor"`
	OverRefunded bool  `json:"over_refunded"`
}

// WebhookReport is the truth about the provider's webhooks since start (or
// Reset).
type WebhookReport struct {
	Enabled bool           `json:"enabled"` // a webhook URL is configured
	Events  []WebhookEvent `json:"events"`  // in order of creation
	// Pending counts the events the sender still works on: held by a fault,
	// waiting for a retry, or owed a duplicate.
	Pending int `json:"pending"`
	// Undelivered counts the events the sender is done with that never
	// reached the receiver: dropped by webhook_drop, or given up after the
	// last attempt.
	Undelivered int `json:"undelivered"`
}

// Event returns the event with this id.
func (w WebhookReport) Event(id string) (WebhookEvent, bool) {
	for _, e := range w.Events {
		if e.ID == id {
			return e, true
		}
	}
	return WebhookEvent{}, false
}

// ForRefund returns the events about one refund, in order of creation.
func (w WebhookReport) ForRefund(refundID string) []WebhookEvent {
	var out []WebhookEvent
	for _, e := range w.Events {
		if e.RefundID == refundID {
			out = append(out, e)
		}
	}
	return out
}

// WebhookEvent is one webhook event and its deliveries. A redelivery is the
// same event: same id, same body, a fresh signature.
type WebhookEvent struct {
	ID       string `json:"id"` // evt_…, never reused
	Type     string `json:"type"`
	RefundID string `json:"refund_id"` // charge.refunded: the refund whose success it reports
	// OperationKey is the refund's merchant reference, sent as
	// metadata.operation_key.
	OperationKey   string       `json:"operation_key"`
	IdempotencyKey string       `json:"idempotency_key"` // of the create that made the refund
	Status         RefundStatus `json:"status"`          // the refund's, in the event
	// Faults are the webhook faults it is sent under, in ParseFaults syntax.
	Faults   string           `json:"faults,omitempty"`
	Attempts []WebhookAttempt `json:"attempts"`
	// Deliveries counts the attempts answered 2xx; Delivered is Deliveries > 0.
	Deliveries int  `json:"deliveries"`
	Delivered  bool `json:"delivered"`
	Dropped    bool `json:"dropped"` // webhook_drop: never sent
	GaveUp     bool `json:"gave_up"` // the last allowed attempt failed
}

// WebhookAttempt is one delivery attempt.
type WebhookAttempt struct {
	At        time.Time `json:"at"`        // wall clock, when it was sent
	Timestamp int64     `json:"timestamp"` // the signature's t, unix seconds
	Status    int       `json:"status"`    // the receiver's HTTP status; 0 when no reply came
	Error     string    `json:"error,omitempty"`
	// Fault names what spoiled this attempt on purpose: webhook_bad_signature,
	// webhook_old_timestamp.
	Fault string `json:"fault,omitempty"`
}

// Stats counts requests since start (or Reset). Admin and oracle calls are not
// counted.
type Stats struct {
	CreateRequests int `json:"create_requests"` // POST /v1/refunds received, any outcome
	RefundsCreated int `json:"refunds_created"`
	Replays        int `json:"replays"`   // answered from the idempotency store
	Conflicts      int `json:"conflicts"` // idempotency_key_reused
	LookupRequests int `json:"lookup_requests"`
	InjectedErrors int `json:"injected_errors"` // 503s from error_burst
	CutReplies     int `json:"cut_replies"`
}
