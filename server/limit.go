package server

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// ReasonTooManyCalls is the ErrorInfo reason of a call refused because its
// caller, or the coordinator, has as many of its kind in flight as allowed.
var ReasonTooManyCalls = reason(pb.ErrorReason_ERROR_REASON_TOO_MANY_CALLS)

// callLimit bounds the calls of one kind: how many are in flight, and,
// when a rate is set, how many start per second, per caller (its
// credential; all callers of a coordinator without credentials are one) and
// in all, so that one client can take neither the whole allowance nor the
// database's time from claims and write-backs. Safe for concurrent use.
type callLimit struct {
	what             string // "expensive reads", "worker streams": for the message
	perCaller, total int    // in flight at once
	// ratePerCaller and rate are calls started per second, each with a
	// burst of as many; 0: no rate.
	ratePerCaller, rate float64
	retry               time.Duration // the RetryInfo hint of a refusal for calls in flight

	mu       sync.Mutex
	n        int
	byCaller map[string]int
	buckets  map[string]*bucket // per caller; "\x00all" for all of them
}

// bucket is a token bucket: tokens refill at its rate up to its burst.
type bucket struct {
	tokens float64
	at     time.Time
}

// allBuckets names the coordinator's bucket among the callers'.
const allBuckets = "\x00all"

func newCallLimit(what string, perCaller, total int, retry time.Duration) *callLimit {
	return &callLimit{what: what, perCaller: perCaller, total: total, retry: retry, byCaller: map[string]int{},
		buckets: map[string]*bucket{}}
}

// withRates sets the calls per second a caller and all of them may start.
func (l *callLimit) withRates(perCaller, total float64) *callLimit {
	l.ratePerCaller, l.rate = perCaller, total
	return l
}

// take spends a token of name's bucket of rate at now; when there is none
// it spends nothing and returns how long until one.
func (l *callLimit) take(name string, rate float64, now time.Time) (wait time.Duration) {
	if rate <= 0 {
		return 0
	}
	b := l.buckets[name]
	if b == nil {
		b = &bucket{tokens: rate, at: now}
		l.buckets[name] = b
	}
	b.tokens = min(rate, b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	if b.tokens < 1 {
		return time.Duration((1 - b.tokens) / rate * float64(time.Second))
	}
	b.tokens--
	return 0
}

// refund gives back a token taken from name's bucket.
func (l *callLimit) refund(name string, rate float64) {
	if b := l.buckets[name]; b != nil && rate > 0 {
		b.tokens = min(rate, b.tokens+1)
	}
}

// acquire takes a place for ctx's caller and returns its release, or a
// RESOURCE_EXHAUSTED status naming the bound that was hit, with
// ErrorInfo TOO_MANY_CALLS (metadata "scope": credential or coordinator,
// "limit": in flight, or "per_second") and a RetryInfo. Nothing was done.
func (l *callLimit) acquire(ctx context.Context) (release func(), err error) {
	caller := ""
	if id, ok := IdentityFrom(ctx); ok {
		caller = id.Name
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.byCaller[caller] >= l.perCaller:
		return nil, l.refusal("credential", fmt.Sprintf("%d in flight at once; finish one", l.perCaller),
			map[string]string{"limit": strconv.Itoa(l.perCaller)}, l.retry)
	case l.n >= l.total:
		return nil, l.refusal("coordinator", fmt.Sprintf("%d in flight at once", l.total),
			map[string]string{"limit": strconv.Itoa(l.total)}, l.retry)
	}
	now := time.Now()
	if wait := l.take(caller, l.ratePerCaller, now); wait > 0 {
		return nil, l.refusal("credential", fmt.Sprintf("%g a second", l.ratePerCaller),
			map[string]string{"per_second": strconv.FormatFloat(l.ratePerCaller, 'g', -1, 64)}, wait)
	}
	if wait := l.take(allBuckets, l.rate, now); wait > 0 {
		l.refund(caller, l.ratePerCaller)
		return nil, l.refusal("coordinator", fmt.Sprintf("%g a second", l.rate),
			map[string]string{"per_second": strconv.FormatFloat(l.rate, 'g', -1, 64)}, wait)
	}
	l.n++
	l.byCaller[caller]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.n--
			if l.byCaller[caller]--; l.byCaller[caller] == 0 {
				delete(l.byCaller, caller)
			}
		})
	}, nil
}

// refusal is the status of a call refused for scope's bound.
func (l *callLimit) refusal(scope, bound string, meta map[string]string, retry time.Duration) error {
	retry = max(retry, time.Millisecond).Round(time.Millisecond)
	whose := "this coordinator allows"
	if scope == "credential" {
		whose = "this credential may have"
	}
	meta["scope"] = scope
	return withDetails(codes.ResourceExhausted, fmt.Sprintf("too many %s: %s %s; try again in %s", l.what, whose,
		bound, retry), info(ReasonTooManyCalls, meta), &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}).Err()
}

// overviewTTL is how long GetOverview serves one answer: an operator's
// page refreshes no faster, and a burst of readers costs the database one
// overview, not one each.
const overviewTTL = 2 * time.Second

// overviewCache keeps the newest overview per limit for overviewTTL. Its
// mutex is held while one is computed, so concurrent callers wait for it
// instead of computing their own.
type overviewCache struct {
	mu      sync.Mutex
	byLimit map[int]cachedOverview
}

type cachedOverview struct {
	resp *pb.GetOverviewResponse
	at   time.Time
}

// get returns the overview for limit: the cached one while it is fresh, else
// compute's, which it then keeps.
func (c *overviewCache) get(limit int, compute func() (*pb.GetOverviewResponse, error)) (*pb.GetOverviewResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byLimit[limit]; ok && time.Since(e.at) < overviewTTL {
		return e.resp, nil
	}
	resp, err := compute()
	if err != nil {
		return nil, err
	}
	if c.byLimit == nil {
		c.byLimit = map[int]cachedOverview{}
	}
	c.byLimit[limit] = cachedOverview{resp: resp, at: time.Now()}
	return resp, nil
}
