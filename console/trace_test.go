package console_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/jobfence/jobfence/console"
	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/internal/testdb"
)

// R35: the job page shows the enqueue's trace id, linked to the trace
// viewer the template names; a job enqueued without one shows none.
func TestJobPageLinksTheEnqueuesTrace_R35(t *testing.T) {
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	e := start(t, testdb.SQLiteBackend(), func(o *console.Options) {
		o.TraceLinkTemplate = "https://traces.example/trace/{trace_id}?view=full"
	})
	ctx := metadata.AppendToOutgoingContext(as(t, tokShop), "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	traced, err := e.api.EnqueueRefund(ctx, &pb.EnqueueRefundRequest{OperationKey: "refund-r35-traced", OrderId: "o-1",
		PaymentId: "p-1", AmountMinor: 100, Currency: "EUR", Provider: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := e.api.EnqueueRefund(as(t, tokShop), &pb.EnqueueRefundRequest{OperationKey: "refund-r35-plain",
		OrderId: "o-2", PaymentId: "p-2", AmountMinor: 100, Currency: "EUR", Provider: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	alice := e.person(t)
	alice.signIn(tokAlice)
	pg := alice.get(fmt.Sprintf("/jobs/%d", traced.GetJob().GetId()))
	mustContain(t, pg, `id="trace"`, `href="https://traces.example/trace/`+traceID+`?view=full"`, traceID)
	if pg := alice.get(fmt.Sprintf("/jobs/%d", plain.GetJob().GetId())); strings.Contains(pg.body, `id="trace"`) {
		t.Fatal("a job enqueued without a trace context shows a trace")
	}
}

// A trace link template that could not link anywhere is refused, naming why.
func TestTraceLinkTemplateChecked(t *testing.T) {
	for _, bad := range []string{"https://traces.example/trace/", "javascript:alert({trace_id})", "/trace/{trace_id}"} {
		if err := console.CheckTraceLinkTemplate(bad); err == nil {
			t.Errorf("CheckTraceLinkTemplate(%q) = nil", bad)
		}
	}
	if err := console.CheckTraceLinkTemplate("http://jaeger:16686/trace/{trace_id}"); err != nil {
		t.Errorf("a good template refused: %v", err)
	}
}
