package jobfence_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
)

func TestResendAllowedNeedsMarginBeforeDeadline_R22(t *testing.T) {
	deadline := time.Date(2030, 1, 2, 0, 0, 0, 0, time.UTC)
	c := jobfence.ClaimedJob{ResendDeadline: deadline}
	p := jobfence.ProviderPolicy{SameKeyResendSafe: true, ResendMargin: time.Minute}
	for _, tc := range []struct {
		now  time.Time
		want bool
	}{
		{deadline.Add(-time.Hour), true},
		{deadline.Add(-time.Minute - time.Nanosecond), true},
		{deadline.Add(-time.Minute), false},
		{deadline.Add(time.Hour), false},
	} {
		ok, why := p.ResendAllowed(c, tc.now)
		if ok != tc.want || why == "" {
			t.Errorf("ResendAllowed at deadline%+v = %v (%s), want %v", tc.now.Sub(deadline), ok, why, tc.want)
		}
	}
	if ok, why := (jobfence.ProviderPolicy{}).ResendAllowed(c, deadline.Add(-time.Hour)); ok || !strings.Contains(why, "guarantee") {
		t.Errorf("without the guarantee: %v %s", ok, why)
	}
}
