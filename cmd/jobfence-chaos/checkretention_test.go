package main

import (
	"database/sql"
	"strings"
	"testing"
	"time"
)

// archivedCampaign is campaign() with retention (R30, R31): job 1 left for
// the archive 5 s after its completion, with its history; job 2 is still in
// refund_jobs; both keys are on file, job 1's marked archived. The producer
// enqueued each once, then re-enqueued job 1's key late, once with its own
// values (answered with job 1, archived) and once with another amount
// (OPERATION_KEY_CONFLICT).
func archivedCampaign() checkInput {
	in := campaign()
	base := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	for i := range in.DB.Events {
		e := &in.DB.Events[i]
		e.At = base.Add(time.Duration(i) * 100 * time.Millisecond)
		e.Archived = e.JobID == 1
	}
	archivedAt := in.DB.Events[2].At.Add(5 * time.Second)
	in.DB.Jobs[0].ArchivedAt = sql.NullTime{Time: archivedAt, Valid: true}
	in.DB.Retention = true
	in.Retention = 3 * time.Second
	for _, sp := range in.Specs {
		in.DB.Keys = append(in.DB.Keys, keyRow{Key: sp.Key, JobID: in.Acked[sp.Key], Order: sp.Order,
			Payment: sp.Payment, Currency: "EUR", Provider: providerName, AmountMinor: sp.AmountMinor})
	}
	in.DB.Keys[0].FinalState = sql.NullString{String: "succeeded", Valid: true}
	in.DB.Keys[0].ArchivedAt = in.DB.Jobs[0].ArchivedAt
	k1, k2 := in.Specs[0].Key, in.Specs[1].Key
	at := base.Add(time.Second)
	in.Enqueues = []enqueueAnswer{
		{Key: k1, Why: answerFirst, JobID: 1, Created: true, At: at},
		{Key: k2, Why: answerFirst, JobID: 2, Created: true, At: at},
		{Key: k1, Why: answerLate, WasArchived: true, JobID: 1, ArchivedAt: archivedAt, At: archivedAt.Add(time.Second)},
		{Key: k1, Why: answerLate, WasArchived: true, OtherValues: true, Conflict: true, At: archivedAt.Add(2 * time.Second)},
	}
	return in
}

func TestCheckPassesArchivedJobsWithTheirKeys_R30(t *testing.T) {
	v := check(archivedCampaign())
	if v.Failed() || v.Archived != 1 || v.ArchivedReenqueues != 1 || v.SecondJobs+v.KeysUnrecorded != 0 {
		t.Fatalf("a clean archive judged: archived=%d archived_reenqueues=%d second_jobs=%d keys_unrecorded=%d\n%s",
			v.Archived, v.ArchivedReenqueues, v.SecondJobs, v.KeysUnrecorded, verdictText(v))
	}
	got := v.Invariants[11].Summary
	for _, want := range []string{"2 jobs for 2 operation keys across refund_jobs and the archive (1 archived, with 3 events",
		"2 keys in refund_operation_keys (1 marked archived)", "1 of keys in the archive answered with their job",
		"1 with another amount answered OPERATION_KEY_CONFLICT"} {
		if !strings.Contains(got, want) {
			t.Errorf("invariant 12's summary lacks %q: %s", want, got)
		}
	}
	// The other invariants read the archived job as present, final and
	// with its history (R31).
	if got := v.Invariants[1].Summary; !strings.Contains(got, "2 rows (1 of them archived") {
		t.Errorf("invariant 2: %s", got)
	}
}

// R30: an archived key enqueued again must never make a second job; a
// database that has one for a key, in either table, fails, and so does an
// answer that named one.
func TestCheckFindsASecondJobForAKey_R30(t *testing.T) {
	in := archivedCampaign()
	k1 := in.Specs[0].Key
	second := in.DB.Jobs[0]
	second.ID, second.ArchivedAt = 3, sql.NullTime{}
	in.DB.Jobs = append(in.DB.Jobs, second)
	for _, e := range in.DB.Events[:3] {
		e.ID, e.JobID, e.Archived = e.ID+20, 3, false
		in.DB.Events = append(in.DB.Events, e)
	}
	in.DB.Ledger = append(in.DB.Ledger, ledgerRow{JobID: 3, Key: k1, ProviderRefundID: "re_1", Attempt: 1})
	in.Enqueues[2].JobID, in.Enqueues[2].Created, in.Enqueues[2].ArchivedAt = 3, true, time.Time{}
	v := check(in)
	text := verdictText(v)
	if !v.Invariants[11].Failed || v.SecondJobs != 1 {
		t.Fatalf("a second job for %s passed: second_jobs=%d\n%s", k1, v.SecondJobs, text)
	}
	for _, want := range []string{"SECOND JOB: operation key " + k1 + " has 2 jobs: job 1 in refund_jobs_archive",
		"job 3 in refund_jobs", "SECOND JOB: the late re-enqueue (its job in the archive) of " + k1,
		"was answered job 3 (created=true), but the key's job is 1"} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}

	// The answer alone: a late re-enqueue answered created=true, with
	// the very id the database has (the first job's rows gone).
	in = archivedCampaign()
	in.Enqueues[2].Created = true
	if v := check(in); !v.Invariants[11].Failed || v.SecondJobs != 1 {
		t.Fatalf("a late re-enqueue answered created=true passed: second_jobs=%d\n%s", v.SecondJobs, verdictText(v))
	}
	// Another amount answered as the same refund, or with its own values
	// as a conflict: R1 both ways.
	for name, edit := range map[string]func(a *enqueueAnswer){
		"other values answered": func(a *enqueueAnswer) { a.Conflict, a.JobID = false, 1 },
		"own values conflict":   func(a *enqueueAnswer) { a.OtherValues = false },
	} {
		in = archivedCampaign()
		edit(&in.Enqueues[3])
		if v := check(in); !v.Invariants[11].Failed || v.SecondJobs != 0 {
			t.Errorf("%s: failed %v, second_jobs=%d\n%s", name, failedInvariants(v), v.SecondJobs, verdictText(v))
		}
	}
}

// R30: the key table is what keeps an archived key from a second job; a
// job whose key is not on file, or on file under another job, fails.
func TestCheckFindsAKeyUnrecorded_R30(t *testing.T) {
	in := archivedCampaign()
	in.DB.Keys = in.DB.Keys[:1]
	v := check(in)
	if !v.Invariants[11].Failed || v.KeysUnrecorded != 1 ||
		!strings.Contains(verdictText(v), "KEY UNRECORDED: job 2 ("+in.Specs[1].Key+", in refund_jobs, succeeded)") {
		t.Fatalf("a job without its key row passed: keys_unrecorded=%d\n%s", v.KeysUnrecorded, verdictText(v))
	}
	if failed := failedInvariants(v); len(failed) != 1 {
		t.Errorf("only invariant 12 should fail, got %v", failed)
	}

	in = archivedCampaign()
	in.DB.Keys[1].JobID = 7
	if v := check(in); !v.Invariants[11].Failed || v.KeysUnrecorded != 1 {
		t.Fatalf("a key row naming another job passed: keys_unrecorded=%d\n%s", v.KeysUnrecorded, verdictText(v))
	}

	in = archivedCampaign()
	in.DB.Keys[0].ArchivedAt, in.DB.Keys[0].FinalState = sql.NullTime{}, sql.NullString{}
	if v := check(in); !v.Invariants[11].Failed || !strings.Contains(verdictText(v), "but job 1 was archived at") {
		t.Fatalf("a key row not marked archived with its job passed\n%s", verdictText(v))
	}
}

// R31: a job leaves after its retention, whole: its history and receipts
// with it, none left behind, none in the archive of a working job.
func TestCheckFindsAJobArchivedEarlyOrLeftBehind_R31(t *testing.T) {
	in := archivedCampaign()
	in.DB.Jobs[0].ArchivedAt.Time = in.DB.Events[2].At.Add(time.Second)
	in.DB.Keys[0].ArchivedAt = in.DB.Jobs[0].ArchivedAt
	if v := check(in); !v.Invariants[11].Failed || !strings.Contains(verdictText(v), "before its retention of 3s") {
		t.Fatalf("a job archived 1s after its completion passed\n%s", verdictText(v))
	}

	in = archivedCampaign()
	in.DB.Events[1].Archived = false
	in.DB.Observations = []observationRow{{ID: 1, JobID: 2, Key: in.Specs[1].Key, Source: "worker:w1",
		Outcome: "succeeded", ProviderRefundID: "re_2", ReportedAttempt: 1, Archived: true}}
	text := verdictText(check(in))
	for _, want := range []string{"event 11 (claimed) of job 1 (" + in.Specs[0].Key + ", in refund_jobs_archive) is in " +
		"refund_job_events", "receipt 1 (worker:w1, succeeded) of job 2 (" + in.Specs[1].Key + ", in refund_jobs) is in " +
		"refund_observations_archive"} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}
}

// After an async failover the new primary may lack an acknowledged enqueue
// (R26): the producer's re-drive makes it again once, under another id,
// and the answers before the repoint named the lost job.
func TestCheckExcusesAnEnqueueLostInAFailover_R26(t *testing.T) {
	in := archivedCampaign()
	base := in.Enqueues[0].At.Add(-10 * time.Second)
	in.Failover = asyncFailover(base)
	k2 := in.Specs[1].Key
	in.Enqueues[1].JobID = 9 // the old primary's id, before the repoint
	in.Enqueues = append(in.Enqueues, enqueueAnswer{Key: k2, Why: answerRedrive, JobID: 2, Created: true,
		At: in.Failover.Repointed.Add(time.Second)})
	in.EnqueuesLost = []string{k2}
	v := check(in)
	if v.Invariants[11].Failed || v.SecondJobs != 0 || !strings.Contains(v.Invariants[11].Summary,
		"1 answers named a job lost in the failover") {
		t.Fatalf("an enqueue lost in the failover and made again judged: second_jobs=%d\n%s", v.SecondJobs, verdictText(v))
	}
	// Made twice after the repoint: a second job all the same.
	in.Enqueues = append(in.Enqueues, enqueueAnswer{Key: k2, Why: answerLate, JobID: 2, Created: true,
		At: in.Failover.Repointed.Add(2 * time.Second)})
	if v := check(in); !v.Invariants[11].Failed || v.SecondJobs != 1 {
		t.Fatalf("a key made twice after the failover passed: second_jobs=%d\n%s", v.SecondJobs, verdictText(v))
	}
}
