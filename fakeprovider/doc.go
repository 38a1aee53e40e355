// Package fakeprovider simulates a payment provider's refund API, modelled on
// Stripe's, for workers, examples and chaos tests to refund against. It keeps
// its state in memory, injects the faults that make refunds dangerous (hangs,
// lost replies, pending refunds, replica lag, 503 bursts) and answers, through
// its oracle, what really happened — the provider's records are the final
// truth, whatever a worker believes.
//
// Use it in-process (New, then httptest.NewServer(p) or http.Serve on any
// listener; Close when done) or as the fakeprovider command; talk to it with
// Client.
//
// # Refunds
//
//	POST /v1/refunds
//	Idempotency-Key: <operation_key>                     (required, ≤ 255 chars)
//	{"payment_id":"pay_1","amount_minor":1500,"currency":"EUR","merchant_reference":"<operation_key>"}
//
// All four fields are required; amount_minor > 0; currency is three letters
// (upper-cased); unknown fields are rejected. The reply is 200 with a refund
// and the header Idempotent-Replayed: true|false:
//
//	{"id":"re_000001","object":"refund","payment_id":"pay_1","amount_minor":1500,"currency":"EUR",
//	 "merchant_reference":"op-1","status":"pending|succeeded|failed","failure_reason":"declined",
//	 "created":"2030-01-01T00:00:00Z"}
//
// Idempotency, as at Stripe: a key is remembered for the retention window
// (default 24h, simulator clock) from the refund it created. Inside it, the
// same key with the same four fields returns that refund (same id, its current
// status, Idempotent-Replayed: true) and creates nothing; the same key with
// other fields is 409 idempotency_key_reused. Past the window the key is
// forgotten and a resend creates a NEW refund, which the oracle reports as a
// double refund. A request rejected as invalid stores nothing under its key.
//
//	GET /v1/refunds/{id}                            → refund, or 404 resource_missing
//	GET /v1/refunds?merchant_reference=R            → {"object":"list","data":[refund…]}
//	GET /v1/refunds?payment_id=P                    → the same; both filters may be combined
//
// Lists are oldest first and may be empty ("no record", which under lookup lag
// does not mean nothing happened, R14).
//
// Errors are {"error":{"type":"…","code":"…","message":"…","param":"…"}} with
// the codes of the Code* constants: 400 idempotency_key_missing,
// parameter_missing, parameter_invalid, invalid_fault; 404 resource_missing;
// 409 idempotency_key_reused; 503 service_unavailable.
//
// # Webhooks
//
// With a webhook URL and secret (Config.WebhookURL, WebhookSecret; the
// command's --webhook-url, --webhook-secret-file and --webhook-max-attempts)
// the provider tells that endpoint about its refunds the way Stripe does:
// one POST per event, never inside the API request that caused it, at least
// once.
//
//	POST <webhook URL>
//	Content-Type: application/json; charset=utf-8
//	Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>" under the secret>
//	{"id":"evt_000001","object":"event","type":"refund.created","created":1893553445,
//	 "data":{"object":{"id":"re_000001","object":"refund","amount":1500,"currency":"eur",
//	   "status":"pending","payment_intent":"pay_1","created":1893553445,
//	   "metadata":{"operation_key":"op-1"}}},
//	 "request":{"id":"req_000001","idempotency_key":"op-1"}}
//
// The refund object has failure_reason when failed. metadata.operation_key is
// the create's merchant_reference; request names the create that made the
// refund, on every event about it. The events of one refund:
//
//	refund.created    when it is made, with its status then: pending, succeeded or failed
//	refund.updated    when a pending refund succeeds
//	refund.failed     when it fails, at once (after refund.created) or after pending
//	charge.refunded   after it succeeds; data.object is the payment as a charge,
//	                  {"object":"charge","id":"pay_1","refunds":{"object":"list","data":[refund…]}},
//	                  with every refund of the payment as it stood, newest first
//
// Statuses are Stripe's words; the simulator never cancels a refund, so
// "canceled" does not occur. created (event and refund) is the simulator
// clock; the signature's t is the wall clock, which the receiver checks
// against its own. A pending refund settles when the simulator clock passes
// its time (Advance, or the wall clock with the default Clock): its events
// exist as soon as anything can see it settled.
//
// Each event has its own id, never reused (not even after Reset); a
// redelivery reuses the id and the body and is signed afresh. A delivery
// answered other than 2xx, or not at all within 10 s, is retried after 100ms,
// doubling to 5s (Config.WebhookRetry, WebhookMaxRetry), at most 10 attempts
// (WebhookMaxAttempts); then the event is given up. One refund's events are
// delivered one at a time, in order (each finished, delivered or given up,
// before the next); different refunds' in parallel. Close stops the sender;
// events made after it are recorded, never sent. The oracle's webhooks section
// lists every event with its attempts (wall-clock time, t, HTTP status).
//
// # Faults
//
// Per request, with the header X-Fake-Fault (syntax of ParseFaults; several
// modes comma-separated or in repeated headers):
//
//	X-Fake-Fault: hang_before=N      hold N seconds, then act (cancelled: nothing done)
//	X-Fake-Fault: hang_after=N       act (create the refund), then hold N seconds
//	X-Fake-Fault: cut_reply          act, then close the connection without a reply (T3)
//	X-Fake-Fault: pending=N          the new refund stays pending N seconds (simulator clock)
//	X-Fake-Fault: lookup_lag=N       on a create: lookups miss the refund for N seconds;
//	                                 on a lookup: it misses refunds younger than N seconds
//	X-Fake-Fault: error_burst[=N]    503 now, and for the next N-1 API requests; nothing done
//	X-Fake-Fault: fail               the new refund ends failed
//
// and, on the events of the refund a create makes (nothing without a
// webhook URL):
//
//	X-Fake-Fault: webhook_delay=N          hold each event N seconds (wall clock) before its first delivery
//	X-Fake-Fault: webhook_duplicate        deliver each event twice (same id, same body)
//	X-Fake-Fault: webhook_reorder          hold the refund's events until its last one, then deliver
//	                                       them newest first (refund.updated before refund.created)
//	X-Fake-Fault: webhook_bad_signature    sign each event's first attempt with a wrong secret; retries are right
//	X-Fake-Fault: webhook_old_timestamp    sign each event's first attempt with t 10 minutes ago; retries are right
//	X-Fake-Fault: webhook_drop             never deliver (the oracle lists the events, dropped)
//
// N is seconds (decimals allowed) or a Go duration ("250ms"). Hangs are
// wall-clock time and end when the client cancels.
//
// Globally, for every later create request (ErrorBurst also counts lookups):
//
//	POST   /v1/_admin/faults  {"hang_before":0,"hang_after":0,"cut_reply":false,"pending":0,
//	                           "lookup_lag":0,"error_burst":0,"fail":false,
//	                           "webhook_delay":0,"webhook_duplicate":false,"webhook_reorder":false,
//	                           "webhook_bad_signature":false,"webhook_old_timestamp":false,
//	                           "webhook_drop":false,"key":"","times":0}
//	GET    /v1/_admin/faults  → the same shape, as it stands now
//	DELETE /v1/_admin/faults  → clears them
//
// Durations are seconds; missing fields are zero; POST replaces the whole set.
// "key" limits the faults to creates with that Idempotency-Key; "times" clears
// the faults other than error_burst after that many matching creates. A
// header's modes add to the global ones for its request; where both give a
// duration, the header's wins.
//
// # Time, oracle and admin
//
//	POST /v1/_admin/advance   {"seconds":86400}   → {"now":"…"}   move the simulator clock forward
//	POST /v1/_admin/payments  {"payment_id":"pay_1","amount_minor":1500,"currency":"EUR"} → 204
//	POST /v1/_admin/reset     → 204: forget refunds, keys, payments, counters and webhook events
//	GET  /v1/_oracle          → OracleReport
//
// The oracle lists every refund with its true status, totals per operation
// (refunds sharing a merchant reference or an Idempotency-Key) and per
// payment, and double_refunds: the number of operations with more than one
// live (pending or succeeded) refund plus registered payments refunded beyond
// their amount, and webhooks: every event (id, type, refund id, operation
// key, faults, attempts with their HTTP status, delivered, dropped, gave_up),
// with pending (events still being worked on) and undelivered (dropped or
// given up). Admin and oracle endpoints are never subject to faults.
package fakeprovider
