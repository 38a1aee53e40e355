package server

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// InProcess is a gRPC connection to a Server through memory: the calls go
// through the same grpc.Server options, interceptors (authentication and
// roles among them), handlers and fences as a client's over a socket, with
// no network hop. The operator console inside the coordinator calls the API
// this way (R29).
type InProcess struct {
	*grpc.ClientConn
	gs *grpc.Server
}

// InProcess serves s on an in-memory listener and returns a connection to
// it. Close it before s.Close.
func (s *Server) InProcess() (*InProcess, error) {
	mem := bufconn.Listen(1 << 20)
	gs, _ := s.NewGRPCServer()
	go gs.Serve(mem) //nolint:errcheck // ends with Stop
	conn, err := grpc.NewClient("passthrough:///coordinator",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return mem.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		gs.Stop()
		return nil, err
	}
	return &InProcess{ClientConn: conn, gs: gs}, nil
}

// Close closes the connection and stops its server.
func (p *InProcess) Close() error {
	err := p.ClientConn.Close()
	p.gs.Stop()
	return err
}
