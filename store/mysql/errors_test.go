package mysql

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/jobfence/jobfence/store"
)

// Errors after which nothing was changed are unavailable, so that clients
// repeat the call (R20, R21); where an operator must act, they say which.
// Before, a demoted primary's 1290 reached clients as INTERNAL and workers
// dropped receipts (R15).
func TestServerErrorsClassified_R20(t *testing.T) {
	cases := []struct {
		err  error
		want []error // all must match; nil: passes through as it is
	}{
		{&mysql.MySQLError{Number: 1290, Message: "The MariaDB server is running with the --read-only option"}, []error{store.ErrUnavailable}},
		{&mysql.MySQLError{Number: 1836, Message: "Running in read-only mode"}, []error{store.ErrUnavailable}},
		{&mysql.MySQLError{Number: 1040, Message: "Too many connections"}, []error{store.ErrUnavailable}},
		{&mysql.MySQLError{Number: 1053, Message: "Server shutdown in progress"}, []error{store.ErrUnavailable}},
		{&mysql.MySQLError{Number: 1927, Message: "Connection was killed"}, []error{store.ErrUnavailable}},
		{&mysql.MySQLError{Number: 1213, Message: "Deadlock found"}, []error{store.ErrUnavailable}},
		{&mysql.MySQLError{Number: 1114, Message: "The table 'refund_observations' is full"},
			[]error{store.ErrUnavailable, store.ErrDatabaseFull}},
		{&mysql.MySQLError{Number: 1021, Message: "Disk full"}, []error{store.ErrUnavailable, store.ErrDatabaseFull}},
		{&mysql.MySQLError{Number: 1142, Message: "INSERT command denied to user"},
			[]error{store.ErrUnavailable, store.ErrDatabaseAccessDenied}},
		{&mysql.MySQLError{Number: 1045, Message: "Access denied for user"},
			[]error{store.ErrUnavailable, store.ErrDatabaseAccessDenied}},
		{fmt.Errorf("commit: %w", mysql.ErrInvalidConn), []error{store.ErrUnavailable}},
		{io.ErrUnexpectedEOF, []error{store.ErrUnavailable}},
		// A statement the server cannot parse, a duplicate key: bugs or
		// answers for the caller, never "try again".
		{&mysql.MySQLError{Number: 1064, Message: "You have an error in your SQL syntax"}, nil},
		{&mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}, nil},
	}
	for _, c := range cases {
		got := unavailable(c.err)
		if c.want == nil {
			if got != c.err {
				t.Errorf("%v became %v, want it unchanged", c.err, got)
			}
			continue
		}
		for _, w := range c.want {
			if !errors.Is(got, w) {
				t.Errorf("%v: %v does not match %v", c.err, got, w)
			}
		}
		if len(c.want) == 1 && (errors.Is(got, store.ErrDatabaseFull) || errors.Is(got, store.ErrDatabaseAccessDenied)) {
			t.Errorf("%v: %v names a cause it does not have", c.err, got)
		}
	}
}
