package console

import (
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Rate is a token bucket: PerSecond attempts a second on average, Burst of
// them at once.
type Rate struct {
	PerSecond float64
	Burst     int
}

// The sign-in limits when Options leave them zero: a person who mistypes a
// token a few times is never slowed down, a script guessing tokens or
// churning sessions is, to a handful of attempts a second.
var (
	DefaultSignInsPerAddress    = Rate{PerSecond: 2, Burst: 10}
	DefaultSignInsPerCredential = Rate{PerSecond: 1, Burst: 5}
)

// maxBuckets bounds the buckets one limiter keeps. Past it the buckets that
// have refilled (the same as new ones) are dropped; when every bucket is
// still draining, attempts from a key without one are refused until some
// refill: a flood from more addresses than this is answered by limiting
// everyone a moment, not by growing memory.
const maxBuckets = 10_000

// limiter keeps one token bucket per key (a client address or a
// credential's name), on this process's monotonic clock: it decides only
// who may try again now, never anything about a job (R12 is about leases).
type limiter struct {
	rate Rate
	mu   sync.Mutex
	keys map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newLimiter(r Rate) *limiter {
	return &limiter{rate: r, keys: map[string]*bucket{}}
}

// take spends one attempt of key's bucket. When none is left it answers
// false and how long until one is.
func (l *limiter) take(key string) (bool, time.Duration) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.keys[key]
	if b == nil {
		if len(l.keys) >= maxBuckets {
			l.dropFull(now)
		}
		if len(l.keys) >= maxBuckets {
			return false, l.perToken()
		}
		b = &bucket{tokens: float64(l.rate.Burst), at: now}
		l.keys[key] = b
	}
	b.refill(l.rate, now)
	if b.tokens < 1 {
		return false, time.Duration((1 - b.tokens) / l.rate.PerSecond * float64(time.Second))
	}
	b.tokens--
	return true, 0
}

func (b *bucket) refill(r Rate, now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = math.Min(float64(r.Burst), b.tokens+d.Seconds()*r.PerSecond)
	}
	b.at = now
}

// dropFull forgets the buckets that have refilled to the burst.
func (l *limiter) dropFull(now time.Time) {
	for k, b := range l.keys {
		if b.refill(l.rate, now); b.tokens >= float64(l.rate.Burst) {
			delete(l.keys, k)
		}
	}
}

func (l *limiter) perToken() time.Duration {
	return time.Duration(float64(time.Second) / l.rate.PerSecond)
}

// clientAddress is the address a request came from, as the limits and the
// logs count it: the connection's IP (a proxy in front of the console is one
// address for everyone behind it; headers such as X-Forwarded-For are not
// trusted), with an IPv6 address cut to its /64, which one host usually
// holds whole.
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// Why a sign-in was refused, as the aggregated log line counts it.
const (
	refusedRateLimited  = "rate_limited"
	refusedFormExpired  = "form_expired"
	refusedNoToken      = "no_token"
	refusedUnknownToken = "unknown_token"
	refusedNoRole       = "no_role"
	refusedNoAuth       = "coordinator_without_credentials"
	refusedSessionsFull = "sessions_full"
	refusedError        = "error"
)

// maxRefusalAddresses bounds the addresses one interval's log keeps apart;
// the rest are counted together under "other".
const maxRefusalAddresses = 1000

// refusals counts refused sign-ins by client address and reason, and logs
// them once an interval: one line per address with the counts, however many
// attempts there were, so a flood of wrong tokens cannot flood the log. The
// first refusal of an interval starts a timer that writes the lines; nothing
// runs while nobody is refused.
type refusals struct {
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	counts map[string]map[string]int // address → reason → attempts
	timer  *time.Timer
}

func (rf *refusals) add(address, reason string) {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	if rf.counts == nil {
		rf.counts = map[string]map[string]int{}
	}
	byReason := rf.counts[address]
	if byReason == nil {
		if len(rf.counts) >= maxRefusalAddresses {
			address = "other"
		}
		if byReason = rf.counts[address]; byReason == nil {
			byReason = map[string]int{}
			rf.counts[address] = byReason
		}
	}
	byReason[reason]++
	if rf.timer == nil {
		rf.timer = time.AfterFunc(rf.every, rf.flush)
	}
}

// flush writes one line per address refused since the last one.
func (rf *refusals) flush() {
	rf.mu.Lock()
	counts := rf.counts
	rf.counts, rf.timer = nil, nil
	rf.mu.Unlock()
	for _, address := range slices.Sorted(maps.Keys(counts)) {
		byReason := counts[address]
		total := 0
		attrs := []any{"address", address, "count", 0, "interval", rf.every.String()}
		for _, reason := range slices.Sorted(maps.Keys(byReason)) {
			total += byReason[reason]
			attrs = append(attrs, reason, byReason[reason])
		}
		attrs[3] = total
		rf.log.Warn("console: sign-ins refused", attrs...)
	}
}
