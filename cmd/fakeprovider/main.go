// Command fakeprovider serves the simulated payment provider of package
// fakeprovider over HTTP, for workers and chaos tests to refund against.
//
// With --webhook-url and --webhook-secret-file it sends Stripe-signed
// webhooks about its refunds to that endpoint (package fakeprovider,
// "Webhooks"), at most --webhook-max-attempts tries each; on SIGTERM it stops
// sending. The secret file is the coordinator's --webhook-secrets-file, one
// file for both: the provider signs with the line of the provider its URL
// names (/webhooks/<provider>).
//
// Every flag falls back to an environment variable: --listen to
// FAKEPROVIDER_LISTEN, --key-retention to FAKEPROVIDER_KEY_RETENTION, and so
// on. Run with -h for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
	"github.com/jobfence/jobfence/internal/cli"
	"github.com/jobfence/jobfence/webhook"
)

func main() {
	cli.Main("fakeprovider", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stderr) })
}

type config struct {
	listen          string
	keyRetention    time.Duration
	faults          fakeprovider.Faults
	latency         time.Duration
	shutdownTimeout time.Duration
	log             cli.Log

	webhookURL        string
	webhookSecretFile string
	// webhookSecret is what the provider signs with, read from the file:
	// the line of webhookProvider, or the first line of a file in the
	// older one-line form (webhookProvider empty).
	webhookSecret      string
	webhookProvider    string
	webhookMaxAttempts int
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("fakeprovider", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8099", "HTTP listen address (port 0 picks a free port, logged at start)")
	fs.DurationVar(&c.keyRetention, "key-retention", fakeprovider.DefaultKeyRetention,
		"how long an Idempotency-Key is remembered; past it a same-key resend creates a new refund")
	fs.Func("faults", "global faults at start, in X-Fake-Fault syntax, e.g. pending=30,lookup_lag=5 or "+
		"cut_reply,key=op-1,times=1 (modes: hang_before=N hang_after=N cut_reply pending=N lookup_lag=N "+
		"error_burst=N fail webhook_delay=N webhook_duplicate webhook_reorder webhook_bad_signature "+
		"webhook_old_timestamp webhook_drop key=K times=N; N in seconds or a Go duration)",
		func(s string) error {
			f, err := fakeprovider.ParseFaults(s)
			if err == nil {
				err = f.Validate()
			}
			c.faults = f
			return err
		})
	fs.DurationVar(&c.latency, "latency", 0,
		"hold every refund creation this long before acting, like a real provider's round trip (0: answer at once)")
	fs.StringVar(&c.webhookURL, "webhook-url", "",
		"send Stripe-signed webhooks (refund.created, refund.updated, refund.failed, charge.refunded) to this "+
			"endpoint, e.g. http://127.0.0.1:8443/webhooks/acme; needs --webhook-secret-file; off when empty")
	fs.StringVar(&c.webhookSecretFile, "webhook-secret-file", "",
		"the signing secrets, in the coordinator's --webhook-secrets-file format (lines <provider> stripe <secret>; the "+
			"same file serves both): this provider signs with the line of the provider --webhook-url names "+
			"(.../webhooks/<provider>), the second of two while rotating. A file whose first line is the secret "+
			"alone, the older form, is still read")
	fs.IntVar(&c.webhookMaxAttempts, "webhook-max-attempts", fakeprovider.DefaultWebhookMaxAttempts,
		"attempts at delivering one webhook event (retried after 100ms, doubling to 5s) before it is given up")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 5*time.Second,
		"on SIGTERM, how long in-flight requests (hangs included) may finish before connections are cut")
	c.log.Register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: fakeprovider [flags]\n\n"+
			"A simulated payment provider (refunds with Stripe-like idempotency, fault injection, an oracle).\n"+
			"Every flag falls back to the environment variable FAKEPROVIDER_<FLAG> (upper case, '-' as '_'),\n"+
			"e.g. FAKEPROVIDER_KEY_RETENTION.\n\n")
		fs.PrintDefaults()
	}
	if err := cli.Parse(fs, args, "FAKEPROVIDER"); err != nil {
		return c, err
	}
	if c.keyRetention <= 0 {
		return c, fmt.Errorf("--key-retention must be positive, got %s", c.keyRetention)
	}
	if c.latency < 0 {
		return c, fmt.Errorf("--latency must not be negative, got %s (e.g. --latency=50ms)", c.latency)
	}
	if c.shutdownTimeout < 0 {
		return c, fmt.Errorf("--shutdown-timeout must not be negative, got %s", c.shutdownTimeout)
	}
	if err := c.log.Validate(); err != nil {
		return c, err
	}
	if err := c.readWebhookSecret(); err != nil {
		return c, err
	}
	return c, nil
}

// readWebhookSecret checks the webhook flags and reads the secret's file.
func (c *config) readWebhookSecret() error {
	switch {
	case c.webhookURL == "" && c.webhookSecretFile != "":
		return errors.New("--webhook-secret-file needs --webhook-url")
	case c.webhookURL == "":
		return nil
	case c.webhookSecretFile == "":
		return errors.New("--webhook-url needs --webhook-secret-file (the signing secret)")
	case c.webhookMaxAttempts < 1:
		return fmt.Errorf("--webhook-max-attempts must be at least 1, got %d", c.webhookMaxAttempts)
	}
	b, err := os.ReadFile(c.webhookSecretFile)
	if err != nil {
		return fmt.Errorf("--webhook-secret-file: %w", err)
	}
	// The older form: the first line is the secret alone.
	first, _, _ := strings.Cut(string(b), "\n")
	if first = strings.TrimSpace(first); first != "" && !strings.HasPrefix(first, "#") && len(strings.Fields(first)) == 1 {
		c.webhookSecret = first
	} else if c.webhookProvider, c.webhookSecret, err = secretOf(c.webhookSecretFile, c.webhookURL); err != nil {
		return err
	}
	if err := c.providerConfig().Validate(); err != nil {
		return fmt.Errorf("--webhook-url: %w", err)
	}
	return nil
}

// secretOf reads a secrets file in the coordinator's format (webhook.LoadSecrets:
// "<provider> stripe <secret>" lines, two for a provider while its secret is
// rotated) and returns the provider url delivers to, /webhooks/<provider> as
// the coordinator serves it, and the secret to sign with: its last line, the
// new secret while rotating (the coordinator verifies with both). A file of
// one provider serves a URL of another shape too.
func secretOf(path, url string) (provider, secret string, err error) {
	providers, err := webhook.LoadSecrets(path, webhook.DefaultTolerance)
	if err != nil {
		return "", "", fmt.Errorf("--webhook-secret-file: %w (want the coordinator's format, <provider> stripe <secret> "+
			"a line, or the secret alone on the first line)", err)
	}
	names := slices.Sorted(maps.Keys(providers))
	u, err := neturl.Parse(url)
	if err != nil {
		return "", "", fmt.Errorf("--webhook-url: %w", err)
	}
	segments := strings.Split(strings.Trim(u.Path, "/"), "/")
	switch n := len(segments); {
	case n >= 2 && segments[n-2] == "webhooks":
		provider = segments[n-1]
	case len(names) == 1:
		provider = names[0]
	default:
		return "", "", fmt.Errorf("--webhook-url %s does not end in /webhooks/<provider>, and --webhook-secret-file %s "+
			"has the secrets of %s: which one to sign with?", url, path, strings.Join(names, ", "))
	}
	p, ok := providers[provider]
	if !ok {
		return "", "", fmt.Errorf("--webhook-secret-file %s has no line for %s, the provider --webhook-url names "+
			"(it has %s): add \"%[2]s stripe <secret>\", the line the coordinator verifies %[2]s's webhooks with",
			path, provider, strings.Join(names, ", "))
	}
	return provider, string(p.Secrets[len(p.Secrets)-1]), nil
}

// providerConfig is the provider's configuration (without its logger).
func (c config) providerConfig() fakeprovider.Config {
	return fakeprovider.Config{KeyRetention: c.keyRetention, Faults: c.faults, Latency: c.latency, WebhookURL: c.webhookURL,
		WebhookSecret: c.webhookSecret, WebhookMaxAttempts: c.webhookMaxAttempts}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := c.log.New(stderr)

	pc := c.providerConfig()
	pc.Logger = log
	p := fakeprovider.New(pc)
	// Deferred, the sender stops after the server has shut down (SIGTERM):
	// attempts in flight are cancelled, nothing more is sent.
	defer func() {
		p.Close()
		if w := p.Oracle().Webhooks; w.Enabled {
			attempts := 0
			for _, e := range w.Events {
				attempts += len(e.Attempts)
			}
			log.Info("webhook sender stopped", "events", len(w.Events), "attempts", attempts, "pending", w.Pending,
				"undelivered", w.Undelivered)
		}
	}()
	lis, err := net.Listen("tcp", c.listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("--listen %s: address already in use: another process listens there (a fake provider "+
			"started earlier?); stop it, or give --listen another address (port 0 picks a free one, logged at start)",
			c.listen)
	}
	if err != nil {
		return fmt.Errorf("--listen %s: %w", c.listen, err)
	}
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("fakeprovider serving", "listen", lis.Addr().String(), "key_retention", c.keyRetention,
		"faults", c.faults.String(), "latency", c.latency.String(), "webhook_url", c.webhookURL, "webhook_secret_of", c.webhookProvider)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", c.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Hanging requests outlived the timeout: cutting their connections
		// ends the hangs (they watch their request's context).
		log.Warn("shutdown timeout: cutting remaining connections", "err", err)
		return srv.Close()
	}
	return nil
}
