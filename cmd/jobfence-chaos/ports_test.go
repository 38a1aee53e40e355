package main

import (
	"net"
	"strconv"
	"testing"
)

// The campaign's fixed addresses lie below the kernel's ephemeral range, so
// that no outgoing connection or port-0 listener takes one between its pick
// and a coordinator's (re)start, and none is handed out twice.
func TestFixedPortsStayOutOfTheEphemeralRange(t *testing.T) {
	low := firstEphemeralPort()
	seen := map[string]bool{}
	for range 50 {
		addr, err := freeLoopbackPort()
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(addr)
		if n, _ := strconv.Atoi(port); n >= low || n < 1024 || seen[addr] {
			t.Fatalf("freeLoopbackPort = %s: want a port in 1024..%d not handed out before", addr, low-1)
		}
		seen[addr] = true
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s is not free: %v", addr, err)
		}
		l.Close()
	}
}
