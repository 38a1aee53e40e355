package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jobfence/jobfence/console"
	"github.com/jobfence/jobfence/server"
)

// consoleServer is the operator console on --console-listen, calling this
// coordinator through an in-memory gRPC connection: the same handlers,
// interceptors, roles and fences as any client's call (R29), without a
// network hop or a second set of credentials to the gRPC listener.
type consoleServer struct {
	http *http.Server
	conn *server.InProcess
}

// startConsole serves the console on addr, with TLS when cfg is set.
func startConsole(srv *server.Server, addr string, cfg *tls.Config, log *slog.Logger) (*consoleServer, error) {
	conn, err := srv.InProcess()
	if err != nil {
		return nil, err
	}
	h, err := console.New(console.Options{Coordinator: conn, Secure: cfg != nil, Logger: log})
	if err != nil {
		conn.Close()
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		conn.Close()
		return nil, err
	}
	cs := &consoleServer{conn: conn, http: &http.Server{Handler: h, TLSConfig: cfg,
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	scheme := "http"
	if cfg != nil {
		scheme = "https"
	}
	log.Info("console serving", "listen", lis.Addr().String(), "url", scheme+"://"+lis.Addr().String()+"/")
	go func() {
		var err error
		if cfg != nil {
			err = cs.http.ServeTLS(lis, "", "")
		} else {
			err = cs.http.Serve(lis)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("console", "error", err)
		}
	}()
	return cs, nil
}

// shutdown lets the console's requests in flight finish (a bulk action among
// them) for up to timeout, then stops its connection to the coordinator.
func (cs *consoleServer) shutdown(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = cs.http.Shutdown(ctx)
	_ = cs.conn.Close()
}
