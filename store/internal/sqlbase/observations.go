package sqlbase

import (
	"context"
	"database/sql"
	"errors"
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

// ObservationPage reads the page of job jobID's receipts that p names, with
// their count and the token of the next page (empty on the last).
func ObservationPage(ctx context.Context, tx Tx, jobID int64, p store.GetParams) (obs []store.Observation, total int64,
	next string, err error) {
	after, err := p.ObservationsAfter(jobID)
	if err != nil {
		return nil, 0, "", err
	}
	obs, err = QueryAll(ctx, tx, ScanObservation, selectObservationPage, jobID, after, p.Limit()+1)
	if err != nil {
		return nil, 0, "", err
	}
	if len(obs) > p.Limit() {
		obs = obs[:p.Limit()]
		next = store.ObservationsToken(jobID, obs[len(obs)-1])
	}
	if err := tx.QueryRowContext(ctx, countObservations, jobID).Scan(&total); err != nil {
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

// ObservationByDedupe reads the receipt on file under key (sql.ErrNoRows
// when there is none).
func ObservationByDedupe(ctx context.Context, tx Tx, key string) (store.Observation, error) {
	return ScanObservation(tx.QueryRowContext(ctx, selectObservationByDedupe, key))
}

// ObservationFull reports whether job jobID may gather no more receipts
// (store.MaxObservationsPerJob), and then answers the one under key: the
// receipt on file when it is a repeat (a duplicate), else
// ErrObservationLimit. When full is false the caller files the receipt.
func ObservationFull(ctx context.Context, tx Tx, jobID int64, key string) (obs store.Observation, full bool, err error) {
	var n int64
	if err := tx.QueryRowContext(ctx, countObservations, jobID).Scan(&n); err != nil || n < store.MaxObservationsPerJob {
		return store.Observation{}, false, err
	}
	obs, err = ObservationByDedupe(ctx, tx, key)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Observation{}, true, fmt.Errorf("%w: job %d has %d receipts on file", store.ErrObservationLimit,
			jobID, n)
	}
	return obs, true, err
}
