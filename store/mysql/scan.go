package mysql

import (
	"database/sql"
	"time"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// The column lists, in the order the scan functions read them.
const (
	jobColumns         = sqlbase.JobColumns
	eventColumns       = sqlbase.EventColumns
	observationColumns = sqlbase.ObservationColumns
)

func scanJob(row sqlbase.Scanner) (store.Job, error) {
	var j store.Job
	var lease, firstSent sql.NullTime
	var refundID sql.NullString
	err := row.Scan(&j.ID, &j.OperationKey, &j.OrderID, &j.PaymentID, &j.AmountMinor, &j.Currency, &j.Provider,
		&j.State, &j.Attempt, &j.NextAction, &j.NextAttemptAt, &lease, &refundID,
		&j.WorkerID, &j.LastReason, &firstSent, &j.CreatedAt, &j.UpdatedAt, &j.Grant)
	j.LeaseUntil = nullTime(lease)
	j.FirstSentAt = nullTime(firstSent)
	j.ProviderRefundID = refundID.String
	return j, err
}

func scanEvent(row sqlbase.Scanner) (store.Event, error) {
	var e store.Event
	err := row.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.WorkerID, &e.FromState, &e.ToState, &e.NextAction,
		&e.ProviderRefundID, &e.Reason, &e.CreatedAt, &e.Grant)
	return e, err
}

func scanObservation(row sqlbase.Scanner) (store.Observation, error) {
	var o store.Observation
	err := row.Scan(&o.ID, &o.JobID, &o.OperationKey, &o.ReportedAttempt, &o.JobAttempt, &o.Source, &o.Outcome,
		&o.ProviderRefundID, &o.ProviderEventID, &o.Detail, &o.CreatedAt, &o.AttemptVerified)
	return o, err
}

func nullTime(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}
