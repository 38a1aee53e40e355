package sqlbase

import (
	"context"
	"fmt"

	"github.com/jobfence/jobfence/store"
)

// The reads of a job's receipts (R15), bounded (store.MaxClaimObservations,
// store.MaxObservationPage) and walking ix_refund_observations_job
// (job_id, id) only.
const (
	selectObservationPage = `SELECT ` + ObservationColumns + ` FROM refund_observations
 WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?`

	countObservations = `SELECT COUNT(*) FROM refund_observations WHERE job_id = ?`

	// The newest receipts of each job in %s, oldest first, each with its
	// job's count: what a claim carries.
	selectNewestObservations = `SELECT ` + ObservationColumns + `, total FROM (
  SELECT ` + ObservationColumns + `,
         ROW_NUMBER() OVER (PARTITION BY job_id ORDER BY id DESC) AS newest,
         COUNT(*) OVER (PARTITION BY job_id) AS total
    FROM refund_observations WHERE job_id IN (%s)) o
 WHERE newest <= ? ORDER BY job_id, id`
)

// ObservationPage reads the page of job's receipts that p names, with
// their count and the token of the next page (empty on the last): from the
// archive for an archived job (R31).
func ObservationPage(ctx context.Context, tx Tx, job store.Job, p store.GetParams) (obs []store.Observation, total int64,
	next string, err error) {
	jobID := job.ID
	after, err := p.ObservationsAfter(jobID)
	if err != nil {
		return nil, 0, "", err
	}
	page, count := selectObservationPage, countObservations
	if !job.ArchivedAt.IsZero() {
		page, count = archived(page, "refund_observations"), archived(count, "refund_observations")
	}
	obs, err = QueryAll(ctx, tx, ScanObservation, page, jobID, after, p.Limit()+1)
	if err != nil {
		return nil, 0, "", err
	}
	if len(obs) > p.Limit() {
		obs = obs[:p.Limit()]
		next = store.ObservationsToken(jobID, obs[len(obs)-1])
	}
	if err := tx.QueryRowContext(ctx, count, jobID).Scan(&total); err != nil {
		return nil, 0, "", err
	}
	return obs, total, next, nil
}

// attachObservations attaches to claimed[i], i in idx, the newest receipts
// on file (R15) and their count, read before COMMIT so that a failure grants
// nothing rather than jobs the caller never hears of.
func attachObservations(ctx context.Context, q Querier, claimed []store.ClaimedJob, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	ids := make([]int64, len(idx))
	index := make(map[int64]int, len(idx))
	for n, i := range idx {
		ids[n] = claimed[i].Job.ID
		index[claimed[i].Job.ID] = i
	}
	type counted struct {
		store.Observation
		total int64
	}
	obs, err := QueryAll(ctx, q, func(row Scanner) (counted, error) {
		var c counted
		var err error
		c.Observation, err = ScanObservation(Prefixed{Row: row, Last: []any{&c.total}})
		return c, err
	}, fmt.Sprintf(selectNewestObservations, Placeholders(len(ids))), append(Int64Args(ids), store.MaxClaimObservations)...)
	if err != nil {
		return err
	}
	for _, o := range obs {
		c := &claimed[index[o.JobID]]
		c.Observations = append(c.Observations, o.Observation)
		c.ObservationCount = o.total
	}
	return nil
}

// selectObservationByDedupe reads the receipt on file under a dedupe key.
const selectObservationByDedupe = `SELECT ` + ObservationColumns + ` FROM refund_observations WHERE dedupe_key = ?`

// countObservationRoom counts a job's receipts as store.ObservationRoom
// does, walking ix_refund_observations_job (job_id, id): at most
// store.MaxObservationsPerJob rows.
const countObservationRoom = `SELECT COUNT(*),
  COALESCE(SUM(CASE WHEN attempt_verified THEN 0 ELSE 1 END), 0),
  COALESCE(SUM(CASE WHEN attempt_verified OR reporter <> ? THEN 0 ELSE 1 END), 0)
  FROM refund_observations WHERE job_id = ?`

// ObservationRoomOf counts job jobID's receipts for a new one of reporter
// with query (countObservationRoom, or its archive's).
func ObservationRoomOf(ctx context.Context, tx Tx, query string, jobID int64, reporter string) (store.ObservationRoom, error) {
	var r store.ObservationRoom
	err := tx.QueryRowContext(ctx, query, reporter, jobID).Scan(&r.Total, &r.Unverified, &r.Reporter)
	return r, err
}
