package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"time"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// The pauser (R33): as an operator would, it pauses the campaign's
// provider for a few seconds now and then while the faults run, through
// one replica or the other, and resumes it; every coordinator must leave
// the provider's jobs out of every grant within a claim poll interval of
// the pause (invariant 15).

// Pacing of the pauser: a pause of pauseMin..pauseMax every
// pauseGapMin..pauseGapMax (divided by --fault-rate), the first one
// pauseFirstMin..pauseGapMin into the window.
const (
	pauseMin, pauseMax       = time.Second, 4 * time.Second
	pauseGapMin, pauseGapMax = 10 * time.Second, 20 * time.Second
	pauseFirstMin            = 5 * time.Second
	// pauseResumeFor bounds the resume after the window: it must happen,
	// or the settle waits for nothing.
	pauseResumeFor = 30 * time.Second
)

// pauseAnswer is one pause or resume the pauser asked for and its answer.
type pauseAnswer struct {
	N      int    // the pause's number
	Action string // "paused" or "resumed"
	// Changed: the provider was not paused (resumed) before; PausedAt is
	// the coordinator's time of the pause it answered (the first pause of
	// a provider already paused).
	Changed  bool
	PausedAt time.Time
	Err      string
	At       time.Time // when the campaign had the answer
}

// pauser pauses and resumes the campaign's provider.
type pauser struct {
	s    *system
	op   *operator
	rng  *rand.Rand
	rate float64

	mu      sync.Mutex
	answers []pauseAnswer
}

func (s *system) newPauser(seed uint64) (*pauser, error) {
	op, err := s.newOperator()
	if err != nil {
		return nil, err
	}
	h := fnv.New64a()
	h.Write([]byte("pauser"))
	return &pauser{s: s, op: op, rng: rand.New(rand.NewPCG(seed, h.Sum64())), rate: s.cfg.faultRate}, nil
}

// between draws a duration in [lo, hi).
func (p *pauser) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(p.rng.Int64N(int64(hi-lo)))
}

// run pauses and resumes the provider until ctx (the window) ends; a pause
// still standing then is resumed.
func (p *pauser) run(ctx context.Context) {
	defer p.op.close()
	wait := time.Duration(float64(p.between(pauseFirstMin, pauseGapMin)) / p.rate)
	for n := 1; ; n++ {
		if !sleepCtx(ctx, wait) {
			return
		}
		hold := p.between(pauseMin, pauseMax)
		paused := p.pause(ctx, n)
		if paused {
			p.s.tl.printf("pauser: provider %s paused (#%d) for %s", providerName, n, hold.Round(time.Millisecond))
		}
		sleepCtx(ctx, hold)
		if paused {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseResumeFor)
			p.resume(rctx, n)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		wait = time.Duration(float64(p.between(pauseGapMin, pauseGapMax)) / p.rate)
	}
}

// pause asks for pause n; it reports whether the provider may be paused
// now (answered or not: a pause that answered nothing may have landed, and
// is resumed all the same).
func (p *pauser) pause(ctx context.Context, n int) bool {
	a := pauseAnswer{N: n, Action: "paused"}
	var resp *pb.PauseProviderResponse
	err := p.op.call(ctx, func(ctx context.Context, cl pb.CoordinatorClient) error {
		var err error
		resp, err = cl.PauseProvider(ctx, &pb.PauseProviderRequest{Provider: providerName,
			Reason: fmt.Sprintf("chaos: pause #%d", n)})
		return err
	})
	if err != nil {
		a.Err = err.Error()
		p.s.tl.printf("pauser: pause #%d of %s not answered: %v", n, providerName, err)
	} else {
		a.Changed, a.PausedAt = resp.GetChanged(), resp.GetPause().GetPausedAt().AsTime()
	}
	p.record(a)
	return true
}

// resume asks for the resume of pause n, repeating while nothing answers,
// until ctx ends.
func (p *pauser) resume(ctx context.Context, n int) {
	a := pauseAnswer{N: n, Action: "resumed"}
	for ctx.Err() == nil {
		var resp *pb.ResumeProviderResponse
		err := p.op.call(ctx, func(ctx context.Context, cl pb.CoordinatorClient) error {
			var err error
			resp, err = cl.ResumeProvider(ctx, &pb.ResumeProviderRequest{Provider: providerName,
				Reason: fmt.Sprintf("chaos: end of pause #%d", n)})
			return err
		})
		if err == nil {
			a.Changed, a.Err = resp.GetChanged(), ""
			break
		}
		a.Err = err.Error()
		if !repeatable(err) {
			break // refused: repeating changes nothing
		}
	}
	p.record(a)
	if a.Err != "" {
		p.s.tl.printf("pauser: resume #%d of %s not answered: %s", n, providerName, a.Err)
		return
	}
	p.s.tl.printf("pauser: provider %s resumed (#%d)", providerName, n)
}

func (p *pauser) record(a pauseAnswer) {
	a.At = time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answers = append(p.answers, a)
}

// all returns the answers so far.
func (p *pauser) all() []pauseAnswer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]pauseAnswer(nil), p.answers...)
}

// pauseSummary is the campaign's line about its pauses.
func pauseSummary(answers []pauseAnswer) string {
	pauses, resumes, unanswered := 0, 0, 0
	for _, a := range answers {
		switch {
		case a.Err != "":
			unanswered++
		case a.Action == "paused" && a.Changed:
			pauses++
		case a.Action == "resumed" && a.Changed:
			resumes++
		}
	}
	return fmt.Sprintf("pauser: %d pauses of %s and %d resumes answered as changes, %d calls not answered", pauses,
		providerName, resumes, unanswered)
}
