package server_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/server"
)

// refusal is what a person reads of a fenced write's refusal: its message,
// the PreconditionFailure's description and the fields a BadRequest names.
type refusal struct {
	msg, precondition string
	fields            map[string]string
}

// refused requires a STALE_ATTEMPT refusal (R24: the reason clients branch
// on stays the same whatever the message says) with the given current
// attempt, and returns what it says.
func refused(t *testing.T, err error, currentAttempt string) refusal {
	t.Helper()
	meta := errorInfo(t, err, codes.FailedPrecondition, server.ReasonStaleAttempt)
	if meta["current_attempt"] != currentAttempt {
		t.Fatalf("metadata %v, want current_attempt %s", meta, currentAttempt)
	}
	st, _ := status.FromError(err)
	r := refusal{msg: st.Message(), fields: map[string]string{}}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.PreconditionFailure:
			r.precondition = d.Violations[0].Description
		case *errdetails.BadRequest:
			for _, v := range d.FieldViolations {
				r.fields[v.Field] = v.Description
			}
		}
	}
	return r
}

// TestCompleteWithoutLeaseTokenNamesIt_R25: a Complete that carries the
// current attempt but no lease_token is refused as STALE_ATTEMPT, as any
// write without the grant's token is (R25), and says so: the message, the
// PreconditionFailure and a BadRequest name lease_token and what to send,
// and none claims a takeover, which did not happen. The job is still the
// holder's: its Complete with the token lands. A write whose attempt was
// really taken over says so and names no field. A grant made before lease
// tokens existed is still written back without one, and one sent for it is
// named as the field that is wrong.
func TestCompleteWithoutLeaseTokenNamesIt_R25(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		job := c.enqueue(t)
		a := c.claimOne(t, "A", job.Id)
		complete := func(attempt int64, token, ref string) error {
			_, err := c.client.Complete(ctx, &pb.CompleteRequest{JobId: job.Id, Attempt: attempt, LeaseToken: token,
				ProviderRefundId: ref})
			return err
		}

		r := refused(t, complete(a.Attempt, "", "re_no_token"), "1")
		for _, said := range []string{r.msg, r.precondition} {
			if !strings.Contains(said, "lease_token is empty") ||
				!strings.Contains(said, "the lease_token the Claim or WorkGrant returned with this attempt") ||
				strings.Contains(said, "taken over") {
				t.Errorf("a Complete without a token is answered %q; want it to name the missing lease_token, "+
					"what to send, and no takeover", said)
			}
		}
		if !strings.Contains(r.fields["lease_token"], "send the lease_token the Claim or WorkGrant returned") {
			t.Errorf("BadRequest fields %v, want lease_token and what to send", r.fields)
		}
		// Another grant's token: named as not this attempt's, not as empty.
		r = refused(t, complete(a.Attempt, strings.Repeat("x", len(a.LeaseToken)), "re_other_token"), "1")
		if !strings.Contains(r.msg, "lease_token is not attempt 1's") || strings.Contains(r.msg, "empty") ||
			!strings.Contains(r.fields["lease_token"], "not attempt 1's") {
			t.Errorf("a Complete with another token is answered %q with fields %v", r.msg, r.fields)
		}
		if err := complete(a.Attempt, a.LeaseToken, "re_A"); err != nil {
			t.Fatalf("the holder's Complete with its token after one without: %v", err)
		}

		// A real takeover: the zombie's write says so and names no field.
		job = c.enqueue(t)
		zombie := c.claimOne(t, "Z", job.Id)
		c.expire(t, job.Id)
		taker := c.claimOne(t, "T", job.Id)
		r = refused(t, complete(zombie.Attempt, zombie.LeaseToken, "re_Z"), "2")
		if !strings.Contains(r.msg, "was taken over") || len(r.fields) != 0 {
			t.Errorf("a taken-over write is answered %q with fields %v; want the takeover and no field", r.msg, r.fields)
		}

		// A grant from before lease tokens (its row carries the empty
		// hash): written back without a token, and one it never had is
		// the field that is wrong.
		db := c.store.(interface{ DB() *sql.DB }).DB()
		if _, err := db.ExecContext(context.Background(), `UPDATE refund_jobs SET lease_token_hash = ? WHERE id = ?`,
			[]byte{}, job.Id); err != nil {
			t.Fatal(err)
		}
		r = refused(t, complete(taker.Attempt, taker.LeaseToken, "re_T"), "2")
		if !strings.Contains(r.msg, "granted before lease tokens existed") || !strings.Contains(r.fields["lease_token"], "send none") ||
			strings.Contains(r.msg, "taken over") {
			t.Errorf("a token for an untokened grant is answered %q with fields %v", r.msg, r.fields)
		}
		if err := complete(taker.Attempt, "", "re_T"); err != nil {
			t.Fatalf("the untokened grant's Complete without a token: %v", err)
		}
	})
}
