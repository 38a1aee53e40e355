// Command coordinator serves the jobfence.v1.Coordinator gRPC API on MySQL, or
// on the embedded SQLite store when no MySQL DSN is given.
//
// Every flag falls back to an environment variable: --mysql-dsn to
// JOBFENCE_MYSQL_DSN, --lease to JOBFENCE_LEASE, and so on. Run with -h for
// the list.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"

	"github.com/jobfence/jobfence/archiver"
	"github.com/jobfence/jobfence/console"
	"github.com/jobfence/jobfence/internal/cli"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/store/mysql"
	"github.com/jobfence/jobfence/store/sqlite"
	"github.com/jobfence/jobfence/tracing"
	"github.com/jobfence/jobfence/webhook"
)

func main() {
	cli.Main("coordinator", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stderr) })
}

// gcPercent is the collector's target (GOGC) unless the environment sets
// GOGC: the coordinator's live heap is small (the calls in flight), so
// collecting less often costs little memory and saves CPU under load.
// docs/BENCHMARKS.md, "Results of a full run", lists GOGC=400 among the
// earlier changes measured in its previous runs (it keeps no figures of
// them). GOGC and GOMEMLIMIT override it as for any Go program.
const gcPercent = 400

// healthInterval is how often the coordinator pings its database for its
// health status (server.WatchDatabase).
const healthInterval = 2 * time.Second

// memoryLimit is the Go runtime's soft memory limit unless GOMEMLIMIT is
// set: near it the collector runs as often as it must, so that a burst of
// calls in flight (each bounded to server.MaxHeaderBytes +
// server.MaxMessageBytes) is collected rather than kept. The live heap of a
// busy coordinator is tens of MB (docs/BENCHMARKS.md, peak_rss_mb).
const memoryLimit = 512 << 20

// configureGC applies gcPercent unless GOGC is set and memoryLimit unless
// GOMEMLIMIT is set, and returns both in force, for the start-up log.
func configureGC() (gogc, memLimit string) {
	gogc = os.Getenv("GOGC")
	if gogc == "" {
		debug.SetGCPercent(gcPercent)
		gogc = strconv.Itoa(gcPercent)
	}
	memLimit = os.Getenv("GOMEMLIMIT")
	if memLimit == "" {
		debug.SetMemoryLimit(memoryLimit)
		memLimit = strconv.Itoa(memoryLimit>>20) + "MiB"
	}
	return gogc, memLimit
}

type config struct {
	listen          string
	mysqlDSN        string
	mysqlDSNFile    string
	dsnOnCmdLine    bool // --mysql-dsn came as an argument, where ps shows it
	mysqlMaxConns   int
	sqlitePath      string
	lease           time.Duration
	keyRetention    time.Duration
	maxGrantAge     time.Duration
	providerKeys    string
	budgets         string
	claimPoll       time.Duration
	writeFlushers   int
	coalesceWindow  time.Duration
	writeBatch      int
	pprofListen     string
	metricsListen   string
	consoleListen   string
	traceLink       string
	webhookListen   string
	webhookSecrets  string
	webhookTol      time.Duration
	tokensFile      string
	tlsCert         string
	tlsKey          string
	tlsClientCA     string
	allowPlaintext  bool
	migrateOnly     bool
	migrateContract bool
	// The archive (R31) and the shares of careless clients.
	retainSucceeded   time.Duration
	retainCancelled   time.Duration
	archiveBatch      int
	archivePause      time.Duration
	archiveInterval   time.Duration
	archiveMaxPurge   int64
	archiveOnce       bool
	exportTo          string
	exportBefore      string
	maxReads          int
	maxReadsPerCred   int
	maxStreams        int
	maxStreamsPerCred int
	readsPerSecond    float64
	readsPerSecCred   float64
	shutdownTimeout   time.Duration
	log               cli.Log
}

func parseFlags(args []string, stderr *os.File) (config, error) {
	var c config
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:50051", "gRPC listen address")
	fs.StringVar(&c.mysqlDSN, "mysql-dsn", "",
		"MySQL DSN (go-sql-driver format, e.g. user:pass@tcp(host:3306)/jobfence); when empty the embedded SQLite store is used. "+
			"readTimeout and writeTimeout default to 90s when the DSN sets none")
	fs.StringVar(&c.mysqlDSNFile, "mysql-dsn-file", "",
		"read the MySQL DSN from this file (its first line) instead of --mysql-dsn, so that the password shows in no "+
			"process listing or debug endpoint")
	fs.IntVar(&c.mysqlMaxConns, "mysql-max-conns", 32, "MySQL connection pool size")
	fs.StringVar(&c.sqlitePath, "sqlite", "data/jobfence.db",
		"embedded store file, created with its folder if absent; ignored when --mysql-dsn is set")
	fs.DurationVar(&c.lease, "lease", server.Defaults.Lease,
		"lease granted when a Claim names none (1s..15m); choose it from the provider call's p99 and deploy hand-over time")
	fs.DurationVar(&c.maxGrantAge, "max-grant-age", server.Defaults.MaxGrantAge,
		"how long lease renewals may keep one grant alive, from its claim (1s..24h); past it RenewLeases refuses "+
			"with GRANT_TOO_OLD and the job is taken over when its lease runs out (R27). Make it longer than the "+
			"slowest handler you accept, reconciles and retries included")
	fs.DurationVar(&c.keyRetention, "key-retention", server.Defaults.KeyRetention,
		"how long providers keep an idempotency key; same-key resends are safe only inside it")
	fs.StringVar(&c.providerKeys, "provider-key-retention", "",
		"per-provider key retention overriding --key-retention, e.g. acme=24h,globex=168h")
	fs.StringVar(&c.budgets, "provider-budget", "",
		"per-provider outbound budget shared by all replicas through the database, as rate per second and burst, "+
			"e.g. acme=50:100,globex=5:5; refunds and reconciles draw from it alike; start every replica with the same value")
	fs.DurationVar(&c.claimPoll, "claim-poll-interval", server.Defaults.ClaimPollInterval,
		"how often a long-polling Claim looks again for work it was not woken for (other replicas' enqueues, delays, expired leases); "+
			"waiting Claims look together, in one transaction")
	fs.IntVar(&c.writeFlushers, "write-flushers", server.Defaults.WriteFlushers,
		"how many enqueue, write-back and claim transactions (each) may run at once: one takes calls as they come, calls arriving meanwhile share its next transaction, the others step in only while a transaction has run for 20ms")
	fs.IntVar(&c.writeBatch, "write-batch", server.Defaults.WriteBatch, "most enqueues or write-backs coalesced into one transaction")
	fs.DurationVar(&c.coalesceWindow, "coalesce-window", server.Defaults.CoalesceWindow,
		"under load (calls coming at least twice per window), the longest an enqueue or write-back transaction waits for more calls to share it (claims never wait); "+
			"fewer transactions and round trips per job for at most this much latency; at low rates almost nothing waits; 0 never waits")
	fs.StringVar(&c.tokensFile, "tokens-file", "",
		"bearer tokens, one per line: <name> <role,…> sha256:<hex of the token's SHA-256> (roles: producer, worker, operator, reader); "+
			"required to listen beyond loopback unless --tls-client-ca is set")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "serve TLS with this certificate (PEM); needs --tls-key")
	fs.StringVar(&c.tlsKey, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&c.tlsClientCA, "tls-client-ca", "",
		"require client certificates signed by this CA (PEM): mutual TLS; without --tokens-file the certificate's common name is the identity, with every role")
	fs.BoolVar(&c.migrateOnly, "migrate-only", false,
		"apply the store's pending migrations and exit: run it with a database user that may create and alter tables "+
			"(a deploy step), then serve with one that may only read and write rows")
	fs.BoolVar(&c.migrateContract, "migrate-contract", false,
		"MySQL: apply the contract migrations too, those that remove what an earlier release still uses (the lease "+
			"indexes): once every coordinator on the database runs this release, e.g. with --migrate-only; a fresh "+
			"database gets them at once")
	fs.BoolVar(&c.allowPlaintext, "allow-plaintext", false,
		"accept bearer tokens without TLS beyond loopback: only when a TLS-terminating proxy or mesh sidecar on this "+
			"host carries the traffic")
	fs.StringVar(&c.metricsListen, "metrics-listen", "",
		"serve Prometheus metrics at /metrics on this address (e.g. 127.0.0.1:9090), without authentication "+
			"(counts and timings, no secrets); off when empty")
	fs.StringVar(&c.consoleListen, "console-listen", "",
		"serve the operator console (web pages for the manual-review queue, docs/CONSOLE.md) on this address, e.g. "+
			"127.0.0.1:8080; people sign in with their own operator or reader token, so it needs --tokens-file; TLS "+
			"with --tls-cert as for --listen, which it requires beyond loopback unless --allow-plaintext; off when empty")
	fs.StringVar(&c.traceLink, "trace-link-template", "",
		"link each job's trace id on the console's job page to a trace viewer: an http(s) URL where {trace_id} is "+
			"replaced, e.g. https://jaeger.example/trace/{trace_id} (R35); the id alone when empty")
	fs.StringVar(&c.webhookListen, "webhook-listen", "",
		"receive payment providers' signed webhooks at POST /webhooks/{provider} on this address, e.g. 0.0.0.0:8443: the one "+
			"port providers must reach, serving nothing else (docs/DEPLOY.md); needs --webhook-secrets-file; TLS with "+
			"--tls-cert, which it needs beyond loopback unless --allow-plaintext; off when empty")
	fs.StringVar(&c.webhookSecrets, "webhook-secrets-file", "",
		"webhook signing secrets, one per line: <provider> stripe <secret> (two lines for a provider while rotating); "+
			"keep it readable by the coordinator alone")
	fs.DurationVar(&c.webhookTol, "webhook-tolerance", webhook.DefaultTolerance,
		"how far a webhook signature's timestamp may be from now, either way (older: a replay; newer: a forgery); 1s..1h")
	fs.StringVar(&c.pprofListen, "pprof-listen", "",
		"serve net/http/pprof on this loopback address (e.g. 127.0.0.1:6060) for profiling; off when empty")
	fs.DurationVar(&c.retainSucceeded, "retain-succeeded", archiver.Defaults.RetainSucceeded,
		"how long a succeeded job stays in the working tables after its completion before the archive takes it, "+
			"with its history and receipts (R31); at least 1s; 0: never archive (the tables then grow without bound)")
	fs.DurationVar(&c.retainCancelled, "retain-cancelled", archiver.Defaults.RetainCancelled,
		"how long a cancelled job stays in the working tables after it was cancelled before the archive takes it "+
			"(R31, R32); at least 1s; 0: cancelled jobs stay. Archived only while the archive runs (--retain-succeeded > 0)")
	fs.IntVar(&c.archiveBatch, "archive-batch", archiver.Defaults.Batch,
		"most jobs one archive transaction moves (1..1000)")
	fs.DurationVar(&c.archivePause, "archive-pause", archiver.Defaults.Pause,
		"the archive's pause between two of its transactions (0..1m)")
	fs.DurationVar(&c.archiveInterval, "archive-interval", archiver.Defaults.Interval,
		"how often the archive looks for jobs past their retention (1s..1h)")
	fs.Int64Var(&c.archiveMaxPurge, "archive-max-purge-backlog", archiver.Defaults.MaxPurgeBacklog,
		"MySQL: the InnoDB history list length above which the archive waits for the purge before deleting more")
	fs.BoolVar(&c.archiveOnce, "archive-once", false,
		"archive every job past its retention now, then exit (not serving); refused while another coordinator archives")
	fs.StringVar(&c.exportTo, "archive-export", "",
		"write every archived job that left the working tables before --archive-export-before to this file, one "+
			"JSON line each (GetJob's answer: job, history, receipts, ledger), then drop those archive rows; the "+
			"keys stay for ever (R30) and the ledger stays; then exit, not serving. /dev/null drops without keeping")
	fs.StringVar(&c.exportBefore, "archive-export-before", "",
		"with --archive-export: the date (2006-01-02, UTC) or RFC 3339 time before which archived jobs are exported")
	fs.IntVar(&c.maxReads, "max-reads", server.Defaults.MaxReads,
		"expensive reads (a ListJobs filtered by reason prefix or creation time; GetOverview when not cached) in flight on this coordinator; past it they answer RESOURCE_EXHAUSTED")
	fs.IntVar(&c.maxReadsPerCred, "max-reads-per-credential", server.Defaults.MaxReadsPerCredential,
		"expensive reads in flight per credential")
	fs.Float64Var(&c.readsPerSecond, "reads-per-second", server.Defaults.ReadsPerSecond,
		"expensive reads that may start each second on this coordinator (a burst of as many); with --max-reads, "+
			"the bound on the database time readers take from claims and write-backs")
	fs.Float64Var(&c.readsPerSecCred, "reads-per-second-per-credential", server.Defaults.ReadsPerSecondPerCredential,
		"expensive reads that may start each second per credential")
	fs.IntVar(&c.maxStreams, "max-streams", server.Defaults.MaxStreams,
		"worker streams open on this coordinator; past it Work answers RESOURCE_EXHAUSTED")
	fs.IntVar(&c.maxStreamsPerCred, "max-streams-per-credential", server.Defaults.MaxStreamsPerCredential,
		"worker streams open per credential")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 15*time.Second,
		"on SIGTERM, how long in-flight calls may finish before they are cut")
	c.log.Register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: coordinator [flags]\n\nEvery flag falls back to the environment variable "+
			"JOBFENCE_<FLAG> (upper case, '-' as '_'), e.g. JOBFENCE_MYSQL_DSN.\n\n")
		fs.PrintDefaults()
	}
	if err := cli.Parse(fs, args, "JOBFENCE"); err != nil {
		return c, err
	}
	c.dsnOnCmdLine = slices.ContainsFunc(args, func(a string) bool {
		name := strings.TrimLeft(a, "-")
		return name == "mysql-dsn" || strings.HasPrefix(name, "mysql-dsn=")
	})
	if c.mysqlDSNFile != "" {
		if c.mysqlDSN != "" {
			return c, errors.New("--mysql-dsn and --mysql-dsn-file are one or the other")
		}
		b, err := os.ReadFile(c.mysqlDSNFile)
		if err != nil {
			return c, fmt.Errorf("--mysql-dsn-file: %w", err)
		}
		c.mysqlDSN, _, _ = strings.Cut(strings.TrimSpace(string(b)), "\n")
		if c.mysqlDSN == "" {
			return c, fmt.Errorf("--mysql-dsn-file %s is empty", c.mysqlDSNFile)
		}
	}
	for name, addr := range map[string]string{"listen": c.listen, "metrics-listen": c.metricsListen,
		"pprof-listen": c.pprofListen, "console-listen": c.consoleListen, "webhook-listen": c.webhookListen} {
		if addr == "" && name != "listen" {
			continue
		}
		if err := cli.CheckListen(name, addr); err != nil {
			return c, err
		}
	}
	if c.lease < store.MinLease || c.lease > store.MaxLease {
		return c, fmt.Errorf("--lease must be between %s and %s, got %s", store.MinLease, store.MaxLease, c.lease)
	}
	if c.maxGrantAge < store.MinLease || c.maxGrantAge > store.MaxGrantAge {
		return c, fmt.Errorf("--max-grant-age must be between %s and %s, got %s", store.MinLease, store.MaxGrantAge, c.maxGrantAge)
	}
	if c.claimPoll < time.Millisecond || c.claimPoll > time.Minute {
		return c, fmt.Errorf("--claim-poll-interval must be between 1ms and 1m, got %s", c.claimPoll)
	}
	if c.writeFlushers < 1 || c.writeFlushers > 256 {
		return c, fmt.Errorf("--write-flushers must be between 1 and 256, got %d", c.writeFlushers)
	}
	if c.coalesceWindow < 0 || c.coalesceWindow > 100*time.Millisecond {
		return c, fmt.Errorf("--coalesce-window must be between 0 and 100ms, got %s", c.coalesceWindow)
	}
	if c.writeBatch < 1 || c.writeBatch > 1000 {
		return c, fmt.Errorf("--write-batch must be between 1 and 1000, got %d", c.writeBatch)
	}
	if c.keyRetention <= 0 {
		return c, fmt.Errorf("--key-retention must be positive, got %s", c.keyRetention)
	}
	if err := console.CheckTraceLinkTemplate(c.traceLink); err != nil {
		return c, fmt.Errorf("--trace-link-template %w, got %q", err, c.traceLink)
	}
	if err := checkRetention(c); err != nil {
		return c, err
	}
	if err := c.log.Validate(); err != nil {
		return c, err
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return c, errors.New("--tls-cert and --tls-key go together")
	}
	if c.tlsClientCA != "" && c.tlsCert == "" {
		return c, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if c.tokensFile == "" && c.tlsClientCA == "" && !cli.IsLoopback(c.listen) {
		return c, fmt.Errorf("--listen %s is not a loopback address: refusing to serve refunds without --tokens-file or --tls-client-ca", c.listen)
	}
	if c.tokensFile != "" && c.tlsCert == "" && !cli.IsLoopback(c.listen) && !c.allowPlaintext {
		return c, fmt.Errorf("--listen %s is not a loopback address and there is no --tls-cert: bearer tokens would "+
			"cross the network in clear. Serve TLS (--tls-cert, --tls-key), or set --allow-plaintext when a "+
			"TLS-terminating proxy or mesh sidecar on this host carries the traffic", c.listen)
	}
	if c.consoleListen != "" && c.tokensFile == "" {
		return c, errors.New("--console-listen needs --tokens-file: people sign in to the console with their own " +
			"operator or reader token, and the history records their names")
	}
	if c.consoleListen != "" && c.tlsCert == "" && !cli.IsLoopback(c.consoleListen) && !c.allowPlaintext {
		return c, fmt.Errorf("--console-listen %s is not a loopback address and there is no --tls-cert: "+
			"sign-in tokens and session cookies would cross the network in clear. Serve TLS (--tls-cert, --tls-key), "+
			"or set --allow-plaintext when a TLS-terminating proxy on this host carries the traffic", c.consoleListen)
	}
	if (c.webhookListen == "") != (c.webhookSecrets == "") {
		return c, errors.New("--webhook-listen and --webhook-secrets-file go together: a webhook is stored only " +
			"when its signature checks against its provider's secret")
	}
	if c.webhookListen != "" && c.tlsCert == "" && !cli.IsLoopback(c.webhookListen) && !c.allowPlaintext {
		return c, fmt.Errorf("--webhook-listen %s is not a loopback address and there is no --tls-cert: providers "+
			"deliver webhooks over HTTPS. Serve TLS (--tls-cert, --tls-key), or set --allow-plaintext when a "+
			"TLS-terminating proxy on this host carries the traffic", c.webhookListen)
	}
	if c.webhookTol < time.Second || c.webhookTol > time.Hour {
		return c, fmt.Errorf("--webhook-tolerance must be between 1s and 1h, got %s", c.webhookTol)
	}
	if c.pprofListen != "" && !cli.IsLoopback(c.pprofListen) {
		return c, fmt.Errorf("--pprof-listen %s is not a loopback address: pprof has no authentication and shows the "+
			"process's memory; serve it on 127.0.0.1 and reach it through an SSH tunnel or kubectl port-forward", c.pprofListen)
	}
	return c, nil
}

func parseProviderKeys(s string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' }) {
		name, dur, ok := strings.Cut(strings.TrimSpace(part), "=")
		d, err := time.ParseDuration(dur)
		if !ok || name == "" || err != nil || d <= 0 {
			return nil, fmt.Errorf("--provider-key-retention: %q is not provider=duration", part)
		}
		out[name] = d
	}
	return out, nil
}

// parseBudgets reads --provider-budget: provider=rate[:burst], burst
// defaulting to the rate.
func parseBudgets(s string) (map[string]store.BudgetConfig, error) {
	out := map[string]store.BudgetConfig{}
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' }) {
		name, spec, ok := strings.Cut(strings.TrimSpace(part), "=")
		rate, burst, hasBurst := strings.Cut(spec, ":")
		var c store.BudgetConfig
		var err1, err2 error
		c.Rate, err1 = strconv.ParseFloat(rate, 64)
		c.Burst = c.Rate
		if hasBurst {
			c.Burst, err2 = strconv.ParseFloat(burst, 64)
		}
		if !ok || name == "" || err1 != nil || err2 != nil || c.Validate() != nil {
			return nil, fmt.Errorf("--provider-budget: %q is not provider=rate[:burst] with rate > 0 and burst >= 1", part)
		}
		out[name] = c
	}
	return out, nil
}

func run(ctx context.Context, args []string, stderr *os.File) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	co, err := open(ctx, c, c.log.New(stderr))
	if err != nil || co == nil { // nil: --migrate-only is done
		return err
	}
	return co.serve(ctx)
}

// coordinator is one coordinator process: its store, the gRPC server on it,
// and the listeners the flags ask for.
type coordinator struct {
	cfg    config
	log    *slog.Logger
	store  store.Store
	server *server.Server
	grpc   *grpc.Server
	health *health.Server
	lis    net.Listener
	// console and webhooks, when --console-listen and --webhook-listen are
	// set.
	console  *consoleServer
	webhooks *webServer
	// archiver moves finished jobs out of the working tables; nil with
	// --retain-succeeded=0.
	archiver *archiver.Archiver
	// tracing is OpenTelemetry's, as the OTEL_* variables configure it
	// (R35); off when none is set.
	tracing *tracing.Tracing
}

// open wires a coordinator from c: the store (migrated), the providers'
// budgets, the metrics, the credentials, the server and its listeners, all
// bound before it returns, so that a port in use or a bad certificate fails
// the start. With --migrate-only it returns nil once the schema is up to
// date.
func open(ctx context.Context, c config, log *slog.Logger) (co *coordinator, err error) {
	providerKeys, err := parseProviderKeys(c.providerKeys)
	if err != nil {
		return nil, err
	}
	budgets, err := parseBudgets(c.budgets)
	if err != nil {
		return nil, err
	}
	authn, creds, httpsTLS, err := security(c)
	if err != nil {
		return nil, err
	}
	var providers map[string]*webhook.Provider
	if c.webhookSecrets != "" {
		if providers, err = webhook.LoadSecrets(c.webhookSecrets, c.webhookTol); err != nil {
			return nil, fmt.Errorf("--webhook-secrets-file: %w", err)
		}
	}
	gogc, memLimit := configureGC()
	st, err := openStore(ctx, c, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if co == nil {
			st.Close()
		}
	}()
	if c.migrateOnly {
		log.Info("schema up to date; --migrate-only: not serving")
		return nil, nil
	}
	if c.archiveOnce {
		return nil, archiveOnce(ctx, c, st, log)
	}
	if c.exportTo != "" {
		return nil, exportArchive(ctx, c, st, log)
	}
	if err := st.ConfigureBudgets(ctx, budgets); err != nil {
		return nil, fmt.Errorf("--provider-budget: %w", err)
	}
	for name, b := range budgets {
		log.Info("provider budget", "provider", name, "rate_per_s", b.Rate, "burst", b.Burst)
	}
	warnExposure(c, authn, log)
	tr, err := startTracing(ctx, log)
	if err != nil {
		return nil, err
	}
	if tr.Enabled() {
		log = slog.New(tracing.NewLogHandler(log.Handler()))
	}
	defer func() {
		if co == nil {
			flushTraces(tr, log)
		}
	}()
	reg := registry(st)
	debug, err := serveDebug(c, reg, log)
	if err != nil {
		return nil, err
	}
	srv := server.New(st, server.Options{
		Lease: c.lease, MaxGrantAge: c.maxGrantAge, KeyRetention: c.keyRetention, ProviderKeyRetention: providerKeys,
		ClaimPollInterval: c.claimPoll, WriteFlushers: c.writeFlushers, WriteBatch: c.writeBatch,
		CoalesceWindow: coalesceWindow(c.coalesceWindow),
		Auth:           authn, Metrics: server.NewMetrics(reg, st), Logger: log,
		MaxReads: c.maxReads, MaxReadsPerCredential: c.maxReadsPerCred,
		ReadsPerSecond: c.readsPerSecond, ReadsPerSecondPerCredential: c.readsPerSecCred,
		MaxStreams: c.maxStreams, MaxStreamsPerCredential: c.maxStreamsPerCred,
		TracerProvider: tr.TracerProvider(),
	})
	// The archive lease's holder outlives this process: a coordinator
	// restarted after a crash takes the lease again at once (fenced: the
	// dead process's generation can move nothing).
	host, _ := os.Hostname()
	arch, err := newArchiver(c, st, reg, log, host+" "+c.listen)
	if err != nil {
		debug.close()
		srv.Close()
		return nil, err
	}
	gs, hs := srv.NewGRPCServer(creds...)
	lis, err := listen("listen", c.listen)
	if err != nil {
		debug.close()
		srv.Close()
		return nil, err
	}
	co = &coordinator{cfg: c, log: log, store: st, server: srv, grpc: gs, health: hs, lis: lis, archiver: arch,
		tracing: tr}
	if c.consoleListen != "" {
		if co.console, err = startConsole(srv, c.consoleListen, httpsTLS, c.webhookListen != "", c.traceLink, log); err != nil {
			lis.Close()
			debug.close()
			srv.Close()
			return nil, err
		}
	}
	if c.webhookListen != "" {
		if co.webhooks, err = startWebhooks(st, providers, c.webhookListen, httpsTLS, reg, log); err != nil {
			lis.Close()
			if co.console != nil {
				co.console.shutdown(0)
			}
			debug.close()
			srv.Close()
			return nil, err
		}
	}
	log.Info("coordinator serving", "listen", lis.Addr().String(), "lease", c.lease, "key_retention", c.keyRetention,
		"gogc", gogc, "gomemlimit", memLimit)
	return co, nil
}

// serve answers calls until ctx ends (SIGTERM, SIGINT), then stops as a
// rolling deploy needs, and closes everything.
func (co *coordinator) serve(ctx context.Context) error {
	defer co.store.Close()
	defer flushTraces(co.tracing, co.log) // after the last call's spans ended
	go co.server.WatchDatabase(ctx, co.health, healthInterval)
	archived := make(chan struct{})
	if co.archiver != nil {
		go func() { defer close(archived); co.archiver.Run(ctx) }() //nolint:errcheck // ends with ctx
	} else {
		close(archived)
	}
	defer func() {
		select { // the archiver gives its lease up as it stops
		case <-archived:
		case <-time.After(10 * time.Second):
		}
	}()
	served := make(chan error, 1)
	go func() { served <- co.grpc.Serve(co.lis) }()
	select {
	case err := <-served:
		co.server.Close()
		return err
	case <-ctx.Done():
	}
	co.shutdown()
	return nil
}

// shutdown is the rolling deploy's stop: take no new calls, let in-flight
// claims and write-backs finish for up to --shutdown-timeout, then cut what
// remains. A cut write-back is safe to repeat (R21); a cut claim grants
// nothing the lease will not recover.
func (co *coordinator) shutdown() {
	timeout := co.cfg.shutdownTimeout
	co.log.Info("shutting down", "timeout", timeout)
	co.health.Shutdown()
	co.server.Drain()
	if co.console != nil {
		co.console.shutdown(timeout)
	}
	if co.webhooks != nil {
		co.webhooks.shutdown(timeout)
	}
	done := make(chan struct{})
	go func() { co.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		co.log.Warn("shutdown timeout: cutting remaining calls")
		co.grpc.Stop()
	}
	co.server.Close()
}

// startTracing configures tracing from the OTEL_* variables (R35,
// docs/DEPLOY.md "Tracing") and, when it is on, makes its provider and the
// W3C propagator OpenTelemetry's globals. Off, it installs nothing: the
// global provider stays the no-op it is. The line it logs says which.
func startTracing(ctx context.Context, log *slog.Logger) (*tracing.Tracing, error) {
	tr, err := tracing.Setup(ctx, log)
	if err != nil {
		return nil, err
	}
	if tr.Enabled() {
		otel.SetTracerProvider(tr.TracerProvider())
		otel.SetTextMapPropagator(tracing.Propagator())
	}
	log.Info("tracing", tr.Describe()...)
	return tr, nil
}

// traceFlushTimeout bounds the flush of the spans still queued at
// shutdown: a collector that does not answer must not hold the stop up.
const traceFlushTimeout = 5 * time.Second

// flushTraces exports the spans still queued and stops the exporter.
func flushTraces(tr *tracing.Tracing, log *slog.Logger) {
	if !tr.Enabled() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		log.Warn("tracing: spans still queued at shutdown were not all exported", "error", err.Error())
	}
}

// warnExposure says at start-up, loudly, what the flags leave open.
func warnExposure(c config, authn *server.Authenticator, log *slog.Logger) {
	if authn == nil {
		log.Warn("NO AUTHENTICATION: anyone who can reach " + c.listen + " may enqueue, claim and complete refunds; " +
			"serving open on loopback only. Set --tokens-file (or --tls-client-ca) before exposing it.")
	}
	if c.tokensFile != "" && c.tlsCert == "" && !cli.IsLoopback(c.listen) {
		log.Warn("PLAINTEXT TOKENS (--allow-plaintext): bearer tokens reach " + c.listen + " without TLS; " +
			"only a TLS-terminating proxy or sidecar on this host may stand in front of it")
	}
	if c.metricsListen != "" && !cli.IsLoopback(c.metricsListen) {
		log.Warn("metrics served without authentication beyond loopback; restrict who may reach it",
			"metrics_listen", c.metricsListen)
	}
	if cfg, err := gomysql.ParseDSN(c.mysqlDSN); c.dsnOnCmdLine && err == nil && cfg.Passwd != "" {
		log.Warn("the MySQL password is on the command line, where any local user's ps shows it: " +
			"pass the DSN in JOBFENCE_MYSQL_DSN or --mysql-dsn-file instead")
	}
}

// registry is the process's Prometheus registry: the Go runtime, the
// process, and the store's connection pool.
func registry(st store.Store) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if db, ok := st.(interface{ DB() *sql.DB }); ok {
		reg.MustRegister(collectors.NewDBStatsCollector(db.DB(), "jobfence"))
	}
	return reg
}

// listen binds addr, the value of the listener flag --flagName, so that
// an address in use (the commonest failed start: a coordinator already
// running) names the flag to change.
func listen(flagName, addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	switch {
	case err == nil:
		return lis, nil
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("--%s %s: address already in use: another process listens there (a coordinator "+
			"started earlier?); stop it, or give --%[1]s another address (port 0 picks a free one, logged at start)",
			flagName, addr)
	default:
		return nil, fmt.Errorf("--%s %s: %w", flagName, addr, err)
	}
}

// debugServers are the operator endpoints serveDebug started.
type debugServers []*http.Server

// close stops them, when the start fails after them.
func (d debugServers) close() {
	for _, s := range d {
		s.Close()
	}
}

// serveDebug serves /metrics and pprof when their flags ask for them. Both
// are bound before it returns, so that an address in use fails the start
// naming its flag.
func serveDebug(c config, reg *prometheus.Registry, log *slog.Logger) (debugServers, error) {
	var servers debugServers
	if c.metricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		s, err := serveHTTP("metrics", "metrics-listen", c.metricsListen, mux, log)
		if err != nil {
			return nil, err
		}
		servers = append(servers, s)
	}
	if c.pprofListen != "" {
		mux := http.NewServeMux()
		// No /debug/pprof/cmdline: it would show every flag, a DSN's
		// password among them.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		s, err := serveHTTP("pprof", "pprof-listen", c.pprofListen, mux, log)
		if err != nil {
			servers.close()
			return nil, err
		}
		servers = append(servers, s)
	}
	return servers, nil
}

func openStore(ctx context.Context, c config, log *slog.Logger) (store.Store, error) {
	if c.mysqlDSN != "" {
		st, err := mysql.Open(ctx, c.mysqlDSN, mysql.Options{MaxOpenConns: c.mysqlMaxConns, Contract: c.migrateContract})
		if err != nil {
			return nil, err
		}
		log.Info("store: mysql", "max_conns", c.mysqlMaxConns)
		if pending := st.PendingContract(); len(pending) > 0 {
			log.Warn("contract migrations pending: once every coordinator on this database runs this release, "+
				"apply them with --migrate-only --migrate-contract (DEPLOY.md)", "migrations", strings.Join(pending, ","))
		}
		return st, nil
	}
	st, err := sqlite.Open(ctx, c.sqlitePath, sqlite.Options{})
	if err != nil {
		return nil, err
	}
	log.Warn("store: embedded sqlite, single-node only: run one coordinator on this file; use --mysql-dsn for production",
		"path", c.sqlitePath)
	return st, nil
}

// security loads the credentials and TLS the flags name: the
// authenticator, the gRPC listener's options and the console's TLS
// configuration (nil without --tls-cert).
func security(c config) (*server.Authenticator, []grpc.ServerOption, *tls.Config, error) {
	var authn *server.Authenticator
	var opts []grpc.ServerOption
	var httpsTLS *tls.Config
	if c.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		// Browsers present no client certificate: the console's people
		// sign in with their tokens.
		httpsTLS = cfg.Clone()
		if c.tlsClientCA != "" {
			pem, err := os.ReadFile(c.tlsClientCA)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("--tls-client-ca: %w", err)
			}
			cfg.ClientCAs = x509.NewCertPool()
			if !cfg.ClientCAs.AppendCertsFromPEM(pem) {
				return nil, nil, nil, fmt.Errorf("--tls-client-ca: no certificate in %s", c.tlsClientCA)
			}
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
			authn = server.MutualTLS()
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	if c.tokensFile != "" {
		var err error
		if authn, err = server.LoadTokens(c.tokensFile); err != nil {
			return nil, nil, nil, fmt.Errorf("--tokens-file: %w", err)
		}
	}
	return authn, opts, httpsTLS, nil
}

// serveHTTP serves an operator endpoint (metrics, pprof) on addr, the
// value of --flagName.
func serveHTTP(name, flagName, addr string, h http.Handler, log *slog.Logger) (*http.Server, error) {
	lis, err := listen(flagName, addr)
	if err != nil {
		return nil, err
	}
	log.Info(name+" serving", "listen", lis.Addr().String())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			log.Error(name, "error", err)
		}
	}()
	return srv, nil
}

// coalesceWindow is --coalesce-window as server.Options takes it: 0 there is
// the default, and off is negative.
func coalesceWindow(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
