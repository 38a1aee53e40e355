package server

import (
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
)

// activityTTL is how long GetActivity serves one answer per window: a chart
// of hours loses nothing in half a minute, and the read aggregates up to
// store.ActivityMaxRows rows of each table.
const activityTTL = 30 * time.Second

// GetActivity implements jobfence.v1.Coordinator: what happened minute by
// minute in the last minutes (store.Store.Activity), read from id ranges of
// the history and the receipts, never by walking them (Q3). An expensive
// read: computed under the expensive reads' limits (Options.MaxReads,
// Options.ReadsPerSecond and their per-credential bounds), once per window
// and activityTTL for every caller of this coordinator.
func (s *Server) GetActivity(ctx context.Context, req *pb.GetActivityRequest) (*pb.GetActivityResponse, error) {
	p := activityFromProto(req)
	if err := p.Validate(); err != nil {
		return nil, s.toStatus(ctx, err, jobAttrs{})
	}
	resp, err := s.activity.get(p.Minutes, activityTTL, func() (*pb.GetActivityResponse, error) {
		release, err := s.reads.acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
		a, err := s.store.Activity(ctx, p)
		if err != nil {
			return nil, s.toStatus(ctx, err, jobAttrs{})
		}
		return activityToProto(a), nil
	})
	if err != nil {
		return nil, err
	}
	return proto.Clone(resp).(*pb.GetActivityResponse), nil // one answer, many callers
}

// activityFromProto is the store's request: the window in minutes, 180 when
// unset.
func activityFromProto(r *pb.GetActivityRequest) store.ActivityParams {
	minutes := int(r.GetMinutes())
	if minutes == 0 {
		minutes = store.DefaultActivityMinutes
	}
	return store.ActivityParams{Minutes: minutes}
}

func activityToProto(a store.Activity) *pb.GetActivityResponse {
	resp := &pb.GetActivityResponse{Now: timeToProto(a.Now), Truncated: a.Truncated,
		CountedSince: timeToProto(a.CountedSince), Minutes: make([]*pb.ActivityMinute, 0, len(a.Minutes))}
	for _, m := range a.Minutes {
		resp.Minutes = append(resp.Minutes, &pb.ActivityMinute{Start: timeToProto(m.Start), Succeeded: m.Succeeded,
			ManualReview: m.ManualReview, Cancelled: m.Cancelled, Takeovers: m.Takeovers,
			ReviewsResolved: m.ReviewsResolved, Receipts: m.Receipts})
	}
	return resp
}

// ttlCache keeps one answer per key for a while. Its mutex is held while an
// answer is computed, so that concurrent callers wait for it instead of
// computing their own; a failed computation keeps nothing. The zero value is
// ready to use.
type ttlCache[K comparable, V any] struct {
	mu    sync.Mutex
	byKey map[K]ttlEntry[V]
}

type ttlEntry[V any] struct {
	v  V
	at time.Time
}

// get returns key's answer while it is younger than ttl, else compute's,
// which it then keeps.
func (c *ttlCache[K, V]) get(key K, ttl time.Duration, compute func() (V, error)) (V, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[key]; ok && time.Since(e.at) < ttl {
		return e.v, nil
	}
	v, err := compute()
	if err != nil {
		return v, err
	}
	if c.byKey == nil {
		c.byKey = map[K]ttlEntry[V]{}
	}
	c.byKey[key] = ttlEntry[V]{v: v, at: time.Now()}
	return v, nil
}
