package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// tcpProxy is an in-process toxiproxy listener on loopback in front of one
// upstream, whose connections the campaign delays, cuts and blackholes. The
// campaign runs two per replica: the replica's own way to MariaDB (every
// database fault, the failover's repoint), and its workers' way to the
// coordinator (the worker front, which a coordinator-stream-cut takes Down
// and Up: every worker stream and call on it cut, the coordinator left
// running). Its address never changes, so a restarted coordinator or worker
// finds it with the same flags.
type tcpProxy struct {
	name  string
	proxy *toxiproxy.Proxy

	mu     sync.Mutex
	toxics map[string]bool
	down   bool
}

// toxiServer is the toxiproxy server object the proxies hang off; its HTTP
// API is never started.
var toxiServer = sync.OnceValue(func() *toxiproxy.ApiServer {
	return toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
})

// newTCPProxy starts a proxy on a free loopback port in front of upstream.
// Errors: the listener could not be opened.
func newTCPProxy(name, upstream string) (*tcpProxy, error) {
	p := toxiproxy.NewProxy(toxiServer(), name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	return &tcpProxy{name: name, proxy: p, toxics: map[string]bool{}}, nil
}

// Addr is the proxy's listen address, the same across Down/Up.
func (d *tcpProxy) Addr() string { return d.proxy.Listen }

// addToxic adds a toxic (toxiproxy's JSON shape) under name. Errors: a bad
// toxic, or one by that name already there.
func (d *tcpProxy) addToxic(name, typ, stream string, attrs any) error {
	body, err := json.Marshal(map[string]any{
		"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs,
	})
	if err != nil {
		return err
	}
	if _, err := d.proxy.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		return fmt.Errorf("proxy %s: add %s toxic: %w", d.name, typ, err)
	}
	d.mu.Lock()
	d.toxics[name] = true
	d.mu.Unlock()
	return nil
}

// removeToxic removes the named toxic; a missing one is no error.
func (d *tcpProxy) removeToxic(name string) {
	d.mu.Lock()
	had := d.toxics[name]
	delete(d.toxics, name)
	d.mu.Unlock()
	if had {
		_ = d.proxy.Toxics.RemoveToxic(context.Background(), name)
	}
}

// Down closes the listener and every connection through it: new connections
// are refused until Up.
func (d *tcpProxy) Down() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = true
	d.proxy.Stop()
}

// Up opens the listener again on the same address. Errors: the port could not
// be bound again.
func (d *tcpProxy) Up() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.down {
		return nil
	}
	if err := d.proxy.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		return fmt.Errorf("proxy %s: listen again on %s: %w", d.name, d.proxy.Listen, err)
	}
	d.down = false
	return nil
}

// Repoint sends the proxy's connections to upstream from now on, as a
// failover's DNS or VIP move does: the listener stays on its address, every
// open connection (to the old server) is cut, and new ones reach upstream.
// A proxy that is down (a db-down fault) stays down and reaches upstream
// once Up. Toxics stay in place. Errors: the port could not be bound again.
func (d *tcpProxy) Repoint(upstream string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	// Stop waits until the accept loop has ended, so that no goroutine reads
	// Upstream while it changes; it closes every connection through it.
	d.proxy.Stop()
	d.proxy.Upstream = upstream
	if d.down {
		return nil
	}
	if err := d.proxy.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		return fmt.Errorf("proxy %s: listen again on %s: %w", d.name, d.proxy.Listen, err)
	}
	return nil
}

// Heal removes every toxic and brings the listener back.
func (d *tcpProxy) Heal() error {
	d.mu.Lock()
	names := make([]string, 0, len(d.toxics))
	for n := range d.toxics {
		names = append(names, n)
	}
	d.mu.Unlock()
	for _, n := range names {
		d.removeToxic(n)
	}
	return d.Up()
}

// Close stops the proxy for good.
func (d *tcpProxy) Close() { d.proxy.Stop() }

// commitCutType is the toxic type name of commitCut.
const commitCutType = "jobfence_commit_cut"

func init() { toxics.Register(commitCutType, new(commitCut)) }

// commitCut is a toxic for the client→server stream that watches for the
// MySQL COM_QUERY "COMMIT" packet and cuts the connection at it: with
// Deliver, after handing the COMMIT to the server (the transaction commits,
// the reply is lost: the outcome is unknown to the coordinator, R7, R10,
// R20, T4); without, before (the server rolls the transaction back). Count
// bounds how many COMMITs it cuts, over all connections of the proxy.
type commitCut struct {
	Deliver bool         `json:"deliver"`
	Count   int64        `json:"count"`
	cut     atomic.Int64 // COMMITs seen; the first Count are cut
}

// commitPacket is COM_QUERY (0x03) "COMMIT" with its 3-byte length and
// sequence id 0, as go-sql-driver/mysql sends it.
var commitPacket = []byte{7, 0, 0, 0, 3, 'C', 'O', 'M', 'M', 'I', 'T'}

// Pipe implements toxics.Toxic.
func (t *commitCut) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if bytes.Equal(c.Data, commitPacket) && t.cut.Add(1) <= t.Count {
				if t.Deliver {
					stub.Output <- c
				}
				stub.Close()
				// The toxics before this one may still hand over data until the
				// client notices the cut; take it so they can finish.
				for range stub.Input { //nolint:revive // draining
				}
				return
			}
			stub.Output <- c
		}
	}
}

// cuts returns how many COMMITs the named commitCut toxic has cut.
func (d *tcpProxy) cuts(name string) int64 {
	w := d.proxy.Toxics.GetToxic(name)
	if w == nil {
		return 0
	}
	if t, ok := w.Toxic.(*commitCut); ok {
		return min(t.cut.Load(), t.Count)
	}
	return 0
}
