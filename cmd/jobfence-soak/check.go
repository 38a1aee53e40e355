package main

import (
	"context"
	"fmt"
	"time"
)

// final is what the checks after the run counted.
type final struct {
	exact    map[string]int64 // exact rows of every table the windows count
	estimate map[string]int64 // InnoDB's estimates of the growing ones, read just before
	// countTook is how long the exact counts of the archive and key tables
	// took: what counting them every window would have cost.
	countTook time.Duration
	lost      int // jobs answered that are neither succeeded nor archived succeeded
	twoJobs   int // keys with more than one job
}

// Per job, where the checks found it.
const (
	foundNone      = iota
	foundSucceeded // succeeded, in refund_jobs or refund_jobs_archive, with the id its enqueue answered
	foundOther     // in another state, or under another id
)

// check counts every table exactly, then holds each job the producer
// enqueued against the database: its key in refund_operation_keys naming
// the job its enqueue answered (R30), exactly one job for the key across
// the working and the archive table, and that job succeeded, in either
// (enqueued but neither completed nor archived: lost). Failures are
// recorded with fail; the error is for reads that failed.
func (s *soak) check(ctx context.Context) (final, error) {
	f := final{exact: map[string]int64{}}
	var err error
	if f.estimate, err = s.estimates(ctx); err != nil {
		return f, err
	}
	count := func(tables []string) error {
		for _, t := range tables {
			var n int64
			if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+t).Scan(&n); err != nil {
				return fmt.Errorf("count %s: %w", t, err)
			}
			f.exact[t] = n
		}
		return nil
	}
	if err := count(workingTables); err != nil {
		return f, err
	}
	began := time.Now()
	if err := count(append(append([]string(nil), archiveTables...), keyTable)); err != nil {
		return f, err
	}
	f.countTook = time.Since(began)

	p := s.prod
	keyJob := make([]int64, p.n)
	jobs := make([]uint8, p.n)
	found := make([]uint8, p.n)
	foreign := 0
	rows, err := s.db.QueryContext(ctx, `SELECT operation_key, job_id FROM refund_operation_keys`)
	if err != nil {
		return f, fmt.Errorf("read the keys: %w", err)
	}
	for rows.Next() {
		var key string
		var id int64
		if err := rows.Scan(&key, &id); err != nil {
			rows.Close()
			return f, err
		}
		if i, ok := p.index(key); ok {
			keyJob[i] = id
		} else if foreign++; foreign <= 3 {
			s.fail("refund_operation_keys holds key %q, which the producer never sent", key)
		}
	}
	if err := rows.Close(); err != nil {
		return f, err
	}
	rows, err = s.db.QueryContext(ctx, `SELECT id, operation_key, state FROM refund_jobs `+
		`UNION ALL SELECT id, operation_key, state FROM refund_jobs_archive`)
	if err != nil {
		return f, fmt.Errorf("read the jobs: %w", err)
	}
	for rows.Next() {
		var id int64
		var key, state string
		if err := rows.Scan(&id, &key, &state); err != nil {
			rows.Close()
			return f, err
		}
		i, ok := p.index(key)
		if !ok {
			if foreign++; foreign <= 3 {
				s.fail("job %d has key %q, which the producer never sent", id, key)
			}
			continue
		}
		jobs[i] = min(jobs[i]+1, 2)
		if state == "succeeded" && id == p.jobID[i].Load() && found[i] == foundNone {
			found[i] = foundSucceeded
		} else if found[i] != foundSucceeded {
			found[i] = foundOther
		}
	}
	if err := rows.Close(); err != nil {
		return f, err
	}

	unseen, keyless := 0, 0
	for i := range p.n {
		id := p.jobID[i].Load()
		if id == 0 {
			continue // its enqueue failed: recorded then
		}
		key := p.key(i)
		switch {
		case keyJob[i] == 0:
			if keyless++; keyless <= 3 {
				s.fail("key %s (job %d) has no row in refund_operation_keys (R30)", key, id)
			}
		case keyJob[i] != id:
			if keyless++; keyless <= 3 {
				s.fail("key %s: refund_operation_keys names job %d, its enqueue answered job %d", key, keyJob[i], id)
			}
		}
		if jobs[i] > 1 {
			if f.twoJobs++; f.twoJobs <= 3 {
				s.fail("key %s has more than one job in refund_jobs and refund_jobs_archive", key)
			}
		}
		if found[i] != foundSucceeded {
			if f.lost++; f.lost <= 5 {
				what := "neither in refund_jobs nor in refund_jobs_archive"
				if found[i] == foundOther {
					what = "not succeeded"
				}
				s.fail("job %d (%s) lost: enqueued, and %s", id, key, what)
			}
		} else if !p.done[i].Load() {
			if unseen++; unseen <= 3 {
				s.fail("job %d (%s) succeeded but no worker saw its completion answered", id, key)
			}
		}
	}
	for name, n := range map[string]int{"jobs lost": f.lost, "keys with two jobs": f.twoJobs,
		"keys missing or naming another job": keyless, "completions no worker saw": unseen,
		"rows of keys never sent": foreign} {
		if n > 3 {
			s.fail("%d %s in all", n, name)
		}
	}
	return f, nil
}
