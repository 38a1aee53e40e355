package server

import (
	"testing"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// TestEveryRPCHasARoleEntry_R29: every RPC of the Coordinator service, read
// from its descriptor, has an entry in the role table with at least one
// role, and every entry names an RPC of the service. An RPC added to the
// proto without an entry is refused to every credential (authenticate); an
// entry left behind by a renamed RPC allows nothing.
func TestEveryRPCHasARoleEntry_R29(t *testing.T) {
	sd := pb.File_jobfence_v1_coordinator_proto.Services().ByName("Coordinator")
	if sd == nil {
		t.Fatal("the proto file has no Coordinator service")
	}
	rpcs := map[string]bool{}
	for i := range sd.Methods().Len() {
		method := "/" + string(sd.FullName()) + "/" + string(sd.Methods().Get(i).Name())
		rpcs[method] = true
		if roles, ok := methodRoles[method]; !ok || len(roles) == 0 {
			t.Errorf("%s has no roles in methodRoles (server/auth.go): every credential is refused it", method)
		}
	}
	for method := range methodRoles {
		if !rpcs[method] {
			t.Errorf("methodRoles (server/auth.go) has an entry for %s, which the Coordinator service does not have", method)
		}
	}
	if len(rpcs) == 0 {
		t.Fatal("the Coordinator service has no RPCs")
	}
}
