// Command refundworker is the example worker of jobfence: it claims refund
// jobs from a coordinator, refunds through the fake payment provider of
// package fakeprovider, and writes each outcome back with the attempt it was
// granted, using the Go worker SDK (clients/go).
//
//	refundworker --coordinator 127.0.0.1:50051 --provider http://127.0.0.1:8099
//
// works jobs until SIGTERM or SIGINT, then stops claiming and drains the jobs
// in flight (a rolling deploy). With --jobs N it first enqueues N fresh
// refunds (registering their payments with the provider, so that
// over-refunds show), works until all N are succeeded or in manual review,
// and prints one summary line on stdout:
//
//	jobs=N succeeded=S manual_review=M double_refunds=D stale_rejected=R observations=O
//
// observations counts the receipts on file for those jobs (R15, R28): the
// provider's webhooks (when the fake provider sends them) and the late
// answers of workers that lost their grant. 0 without webhooks and
// takeovers; the log line "summary" splits it by source.
//
// A receipt the coordinator cannot take (its write-back was stale, or its
// grant was lost, and ReportObservation failed too) is kept in the receipt
// spool, --receipt-spool, and filed when the worker next can, after a
// restart too (R28). A restart finds the spool by the worker id: with the
// default id, which holds the pid, set --worker-id or --receipt-spool.
//
// Every flag falls back to an environment variable REFUNDWORKER_<FLAG>
// (upper case, '-' as '_'), e.g. REFUNDWORKER_COORDINATOR. Run with -h for
// the list.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jobfence/jobfence/clients/go/jobfence"
	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/cli"
)

func main() {
	cli.Main("refundworker", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

type config struct {
	coordinator     string
	tlsCA           string
	tlsCert         string
	tlsKey          string
	useTLS          bool
	tokenFile       string
	callTimeout     time.Duration
	provider        string
	providerName    string
	workerID        string
	concurrency     int
	lease           time.Duration
	renewInterval   time.Duration
	noRenewal       bool
	noStream        bool
	providerTimeout time.Duration
	sameKeyResends  bool
	resendMargin    time.Duration
	pendingDelay    time.Duration
	unknownDelay    time.Duration
	pollInterval    time.Duration
	claimWait       time.Duration
	drainTimeout    time.Duration
	receiptSpool    string
	jobs            int
	keyPrefix       string
	amountMinor     int64
	currency        string
	jobsTimeout     time.Duration
	log             cli.Log
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("refundworker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.coordinator, "coordinator", "127.0.0.1:50051", "coordinator gRPC address")
	fs.BoolVar(&c.useTLS, "tls", false, "connect to the coordinator over TLS (system roots unless --tls-ca)")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "PEM file of the CA that signed the coordinator's certificate; implies --tls")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "client certificate (PEM) for mutual TLS, with --tls-key; implies --tls")
	fs.StringVar(&c.tlsKey, "tls-key", "", "the client certificate's private key (PEM)")
	fs.StringVar(&c.tokenFile, "token-file", "",
		"file holding a bearer token sent with every coordinator call, re-read per call; sent only over TLS "+
			"or to a loopback coordinator")
	fs.DurationVar(&c.callTimeout, "call-timeout", jobfence.DefaultCallTimeout, "deadline of each coordinator call")
	fs.StringVar(&c.provider, "provider", "http://127.0.0.1:8099", "base URL of the payment provider (fakeprovider)")
	fs.StringVar(&c.providerName, "provider-name", "acme", "the provider name of the jobs to claim (and to enqueue with --jobs)")
	fs.StringVar(&c.workerID, "worker-id", "",
		"this worker's name in job histories and observation sources (worker:<id>) (default refundworker-<hostname>-<pid>)")
	fs.IntVar(&c.concurrency, "concurrency", 4, "jobs worked at once (1..100); only that many are claimed (R18)")
	fs.DurationVar(&c.lease, "lease", 30*time.Second,
		"lease to ask for (1s..15m); renewed while a job's provider calls run (R27), so it bounds how long a dead "+
			"or frozen worker holds a job: a few seconds recovers quickly")
	fs.DurationVar(&c.renewInterval, "renew-interval", 0,
		"how often a running job's lease is renewed; 0: a third of the lease (R27)")
	fs.BoolVar(&c.noRenewal, "no-lease-renewal", false,
		"never renew a lease: --lease must then outlast --provider-timeout and the deploy hand-over time (R17)")
	fs.BoolVar(&c.noStream, "no-stream", false,
		"claim with Claim calls (--poll-interval, --claim-wait) and write back with unary calls instead of the worker "+
			"stream, on which the coordinator pushes grants as slots free up")
	fs.DurationVar(&c.providerTimeout, "provider-timeout", 3*time.Second,
		"deadline of each provider call; with --no-lease-renewal keep it well under --lease (R17)")
	fs.BoolVar(&c.sameKeyResends, "same-key-resends", true,
		"the provider guarantees that a same-key, same-body resend inside its idempotency-key window returns the first "+
			"result (fakeprovider does); false: every \"no record\" reconcile goes to manual review (R14, R16). "+
			"The window itself is the coordinator's --provider-key-retention (R22)")
	fs.DurationVar(&c.resendMargin, "resend-margin", jobfence.DefaultResendMargin,
		"no same-key resend is started closer than this to the job's resend deadline")
	fs.DurationVar(&c.pendingDelay, "pending-delay", jobfence.DefaultPendingDelay, "when to reconcile a pending refund again (R4)")
	fs.DurationVar(&c.unknownDelay, "unknown-delay", jobfence.DefaultUnknownDelay,
		"when to reconcile after a provider call whose outcome is unknown (R14)")
	fs.DurationVar(&c.pollInterval, "poll-interval", jobfence.DefaultPollInterval, "with --no-stream: pause after a claim that found too little work")
	fs.DurationVar(&c.claimWait, "claim-wait", 0, "with --no-stream: long-poll each claim up to this long (0..60s); 0: poll every --poll-interval")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", jobfence.DefaultDrainTimeout,
		"on SIGTERM, how long jobs in flight may finish their provider call and write-back")
	fs.StringVar(&c.receiptSpool, "receipt-spool", "",
		"file keeping the receipts the coordinator could not take (R28), filed again before the first claim and "+
			"every 30s; a restart files them only from the same file, so keep --worker-id (or this) stable. "+
			"\"off\": such receipts are only logged (default <user cache dir>/jobfence/<worker id>.receipts.jsonl)")
	fs.IntVar(&c.jobs, "jobs", 0, "enqueue this many fresh refunds, work until all are final, print the summary line and exit")
	fs.StringVar(&c.keyPrefix, "key-prefix", "",
		"with --jobs: operation keys are <prefix><n> for n = 1..N, payments pay-<key>, orders order-<key> "+
			"(default rw-<start time>-)")
	fs.Int64Var(&c.amountMinor, "amount-minor", 1500, "with --jobs: the amount of each refund (and of its payment), in minor units")
	fs.StringVar(&c.currency, "currency", "EUR", "with --jobs: the currency of each refund")
	fs.DurationVar(&c.jobsTimeout, "jobs-timeout", 5*time.Minute, "with --jobs: give up when the jobs are not all final by then")
	c.log.Register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: refundworker [flags]\n\n"+
			"Works refund jobs from a jobfence coordinator against a payment provider until SIGTERM (then drains).\n"+
			"With --jobs N: enqueues N refunds, works them to the end and prints one line:\n"+
			"  jobs=N succeeded=S manual_review=M double_refunds=D stale_rejected=R observations=O\n"+
			"succeeded, manual_review and observations come from the coordinator (GetJob of each job), double_refunds\n"+
			"from the provider's oracle (operations and payments of this run refunded twice), stale_rejected from this\n"+
			"worker's write-backs rejected by the fence. observations counts the receipts on file for the jobs: the\n"+
			"provider's webhooks and the late answers of workers that lost their grant (0 without webhooks and\n"+
			"takeovers); the log line \"summary\" splits it by source.\n\n"+
			"Every flag falls back to the environment variable REFUNDWORKER_<FLAG> (upper case, '-' as '_'),\n"+
			"e.g. REFUNDWORKER_COORDINATOR.\n\n")
		fs.PrintDefaults()
	}
	if err := cli.Parse(fs, args, "REFUNDWORKER"); err != nil {
		return c, err
	}
	switch {
	case c.concurrency < 1 || c.concurrency > 100:
		return c, fmt.Errorf("--concurrency must be 1..100, got %d", c.concurrency)
	case c.renewInterval < 0 || (c.renewInterval > 0 && c.renewInterval >= c.lease):
		return c, fmt.Errorf("--renew-interval must be 0 (a third of the lease) or shorter than --lease, got %s", c.renewInterval)
	case c.lease < time.Second || c.lease > 15*time.Minute:
		return c, fmt.Errorf("--lease must be between 1s and 15m, got %s", c.lease)
	case c.providerTimeout <= 0:
		return c, fmt.Errorf("--provider-timeout must be positive, got %s", c.providerTimeout)
	case c.jobs < 0:
		return c, fmt.Errorf("--jobs must not be negative, got %d", c.jobs)
	case c.jobs > 0 && c.amountMinor <= 0:
		return c, fmt.Errorf("--amount-minor must be positive, got %d", c.amountMinor)
	case c.log.Validate() != nil:
		return c, c.log.Validate()
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return c, errors.New("--tls-cert and --tls-key go together")
	}
	c.useTLS = c.useTLS || c.tlsCA != "" || c.tlsCert != ""
	if c.tokenFile != "" && !c.useTLS && !cli.IsLoopback(c.coordinator) {
		return c, errors.New("--token-file needs TLS (--tls or --tls-ca) unless the coordinator is on loopback: " +
			"a bearer token never crosses a network in plaintext")
	}
	if c.workerID == "" {
		host, _ := os.Hostname()
		c.workerID = fmt.Sprintf("refundworker-%s-%d", host, os.Getpid())
	}
	if c.keyPrefix == "" {
		c.keyPrefix = "rw-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := c.log.New(stderr)
	if c.noRenewal && c.providerTimeout >= c.lease {
		log.Warn("--provider-timeout is not shorter than --lease and leases are not renewed: slow provider calls will be taken over (R17)",
			"provider_timeout", c.providerTimeout, "lease", c.lease)
	}

	opts, err := clientOptions(c)
	if err != nil {
		return err
	}
	// R35: spans only when the OTEL_* variables ask for them.
	tr, err := setupTracing(ctx)
	if err != nil {
		return err
	}
	defer tr.shutdown(log)
	log.Info("tracing", tr.describe()...)
	client, err := jobfence.Dial(c.coordinator, append(opts, jobfence.WithLogger(log))...)
	if err != nil {
		return err
	}
	defer client.Close()
	// The provider client never resends on its own: whether to resend is the
	// decision table's call (R14, R16), not the transport's.
	pay := fakeprovider.NewClient(c.provider, &http.Client{})

	wo := jobfence.WorkerOptions{
		WorkerID:        c.workerID,
		Concurrency:     c.concurrency,
		Lease:           c.lease,
		RenewInterval:   c.renewInterval,
		NoLeaseRenewal:  c.noRenewal,
		NoStream:        c.noStream,
		Provider:        c.providerName,
		ProviderTimeout: c.providerTimeout,
		Policy: jobfence.ProviderPolicy{
			SameKeyResendSafe: c.sameKeyResends,
			ResendMargin:      c.resendMargin,
			PendingDelay:      c.pendingDelay,
			UnknownDelay:      c.unknownDelay,
		},
		PollInterval: c.pollInterval,
		ClaimWait:    c.claimWait,
		DrainTimeout: c.drainTimeout,
		ReceiptSpool: c.receiptSpool,
		Logger:       log,
	}
	if tp := tr.provider(); tp != nil {
		wo.TracerProvider = tp
	}
	w, err := jobfence.NewWorker(client, &refunds{pay: pay}, wo)
	if err != nil {
		return err
	}
	// NewWorker opened the receipt spool: a run that ends before or after
	// Run (a provider or coordinator that did not answer the enqueues)
	// releases it, which removes the file when it holds nothing, so failed
	// starts leave no empty spools named after their pids behind.
	defer w.Shutdown(context.Background()) //nolint:errcheck // nil once Run has returned, or when it never ran
	log.Info("refundworker started", "worker_id", c.workerID, "coordinator", c.coordinator, "provider", c.provider,
		"provider_name", c.providerName, "concurrency", c.concurrency, "lease", c.lease, "jobs", c.jobs)
	if c.jobs > 0 {
		return runJobs(ctx, c, client, pay, w, stdout, log)
	}
	err = w.Run(ctx)
	log.Info("refundworker stopped", "stats", fmt.Sprintf("%+v", w.Stats()))
	return err
}

// clientOptions turns the TLS and token flags into client options.
func clientOptions(c config) ([]jobfence.Option, error) {
	opts := []jobfence.Option{jobfence.WithCallTimeout(c.callTimeout)}
	if c.useTLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
			if err != nil {
				return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		if c.tlsCA != "" {
			pem, err := os.ReadFile(c.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca: no certificate in %s", c.tlsCA)
			}
		}
		opts = append(opts, jobfence.WithTLS(cfg))
	}
	if c.tokenFile != "" {
		path := c.tokenFile
		opts = append(opts, jobfence.WithBearerToken(func(context.Context) (string, error) {
			b, err := os.ReadFile(path)
			return strings.TrimSpace(string(b)), err
		}))
		if !c.useTLS {
			opts = append(opts, jobfence.WithPlaintextTokens()) // loopback only, checked above
		}
	}
	return opts, nil
}
