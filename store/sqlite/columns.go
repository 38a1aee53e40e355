package sqlite

import (
	"time"

	"github.com/jobfence/jobfence/store/internal/sqlbase"
)

// The column lists, in the order sqlbase's scan functions read them (they
// read SQLite's INTEGER microseconds through sqlbase.Time).
const (
	jobColumns         = sqlbase.JobColumns
	eventColumns       = sqlbase.EventColumns
	observationColumns = sqlbase.ObservationColumns
)

// toMicros converts a caller's time for storage; the zero time is NULL.
func toMicros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

func scanID(row sqlbase.Scanner) (int64, error) {
	var id int64
	err := row.Scan(&id)
	return id, err
}
