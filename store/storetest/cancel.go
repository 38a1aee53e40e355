package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

func cancelOf(id, attempt int64, reason string) store.CancelParams {
	return store.CancelParams{JobID: id, Attempt: attempt, Reason: reason, Actor: "alice"}
}

func cancel(t *testing.T, s store.Store, p store.CancelParams) store.CancelResult {
	t.Helper()
	res, err := s.Cancel(ctxFor(t), p)
	if err != nil {
		t.Fatalf("Cancel(job %d attempt %d): %v", p.JobID, p.Attempt, err)
	}
	return res
}

// testCancelNeverSentIsFinal_R32: a refund never sent is cancelled at
// once, recorded with who and why; nothing claims it, its key answers with
// it (R1), a repeat is a replay, and every other cancel is refused with why.
func testCancelNeverSentIsFinal_R32(t *testing.T, s store.Store) {
	p := refund(t)
	job := enqueue(t, s, p)
	res := cancel(t, s, cancelOf(job.ID, 0, "order reinstated"))
	if !res.Cancelled || res.Replayed || res.Job.State != store.StateCancelled || res.Job.CancelRequested() ||
		res.Job.Attempt != 0 || res.Job.LastReason != "order reinstated" {
		t.Fatalf("cancel of a never-sent job = %+v", res)
	}
	d := get(t, s, job.ID)
	if d.Job != res.Job {
		t.Fatalf("Cancel answered\n %+v\nbut the row is\n %+v", res.Job, d.Job)
	}
	ev := d.Events[len(d.Events)-1]
	if ev.Kind != store.EventCancelled || ev.WorkerID != "alice" || ev.Reason != "order reinstated" ||
		ev.FromState != store.StateReady || ev.ToState != store.StateCancelled {
		t.Fatalf("cancel's history entry = %+v", ev)
	}
	if got := claim(t, s, "A", 10); len(got) != 0 {
		t.Fatalf("a cancelled job was granted: %v", ids(got))
	}
	again, created, err := s.Enqueue(ctxFor(t), p)
	if err != nil || created || again.ID != job.ID || again.State != store.StateCancelled {
		t.Fatalf("enqueue of a cancelled job's key = %+v created %v, %v; want the cancelled job (R1)", again, created, err)
	}
	if r := cancel(t, s, cancelOf(job.ID, 0, "order reinstated")); !r.Replayed || !r.Cancelled {
		t.Fatalf("repeated cancel = %+v, want a replay", r)
	}
	_, err = s.Cancel(ctxFor(t), cancelOf(job.ID, 0, "another reason"))
	wantFence(t, err, store.ErrNotCancellable, 0, store.StateCancelled)
	// A cancel never pretends: a receipt saying money moved for a cancelled
	// job puts it on the attention list (R34), and changes nothing else.
	o := observe(t, s, store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "webhook",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_surprise", ProviderEventID: "evt_c"}, false)
	if d := get(t, s, job.ID); !o.Attention || d.Job.AttentionSince.IsZero() || d.Job.State != store.StateCancelled {
		t.Fatalf("a receipt of success for a cancelled job: attention %v, job %+v", o.Attention, d.Job)
	}

	// Fenced by the attempt the caller saw; bad input names its field.
	other := enqueue(t, s, refund(t))
	_, err = s.Cancel(ctxFor(t), cancelOf(other.ID, 3, "stale view"))
	wantFence(t, err, store.ErrStaleAttempt, 0, store.StateReady)
	if _, err := s.Cancel(ctxFor(t), cancelOf(1<<40, 0, "no such job")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("cancel of an unknown job: %v, want ErrNotFound", err)
	}
	for field, p := range map[string]store.CancelParams{
		"reason": cancelOf(other.ID, 0, ""),
		"job_id": cancelOf(0, 0, "why"),
	} {
		_, err := s.Cancel(ctxFor(t), p)
		wantViolation(t, err, field)
	}
	if d := get(t, s, other.ID); d.Job.State != store.StateReady || len(d.Events) != 1 {
		t.Fatalf("refused cancels wrote: %+v %v", d.Job, kinds(d.Events))
	}

	// A producer cancels only what it enqueued.
	mine := refund(t)
	mine.Producer = "orders"
	mj := enqueue(t, s, mine)
	theirs := cancelOf(mj.ID, 0, "not mine")
	theirs.EnqueuedBy = "billing"
	if _, err := s.Cancel(ctxFor(t), theirs); !errors.Is(err, store.ErrNotEnqueuedByCaller) {
		t.Fatalf("a producer's cancel of another's job: %v, want ErrNotEnqueuedByCaller", err)
	}
	own := cancelOf(mj.ID, 0, "order reinstated")
	own.EnqueuedBy = "orders"
	if r := cancel(t, s, own); !r.Cancelled {
		t.Fatalf("a producer's cancel of its own job = %+v", r)
	}
}

// testCancelRunningFencesHolder_R32: a cancel of a running job takes it
// over at once: the holder's renewal and write-back are stale and write
// nothing; the next grant says a cancel was requested and reconciles; no
// reschedule may ask to send the refund; the provider having it completes
// the job, too late, onto the attention list (R34).
func testCancelRunningFencesHolder_R32(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", job.ID)
	res := cancel(t, s, cancelOf(job.ID, c.Job.Attempt, "customer disputed"))
	if res.Cancelled || res.Job.State != store.StateReady || res.Job.Attempt != c.Job.Attempt+1 ||
		res.Job.NextAction != store.ActionReconcile || !res.Job.CancelRequested() || !res.Job.LeaseUntil.IsZero() ||
		res.Job.NextAttemptAt.After(res.Job.UpdatedAt) {
		t.Fatalf("cancel of a running job = %+v", res)
	}
	_, err := s.Write(ctxFor(t), complete(of(c), "re_zombie"))
	wantFence(t, err, store.ErrStaleAttempt, c.Job.Attempt+1, store.StateReady)
	if o := renew(t, s, renewal(of(c), time.Minute))[0]; !errors.Is(o.Err, store.ErrStaleAttempt) {
		t.Fatalf("the old holder's renewal: %v, want ErrStaleAttempt", o.Err)
	}
	d := get(t, s, job.ID)
	if d.Job != res.Job || d.Ledger != nil {
		t.Fatalf("the refused holder wrote: %+v ledger %+v", d.Job, d.Ledger)
	}
	if e := d.Events[len(d.Events)-1]; e.Kind != store.EventCancelRequested || e.Attempt != c.Job.Attempt+1 ||
		e.FromState != store.StateRunning || e.ToState != store.StateReady || e.WorkerID != "alice" {
		t.Fatalf("cancel request's history entry = %+v", e)
	}
	if r := cancel(t, s, cancelOf(job.ID, c.Job.Attempt, "customer disputed")); !r.Replayed || r.Cancelled {
		t.Fatalf("repeated cancel = %+v, want a replay", r)
	}

	c2 := claimOne(t, s, "B", job.ID)
	if !c2.Job.CancelRequested() || c2.Job.NextAction != store.ActionReconcile || c2.Takeover ||
		c2.Job.Attempt != c.Job.Attempt+2 {
		t.Fatalf("grant after a cancel request = %+v takeover %v", c2.Job, c2.Takeover)
	}
	toRefund := reschedule(of(c2), 0)
	toRefund.NextAction = store.ActionRefund
	_, err = s.Write(ctxFor(t), toRefund)
	wantFence(t, err, store.ErrCancelRequested, c2.Job.Attempt, store.StateRunning)
	if d := get(t, s, job.ID); d.Job.State != store.StateRunning || d.Job.Attempt != c2.Job.Attempt {
		t.Fatalf("the refused reschedule wrote: %+v", d.Job)
	}
	write(t, s, reschedule(of(c2), 0)) // pending: reconcile again

	c3 := claimOne(t, s, "C", job.ID)
	if !c3.Job.CancelRequested() || c3.Job.NextAction != store.ActionReconcile {
		t.Fatalf("third grant = %+v", c3.Job)
	}
	done := write(t, s, complete(of(c3), "re_had_it"))
	if done.Job.State != store.StateSucceeded || done.Job.AttentionSince.IsZero() ||
		done.Job.AttentionReason != store.CancelTooLate {
		t.Fatalf("completion of a cancel-requested job = %+v, want succeeded on the attention list", done.Job)
	}
	d = get(t, s, job.ID)
	if d.Job != done.Job || d.Ledger == nil || d.Events[len(d.Events)-1].Kind != store.EventAttention {
		t.Fatalf("after a too-late completion: %+v ledger %+v history %v", d.Job, d.Ledger, kinds(d.Events))
	}
	if r := write(t, s, complete(of(c3), "re_had_it")); !r.Replayed || r.Job != done.Job {
		t.Fatalf("replayed completion = %+v", r)
	}
	if n := countKind(get(t, s, job.ID).Events, store.EventAttention); n != 1 {
		t.Fatalf("%d attention entries after a replay, want 1", n)
	}
	listed, total, err := s.Attention(ctxFor(t), 10)
	if err != nil || total != 1 || len(listed) != 1 || listed[0].ID != job.ID {
		t.Fatalf("Attention = %v total %d, %v; want job %d", jobIDs(listed), total, err, job.ID)
	}
	_, err = s.Cancel(ctxFor(t), cancelOf(job.ID, done.Job.Attempt, "again"))
	wantFence(t, err, store.ErrNotCancellable, done.Job.Attempt, store.StateSucceeded)

	// Acknowledged with the attention_since the person saw, never another.
	ack := store.AcknowledgeParams{JobID: job.ID, Since: done.Job.AttentionSince.Add(-time.Second), Note: "customer refunded by hand", Actor: "bob"}
	_, _, err = s.Acknowledge(ctxFor(t), ack)
	if !errors.Is(err, store.ErrAttentionMoved) || !errors.Is(err, store.ErrStaleAttempt) {
		t.Fatalf("acknowledge of an older look: %v, want ErrAttentionMoved", err)
	}
	ack.Since = done.Job.AttentionSince
	acked, replayed, err := s.Acknowledge(ctxFor(t), ack)
	if err != nil || replayed || !acked.AttentionSince.IsZero() || acked.State != store.StateSucceeded {
		t.Fatalf("Acknowledge = %+v replayed %v, %v", acked, replayed, err)
	}
	if _, again, err := s.Acknowledge(ctxFor(t), ack); err != nil || !again {
		t.Fatalf("repeated acknowledgement: replayed %v, %v", again, err)
	}
	ack.Note = "another note"
	if _, _, err := s.Acknowledge(ctxFor(t), ack); !errors.Is(err, store.ErrNotOnAttentionList) {
		t.Fatalf("acknowledge of a job off the list: %v, want ErrNotOnAttentionList", err)
	}
	if e := get(t, s, job.ID).Events; e[len(e)-1].Kind != store.EventAcknowledged || e[len(e)-1].WorkerID != "bob" {
		t.Fatalf("acknowledgement's history entry = %+v", e[len(e)-1])
	}
	if _, total, _ := s.Attention(ctxFor(t), 10); total != 0 {
		t.Fatalf("attention list after acknowledgement: %d jobs", total)
	}
	// R31: a job with a cancel request is never archived, even once final.
	aged(t, s, done.Job)
	archiveAll(t, s, "archiver-r", 10)
	if d := get(t, s, job.ID); !d.Job.ArchivedAt.IsZero() {
		t.Fatalf("a job with a cancel request was archived: %+v", d.Job)
	}
}

// testCancelMaybeSentWaitsForAPerson_R32: a job sent before and waiting
// is made due now to reconcile; one in review keeps waiting for its person,
// who alone may resolve it as cancelled.
func testCancelMaybeSentWaitsForAPerson_R32(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", job.ID)
	later := reschedule(of(c), time.Hour)
	later.NextAction = store.ActionRefund // the provider refused: send again later
	write(t, s, later)
	res := cancel(t, s, cancelOf(job.ID, c.Job.Attempt, "entered twice"))
	if res.Cancelled || res.Job.State != store.StateReady || res.Job.Attempt != c.Job.Attempt ||
		res.Job.NextAction != store.ActionReconcile || !res.Job.CancelRequested() || res.Job.NextAttemptAt.After(res.Job.UpdatedAt) {
		t.Fatalf("cancel of a sent, waiting job = %+v", res)
	}
	c2 := claimOne(t, s, "B", job.ID)
	if !c2.Job.CancelRequested() || c2.Job.NextAction != store.ActionReconcile {
		t.Fatalf("grant = %+v", c2.Job)
	}
	write(t, s, escalate(of(c2))) // the provider has no record: a person decides

	inReview := get(t, s, job.ID).Job
	res2, err := s.Cancel(ctxFor(t), cancelOf(job.ID, inReview.Attempt, "again"))
	wantFence(t, err, store.ErrNotCancellable, inReview.Attempt, store.StateManualReview)
	_ = res2
	r := write(t, s, resolve(job.ID, inReview.Attempt, store.ResolutionCancelled, ""))
	if r.Job.State != store.StateCancelled || r.Replayed {
		t.Fatalf("resolved as cancelled = %+v", r.Job)
	}
	if again := write(t, s, resolve(job.ID, inReview.Attempt, store.ResolutionCancelled, "")); !again.Replayed {
		t.Fatalf("repeated resolution = %+v, want replayed", again)
	}

	// A job in review never sent is cancelled at once; one sent gets a
	// request and stays in review.
	never, attempt := escalated(t, s)
	never.FirstSentAt = time.Time{}
	sent := get(t, s, never.ID).Job
	res3 := cancel(t, s, cancelOf(sent.ID, attempt, "duplicate"))
	if sent.FirstSentAt.IsZero() {
		t.Fatalf("a claimed job has no first send: %+v", sent)
	}
	if res3.Cancelled || res3.Job.State != store.StateManualReview || !res3.Job.CancelRequested() {
		t.Fatalf("cancel of a sent job in review = %+v", res3)
	}
}

// testCancelRacesClaim_R32: a cancel of a never-sent job racing its claim
// ends in exactly one of: cancelled before any grant (the claim got
// nothing), or the grant first and the cancel refused as stale (the person
// saw attempt 0), then requested on the granted job, fencing its holder.
func testCancelRacesClaim_R32(t *testing.T, s store.Store) {
	const rounds = 100
	var before, after int
	for i := range rounds {
		p := refund(t)
		p.Provider = fmt.Sprintf("race%d", i) // a cancel request leaves the job due: each round claims its own
		job := enqueue(t, s, p)
		var wg sync.WaitGroup
		var got []store.ClaimedJob
		var cerr error
		var res store.CancelResult
		wg.Add(2)
		go func() {
			defer wg.Done()
			got, cerr = s.Claim(ctxFor(t), store.ClaimParams{WorkerID: "racer", MaxJobs: 1, Lease: time.Minute, Provider: p.Provider})
		}()
		go func() {
			defer wg.Done()
			var err error
			res, err = s.Cancel(ctxFor(t), cancelOf(job.ID, 0, "race"))
			if err != nil {
				res = store.CancelResult{}
				if !errors.Is(err, store.ErrStaleAttempt) {
					t.Errorf("cancel: %v", err)
				}
			}
		}()
		wg.Wait()
		if cerr != nil {
			t.Fatalf("claim: %v", cerr)
		}
		switch {
		case res.Cancelled && len(got) == 0:
			before++
		case !res.Cancelled && len(got) == 1 && got[0].Job.ID == job.ID:
			after++
			r := cancel(t, s, cancelOf(job.ID, got[0].Job.Attempt, "race, seen running"))
			if r.Cancelled || !r.Job.CancelRequested() {
				t.Fatalf("cancel of the granted job = %+v", r)
			}
			if _, err := s.Write(ctxFor(t), complete(of(got[0]), "re_race")); !errors.Is(err, store.ErrStaleAttempt) {
				t.Fatalf("the granted holder's completion after the cancel: %v, want ErrStaleAttempt", err)
			}
		default:
			t.Fatalf("cancel %+v and claim %v of job %d: neither or both", res, ids(got), job.ID)
		}
		if d := get(t, s, job.ID); countKind(d.Events, store.EventClaimed)+countKind(d.Events, store.EventCancelled) != 1 {
			t.Fatalf("history of job %d: %v", job.ID, kinds(d.Events))
		}
	}
	t.Logf("%d rounds: cancelled before the grant %d, after it %d", rounds, before, after)
}

// testPauseStopsGrants_R33: a paused provider's jobs are granted to nobody,
// reconciles and takeovers included, while other providers' are; grants
// already made renew and write back; resume lets them go; who, when and why
// are kept.
func testPauseStopsGrants_R33(t *testing.T, s store.Store) {
	held := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", held.ID)
	waiting := enqueue(t, s, refund(t))
	expired := enqueue(t, s, refund(t))
	ce := claimOne(t, s, "A", waiting.ID)
	_ = expired
	expire(t, s, ce.Job.ID)
	other := refund(t)
	other.Provider = "globex"
	og := enqueue(t, s, other)

	pause, changed, err := s.PauseProvider(ctxFor(t), store.PauseParams{Provider: "acme", Actor: "alice", Reason: "provider down"})
	if err != nil || !changed || pause.Provider != "acme" || pause.PausedBy != "alice" || pause.PausedAt.IsZero() {
		t.Fatalf("PauseProvider = %+v changed %v, %v", pause, changed, err)
	}
	if _, changed, err := s.PauseProvider(ctxFor(t), store.PauseParams{Provider: "acme", Actor: "bob", Reason: "again"}); err != nil || changed {
		t.Fatalf("second pause: changed %v, %v; want the first to stand", changed, err)
	}
	got := claim(t, s, "B", 10)
	if len(got) != 1 || got[0].Job.ID != og.ID {
		t.Fatalf("claim while acme is paused = %v, want only globex's job %d", ids(got), og.ID)
	}
	for _, p := range []string{"", "acme"} {
		if work, err := s.HasWork(ctxFor(t), p); err != nil || work {
			t.Fatalf("HasWork(%q) while acme is paused = %v, %v", p, work, err)
		}
	}
	if got, err := s.Claim(ctxFor(t), store.ClaimParams{WorkerID: "B", MaxJobs: 5, Lease: time.Minute, Provider: "acme"}); err != nil || len(got) != 0 {
		t.Fatalf("claim of acme's jobs while paused = %v, %v", ids(got), err)
	}
	if o := renew(t, s, renewal(of(c), time.Minute))[0]; o.Err != nil {
		t.Fatalf("a running grant's renewal while paused: %v", o.Err)
	}
	write(t, s, complete(of(c), "re_paused"))

	pauses, err := s.RefreshPauses(ctxFor(t))
	if err != nil || len(pauses) != 1 || pauses[0].Reason != "provider down" {
		t.Fatalf("RefreshPauses = %+v, %v", pauses, err)
	}
	if changed, err := s.ResumeProvider(ctxFor(t), store.PauseParams{Provider: "acme", Actor: "bob", Reason: "provider back"}); err != nil || !changed {
		t.Fatalf("ResumeProvider: changed %v, %v", changed, err)
	}
	if changed, err := s.ResumeProvider(ctxFor(t), store.PauseParams{Provider: "acme", Actor: "bob", Reason: "again"}); err != nil || changed {
		t.Fatalf("second resume: changed %v, %v", changed, err)
	}
	if got := claim(t, s, "B", 10); len(got) != 2 || !got[0].Takeover {
		t.Fatalf("claim after resume = %v, want the expired lease then the waiting job", ids(got))
	}
	events, err := s.PauseEvents(ctxFor(t), 10)
	if err != nil || len(events) != 2 || events[0].Action != store.PauseActionResumed || events[0].Actor != "bob" ||
		events[1].Action != store.PauseActionPaused || events[1].Reason != "provider down" {
		t.Fatalf("PauseEvents = %+v, %v", events, err)
	}
	for field, p := range map[string]store.PauseParams{
		"provider": {Provider: "Not A Name", Actor: "a", Reason: "r"},
		"reason":   {Provider: "acme", Actor: "a"},
	} {
		_, _, err := s.PauseProvider(ctxFor(t), p)
		wantViolation(t, err, field)
	}
}

// testReceiptAfterSuccessRaisesAttention_R34: a receipt of failure, or of
// another refund id, for a job that succeeded puts it on the attention
// list and changes nothing else; one that agrees with it does not; a job on
// the list is never archived; the list pages like any listing.
func testReceiptAfterSuccessRaisesAttention_R34(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", job.ID)
	done := write(t, s, complete(of(c), "re_ok")).Job
	agree := observe(t, s, store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "webhook",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_ok", ProviderEventID: "evt_1"}, false)
	if agree.Attention || !get(t, s, job.ID).Job.AttentionSince.IsZero() {
		t.Fatalf("an agreeing receipt raised attention: %+v", agree)
	}
	failed := observe(t, s, store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "webhook",
		Outcome: store.OutcomeFailed, ProviderRefundID: "re_ok", ProviderEventID: "evt_2"}, false)
	d := get(t, s, job.ID)
	if !failed.Attention || d.Job.AttentionSince.IsZero() || d.Job.State != store.StateSucceeded ||
		d.Job.Attempt != done.Attempt || d.Job.ProviderRefundID != "re_ok" {
		t.Fatalf("after a receipt of failure: %+v (attention %v)", d.Job, failed.Attention)
	}
	if e := d.Events[len(d.Events)-1]; e.Kind != store.EventAttention || e.ToState != store.StateSucceeded {
		t.Fatalf("attention's history entry = %+v", e)
	}
	first := d.Job.AttentionSince
	waitForClock(t, s, first)
	observe(t, s, store.ObservationParams{Job: store.JobRef{ID: job.ID}, Source: "webhook",
		Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_other", ProviderEventID: "evt_3"}, false)
	if again := get(t, s, job.ID).Job; !again.AttentionSince.After(first) {
		t.Fatalf("a receipt of another refund id left attention_since at %s", again.AttentionSince)
	}

	// Others on the list, paged longest listed first.
	var want []int64
	want = append(want, job.ID)
	for range 2 {
		j := enqueue(t, s, refund(t))
		jc := claimOne(t, s, "A", j.ID)
		write(t, s, complete(of(jc), "re_x"))
		observe(t, s, store.ObservationParams{Job: store.JobRef{ID: j.ID}, Source: "webhook",
			Outcome: store.OutcomeFailed, ProviderEventID: "evt_f"}, false)
		want = append(want, j.ID)
	}
	var listed []int64
	p := store.ListParams{Attention: true, Limit: 2}
	for {
		page, err := s.List(ctxFor(t), p)
		if err != nil {
			t.Fatalf("List(attention): %v", err)
		}
		listed = append(listed, jobIDs(page.Jobs)...)
		if page.NextPageToken == "" {
			break
		}
		p.PageToken = page.NextPageToken
	}
	if !slices.Equal(listed, want) {
		t.Fatalf("attention listing = %v, want %v", listed, want)
	}
	_, err := s.List(ctxFor(t), store.ListParams{Attention: true, State: store.StateSucceeded, Limit: 5})
	wantViolation(t, err, "attention")

	// Never archived while listed.
	aged(t, s, done)
	archiveAll(t, s, "archiver-a", 10)
	if d := get(t, s, job.ID); !d.Job.ArchivedAt.IsZero() {
		t.Fatalf("a job on the attention list was archived: %+v", d.Job)
	}
}

// testCancelledJobsArchived_R31_R32: a cancelled job leaves the working
// tables RetainCancelled after it was cancelled, never with a zero
// RetainCancelled; it stays readable, and its key answers with it (R30).
func testCancelledJobsArchived_R31_R32(t *testing.T, s store.Store) {
	r := retainer(t, s)
	p := refund(t)
	job := enqueue(t, s, p)
	cancelled := cancel(t, s, cancelOf(job.ID, 0, "order reinstated")).Job
	aged(t, s, cancelled)
	l, err := r.TakeLease(ctxFor(t), store.ArchiverLease, "archiver-c", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Archive(ctxFor(t), store.ArchiveParams{Lease: l, RetainSucceeded: time.Second, Limit: 10})
	if err != nil || res.Jobs != 0 {
		t.Fatalf("Archive without RetainCancelled moved %d jobs, %v; want none", res.Jobs, err)
	}
	res, err = r.Archive(ctxFor(t), store.ArchiveParams{Lease: l, RetainSucceeded: time.Second,
		RetainCancelled: time.Second, Limit: 10})
	if err != nil || res.Jobs != 1 {
		t.Fatalf("Archive with RetainCancelled moved %d jobs, %v; want the cancelled one", res.Jobs, err)
	}
	d := get(t, s, job.ID)
	if d.Job.ArchivedAt.IsZero() || d.Job.State != store.StateCancelled || d.Events[len(d.Events)-1].Kind != store.EventCancelled {
		t.Fatalf("the archived cancelled job reads %+v %v", d.Job, kinds(d.Events))
	}
	again, created, err := s.Enqueue(ctxFor(t), p)
	if err != nil || created || again.ID != job.ID || again.State != store.StateCancelled {
		t.Fatalf("enqueue of an archived cancelled key = %+v created %v, %v", again, created, err)
	}
	_, err = s.Cancel(ctxFor(t), cancelOf(job.ID, 0, "again"))
	wantFence(t, err, store.ErrNotCancellable, 0, store.StateCancelled)
}
