package server

import (
	"context"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobfence/jobfence/store"
)

// Metrics are what operators watch (M1): takeovers, stale-attempt
// rejections, the age of the oldest unfinished job and the share of grants
// that are reconciles, plus queue depth, batch sizes and gRPC server metrics.
type Metrics struct {
	takeovers    prometheus.Counter
	stale        *prometheus.CounterVec
	granted      *prometheus.CounterVec
	jobsPerClaim prometheus.Histogram
	writeBatch   prometheus.Histogram
	enqueueBatch prometheus.Histogram
	claimTxBatch prometheus.Histogram
	batchHolds   *prometheus.HistogramVec
	handoffs     prometheus.Counter
	idleLooks    prometheus.Counter
	earlyRejects *prometheus.CounterVec
	renewals     *prometheus.CounterVec
	renewBatch   prometheus.Histogram
	// receiptToCompletion: seconds from the newest receipt of success or
	// failure to the job's completion (R28).
	receiptToCompletion prometheus.Histogram
	// workStreams: worker streams open now.
	workStreams prometheus.Gauge
	// handedBack: grants a worker stream could not deliver.
	handedBack prometheus.Counter
	// refused: calls refused in bulk, by kind (logged in aggregate).
	refused *prometheus.CounterVec
	// unacknowledged: of those, the grants sent that the worker did not
	// acknowledge in time or before its stream ended.
	unacknowledged prometheus.Counter
	// cancels: CancelRefund calls that changed a job, by outcome
	// (cancelled at once, or a cancel requested); cancelsTooLate: the
	// cancel-requested jobs the provider had refunded (R32).
	cancels        *prometheus.CounterVec
	cancelsTooLate prometheus.Counter
	grpc           *grpcprom.ServerMetrics
}

// NewMetrics registers the coordinator's metrics for st on reg.
func NewMetrics(reg prometheus.Registerer, st store.Store) *Metrics {
	m := &Metrics{
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobfence_takeovers_total",
			Help: "Jobs taken over from an expired lease (R6). Frequent takeovers point at GC pauses, too-short leases or over-claiming.",
		}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_stale_attempt_rejections_total",
			Help: "Write-backs and lease renewals rejected because they do not carry the job's current grant (R9, R25, R27), by RPC.",
		}, []string{"rpc"}),
		granted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_granted_jobs_total",
			Help: "Jobs granted by Claim, by next_action; the reconcile share is the share of provider calls that are reconciles.",
		}, []string{"next_action"}),
		jobsPerClaim: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jobfence_claim_batch_size",
			Help:    "Jobs granted per non-empty Claim.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100},
		}),
		writeBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jobfence_write_batch_size",
			Help:    "Write-backs coalesced into one transaction.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200},
		}),
		enqueueBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jobfence_enqueue_batch_size",
			Help:    "Enqueues coalesced into one transaction.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200},
		}),
		claimTxBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jobfence_claim_tx_batch_size",
			Help:    "Claims coalesced into one transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32},
		}),
		batchHolds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "jobfence_batch_hold_seconds",
			Help:    "How long a transaction held open under load waited for more calls to share it (--coalesce-window), by kind: enqueue, write, renew (claims are never held).",
			Buckets: []float64{.0005, .001, .002, .004, .008, .016, .032, .1},
		}, []string{"kind"}),
		handoffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobfence_handoff_claims_total",
			Help: "Long-polling Claims answered with jobs in the transaction of the enqueue that created them, instead of a claim transaction of their own.",
		}),
		idleLooks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobfence_idle_looks_total",
			Help: "Looks for work on behalf of idle long-polling Claims, one per poll instant and provider filter, each a read without a transaction.",
		}),
		earlyRejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_calls_refused_unparsed_total",
			Help: "Calls grpc-go refused before the service saw them, by method and code: requests that did not parse (malformed protobuf, invalid UTF-8).",
		}, []string{"grpc_method", "grpc_code"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_lease_renewals_total",
			Help: "Grants RenewLeases was asked to renew (R27), by result: renewed, stale_attempt (taken over), not_running, grant_too_old, not_found, unavailable.",
		}, []string{"result"}),
		renewBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jobfence_renew_batch_size",
			Help:    "Lease renewals coalesced into one transaction.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200},
		}),
		receiptToCompletion: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jobfence_receipt_to_completion_seconds",
			Help:    "Seconds from the newest receipt of success or failure on file for a job (a webhook, a late answer) to its completion by a worker (R28).",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 3600},
		}),
		workStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobfence_worker_streams",
			Help: "Worker streams (Work) open on this coordinator.",
		}),
		handedBack: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobfence_grants_handed_back_total",
			Help: "Grants a worker stream could not deliver (it failed or closed first, or the worker did not acknowledge them), handed back due now under their own tokens.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_calls_refused_total",
			Help: "Calls refused that a client can make by the thousand, by kind: too_many_calls (past its share of expensive reads or worker streams) and unauthenticated (no valid credential); the log says them in aggregate, a line per kind and caller every 10 s.",
		}, []string{"kind"}),
		unacknowledged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobfence_grants_unacknowledged_total",
			Help: "Grants sent on a worker stream that the worker did not acknowledge within 5 s (or half the lease) or before the stream ended, handed back (counted in jobfence_grants_handed_back_total too).",
		}),
		cancels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_cancels_total",
			Help: "Refunds cancelled (R32), by outcome: cancelled (never sent, cancelled at once) or requested (it may have been sent: the provider decides).",
		}, []string{"outcome"}),
		cancelsTooLate: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobfence_cancels_too_late_total",
			Help: "Cancel-requested refunds the provider had made: completed all the same, and put on the attention list (R32, R34).",
		}),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets([]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30, 60}))),
	}
	for _, action := range []store.NextAction{store.ActionRefund, store.ActionReconcile} {
		m.granted.WithLabelValues(string(action)) // present at 0 from the start
	}
	for _, r := range []string{"renewed", "stale_attempt", "not_running", "grant_too_old", "not_found", "unavailable"} {
		m.renewals.WithLabelValues(r)
	}
	for _, o := range []string{"cancelled", "requested"} {
		m.cancels.WithLabelValues(o)
	}
	for _, rpc := range []string{"Complete", "Reschedule", "Escalate", "RenewLeases"} {
		m.stale.WithLabelValues(rpc)
	}
	reg.MustRegister(m.takeovers, m.stale, m.granted, m.jobsPerClaim, m.writeBatch, m.enqueueBatch, m.claimTxBatch, m.batchHolds, m.handoffs, m.idleLooks, m.earlyRejects, m.renewals, m.renewBatch, m.receiptToCompletion, m.workStreams, m.handedBack, m.unacknowledged, m.refused, m.cancels, m.cancelsTooLate, m.grpc,
		newStatsCollector(st))
	return m
}

// rpcOf names the RPC of a write-back kind.
func rpcOf(kind store.EventKind) string {
	switch kind {
	case store.EventCompleted:
		return "Complete"
	case store.EventRescheduled:
		return "Reschedule"
	case store.EventResolved:
		return "ResolveReview"
	default:
		return "Escalate"
	}
}

// statsCollector reads the queue from the database at each scrape.
type statsCollector struct {
	st        store.Store
	jobs      *prometheus.Desc
	oldest    *prometheus.Desc
	retries   *prometheus.Desc
	attention *prometheus.Desc
	paused    *prometheus.Desc
}

func newStatsCollector(st store.Store) *statsCollector {
	return &statsCollector{
		st: st,
		jobs: prometheus.NewDesc("jobfence_jobs", "Jobs by state (ready, running, manual_review; succeeded history is not counted).",
			[]string{"state"}, nil),
		oldest: prometheus.NewDesc("jobfence_oldest_unfinished_job_age_seconds",
			"Age of the oldest ready or running job by the database clock; 0 when there is none.", nil, nil),
		retries: prometheus.NewDesc("jobfence_db_transaction_retries_total",
			"Transactions the database rolled back as a whole (deadlock, lock-wait timeout, busy file) and that ran again.",
			nil, nil),
		attention: prometheus.NewDesc("jobfence_attention_jobs",
			"Jobs on the attention list (R34): a receipt of failure or of another refund id after success, or a cancel that came too late; until a person acknowledges each.",
			nil, nil),
		paused: prometheus.NewDesc("jobfence_provider_paused",
			"1 for each provider paused now (R33): its jobs are granted to nobody.", []string{"provider"}, nil),
	}
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.jobs
	ch <- c.oldest
	ch <- c.retries
	ch <- c.attention
	ch <- c.paused
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.st.Stats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.jobs, err)
		ch <- prometheus.NewInvalidMetric(c.oldest, err)
		ch <- prometheus.NewInvalidMetric(c.retries, err)
		return
	}
	for _, s := range []store.State{store.StateReady, store.StateRunning, store.StateManualReview} {
		ch <- prometheus.MustNewConstMetric(c.jobs, prometheus.GaugeValue, float64(st.Jobs[s]), string(s))
	}
	age := 0.0
	if !st.OldestUnfinished.IsZero() {
		age = st.Now.Sub(st.OldestUnfinished).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
	ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(st.TxRetries))
	if _, n, err := c.st.Attention(ctx, 1); err != nil {
		ch <- prometheus.NewInvalidMetric(c.attention, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.attention, prometheus.GaugeValue, float64(n))
	}
	pauses, err := c.st.RefreshPauses(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.paused, err)
		return
	}
	for _, p := range pauses {
		ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, 1, p.Provider)
	}
}
