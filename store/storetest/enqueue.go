package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

func testEnqueueIdempotent(t *testing.T, s store.Store) {
	p := refund(t)
	job := enqueue(t, s, p)
	if job.ID == 0 || job.State != store.StateReady || job.Attempt != 0 || job.NextAction != store.ActionRefund {
		t.Fatalf("new job = %+v, want ready, attempt 0, next_action refund", job)
	}
	if job.NextAttemptAt.IsZero() || job.LeaseUntil != (time.Time{}) || job.FirstSentAt != (time.Time{}) {
		t.Fatalf("new job times = next %v lease %v first_sent %v; want next set, others NULL",
			job.NextAttemptAt, job.LeaseUntil, job.FirstSentAt)
	}
	again, created, err := s.Enqueue(ctxFor(t), p)
	if err != nil || created || again.ID != job.ID {
		t.Fatalf("second Enqueue = id %d created %v err %v, want id %d created false", again.ID, created, err, job.ID)
	}
	// A different schedule is not a different refund.
	p.NotBefore = dbNow(t, s).Add(time.Hour)
	if again, created, err = s.Enqueue(ctxFor(t), p); err != nil || created || again.ID != job.ID {
		t.Fatalf("Enqueue with other not_before = id %d created %v err %v", again.ID, created, err)
	}
	d := get(t, s, job.ID)
	if got := kinds(d.Events); len(got) != 1 || got[0] != store.EventEnqueued {
		t.Fatalf("events = %v, want one enqueued", got)
	}
	byKey, err := s.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{OperationKey: p.OperationKey}})
	if err != nil || byKey.Job.ID != job.ID {
		t.Fatalf("Get by key = %d, %v", byKey.Job.ID, err)
	}
}

func testEnqueueConflict(t *testing.T, s store.Store) {
	p := refund(t)
	job := enqueue(t, s, p)
	for name, change := range map[string]func(*store.EnqueueParams){
		"amount":   func(p *store.EnqueueParams) { p.AmountMinor++ },
		"currency": func(p *store.EnqueueParams) { p.Currency = "USD" },
		"payment":  func(p *store.EnqueueParams) { p.PaymentID += "x" },
		"order":    func(p *store.EnqueueParams) { p.OrderID += "x" },
		"provider": func(p *store.EnqueueParams) { p.Provider = "other" },
	} {
		q := p
		change(&q)
		_, created, err := s.Enqueue(ctxFor(t), q)
		if !errors.Is(err, store.ErrKeyConflict) || created {
			t.Errorf("%s changed: created %v err %v, want ErrKeyConflict", name, created, err)
		}
	}
	d := get(t, s, job.ID)
	if d.Job.AmountMinor != p.AmountMinor || d.Job.Currency != p.Currency || len(d.Events) != 1 {
		t.Fatalf("job changed by conflicting enqueues: %+v, %d events", d.Job, len(d.Events))
	}
	// Keys are byte-exact: another case is another refund.
	q := p
	q.OperationKey = strings.ToUpper(p.OperationKey)
	q.AmountMinor = 1
	if _, created, err := s.Enqueue(ctxFor(t), q); err != nil || !created {
		t.Fatalf("upper-case key: created %v err %v, want a new job", created, err)
	}
}

func testEnqueueNotBefore(t *testing.T, s store.Store) {
	later := refund(t)
	later.NotBefore = dbNow(t, s).Add(time.Hour)
	job := enqueue(t, s, later)
	if job.NextAttemptAt.Sub(later.NotBefore).Abs() > time.Millisecond {
		t.Fatalf("next_attempt_at = %v, want %v", job.NextAttemptAt, later.NotBefore)
	}
	if got := claim(t, s, "w1", 10); len(got) != 0 {
		t.Fatalf("claimed %v before not_before", ids(got))
	}
	now := enqueue(t, s, refund(t))
	claimOne(t, s, "w1", now.ID)
}

func testBadInput(t *testing.T, s store.Store) {
	ctx := ctxFor(t)
	good := refund(t)
	cases := []struct {
		field  string
		change func(*store.EnqueueParams)
	}{
		{"operation_key", func(p *store.EnqueueParams) { p.OperationKey = "" }},
		{"operation_key", func(p *store.EnqueueParams) { p.OperationKey = strings.Repeat("k", 129) }},
		{"operation_key", func(p *store.EnqueueParams) { p.OperationKey = "has space" }},
		{"order_id", func(p *store.EnqueueParams) { p.OrderID = "" }},
		{"payment_id", func(p *store.EnqueueParams) { p.PaymentID = strings.Repeat("p", 129) }},
		{"amount_minor", func(p *store.EnqueueParams) { p.AmountMinor = 0 }},
		{"amount_minor", func(p *store.EnqueueParams) { p.AmountMinor = -5 }},
		{"currency", func(p *store.EnqueueParams) { p.Currency = "eur" }},
		{"currency", func(p *store.EnqueueParams) { p.Currency = "EURO" }},
		{"currency", func(p *store.EnqueueParams) { p.Currency = "ABC" }},
		{"currency", func(p *store.EnqueueParams) { p.Currency = strings.Repeat("X", 60000) }},
		{"provider", func(p *store.EnqueueParams) { p.Provider = "" }},
		{"provider", func(p *store.EnqueueParams) { p.Provider = "Acme Pay" }},
		{"not_before", func(p *store.EnqueueParams) { p.NotBefore = time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC) }},
	}
	for _, c := range cases {
		p := good
		c.change(&p)
		_, _, err := s.Enqueue(ctx, p)
		wantViolation(t, err, c.field)
		if len(err.Error()) > 300 {
			t.Errorf("%s: a %d-byte rejection echoes the request (it goes to a status and a log line)", c.field, len(err.Error()))
		}
		if p.OperationKey != "" && len(p.OperationKey) <= store.MaxKeyLen && !strings.Contains(p.OperationKey, " ") {
			if _, err := s.Get(ctx, store.GetParams{JobRef: store.JobRef{OperationKey: p.OperationKey}}); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("%s: rejected enqueue left a job behind (Get: %v)", c.field, err)
			}
		}
	}

	job := enqueue(t, s, good)
	claims := []struct {
		field string
		p     store.ClaimParams
	}{
		{"max_jobs", store.ClaimParams{WorkerID: "w", MaxJobs: 0, Lease: time.Minute}},
		{"max_jobs", store.ClaimParams{WorkerID: "w", MaxJobs: 101, Lease: time.Minute}},
		{"lease_duration", store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: 999 * time.Millisecond}},
		{"lease_duration", store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: 15*time.Minute + time.Second}},
		{"worker_id", store.ClaimParams{WorkerID: "", MaxJobs: 1, Lease: time.Minute}},
		{"provider", store.ClaimParams{WorkerID: "w", MaxJobs: 1, Lease: time.Minute, Provider: "BAD NAME"}},
	}
	for _, c := range claims {
		_, err := s.Claim(ctx, c.p)
		wantViolation(t, err, c.field)
	}
	if d := get(t, s, job.ID); d.Job.State != store.StateReady || d.Job.Attempt != 0 {
		t.Fatalf("rejected claims touched the job: %+v", d.Job)
	}

	c := claimOne(t, s, "w", job.ID)
	writes := []struct {
		field string
		w     store.Writeback
	}{
		{"attempt", complete(grant{id: job.ID}, "re_1")},
		{"job_id", complete(grant{attempt: 1}, "re_1")},
		{"provider_refund_id", complete(of(c), "")},
		{"lease_token", complete(grant{id: job.ID, attempt: 1, token: "not a token"}, "re_1")},
		{"lease_token", complete(grant{id: job.ID, attempt: 1, token: store.LeaseToken(strings.Repeat("t", 65))}, "re_1")},
		{"next_action", store.Writeback{Kind: store.EventRescheduled, JobID: job.ID, Attempt: 1, NextAction: "sleep"}},
		{"delay", store.Writeback{Kind: store.EventRescheduled, JobID: job.ID, Attempt: 1,
			NextAction: store.ActionReconcile, Delay: -time.Second}},
		{"reason", store.Writeback{Kind: store.EventEscalated, JobID: job.ID, Attempt: 1}},
		{"reason", store.Writeback{Kind: store.EventEscalated, JobID: job.ID, Attempt: 1, Reason: strings.Repeat("r", 1025)}},
	}
	for _, c := range writes {
		_, err := s.Write(ctx, c.w)
		wantViolation(t, err, c.field)
	}
	obs := []struct {
		field string
		p     store.ObservationParams
	}{
		{"job_id", store.ObservationParams{Source: "x", Outcome: store.OutcomeSucceeded}},
		{"source", store.ObservationParams{Job: store.JobRef{ID: job.ID}, Outcome: store.OutcomeSucceeded}},
		{"outcome", store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "x", Outcome: "maybe"}},
		{"attempt", store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "x", Outcome: store.OutcomePending, Attempt: -1}},
		{"lease_token", store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "x", Outcome: store.OutcomePending,
			LeaseToken: c.LeaseToken}}, // a token without the attempt it was granted with
		{"detail", store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "x", Outcome: store.OutcomePending,
			Detail: strings.Repeat("d", store.MaxDetailLen+1)}},
		{"detail", store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "x", Outcome: store.OutcomePending,
			Detail: "late\x00reply"}},
		{"detail", store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "x", Outcome: store.OutcomePending,
			Detail: "\x1b[31mred"}},
	}
	for _, c := range obs {
		_, _, err := s.Observe(ctx, c.p)
		wantViolation(t, err, c.field)
	}
	d := get(t, s, job.ID)
	if d.Job.State != store.StateRunning || d.Job.Attempt != 1 || len(d.Observations) != 0 || len(d.Events) != 2 {
		t.Fatalf("rejected input changed something: job %+v, %d events, %d observations",
			d.Job, len(d.Events), len(d.Observations))
	}
}
