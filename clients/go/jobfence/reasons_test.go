package jobfence

import (
	"testing"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// R24: every reason of the proto's ErrorReason, the one list, decodes to a
// sentinel of its own; a reason added to the proto without one fails here.
func TestEveryErrorReasonHasASentinel_R24(t *testing.T) {
	seen := map[error]string{}
	for n := range pb.ErrorReason_name {
		r := pb.ErrorReason(n)
		if r == pb.ErrorReason_ERROR_REASON_UNSPECIFIED {
			continue
		}
		err, ok := reasonSentinels[reasonName(r)]
		if !ok {
			t.Errorf("reason %s has no sentinel error", reasonName(r))
			continue
		}
		if other, dup := seen[err]; dup {
			t.Errorf("reasons %s and %s share the sentinel %v", other, reasonName(r), err)
		}
		seen[err] = reasonName(r)
	}
}
