package mysql

import "github.com/jobfence/jobfence/store/internal/sqlbase"

// The column lists, in the order sqlbase's scan functions read them.
const (
	jobColumns         = sqlbase.JobColumns
	eventColumns       = sqlbase.EventColumns
	observationColumns = sqlbase.ObservationColumns
)
