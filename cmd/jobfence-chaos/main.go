// Command jobfence-chaos runs a fault campaign against a whole jobfence
// deployment on one machine and checks, against the database and the
// provider's own records, that no refund was lost or made twice.
//
//	jobfence-chaos --mysql-dsn 'root@tcp(127.0.0.1:3306)/' --duration 1m --seed 42
//
// It creates a fresh database, starts the fake provider, two coordinator
// replicas (each reaching MariaDB through its own in-process toxiproxy, and
// reached by its workers through another) and several refundworker
// processes, enqueues refunds, and for --duration injects faults drawn from
// --seed: frozen and killed workers, killed coordinators, the workers'
// streams and calls to a coordinator cut mid-flight, cut, delayed and
// blackholed database connections (COMMITs included), provider hangs,
// provider calls longer than the lease (which
// the patient workers wait out, renewing their leases), cut replies,
// pending refunds, lookup lag and 503 bursts; the provider's Stripe-signed webhooks reach the coordinators'
// --webhook-listen through a front spread over the replicas, delayed,
// duplicated, reordered or first signed wrong (--webhooks, on by default).
// A share of the refunds is enqueued with a not_before in the future, some
// beyond the campaign's end (--future-share), and a forger sends correctly
// signed webhook events naming them that must move nothing: another
// provider's, or for another amount or currency (--forged-webhooks).
// The coordinators archive succeeded jobs a few seconds after their
// completion (--retain-succeeded), while the faults run, and the producer
// enqueues a sample of archived keys again, which must answer their jobs
// and never make a second one (R30, R31).
// Meanwhile an operator cancels a share of the refunds at moments that
// matter (--cancel-share) and pauses the provider now and then (--pauses):
// none may be sent after its cancel took effect, and no replica may grant a
// paused provider's jobs (R32, R33).
// Then it heals everything, lets the system settle, stops the workers and
// checks fifteen invariants (docs/CHAOS.md). With --failover async or
// semi-sync it runs on a MariaDB primary and replica of its own instead of
// --mysql-dsn and fails the database over once (R26): the replica held back,
// the primary killed, the replica promoted, every proxy repointed. The last
// line of its output is
//
//	seed=S jobs=N faults=F double_refunds=0 lost=0 stale_writes_accepted=0 unobserved_late_success=0
//	  takeovers=T false_takeovers=0 handed_back=H webhooks_delivered=D webhook_observations=O expedited=E
//	  webhook_receipts_lost=0 duplicate_receipts=0 future_dated=F early_refunds=0 forged_webhooks=W forged_filed=0
//	  archived=A archived_reenqueues=R second_jobs=0 keys_unrecorded=0 cancels=C cancels_too_late=L
//	  refunds_after_cancel=0 cancels_unended=0 pauses=P grants_while_paused=0
//
// (one line), and the exit status is 1 when an invariant failed. The same seed and
// flags replay the same fault plan. Every flag falls back to an environment
// variable JOBFENCE_CHAOS_<FLAG> (upper case, '-' as '_'). Run with -h for
// the list.
package main

import (
	"context"
	"os"

	"github.com/jobfence/jobfence/internal/cli"
)

func main() {
	cli.Main("jobfence-chaos", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}
