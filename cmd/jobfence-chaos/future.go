package main

import (
	"hash/fnv"
	"math/rand/v2"
	"time"
)

// futureBeyond is how far after its enqueue a refund dated beyond the
// campaign is due: a year, long after any campaign ends.
const futureBeyond = 365 * 24 * time.Hour

// The delay of a refund due within the campaign: 10–30 s after its enqueue,
// long enough that the forger's events reach it while it waits, short
// enough that it is sent in the fault window. A short window scales it
// down (a sixth to a half of the window).
const (
	futureSoonMin = 10 * time.Second
	futureSoonMax = 30 * time.Second
	// futureLeadMin is the least a refund due within the campaign waits
	// after its enqueue when the producer fell behind its schedule.
	futureLeadMin = 2 * time.Second
)

// dateSomeInTheFuture gives a share of specs a not_before in the future,
// drawn from seed on a random stream of its own (the fault plan's lanes
// keep theirs): half of them due within the fault window, NotBeforeIn
// 10–30 s after their enqueue and never later than nine tenths into the
// window, so that they are sent while the faults run and the settle does
// not wait for them (the producer enqueues spec i of n at spread·i/n into
// the window; one enqueued too late for that is dated beyond); the others
// a year later (Beyond), never to be sent during the campaign. Nothing a
// receipt does may make either be sent earlier (R28, invariant 11). It
// returns how many of each it dated.
func dateSomeInTheFuture(seed uint64, specs []refundSpec, share float64,
	spread, window time.Duration) (soon, beyond int) {
	h := fnv.New64a()
	h.Write([]byte("future-dated"))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	lo, hi := soonDelays(window)
	latest := window * 9 / 10
	for i := range specs {
		// Every spec draws the same three numbers, so that the share
		// changes which are dated, not how the others are.
		dated := rng.Float64() < share
		far := rng.IntN(2) == 0
		delay := lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
		if !dated {
			continue
		}
		at := spread * time.Duration(i) / time.Duration(max(len(specs), 1))
		if !far && at+lo > latest {
			far = true // no room left in the window: dated beyond it
		}
		if far {
			specs[i].NotBeforeIn, specs[i].Beyond = futureBeyond, true
			beyond++
			continue
		}
		specs[i].NotBeforeIn = min(delay, latest-at)
		soon++
	}
	return soon, beyond
}

// soonDelays are the least and the most a refund due within a window of
// that length waits after its enqueue: 10–30 s, a sixth to a half of a
// shorter window.
func soonDelays(window time.Duration) (lo, hi time.Duration) {
	return min(futureSoonMin, window/6), min(futureSoonMax, window/2)
}

// maxTime is the later of a and b.
func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
