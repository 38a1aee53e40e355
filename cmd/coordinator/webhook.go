package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobfence/jobfence/store"
	"github.com/jobfence/jobfence/webhook"
)

// webhookServer is the provider webhook endpoint on --webhook-listen: the one
// port a provider must reach from outside, serving POST /webhooks/{provider}
// and nothing else (no API, no console, no metrics).
type webhookServer struct {
	http *http.Server
}

// startWebhooks serves the endpoint of providers on addr, with TLS when cfg
// is set, filing into st.
func startWebhooks(st store.Store, providers map[string]*webhook.Provider, addr string, cfg *tls.Config,
	reg prometheus.Registerer, log *slog.Logger) (*webhookServer, error) {
	h := webhook.NewHandler(providers, st, webhook.NewMetrics(reg), log)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ws := &webhookServer{http: &http.Server{Handler: h, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	scheme := "http"
	if cfg != nil {
		scheme = "https"
	}
	names := make([]string, 0, len(providers))
	for name := range providers {
		names = append(names, name)
	}
	log.Info("webhooks serving", "listen", lis.Addr().String(), "url", scheme+"://"+lis.Addr().String()+"/webhooks/{provider}",
		"providers", names)
	go func() {
		var err error
		if cfg != nil {
			err = ws.http.ServeTLS(lis, "", "")
		} else {
			err = ws.http.Serve(lis)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("webhooks", "error", err)
		}
	}()
	return ws, nil
}

// shutdown lets deliveries in flight be stored and answered, for up to
// timeout: a delivery cut before its answer is delivered again by the
// provider.
func (ws *webhookServer) shutdown(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = ws.http.Shutdown(ctx)
}
