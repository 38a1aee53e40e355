package storetest

import (
	"database/sql"
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// R25: every claim and takeover mints its own unguessable token, keeps only
// its hash, and records the grant in the history.
func testEveryGrantMintsAToken(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	seen := map[store.LeaseToken]bool{}
	for n := int64(1); n <= 3; n++ {
		c := claimOne(t, s, "A", job.ID)
		raw, err := base64.RawURLEncoding.DecodeString(string(c.LeaseToken))
		if err != nil || len(raw) < 16 {
			t.Fatalf("grant %d: lease token %q is not 128 bits of base64url (%v)", n, c.LeaseToken, err)
		}
		if seen[c.LeaseToken] {
			t.Fatalf("grant %d: lease token handed out twice", n)
		}
		seen[c.LeaseToken] = true
		if c.Job.Grant != c.LeaseToken.Hash() {
			t.Fatalf("grant %d: answered hash %x, want the token's", n, c.Job.Grant)
		}
		d := get(t, s, job.ID)
		if d.Job.Grant != c.LeaseToken.Hash() {
			t.Fatalf("grant %d: row keeps %x, want the token's hash", n, d.Job.Grant)
		}
		last := d.Events[len(d.Events)-1]
		if last.Attempt != n || (last.Kind != store.EventClaimed && last.Kind != store.EventTakenOver) ||
			last.Grant != c.LeaseToken.Hash() {
			t.Fatalf("grant %d: last event %+v, want the claim with its grant", n, last)
		}
		expire(t, s, job.ID)
	}
}

// R25, the attack: a stale worker learns the current attempt from
// its rejection (it is in the error and the logs) and writes again with it.
// Whatever token it brings, its own old one, none or a guess, nothing is
// written; the holder's write then lands, and only the holder's repeat is a
// replay (R21).
func testCurrentAttemptWithoutItsTokenRefused_R25(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := claimOne(t, s, "A", job.ID)
	expire(t, s, job.ID)
	b := claimOne(t, s, "B", job.ID)

	_, err := s.Write(ctxFor(t), complete(of(a), "re_A"))
	wantFence(t, err, store.ErrStaleAttempt, b.Job.Attempt, store.StateRunning)
	for _, token := range []store.LeaseToken{a.LeaseToken, "", store.NewLeaseToken()} {
		forged := grant{id: job.ID, attempt: b.Job.Attempt, token: token} // "retry with current_attempt"
		for _, w := range []store.Writeback{complete(forged, "re_forged"), reschedule(forged, 0), escalate(forged)} {
			_, err := s.Write(ctxFor(t), w)
			wantFence(t, err, store.ErrStaleAttempt, b.Job.Attempt, store.StateRunning)
		}
	}
	d := get(t, s, job.ID)
	if d.Job.State != store.StateRunning || d.Job.Attempt != b.Job.Attempt || d.Job.ProviderRefundID != "" ||
		d.Job.WorkerID != "B" {
		t.Fatalf("job after forged writes = %+v, want B's grant untouched", d.Job)
	}
	if n := countKind(d.Events, store.EventCompleted) + countKind(d.Events, store.EventRescheduled) +
		countKind(d.Events, store.EventEscalated); n != 0 {
		t.Fatalf("%d write-backs in the history after forged writes: %v", n, kinds(d.Events))
	}

	done := write(t, s, complete(of(b), "re_B"))
	if done.Replayed || done.Job.State != store.StateSucceeded || done.Job.ProviderRefundID != "re_B" {
		t.Fatalf("B's complete = %+v", done)
	}
	if again := write(t, s, complete(of(b), "re_B")); !again.Replayed {
		t.Fatalf("B's repeated complete = %+v, want replayed", again)
	}
	last := get(t, s, job.ID).Events
	if e := last[len(last)-1]; e.Kind != store.EventCompleted || e.Grant != b.LeaseToken.Hash() {
		t.Fatalf("completion event %+v, want it under B's grant", e)
	}
}

// R25: a batch decides each write by its own grant: in one transaction the
// holder's write lands and a forged one with the same attempt does not.
func testBatchFencesEachWriteByItsToken_R25(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	c := claimOne(t, s, "A", job.ID)
	forged := of(c)
	forged.token = store.NewLeaseToken()
	out := s.WriteMany(ctxFor(t), []store.Writeback{complete(forged, "re_forged"), reschedule(of(c), time.Hour)})
	var fe *store.FenceError
	if !errors.Is(out[0].Err, store.ErrStaleAttempt) || !errors.As(out[0].Err, &fe) || fe.Current.Attempt != c.Job.Attempt {
		t.Fatalf("forged write in a batch = %+v, want STALE_ATTEMPT", out[0])
	}
	if out[1].Err != nil || out[1].Result.Job.State != store.StateReady {
		t.Fatalf("holder's write in the batch = %+v", out[1])
	}
	if d := get(t, s, job.ID); d.Job.State != store.StateReady || d.Job.ProviderRefundID != "" {
		t.Fatalf("job = %+v, want rescheduled by its holder only", d.Job)
	}
}

// R25: a receipt names the attempt its reporter held; with that grant's
// token it is marked verified. Without it, or with another, it is filed all
// the same (R15) and marked unverified.
func testObservationVerifiedByToken_R25(t *testing.T, s store.Store) {
	job := enqueue(t, s, refund(t))
	a := claimOne(t, s, "A", job.ID)
	expire(t, s, job.ID)
	claimOne(t, s, "B", job.ID)
	cases := []struct {
		source string
		token  store.LeaseToken
		want   bool
	}{
		{"worker:A", a.LeaseToken, true}, // the stale holder's own grant
		{"worker:A-no-token", "", false},
		{"worker:A-guess", store.NewLeaseToken(), false},
	}
	for _, c := range cases {
		o, dup, err := s.Observe(ctxFor(t), store.ObservationParams{Job: store.JobRef{ID: job.ID}, Attempt: a.Job.Attempt,
			LeaseToken: c.token, Source: c.source, Outcome: store.OutcomeSucceeded, ProviderRefundID: "re_1"})
		if err != nil || dup {
			t.Fatalf("%s: Observe = dup %v, %v", c.source, dup, err)
		}
		if o.AttemptVerified != c.want || o.ReportedAttempt != a.Job.Attempt {
			t.Fatalf("%s: observation = %+v, want attempt_verified %v", c.source, o, c.want)
		}
	}
	if n := len(get(t, s, job.ID).Observations); n != len(cases) {
		t.Fatalf("%d observations on file, want %d: none may be dropped", n, len(cases))
	}
}

// The legacy rows UpgradeFromUntokened expects: a job a coordinator from
// before lease tokens granted, and one it never claimed.
const (
	LegacyAttempt = 3
	LegacyWorker  = "old-worker"
)

// DBStore is a backend's store with its database handle.
type DBStore interface {
	store.Store
	DB() *sql.DB
}

// UpgradeWithRunningJobs runs legacySQL on the store openOld opens at schema
// version 3, as a coordinator from before lease tokens left it (its
// statement inserts the job keyed legacy-running, granted under
// LegacyAttempt to LegacyWorker with a live lease, and legacy-ready, never
// claimed), opens the file or database again with openNew (every
// migration) and checks it with UpgradeFromUntokened.
func UpgradeWithRunningJobs(t *testing.T, openOld func() (DBStore, error), legacySQL string, openNew func() DBStore) {
	t.Helper()
	old, err := openOld()
	if err != nil {
		t.Fatal(err)
	}
	_, err = old.DB().ExecContext(ctxFor(t), legacySQL)
	old.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := openNew()
	var running, ready int64
	if err := s.DB().QueryRowContext(ctxFor(t), `SELECT
  (SELECT id FROM refund_jobs WHERE operation_key = 'legacy-running'),
  (SELECT id FROM refund_jobs WHERE operation_key = 'legacy-ready')`).Scan(&running, &ready); err != nil {
		t.Fatal(err)
	}
	UpgradeFromUntokened(t, s, running, ready)
}

// UpgradeFromUntokened checks a store opened on a database that a
// coordinator from before lease tokens left behind (R25), with running a job
// that coordinator granted (state running, attempt LegacyAttempt, worker
// LegacyWorker, lease still live) and ready one it never claimed. Nothing is
// lost; the untokened grant is written back with its attempt alone, until
// its next grant; a token it never had is refused; new grants mint tokens
// and need them.
func UpgradeFromUntokened(t *testing.T, s store.Store, running, ready int64) {
	t.Helper()
	d := get(t, s, running)
	if d.Job.State != store.StateRunning || d.Job.Attempt != LegacyAttempt || d.Job.WorkerID != LegacyWorker ||
		!d.Job.Grant.IsZero() {
		t.Fatalf("legacy running job after the upgrade = %+v", d.Job)
	}
	legacy := grant{id: running, attempt: LegacyAttempt}
	guessed := legacy
	guessed.token = store.NewLeaseToken()
	_, err := s.Write(ctxFor(t), complete(guessed, "re_guess"))
	wantFence(t, err, store.ErrStaleAttempt, LegacyAttempt, store.StateRunning)
	res := write(t, s, complete(legacy, "re_legacy"))
	if res.Replayed || res.Job.State != store.StateSucceeded || res.Job.ProviderRefundID != "re_legacy" {
		t.Fatalf("the legacy holder's complete = %+v", res)
	}
	if again := write(t, s, complete(legacy, "re_legacy")); !again.Replayed {
		t.Fatalf("the legacy holder's repeated complete = %+v, want replayed", again)
	}

	c := claimOne(t, s, "new-worker", ready)
	if c.LeaseToken == "" || c.Job.Attempt != 1 {
		t.Fatalf("first grant after the upgrade = attempt %d token %q", c.Job.Attempt, c.LeaseToken)
	}
	_, err = s.Write(ctxFor(t), complete(grant{id: ready, attempt: 1}, "re_no_token"))
	wantFence(t, err, store.ErrStaleAttempt, 1, store.StateRunning)
	write(t, s, complete(of(c), "re_new"))
}

// UpgradeDatesReviewsFromTheirEscalation checks the upgrade to the schema
// where an escalation sets next_attempt_at: openOld opens the file or
// database at schema version 5, and legacySQL inserts what an earlier
// release left there: a job "legacy-review" in manual_review, escalated at
// its updated_at with next_attempt_at still when it was due, and a job
// "legacy-parked" ready for later. openNew (every migration) must then show
// the review waiting since its escalation, and the ready job's schedule
// untouched. The rows are written by SQL, not through a store: the code of
// today may read columns schema 5 does not have.
func UpgradeDatesReviewsFromTheirEscalation(t *testing.T, openOld func() (DBStore, error), legacySQL string,
	openNew func() DBStore) {
	t.Helper()
	old, err := openOld()
	if err != nil {
		t.Fatal(err)
	}
	_, err = old.DB().ExecContext(ctxFor(t), legacySQL)
	old.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := openNew()
	var review, ready int64
	if err := s.DB().QueryRowContext(ctxFor(t), `SELECT
  (SELECT id FROM refund_jobs WHERE operation_key = 'legacy-review'),
  (SELECT id FROM refund_jobs WHERE operation_key = 'legacy-parked')`).Scan(&review, &ready); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, review).Job; got.State != store.StateManualReview || !got.NextAttemptAt.Equal(got.UpdatedAt) ||
		!got.NextAttemptAt.After(got.CreatedAt) {
		t.Fatalf("review after the upgrade = %+v, want next_attempt_at its escalation (updated_at)", got)
	}
	if got := get(t, s, ready).Job; got.State != store.StateReady || !got.NextAttemptAt.After(got.UpdatedAt) {
		t.Fatalf("ready job after the upgrade = %+v, want it still due later", got)
	}
}
