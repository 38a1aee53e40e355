package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// calibration is what the machine charges for the parts every jobfence call
// is made of, measured one at a time with nothing else running: a statement's
// round trip to the database, a durable COMMIT, and a bare gRPC round trip on
// loopback. Machines of one kind differ by several times in these (shared
// hosts, wake-up costs of virtual CPUs), so a run's results are read against
// its own calibration.
type calibration struct {
	dbRTT, commit, grpcRTT time.Duration // medians
}

const calibrationRounds = 300

func (b *bench) calibrate(ctx context.Context) (calibration, error) {
	var c calibration
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return c, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `CREATE TABLE bench_calibration (id INT PRIMARY KEY, n BIGINT NOT NULL)`); err != nil {
		return c, err
	}
	if _, err := conn.ExecContext(ctx, `INSERT INTO bench_calibration VALUES (1, 0)`); err != nil {
		return c, err
	}
	if c.dbRTT, err = median(calibrationRounds, func() error {
		var one int
		return conn.QueryRowContext(ctx, `SELECT 1`).Scan(&one)
	}); err != nil {
		return c, fmt.Errorf("calibration, SELECT 1: %w", err)
	}
	// Autocommit: each UPDATE is its own durable COMMIT.
	if c.commit, err = median(calibrationRounds/3, func() error {
		_, err := conn.ExecContext(ctx, `UPDATE bench_calibration SET n = n + 1 WHERE id = 1`)
		return err
	}); err != nil {
		return c, fmt.Errorf("calibration, COMMIT: %w", err)
	}
	if c.grpcRTT, err = grpcRoundTrip(ctx); err != nil {
		return c, fmt.Errorf("calibration, gRPC: %w", err)
	}
	return c, nil
}

// grpcRoundTrip is the median round trip of a health check to a gRPC server
// in this process, over loopback TCP.
func grpcRoundTrip(ctx context.Context) (time.Duration, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	check := func() error {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(); err != nil { // connect outside the measurement
		return 0, err
	}
	return median(calibrationRounds, check)
}

// median runs fn n times, one after another, and returns its median duration.
func median(n int, fn func() error) (time.Duration, error) {
	var l latencies
	for range n {
		t := time.Now()
		if err := fn(); err != nil {
			return 0, err
		}
		l = append(l, time.Since(t))
	}
	return l.percentile(0.5), nil
}
