package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobfence/jobfence/fakeprovider"
)

// webhookMaxAttempts is how often the provider tries one event before it
// gives up: with its backoff (100 ms doubling to 5 s) about five minutes,
// longer than any outage the campaign makes, so that an event given up is a
// receipt the coordinators would not take, never one the faults outlasted.
// Real providers retry for days (R28).
const webhookMaxAttempts = 60

// webhookDrainTimeout bounds the wait, after the workers stopped, for the
// provider to deliver what it still owes (held, retried, duplicated events).
const webhookDrainTimeout = 30 * time.Second

// webhookFront is the one address the provider delivers its webhooks to, as
// a load balancer in front of the replicas would be: each delivery goes to
// the next replica's --webhook-listen in turn, with no retry and no health
// check of its own, so a delivery that reaches a killed coordinator fails
// (502) and the provider delivers it again — at least once is the
// provider's promise, not the front's.
type webhookFront struct {
	srv      *http.Server
	addr     string
	replicas []*replica
	next     atomic.Uint64

	mu      sync.Mutex
	answers map[string]map[int]int // by replica name: HTTP status → deliveries answered with it (502: not reached)
}

// startWebhookFront listens on a free loopback port and forwards to the
// replicas' webhook listeners. Errors: the listener's.
func startWebhookFront(replicas []*replica) (*webhookFront, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &webhookFront{addr: ln.Addr().String(), replicas: replicas, answers: map[string]map[int]int{}}
	byHost := map[string]string{}
	for _, r := range replicas {
		byHost[r.webhookListen] = r.name
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.ResponseHeaderTimeout = 15 * time.Second
	rp := &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			r := replicas[int(f.next.Add(1)-1)%len(replicas)]
			pr.SetURL(&url.URL{Scheme: "http", Host: r.webhookListen})
		},
		ModifyResponse: func(resp *http.Response) error {
			f.count(byHost[resp.Request.URL.Host], resp.StatusCode)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			f.count(byHost[req.URL.Host], http.StatusBadGateway)
			http.Error(w, "replica unreachable: "+err.Error(), http.StatusBadGateway)
		},
	}
	f.srv = &http.Server{Handler: rp, ReadHeaderTimeout: 5 * time.Second}
	go f.srv.Serve(ln) //nolint:errcheck // ends with Close
	return f, nil
}

func (f *webhookFront) count(replica string, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.answers[replica] == nil {
		f.answers[replica] = map[int]int{}
	}
	f.answers[replica][status]++
}

// url is the endpoint the provider is given for its webhooks.
func (f *webhookFront) url() string { return "http://" + f.addr + "/webhooks/" + providerName }

// summary says how the replicas answered the deliveries, for the campaign's
// output: "replica-a 2xx=310 400=12 502=4 503=1, replica-b …".
func (f *webhookFront) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for _, r := range f.replicas {
		var statuses []int
		for st := range f.answers[r.name] {
			statuses = append(statuses, st)
		}
		sort.Ints(statuses)
		ok := 0
		var rest []string
		for _, st := range statuses {
			if st >= 200 && st < 300 {
				ok += f.answers[r.name][st]
				continue
			}
			rest = append(rest, fmt.Sprintf("%d=%d", st, f.answers[r.name][st]))
		}
		parts = append(parts, strings.TrimSpace(fmt.Sprintf("%s 2xx=%d %s", r.name, ok, strings.Join(rest, " "))))
	}
	return strings.Join(parts, ", ")
}

func (f *webhookFront) close() {
	if f != nil {
		f.srv.Close()
	}
}

// webhookKeys are the campaign's webhook signing secrets and the files the
// processes read them from.
type webhookKeys struct {
	// coordinatorFile is the coordinators' --webhook-secrets-file, with a
	// line for providerName and one for otherProviderName; providerFile the
	// provider's --webhook-secret-file.
	coordinatorFile, providerFile string
	// own is providerName's secret, the provider's; other is
	// otherProviderName's, which only the forger signs with.
	own, other []byte
}

// otherProviderName is the second provider whose webhooks the coordinators
// take: no job of the campaign is its, so a signed event of it names none
// of its own (R28: a webhook of provider P touches only P's jobs).
const otherProviderName = "globex"

// writeWebhookSecrets writes fresh signing secrets for the campaign into
// dir, in the two forms their readers take: the coordinators' secrets file
// ("<provider> stripe <secret>", for providerName and otherProviderName)
// and the provider's secret file (its first line). Both are readable by
// their owner alone.
func writeWebhookSecrets(dir string) (webhookKeys, error) {
	var k webhookKeys
	for _, secret := range []*[]byte{&k.own, &k.other} {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return k, err
		}
		*secret = []byte("whsec_chaos_" + hex.EncodeToString(b))
	}
	k.coordinatorFile = filepath.Join(dir, "webhook-secrets")
	k.providerFile = filepath.Join(dir, "webhook-secret")
	lines := fmt.Sprintf("%s stripe %s\n%s stripe %s\n", providerName, k.own, otherProviderName, k.other)
	if err := os.WriteFile(k.coordinatorFile, []byte(lines), 0o600); err != nil {
		return k, err
	}
	if err := os.WriteFile(k.providerFile, append(slices.Clone(k.own), '\n'), 0o600); err != nil {
		return k, err
	}
	return k, nil
}

// The provider has one set of global faults; the provider lane (API faults),
// the provider-slow lane (its hangs) and the webhook lane (webhook modes)
// each own their part of it, and whichever sets its part writes the union.

// setAPIFaults replaces the API part of the provider's faults, keeping the
// provider-slow lane's hangs and the webhook lane's modes.
func (s *system) setAPIFaults(ctx context.Context, fs fakeprovider.Faults) error {
	s.provMu.Lock()
	defer s.provMu.Unlock()
	s.apiFaults = withoutWebhookModes(fs)
	return s.writeProviderFaults(ctx, unionOfFaults(s.apiFaults, s.slowFaults, s.hookFaults))
}

// setWebhookModes replaces the webhook part of the provider's faults.
func (s *system) setWebhookModes(ctx context.Context, modes fakeprovider.Faults) error {
	s.provMu.Lock()
	defer s.provMu.Unlock()
	s.hookFaults = modes
	api, err := s.apiFaultsLeft(ctx)
	if err != nil {
		return err
	}
	return s.writeProviderFaults(ctx, unionOfFaults(api, s.slowFaults, modes))
}

// setSlowFaults replaces the provider-slow part of the provider's faults:
// its hangs.
func (s *system) setSlowFaults(ctx context.Context, hangs fakeprovider.Faults) error {
	s.provMu.Lock()
	defer s.provMu.Unlock()
	s.slowFaults = fakeprovider.Faults{HangBefore: hangs.HangBefore, HangAfter: hangs.HangAfter}
	api, err := s.apiFaultsLeft(ctx)
	if err != nil {
		return err
	}
	return s.writeProviderFaults(ctx, unionOfFaults(api, s.slowFaults, s.hookFaults))
}

// apiFaultsLeft is what is left of the API part: a counted fault (Times,
// ErrorBurst) counts down at the provider, and writing the plan's count
// again would stretch it, so its count is read back first; one that ran
// out cleared the provider's faults, the other parts' with it, until a
// lane sets its part again (they may end early, never late). Called with
// provMu held.
func (s *system) apiFaultsLeft(ctx context.Context) (fakeprovider.Faults, error) {
	api := s.apiFaults
	if api.Times == 0 && api.ErrorBurst == 0 {
		return api, nil
	}
	cur, err := s.pay.Faults(ctx)
	if err != nil {
		return api, fmt.Errorf("read provider faults: %w", err)
	}
	switch {
	case api.Times > 0 && cur.Times == 0:
		return fakeprovider.Faults{}, nil
	case api.Times > 0:
		api.Times = cur.Times
	}
	api.ErrorBurst = min(api.ErrorBurst, cur.ErrorBurst)
	return api, nil
}

// clearProviderFaults ends every part (heal).
func (s *system) clearProviderFaults(ctx context.Context) error {
	s.provMu.Lock()
	defer s.provMu.Unlock()
	s.apiFaults, s.slowFaults, s.hookFaults = fakeprovider.Faults{}, fakeprovider.Faults{}, fakeprovider.Faults{}
	return s.pay.ClearFaults(ctx)
}

func (s *system) writeProviderFaults(ctx context.Context, fs fakeprovider.Faults) error {
	if fs.IsZero() {
		return s.pay.ClearFaults(ctx)
	}
	_, err := s.pay.SetFaults(ctx, fs)
	return err
}

// unionOfFaults is the provider's faults of the three parts: the API
// faults with the webhook modes of hooks, each hang the longer of the API
// part's and the provider-slow part's.
func unionOfFaults(api, slow, hooks fakeprovider.Faults) fakeprovider.Faults {
	f := withWebhookModes(api, hooks)
	f.HangBefore, f.HangAfter = max(f.HangBefore, slow.HangBefore), max(f.HangAfter, slow.HangAfter)
	return f
}

// withoutWebhookModes is f with its webhook modes off.
func withoutWebhookModes(f fakeprovider.Faults) fakeprovider.Faults {
	return withWebhookModes(f, fakeprovider.Faults{})
}

// withWebhookModes is f with the webhook modes of modes instead of its own.
func withWebhookModes(f, modes fakeprovider.Faults) fakeprovider.Faults {
	f.WebhookDelay, f.WebhookDuplicate, f.WebhookReorder = modes.WebhookDelay, modes.WebhookDuplicate, modes.WebhookReorder
	f.WebhookBadSignature, f.WebhookOldTimestamp = modes.WebhookBadSignature, modes.WebhookOldTimestamp
	f.WebhookDrop = modes.WebhookDrop
	return f
}

// applyWebhook runs one webhook-* fault: the events of the refunds the
// provider makes while it lasts carry its mode.
func (s *system) applyWebhook(ctx context.Context, f fault) (string, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.setWebhookModes(actx, f.webhookModes()); err != nil {
		return "", fmt.Errorf("set webhook faults: %w", err)
	}
	s.tl.printf("fault #%d %s", f.N, f)
	sleepCtx(ctx, f.For)
	cctx, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel2()
	if err := s.setWebhookModes(cctx, fakeprovider.Faults{}); err != nil {
		return "", fmt.Errorf("clear webhook faults: %w", err)
	}
	return "", nil
}

// drainWebhooks waits (at most webhookDrainTimeout) until the provider owes
// no delivery and no refund is still pending (its settling events are yet
// to come), so that the checks judge every receipt the provider will ever
// send. It reports what is still owed when the wait ends early.
func (s *system) drainWebhooks(ctx context.Context) {
	start := time.Now()
	deadline := start.Add(webhookDrainTimeout)
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		o, err := s.pay.Oracle(octx)
		cancel()
		pendingRefunds := 0
		for _, r := range o.Refunds {
			if r.Status == fakeprovider.StatusPending {
				pendingRefunds++
			}
		}
		if err == nil && o.Webhooks.Pending == 0 && pendingRefunds == 0 {
			s.tl.printf("webhooks drained after %s: %d events, %d never delivered", time.Since(start).Round(100*time.Millisecond),
				len(o.Webhooks.Events), o.Webhooks.Undelivered)
			return
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 250*time.Millisecond) {
			s.tl.printf("webhooks not drained after %s: %d events still owed, %d refunds still pending (err=%v)",
				webhookDrainTimeout, o.Webhooks.Pending, pendingRefunds, err)
			return
		}
	}
}

// webhookRefusals counts, over every coordinator process, the deliveries
// refused before anything was stored, by reason ("webhook refused": a bad
// signature, a stale timestamp…), and the events not stored (answered 503,
// delivered again).
func (s *system) webhookRefusals() (refused map[string]int, notStored int) {
	refused = map[string]int{}
	s.eachCoordinatorRecord(func(rec map[string]any) {
		switch rec["msg"] {
		case "webhook refused":
			refused[str(rec["reason"])]++
		case "webhook event not stored; the provider will deliver it again":
			notStored++
		}
	})
	return refused, notStored
}
