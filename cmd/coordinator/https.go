package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"time"
)

// webServer is one of the coordinator's HTTP listeners for people and
// providers (the console, the webhooks): HTTPS when the coordinator has a
// certificate, with bounded reads and headers.
type webServer struct {
	http *http.Server
}

// serveWeb serves h on addr, the value of --flagName, with TLS when cfg is
// set, and logs msg with the address it listens on and the URL of path
// there.
func serveWeb(name, flagName, msg, addr, path string, h http.Handler, cfg *tls.Config, log *slog.Logger,
	attrs ...any) (*webServer, error) {
	lis, err := listen(flagName, addr)
	if err != nil {
		return nil, err
	}
	ws := &webServer{http: &http.Server{Handler: h, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	scheme := "http"
	if cfg != nil {
		scheme = "https"
	}
	log.Info(msg, append([]any{"listen", lis.Addr().String(), "url", scheme + "://" + lis.Addr().String() + path}, attrs...)...)
	go func() {
		var err error
		if cfg != nil {
			err = ws.http.ServeTLS(lis, "", "")
		} else {
			err = ws.http.Serve(lis)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error(name, "error", err)
		}
	}()
	return ws, nil
}

// shutdown lets the requests in flight finish for up to timeout.
func (ws *webServer) shutdown(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = ws.http.Shutdown(ctx)
}
