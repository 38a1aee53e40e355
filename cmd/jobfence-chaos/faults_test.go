package main

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// The provider lane, the provider-slow lane and the webhook lane share the
// provider's one set of faults: each writes the union, a hang is the longer
// of the two lanes', and a counted fault that ran out at the provider is
// not written again.
func TestProviderFaultLanesMergeAtTheProvider(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(fakeprovider.New(fakeprovider.Config{}))
	defer srv.Close()
	s := &system{pay: fakeprovider.NewClient(srv.URL, nil)}
	want := func(step string, f fakeprovider.Faults) {
		t.Helper()
		got, err := s.pay.Faults(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got != f {
			t.Errorf("%s: the provider has %+v, want %+v", step, got, f)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	must(s.setAPIFaults(ctx, fakeprovider.Faults{HangBefore: 2 * time.Second, LookupLag: time.Second}))
	must(s.setSlowFaults(ctx, fakeprovider.Faults{HangBefore: 9 * time.Second}))
	want("a hang and a slow hang", fakeprovider.Faults{HangBefore: 9 * time.Second, LookupLag: time.Second})
	must(s.setWebhookModes(ctx, fakeprovider.Faults{WebhookDuplicate: true}))
	want("and a webhook mode", fakeprovider.Faults{HangBefore: 9 * time.Second, LookupLag: time.Second, WebhookDuplicate: true})
	must(s.setSlowFaults(ctx, fakeprovider.Faults{}))
	want("the slow one over", fakeprovider.Faults{HangBefore: 2 * time.Second, LookupLag: time.Second, WebhookDuplicate: true})
	must(s.setAPIFaults(ctx, fakeprovider.Faults{}))
	must(s.setWebhookModes(ctx, fakeprovider.Faults{}))
	want("all over", fakeprovider.Faults{})

	// A counted cut-reply with a slow hang; its count runs out at the
	// provider (which clears every fault): the slow lane's end does not
	// bring it back, and neither does a webhook mode.
	must(s.setAPIFaults(ctx, fakeprovider.Faults{CutReply: true, Times: 2}))
	must(s.setSlowFaults(ctx, fakeprovider.Faults{HangAfter: 7 * time.Second}))
	want("a cut-reply and a slow hang", fakeprovider.Faults{CutReply: true, Times: 2, HangAfter: 7 * time.Second})
	must(s.pay.ClearFaults(ctx))
	must(s.setSlowFaults(ctx, fakeprovider.Faults{}))
	want("the count ran out, the slow one over", fakeprovider.Faults{})
	must(s.setWebhookModes(ctx, fakeprovider.Faults{WebhookReorder: true}))
	want("a webhook mode after it", fakeprovider.Faults{WebhookReorder: true})

	// An error burst counting down keeps its count left.
	must(s.setAPIFaults(ctx, fakeprovider.Faults{ErrorBurst: 5}))
	_, err := s.pay.SetFaults(ctx, fakeprovider.Faults{ErrorBurst: 3, WebhookReorder: true})
	must(err)
	must(s.setSlowFaults(ctx, fakeprovider.Faults{HangBefore: 8 * time.Second}))
	want("a burst half spent and a slow hang", fakeprovider.Faults{ErrorBurst: 3, HangBefore: 8 * time.Second,
		WebhookReorder: true})
	must(s.clearProviderFaults(ctx))
	want("healed", fakeprovider.Faults{})
}
