package sqlite

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
	var nextAttempt, created, updated int64
	var lease, firstSent sql.NullInt64
	var refundID sql.NullString
	err := row.Scan(&j.ID, &j.OperationKey, &j.OrderID, &j.PaymentID, &j.AmountMinor, &j.Currency, &j.Provider,
		&j.State, &j.Attempt, &j.NextAction, &nextAttempt, &lease, &refundID,
		&j.WorkerID, &j.LastReason, &firstSent, &created, &updated, &j.Grant)
	j.NextAttemptAt = fromMicros(nextAttempt)
	j.LeaseUntil = nullMicros(lease)
	j.FirstSentAt = nullMicros(firstSent)
	j.CreatedAt = fromMicros(created)
	j.UpdatedAt = fromMicros(updated)
	j.ProviderRefundID = refundID.String
	return j, err
}

func scanEvent(row sqlbase.Scanner) (store.Event, error) {
	var e store.Event
	var created int64
	err := row.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.WorkerID, &e.FromState, &e.ToState, &e.NextAction,
		&e.ProviderRefundID, &e.Reason, &created, &e.Grant)
	e.CreatedAt = fromMicros(created)
	return e, err
}

func scanObservation(row sqlbase.Scanner) (store.Observation, error) {
	var o store.Observation
	var created int64
	err := row.Scan(&o.ID, &o.JobID, &o.OperationKey, &o.ReportedAttempt, &o.JobAttempt, &o.Source, &o.Outcome,
		&o.ProviderRefundID, &o.ProviderEventID, &o.Detail, &created, &o.AttemptVerified)
	o.CreatedAt = fromMicros(created)
	return o, err
}

func scanID(row sqlbase.Scanner) (int64, error) {
	var id int64
	err := row.Scan(&id)
	return id, err
}

// fromMicros converts a stored time (microseconds since the Unix epoch) to UTC.
func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

// nullMicros converts a nullable stored time; NULL is the zero time.
func nullMicros(us sql.NullInt64) time.Time {
	if !us.Valid {
		return time.Time{}
	}
	return fromMicros(us.Int64)
}

// toMicros converts a caller's time for storage; the zero time is NULL.
func toMicros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}
