package main

import (
	"crypto/tls"
	"log/slog"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/webhook"
)

// startWebhooks serves the provider webhook endpoint on addr (--webhook-listen):
// the one port a provider must reach from outside, serving POST
// /webhooks/{provider} and nothing else (no API, no console, no metrics),
// with TLS when cfg is set, filing into st. A delivery cut by a shutdown is
// delivered again by its provider.
func startWebhooks(st store.Store, providers map[string]*webhook.Provider, addr string, cfg *tls.Config,
	reg prometheus.Registerer, log *slog.Logger) (*webServer, error) {
	h := webhook.NewHandler(providers, st, webhook.NewMetrics(reg), log)
	var names []string
	for name := range providers {
		names = append(names, name)
	}
	slices.Sort(names)
	return serveWeb("webhooks", "webhook-listen", "webhooks serving", addr, "/webhooks/{provider}", h, cfg, log,
		"providers", names)
}
