package main

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/jobfence/jobfence/console"
	"github.com/jobfence/jobfence/server"
)

// consoleServer is the operator console on --console-listen, calling this
// coordinator through an in-memory gRPC connection: the same handlers,
// interceptors, roles and fences as any client's call (R29), without a
// network hop or a second set of credentials to the gRPC listener.
type consoleServer struct {
	web  *webServer
	conn *server.InProcess
}

// startConsole serves the console on addr, with TLS when cfg is set.
func startConsole(srv *server.Server, addr string, cfg *tls.Config, webhooks bool, traceLink string,
	log *slog.Logger) (*consoleServer, error) {
	conn, err := srv.InProcess()
	if err != nil {
		return nil, err
	}
	h, err := console.New(console.Options{Coordinator: conn, Secure: cfg != nil, Logger: log, Webhooks: webhooks,
		TraceLinkTemplate: traceLink})
	if err != nil {
		conn.Close()
		return nil, err
	}
	web, err := serveWeb("console", "console-listen", "console serving", addr, "/", h, cfg, log)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &consoleServer{web: web, conn: conn}, nil
}

// shutdown lets the console's requests in flight finish (a bulk action among
// them) for up to timeout, then closes its connection to the coordinator.
func (cs *consoleServer) shutdown(timeout time.Duration) {
	cs.web.shutdown(timeout)
	_ = cs.conn.Close()
}
