package main

import (
	"fmt"
	"strings"
)

// keyTally is what invariant 12 counts for the verdict.
type keyTally struct {
	// Archived counts the jobs in the archive, ArchivedEvents and
	// ArchivedReceipts their history and receipts there (archived).
	Archived, ArchivedEvents, ArchivedReceipts int
	// LateArchived counts the late re-enqueues of keys whose jobs were in
	// the archive answered with their job, created=false
	// (archived_reenqueues).
	LateArchived int
	// SecondJobs counts the keys with a second job: two job rows, or an
	// enqueue answered with another job than the key's or with a job
	// created anew, or both (second_jobs).
	SecondJobs int
	// KeysUnrecorded counts the jobs whose key is not in
	// refund_operation_keys naming them (keys_unrecorded).
	KeysUnrecorded int
}

// perKind bounds the failures of one kind invariant 12 lists: a store that
// lost every key fails it hundreds of times, and each kind should show.
const perKind = 4

// capped lists an invariant's failures of each kind up to perKind, and
// counts the rest.
type capped struct {
	inv   *invariant
	shown map[string]int
	more  map[string]int
	kinds []string // of those with more, in order
}

func (c *capped) fail(kind, format string, args ...any) {
	if c.shown == nil {
		c.shown, c.more = map[string]int{}, map[string]int{}
	}
	if c.shown[kind] < perKind {
		c.shown[kind]++
		c.inv.fail(format, args...)
		return
	}
	c.inv.Failed = true
	if c.more[kind] == 0 {
		c.kinds = append(c.kinds, kind)
	}
	c.more[kind]++
}

// close lists how many of each kind were left out.
func (c *capped) close() {
	for _, k := range c.kinds {
		c.inv.note("… and %d more %s", c.more[k], k)
	}
}

// where says which table a job was read from.
func where(j jobRow) string {
	if j.ArchivedAt.Valid {
		return "refund_jobs_archive"
	}
	return "refund_jobs"
}

// checkOneJobPerKey is invariant 12 (R1, R30, R31): no operation key ever
// has two jobs. Across refund_jobs and refund_jobs_archive together, one
// job per key and each job in one of them; an archived job succeeded,
// left no earlier than its retention after its completion, and took its
// whole history and all its receipts with it (none left behind, none in
// the archive of a job still working, none twice). Where the database
// keeps the key table: every job's key is in refund_operation_keys naming
// that job, with the refund the campaign enqueued, marked archived (final
// state and time) exactly when its job left; no key row names a job that
// is nowhere. And the producer's answers: every enqueue of a key — its
// own, a failover's re-drive, and the late re-enqueues of keys whose jobs
// were archived or due to be — names the key's one job, created=false but
// for the first; one with another amount is OPERATION_KEY_CONFLICT, one
// with the refund's own values never is. After an async failover an
// enqueue the old primary acknowledged may have been lost and made again
// once under another id (re-driven, or re-enqueued): its answers before
// the proxies pointed at the new primary name the lost job, counted.
func checkOneJobPerKey(in checkInput, x *checkFacts) (i12 *invariant, t keyTally) {
	i12 = &invariant{N: 12, Name: "no operation key ever has two jobs: one job per key across the working tables and " +
		"the archive, every key on file naming its job, every enqueue of it answered with that job (R1, R30, R31)"}
	c := &capped{inv: i12}
	db := in.DB

	// The jobs, by key and by id, working and archived together.
	byKey := map[string][]jobRow{}
	var keys []string
	inTables := map[int64][]jobRow{}
	for _, j := range db.Jobs {
		if byKey[j.Key] == nil {
			keys = append(keys, j.Key)
		}
		byKey[j.Key] = append(byKey[j.Key], j)
		inTables[j.ID] = append(inTables[j.ID], j)
		if j.ArchivedAt.Valid {
			t.Archived++
		}
	}
	second := map[string]bool{} // the keys with a second job
	for _, key := range keys {
		if js := byKey[key]; len(js) > 1 {
			second[key] = true
			var desc []string
			for _, j := range js {
				desc = append(desc, fmt.Sprintf("job %d in %s (%s)%s", j.ID, where(j), j.State, x.historyOf(j)))
			}
			c.fail("keys with two jobs", "SECOND JOB: operation key %s has %d jobs: %s", key, len(js), strings.Join(desc, "; "))
		}
	}
	for _, j := range db.Jobs {
		if js := inTables[j.ID]; len(js) > 1 && j.ArchivedAt.Valid {
			c.fail("jobs in both tables", "job %d (%s) is in refund_jobs and in refund_jobs_archive: archived without leaving the working "+
				"tables (R31: the move is one transaction)", j.ID, j.Key)
		}
	}

	// Each archived job as R31 moves it: succeeded, past its retention,
	// with all of its history and receipts, and nothing of a working job
	// in the archive.
	for _, e := range db.Events {
		if e.Archived {
			t.ArchivedEvents++
		}
	}
	for _, o := range db.Observations {
		if o.Archived {
			t.ArchivedReceipts++
		}
	}
	early := 0
	for _, j := range db.Jobs {
		if !j.ArchivedAt.Valid {
			continue
		}
		if j.State != "succeeded" {
			c.fail("jobs archived wrong", "job %d (%s) was archived %s: only succeeded jobs leave (R31)%s", j.ID, j.Key, j.State, x.historyOf(j))
		}
		if evs := x.events[j.ID]; in.Retention > 0 && len(evs) > 0 {
			done := evs[len(evs)-1].At
			if age := j.ArchivedAt.Time.Sub(done); age < in.Retention {
				early++
				c.fail("jobs archived wrong", "job %d (%s) was archived at %s, %s after its completion at %s: before its retention of %s (R31)",
					j.ID, j.Key, dateTime(j.ArchivedAt.Time), age, dateTime(done), in.Retention)
			}
		}
	}
	for _, side := range sidesOf(db, x) {
		c.fail("jobs archived wrong", "%s", side)
	}

	// The key table (R30).
	keyRows := 0
	if db.Retention {
		keyOf := map[string]keyRow{}
		markedArchived := 0
		for _, k := range db.Keys {
			keyOf[k.Key] = k
			keyRows++
			if k.ArchivedAt.Valid {
				markedArchived++
			}
			if _, ours := x.specByKey[k.Key]; !ours {
				c.fail("key rows that disagree", "refund_operation_keys has %q, which the campaign never enqueued", k.Key)
				continue
			}
			if len(byKey[k.Key]) == 0 {
				c.fail("key rows that disagree", "KEY WITHOUT ITS JOB: refund_operation_keys names job %d for %s, which is neither in refund_jobs "+
					"nor in the archive", k.JobID, k.Key)
			}
		}
		for _, key := range keys {
			j := byKey[key][0]
			k, ok := keyOf[key]
			switch {
			case !ok:
				t.KeysUnrecorded++
				c.fail("keys unrecorded", "KEY UNRECORDED: job %d (%s, in %s, %s) has no row in refund_operation_keys: once its job is "+
					"archived, an enqueue of the key would make a second job (R30)%s", j.ID, key, where(j), j.State,
					x.historyOf(j))
				continue
			case k.JobID != j.ID:
				t.KeysUnrecorded++
				c.fail("keys unrecorded", "KEY NAMES ANOTHER JOB: refund_operation_keys has %s under job %d, but its job is %d (in %s)%s",
					key, k.JobID, j.ID, where(j), x.historyOf(j))
				continue
			}
			if sp := x.specByKey[key]; sp.Key != "" && (k.Order != sp.Order || k.Payment != sp.Payment ||
				k.AmountMinor != sp.AmountMinor || k.Currency != "EUR" || k.Provider != providerName) {
				c.fail("key rows that disagree", "the key row of %s (job %d) keeps order %s, payment %s, %d %s, provider %s; the refund enqueued "+
					"was order %s, payment %s, %d EUR, provider %s: R30 compares an enqueue with these", key, j.ID, k.Order,
					k.Payment, k.AmountMinor, k.Currency, k.Provider, sp.Order, sp.Payment, sp.AmountMinor, providerName)
			}
			switch {
			case j.ArchivedAt.Valid && (k.FinalState.String != "succeeded" || !k.ArchivedAt.Valid ||
				!k.ArchivedAt.Time.Equal(j.ArchivedAt.Time)):
				c.fail("key rows that disagree", "the key row of %s says final state %q, archived at %s, but job %d was archived at %s, %s", key,
					k.FinalState.String, nullTime(k.ArchivedAt), j.ID, dateTime(j.ArchivedAt.Time), j.State)
			case !j.ArchivedAt.Valid && (k.FinalState.Valid || k.ArchivedAt.Valid):
				c.fail("key rows that disagree", "the key row of %s says final state %q, archived at %s, but job %d is in refund_jobs, %s", key,
					k.FinalState.String, nullTime(k.ArchivedAt), j.ID, j.State)
			}
		}
		i12.Summary = fmt.Sprintf("%d jobs for %d operation keys across refund_jobs and the archive (%d archived, with %d "+
			"events and %d receipts); %d keys in refund_operation_keys (%d marked archived), %d jobs without their key "+
			"on file naming them", len(db.Jobs), len(keys), t.Archived, t.ArchivedEvents, t.ArchivedReceipts, keyRows,
			markedArchived, t.KeysUnrecorded)
	} else {
		i12.Summary = fmt.Sprintf("%d jobs for %d operation keys (the database keeps no archive and no key table)",
			len(db.Jobs), len(keys))
	}
	if in.Retention > 0 {
		i12.Summary += fmt.Sprintf("; each archived job succeeded, %s or more after its completion (%d sooner)",
			in.Retention, early)
	}

	s := judgeAnswers(in, x, c, second)
	c.close()
	t.SecondJobs = len(second)
	t.LateArchived = s.lateArchived
	i12.Summary += "; " + s.String()
	return i12, t
}

// sidesOf lists every job whose rows are on both sides of the archive: a
// history event or receipt of an archived job left in the working tables
// (where nobody reads it, R28, R31), or one of a job still working filed
// in the archive; and every event or receipt id read from both sides
// (moved twice, or not deleted).
func sidesOf(db dbState, x *checkFacts) []string {
	var out []string
	seenEvent, seenObs := map[int64]bool{}, map[int64]bool{}
	for _, e := range db.Events {
		if seenEvent[e.ID] {
			out = append(out, fmt.Sprintf("event %d of job %d is in refund_job_events and in its archive", e.ID, e.JobID))
		}
		seenEvent[e.ID] = true
		if j, ok := x.jobByID[e.JobID]; ok && j.ArchivedAt.Valid != e.Archived {
			out = append(out, fmt.Sprintf("event %d (%s) of job %d (%s, in %s) is in %s", e.ID, e.Kind, j.ID, j.Key, where(j),
				tableOf("refund_job_events", e.Archived)))
		}
	}
	for _, o := range db.Observations {
		if seenObs[o.ID] {
			out = append(out, fmt.Sprintf("receipt %d of job %d is in refund_observations and in its archive", o.ID, o.JobID))
		}
		seenObs[o.ID] = true
		if j, ok := x.jobByID[o.JobID]; ok && j.ArchivedAt.Valid != o.Archived {
			out = append(out, fmt.Sprintf("receipt %d (%s, %s) of job %d (%s, in %s) is in %s", o.ID, o.Source, o.Outcome, j.ID,
				j.Key, where(j), tableOf("refund_observations", o.Archived)))
		}
	}
	return out
}

// answerTally counts the producer's enqueues as invariant 12 judged them.
type answerTally struct {
	first, repeated, redrives, excused int
	// The late re-enqueues: sent, of keys in the archive answered with
	// their job, of keys due for it (and of those, answered as archived:
	// the archive took the job between the read and the enqueue), with
	// another amount answered OPERATION_KEY_CONFLICT, not answered.
	late, lateArchived, lateDue, raced, conflicts, unanswered int
	lateCreated                                               int // answered with a new job: a second one
}

func (s answerTally) String() string {
	line := fmt.Sprintf("enqueues answered: %d by the producer (%d of them created=false: a repeat after an error), "+
		"%d re-drives; %d late re-enqueues of keys whose jobs had completed more than the retention before: %d of "+
		"keys in the archive answered with their job (created=false, archived), %d of keys due for it (%d answered "+
		"as archived meanwhile), %d with another amount answered OPERATION_KEY_CONFLICT, %d answered with a new job "+
		"(created=true), %d not answered", s.first, s.repeated, s.redrives, s.late, s.lateArchived, s.lateDue, s.raced,
		s.conflicts, s.lateCreated, s.unanswered)
	if s.excused > 0 {
		line += fmt.Sprintf("; %d answers named a job lost in the failover", s.excused)
	}
	return line
}

// judgeAnswers judges every answer the producer had (invariant 12), adding
// the keys it finds with a second job to second.
func judgeAnswers(in checkInput, x *checkFacts, c *capped, second map[string]bool) (s answerTally) {
	fo := in.Failover
	lossy := fo != nil && !fo.lossless()
	// After an async failover: the keys made again on the new primary (an
	// answer created=true after the repoint, of a key answered before it).
	remade := map[string]int{}
	if lossy {
		before := map[string]bool{}
		for _, a := range in.Enqueues {
			if a.Err == "" && !a.Conflict && a.At.Before(fo.Repointed) {
				before[a.Key] = true
			}
		}
		for _, a := range in.Enqueues {
			if a.Created && before[a.Key] && !a.At.Before(fo.Repointed) {
				remade[a.Key]++
			}
		}
	}
	secondJob := func(key, format string, args ...any) {
		second[key] = true
		c.fail("answers naming a second job", format, args...)
	}
	unansweredListed := 0
	for _, a := range in.Enqueues {
		what := fmt.Sprintf("the %s of %s at %s", describeEnqueue(a), a.Key, a.At.Format("15:04:05.000"))
		switch a.Why {
		case answerFirst:
			s.first++
		case answerRedrive:
			s.redrives++
		case answerLate:
			s.late++
			if a.DueForArchive {
				s.lateDue++
				if !a.ArchivedAt.IsZero() {
					s.raced++
				}
			}
		}
		j := x.jobByKey[a.Key]
		switch {
		case a.Err != "":
			s.unanswered++
			if a.Why == answerLate && unansweredListed < 5 {
				unansweredListed++
				c.inv.note("%s was not answered: %s", what, a.Err)
			}
			continue
		case a.Conflict && a.OtherValues:
			s.conflicts++
			continue
		case a.Conflict:
			c.fail("answers", "%s, with the refund's own values, was answered OPERATION_KEY_CONFLICT: the same refund answers its "+
				"job (R1, R30)%s", what, x.historyOf(j))
			continue
		}
		remadeOnce := lossy && remade[a.Key] == 1 && !a.At.Before(fo.Repointed)
		if a.Why == answerLate && a.Created {
			s.lateCreated++
		}
		if a.OtherValues {
			what += " with another amount"
		}
		switch {
		case j.ID == 0:
			// Invariant 2 tells.
		case a.JobID != j.ID && lossy && remade[a.Key] > 0 && a.At.Before(fo.Repointed):
			s.excused++
			c.inv.note("%s named job %d, lost in the failover; the key's job on the new primary is %d", what, a.JobID,
				j.ID)
		case a.JobID != j.ID:
			// The job it named, made by this enqueue or an earlier one.
			secondJob(a.Key, "SECOND JOB: %s was answered job %d (created=%v), but the key's job is %d (in %s)%s", what,
				a.JobID, a.Created, j.ID, where(j), x.historyOf(x.jobByID[a.JobID]))
		case a.Created && a.Why != answerFirst && !remadeOnce:
			secondJob(a.Key, "SECOND JOB: %s was answered created=true with job %d: the key had its job already (R1, "+
				"R30)%s", what, a.JobID, x.historyOf(j))
		case a.OtherValues:
			c.fail("answers", "%s was answered with the key's job %d as the same refund: another refund under the "+
				"key is OPERATION_KEY_CONFLICT (R1, R30)%s", what, a.JobID, x.historyOf(j))
		case a.Created:
			// The first enqueue, or the one the failover lost made again
			// once (invariant 2 counts it).
		case a.Why == answerFirst:
			s.repeated++
		case a.Why == answerLate && a.WasArchived && a.ArchivedAt.IsZero():
			c.fail("answers", "%s was answered with job %d as a job still working, although it was in the archive when sent: an "+
				"archived job's answer says when it was archived%s", what, a.JobID, x.historyOf(j))
		case a.Why == answerLate && a.WasArchived:
			s.lateArchived++
		}
	}
	return s
}

// describeEnqueue names an enqueue's reason for a failure's details.
func describeEnqueue(a enqueueAnswer) string {
	switch {
	case a.Why == answerLate && a.WasArchived:
		return "late re-enqueue (its job in the archive)"
	case a.Why == answerLate:
		return "late re-enqueue (its job due for the archive)"
	case a.Why == answerRedrive:
		return "failover's re-drive"
	}
	return "producer's enqueue"
}

// tableOf names the table an event or receipt was read from: the working
// one, or its archive.
func tableOf(working string, archived bool) string {
	if archived {
		return working + "_archive"
	}
	return working
}
