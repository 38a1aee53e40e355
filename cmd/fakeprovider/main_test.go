package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

func TestFlagsFallBackToEnv(t *testing.T) {
	t.Setenv("FAKEPROVIDER_KEY_RETENTION", "2h")
	t.Setenv("FAKEPROVIDER_FAULTS", "pending=30,lookup_lag=5")
	t.Setenv("FAKEPROVIDER_LISTEN", "127.0.0.1:9999")
	c, err := parseFlags([]string{"--listen", "127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := fakeprovider.Faults{Pending: 30 * time.Second, LookupLag: 5 * time.Second}
	if c.keyRetention != 2*time.Hour || c.faults != want || c.listen != "127.0.0.1:0" {
		t.Fatalf("config = %+v; want env values, with the command line winning", c)
	}
}

func TestFlagsRejectBadValues(t *testing.T) {
	for _, args := range [][]string{
		{"--faults", "explode"},
		{"--key-retention", "0s"},
		{"--log-format", "xml"},
		{"extra"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	t.Setenv("FAKEPROVIDER_FAULTS", "pending=-1")
	if _, err := parseFlags(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "FAKEPROVIDER_FAULTS") {
		t.Errorf("bad env value: err = %v, want it named", err)
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err = %v", err)
	}
}

func TestRunServesAndShutsDown(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs, logw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--log-format", "json", "--faults", "pending=60"}, logw)
		logw.Close()
	}()

	lines := bufio.NewScanner(logs)
	var addr string
	for addr == "" && lines.Scan() {
		var rec struct{ Msg, Listen string }
		if json.Unmarshal(lines.Bytes(), &rec) == nil && rec.Msg == "fakeprovider serving" {
			addr = rec.Listen
		}
	}
	if addr == "" {
		t.Fatalf("no serving line; run returned %v", <-done)
	}
	go io.Copy(io.Discard, logs)

	c := fakeprovider.NewClient("http://"+addr, nil)
	r, err := c.CreateRefund(ctx, "op-1", fakeprovider.RefundParams{PaymentID: "pay_1", AmountMinor: 100, Currency: "EUR"})
	if err != nil || r.Status != fakeprovider.StatusPending {
		t.Fatalf("create: %+v, %v; want pending from --faults", r, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}
