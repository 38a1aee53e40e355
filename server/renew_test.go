package server_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testdb"
	"github.com/jobfence/jobfence/server"
)

// R27 over gRPC: one RenewLeases call renews the holder's grant on the
// database's clock and answers, per grant, the refusals a write-back would
// get (the old grant after a takeover STALE_ATTEMPT with the current
// attempt in the metadata, a missing job NOT_FOUND), and past the
// coordinator's --max-grant-age, GRANT_TOO_OLD. A bad request fails as a
// whole, naming the field. The refusals are counted.
func TestRenewLeasesOverGRPC_R27(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *coordinator) {
		ctx := ctxFor(t)
		a := c.claimOne(t, "worker-a", c.enqueue(t).Id)
		c.expire(t, a.Job.Id)
		b := c.claimOne(t, "worker-b", a.Job.Id)
		held := c.claimOne(t, "worker-c", c.enqueue(t).Id)

		resp, err := c.client.RenewLeases(ctx, &pb.RenewLeasesRequest{LeaseDuration: durationpb.New(5 * time.Minute),
			Grants: []*pb.GrantRef{
				{JobId: held.Job.Id, Attempt: held.Attempt, LeaseToken: held.LeaseToken},
				{JobId: a.Job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken},
				{JobId: a.Job.Id + 1000, Attempt: 1, LeaseToken: a.LeaseToken},
			}})
		if err != nil || len(resp.Renewals) != 3 {
			t.Fatalf("RenewLeases = %v, %v", resp, err)
		}
		ok, stale, missing := resp.Renewals[0], resp.Renewals[1], resp.Renewals[2]
		if ok.Refused != pb.ErrorReason_ERROR_REASON_UNSPECIFIED || ok.LeaseUntil == nil ||
			ok.LeaseUntil.AsTime().Sub(held.LeaseUntil.AsTime()) < 4*time.Minute || ok.GrantExpiresAt == nil {
			t.Fatalf("the holder's renewal = %v (claimed lease until %v)", ok, held.LeaseUntil.AsTime())
		}
		if stale.Refused != pb.ErrorReason_ERROR_REASON_STALE_ATTEMPT || stale.LeaseUntil != nil ||
			stale.Metadata["current_attempt"] != "2" || stale.GrantExpiresAt != nil {
			t.Fatalf("the taken-over grant's renewal = %v", stale)
		}
		if missing.Refused != pb.ErrorReason_ERROR_REASON_NOT_FOUND {
			t.Fatalf("a missing job's renewal = %v", missing)
		}
		got, err := c.client.GetJob(ctx, &pb.GetJobRequest{Job: &pb.GetJobRequest_JobId{JobId: a.Job.Id}})
		if err != nil || !got.Job.LeaseUntil.AsTime().Equal(b.LeaseUntil.AsTime()) || got.Job.Attempt != 2 {
			t.Fatalf("the new holder's job after the old grant's renewal = %v, %v; want it untouched", got, err)
		}
		if got := c.byLabel(t, "jobfence_lease_renewals_total"); got["renewed"] != 1 || got["stale_attempt"] != 1 ||
			got["not_found"] != 1 {
			t.Fatalf("jobfence_lease_renewals_total = %v, want one renewed, one stale_attempt, one not_found", got)
		}

		for _, tc := range []struct {
			req   *pb.RenewLeasesRequest
			field string
		}{
			{&pb.RenewLeasesRequest{}, "grants"},
			{&pb.RenewLeasesRequest{Grants: []*pb.GrantRef{{JobId: 1, Attempt: 1}, {JobId: 1, Attempt: 1}}}, "grants[1].job_id"},
			{&pb.RenewLeasesRequest{Grants: []*pb.GrantRef{{JobId: 1, Attempt: 0}}}, "grants[0].attempt"},
			{&pb.RenewLeasesRequest{Grants: []*pb.GrantRef{{JobId: 1, Attempt: 1}},
				LeaseDuration: durationpb.New(time.Hour)}, "lease_duration"},
		} {
			_, err := c.client.RenewLeases(ctx, tc.req)
			errorInfo(t, err, codes.InvalidArgument, server.ReasonInvalidArgument)
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("RenewLeases(%v) = %v, want the field %s named", tc.req, err, tc.field)
			}
		}
	})
}

// R27: past --max-grant-age since its claim a grant is not renewed
// (GRANT_TOO_OLD); its lease runs out and another worker takes the job over.
func TestRenewLeasesGrantTooOld_R27(t *testing.T) {
	for _, backend := range testdb.Backends() {
		t.Run(backend.Name, func(t *testing.T) {
			t.Parallel()
			grantTooOld(t, start(t, backend, func(o *server.Options) { o.MaxGrantAge = 2 * time.Second }))
		})
	}
}

func grantTooOld(t *testing.T, c *coordinator) {
	{
		ctx := ctxFor(t)
		a := c.claimOne(t, "worker-a", c.enqueue(t).Id)
		req := &pb.RenewLeasesRequest{LeaseDuration: durationpb.New(time.Second),
			Grants: []*pb.GrantRef{{JobId: a.Job.Id, Attempt: a.Attempt, LeaseToken: a.LeaseToken}}}
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := c.client.RenewLeases(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			r := resp.Renewals[0]
			if r.Refused == pb.ErrorReason_ERROR_REASON_GRANT_TOO_OLD {
				if r.GrantExpiresAt.AsTime().Sub(a.ClaimedAt.AsTime()) != 2*time.Second {
					t.Fatalf("grant expires at %v, claimed at %v: want 2s later", r.GrantExpiresAt.AsTime(), a.ClaimedAt.AsTime())
				}
				break
			}
			if r.Refused != pb.ErrorReason_ERROR_REASON_UNSPECIFIED || r.LeaseUntil.AsTime().After(r.GrantExpiresAt.AsTime()) {
				t.Fatalf("renewal = %v, want renewed within the grant's life", r)
			}
			if time.Now().After(deadline) {
				t.Fatal("still renewed 10s after a claim with a 2s grant age bound")
			}
			time.Sleep(200 * time.Millisecond)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			got, err := c.client.Claim(ctx, &pb.ClaimRequest{WorkerId: "worker-b", MaxJobs: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Jobs) == 1 && got.Jobs[0].Takeover && got.Jobs[0].Attempt == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the too-old grant's job was not taken over within 10s")
			}
		}
	}
}

// byLabel reads a counter vector with one label, by the label's value.
func (c *coordinator) byLabel(t *testing.T, name string) map[string]float64 {
	t.Helper()
	families, err := c.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}
