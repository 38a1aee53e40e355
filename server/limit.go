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

// callLimit bounds the calls of one kind in flight: per caller (its
// credential; all callers of a coordinator without credentials are one) and
// in all, so that one client can take neither the whole allowance nor the
// database's time from claims and write-backs. Safe for concurrent use.
type callLimit struct {
	what             string // "expensive reads", "worker streams": for the message
	perCaller, total int
	retry            time.Duration // the RetryInfo hint

	mu       sync.Mutex
	n        int
	byCaller map[string]int
}

func newCallLimit(what string, perCaller, total int, retry time.Duration) *callLimit {
	return &callLimit{what: what, perCaller: perCaller, total: total, retry: retry, byCaller: map[string]int{}}
}

// acquire takes a place for ctx's caller and returns its release, or a
// RESOURCE_EXHAUSTED status naming the bound that was hit, with
// ErrorInfo TOO_MANY_CALLS (metadata "scope": credential or coordinator,
// "limit") and a RetryInfo. Nothing was done.
func (l *callLimit) acquire(ctx context.Context) (release func(), err error) {
	caller := ""
	if id, ok := IdentityFrom(ctx); ok {
		caller = id.Name
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	scope, limit := "", 0
	switch {
	case l.byCaller[caller] >= l.perCaller:
		scope, limit = "credential", l.perCaller
	case l.n >= l.total:
		scope, limit = "coordinator", l.total
	}
	if scope != "" {
		msg := fmt.Sprintf("too many %s in flight: this %s allows %d at once; try again in %s", l.what, scope, limit,
			l.retry)
		if scope == "credential" {
			msg = fmt.Sprintf("too many %s in flight for this credential: %d at once; finish one, or try again in %s",
				l.what, limit, l.retry)
		}
		return nil, withDetails(codes.ResourceExhausted, msg,
			info(ReasonTooManyCalls, map[string]string{"scope": scope, "limit": strconv.Itoa(limit)}),
			&errdetails.RetryInfo{RetryDelay: durationpb.New(l.retry)}).Err()
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
