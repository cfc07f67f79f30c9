package kvfault

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvevents/zmtpguard/zmtptest"
)

// rawKVPeer listens on an endpoint's KV port and runs serve on each
// connection, counting them.
type rawKVPeer struct {
	mu    sync.Mutex
	n     int
	conns []net.Conn
}

func listenRaw(t *testing.T, host string, port int, serve func(c net.Conn)) *rawKVPeer {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	p := &rawKVPeer{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.n++
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			go serve(c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *rawKVPeer) accepted() int { p.mu.Lock(); defer p.mu.Unlock(); return p.n }

// batch is one [topic, seq, payload] message storing hashes.
func batch(t *testing.T, seq uint64, hashes ...uint64) []byte {
	t.Helper()
	b := &kvevents.Batch{TS: 1, HasRank: true, Events: []kvevents.Event{{Type: kvevents.BlockStored, BlockHashes: hashes, BlockSize: 16, Medium: "GPU"}}}
	payload, err := kvevents.AppendEncode(nil, b, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return zmtptest.Message(kvevents.BuildMessage([]byte("kv-events"), seq, payload)...)
}

func urlEndpoint(t *testing.T, url string) endpoint {
	t.Helper()
	h, p, err := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return endpoint{h, n}
}

// faultSetup starts kvgate and a rule over a real engine on <block>.11
// (ep 0, KV events on zmq) and, on <block>.12 (ep 1), an engine without KV
// events whose KV port zmq is served by kvPeer instead.
func faultSetup(t *testing.T, kvPeer func(host string, port int)) (d *daemon, service int, base string) {
	t.Helper()
	block := testnet.Block(t)
	h0, h1 := block+"11", block+"12"
	zmq := testnet.PortPair(t, h0, 1000)
	e0 := startEngine(t, engineConfig("engine-0", h0, 0, zmq))
	e1 := startEngine(t, engineConfig("engine-1", h1, 0, 0))
	kvPeer(h1, zmq)
	d = startDaemon(t, block)
	service, base = d.createRule(t, block, zmq, []endpoint{urlEndpoint(t, e0.URL()), urlEndpoint(t, e1.URL())})
	return d, service, base
}

// warmRoutes checks that kvgate still routes normally: a cold prompt lands
// somewhere, and once ep 0 has published its blocks, a prompt sharing the
// prefix gets a real tier-1.5 hit (cached tokens > 0) when it goes to ep 0.
func warmRoutes(t *testing.T, d *daemon, service int, base string, salt int) {
	t.Helper()
	prefix := tokens(10000+salt*1000, 64)
	for i := range 20 {
		r := complete(t, base, append(slices.Clone(prefix), tokens(90000+i, 5)...))
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		if r.field("tier") == "1.5" {
			if r.cached == 0 {
				t.Fatalf("tier-1.5 hit with 0 cached tokens: decision %q from %s", r.decision, r.engine)
			}
			return
		}
		if r.engine == "engine-0" {
			waitFor(t, "ep 0's blocks", 5*time.Second, func() bool { return len(d.inventory(t, service, 0)) >= 4 })
		}
	}
	t.Fatal("no request sharing a cached prefix was routed by tier 1.5")
}

// TestHostilePeer: whoever holds ep 1's KV port completes the ZMTP handshake
// and declares a 2^50-byte frame on every connection. Before zmtpguard this
// killed the kvgate process on the first one; now ep 1's subscriber drops
// the connection and retries, ep 1's inventory stays empty, and ep 0 routes
// as before.
func TestHostilePeer(t *testing.T) {
	t.Parallel()
	var peer *rawKVPeer
	d, service, base := faultSetup(t, func(host string, port int) {
		peer = listenRaw(t, host, port, func(c net.Conn) {
			if zmtptest.Handshake(c, "PUB") == nil {
				_, _ = c.Write(zmtptest.LongHeader(0, 1<<50))
			}
		})
	})
	waitFor(t, "three hostile connections", 30*time.Second, func() bool { d.alive(t); return peer.accepted() >= 3 })
	d.alive(t)
	if got := d.inventory(t, service, 1); len(got) != 0 {
		t.Errorf("ep 1 inventory = %v, want empty", got)
	}
	if n := d.metric(t, "loxilb_kv_subscriber_recv_error_total", map[string]string{"ep": "1"}); n < 1 {
		t.Errorf("recv errors for ep 1 = %v, want ≥ 1", n)
	}
	warmRoutes(t, d, service, base, 1)
	d.alive(t)
}

// TestSilentPublisher: ep 1's publisher sends two batches, then holds the
// connection open and says nothing more. Silence is not a reason to drop
// state: its blocks stay, its subscriber stays connected, and requests route.
func TestSilentPublisher(t *testing.T) {
	t.Parallel()
	held := []uint64{111, 222, 333}
	d, service, base := faultSetup(t, func(host string, port int) {
		listenRaw(t, host, port, func(c net.Conn) {
			if zmtptest.Handshake(c, "PUB") != nil {
				return
			}
			// Repeat batch 0 until the subscription is in place (a
			// duplicate is ignored), then batch 1, then silence.
			for range 25 {
				if _, err := c.Write(batch(t, 0, held[:2]...)); err != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			_, _ = c.Write(batch(t, 1, held[2]))
		})
	})
	waitFor(t, "ep 1's batches", 15*time.Second, func() bool { return len(d.inventory(t, service, 1)) == len(held) })
	time.Sleep(time.Second) // silence
	if got := d.inventory(t, service, 1); !slices.Equal(got, held) {
		t.Errorf("ep 1 inventory after silence = %v, want %v", got, held)
	}
	if n := d.metric(t, "loxilb_kv_subscriber_connected", map[string]string{"ep": "1"}); n != 1 {
		t.Errorf("ep 1 subscriber connected = %v, want 1", n)
	}
	warmRoutes(t, d, service, base, 2)
}

// TestEngineRestartSequenceReset: the engine holding a prompt's blocks
// restarts (sequence from 0, empty cache) and publishes nothing yet. kvgate
// must drop its old blocks before any new batch arrives: with a replay
// socket when the subscriber reconnects (the replay shows a new history),
// without one when the health probe sees the engine come back. Before, they
// stayed until the new engine published, and the next request sharing the
// prefix got a tier-1.5 "hit" with 0 cached tokens.
func TestEngineRestartSequenceReset(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		replay bool
		reason string // the clear's reason label
	}{
		{"replay: reconnect check", true, "restart"},
		{"no replay: probe up", false, "unverified"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			block := testnet.Block(t)
			hosts := []string{block + "11", block + "12"}
			zmq := testnet.PortPair(t, hosts[0], 1000)
			for {
				if l, err := net.Listen("tcp", net.JoinHostPort(hosts[1], strconv.Itoa(zmq+1000))); err == nil {
					l.Close()
					break
				}
				zmq = testnet.PortPair(t, hosts[0], 1000)
			}
			cfgs := make([]enginesim.Config, 2)
			engines := make([]*enginesim.Engine, 2)
			for i, h := range hosts {
				cfgs[i] = engineConfig("engine-"+strconv.Itoa(i), h, testnet.Port(t, h), zmq)
				engines[i] = startEngine(t, cfgs[i])
			}
			var env []string
			if !tc.replay {
				env = append(env, "LLB_KV_REPLAY_PORT_OFFSET=0")
			}
			d := startDaemon(t, block, env...)
			service, base := d.createRule(t, block, zmq, []endpoint{urlEndpoint(t, engines[0].URL()), urlEndpoint(t, engines[1].URL())},
				map[string]any{"probeInterval": 1, "probeRetries": 1, "probeTimeout": 1})
			svc := strconv.Itoa(service)
			waitFor(t, "both subscribers", 15*time.Second, func() bool {
				return d.metric(t, "loxilb_kv_subscriber_connected", map[string]string{"service": svc}) == 2
			})
			time.Sleep(200 * time.Millisecond) // ZeroMQ subscriptions settle after the connect

			prefix := tokens(20000, 64)
			cold := complete(t, base, append(slices.Clone(prefix), 1, 2, 3))
			if cold.status != 200 {
				t.Fatalf("cold: %d %s", cold.status, cold.body)
			}
			x, _ := strconv.Atoi(cold.field("ep"))
			ep := strconv.Itoa(x)
			waitFor(t, "the cold prompt's blocks", 10*time.Second, func() bool { return len(d.inventory(t, service, x)) >= 4 })
			warm := complete(t, base, append(slices.Clone(prefix), 4, 5, 6))
			if warm.field("tier") != "1.5" || warm.field("ep") != ep || warm.cached == 0 {
				t.Fatalf("warm before the restart: decision %q cached %d, want a tier-1.5 hit on ep %d", warm.decision, warm.cached, x)
			}

			engines[x].Close()
			if !tc.replay {
				// Down long enough for the probe to see it.
				waitFor(t, "the probe to mark the engine down", 10*time.Second, func() bool {
					return d.metric(t, "kvgate_endpoint_probe_transitions_total", map[string]string{"service": svc, "ep_idx": ep, "to": "down"}) > 0
				})
			}
			engines[x] = startEngine(t, cfgs[x]) // same ports, sequence from 0, empty cache
			waitFor(t, "the restarted engine's old blocks to go", 15*time.Second, func() bool {
				return len(d.inventory(t, service, x)) == 0
			})
			if n := d.metric(t, "kvgate_kv_subscriber_clears_total", map[string]string{"service": svc, "ep": ep, "reason": tc.reason}); n < 1 {
				t.Errorf("clears{reason=%q} = %v, want ≥ 1", tc.reason, n)
			}
			if !tc.replay {
				waitFor(t, "the engine back in rotation", 10*time.Second, func() bool {
					return d.metric(t, "kvgate_endpoint_probe_up", map[string]string{"service": svc, "ep_idx": ep}) == 1
				})
			}
			again := complete(t, base, append(slices.Clone(prefix), 7, 8, 9))
			if again.status != 200 {
				t.Fatalf("after the restart: %d %s", again.status, again.body)
			}
			if again.field("tier") == "1.5" && again.cached == 0 {
				t.Fatalf("after the restart: tier-1.5 hit with 0 cached tokens (decision %q)", again.decision)
			}
			// The engines' own batches then fill the inventory again.
			waitFor(t, "new blocks", 10*time.Second, func() bool {
				return len(d.inventory(t, service, 0))+len(d.inventory(t, service, 1)) >= 4
			})
			d.alive(t)
		})
	}
}

// TestHashGranularity: engines whose KV block is a multiple of the rule's
// kvBlockSize (hybrid models, prefix_match_unit) publish every k-th hash of
// the chain kvgate computes; kvgate scores with that stride and the warm
// request is a real tier-1.5 hit. Before, the first block never matched and
// every request scored 0. A block size that is not a multiple is named:
// requests skip the tier with reason hashes and kvgate_kv_skip_total{cause=
// "block_size"} counts them.
func TestHashGranularity(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                 string
		blockSize, hashBlock int
		wantHit              bool
	}{
		{"group block of two hash blocks", 32, 16, true},
		{"group block of four hash blocks", 64, 16, true},
		{"block size not a multiple", 24, 8, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			block := testnet.Block(t)
			hosts := []string{block + "11", block + "12"}
			zmq := testnet.PortPair(t, hosts[0], 1000)
			var eps []endpoint
			for j, h := range hosts {
				c := engineConfig("engine-"+strconv.Itoa(j), h, 0, zmq)
				c.BlockSize, c.HashBlockSize, c.NumGPUBlocks = tc.blockSize, tc.hashBlock, 512
				eps = append(eps, urlEndpoint(t, startEngine(t, c).URL()))
			}
			d := startDaemon(t, block)
			service, base := d.createRule(t, block, zmq, eps) // kvBlockSize 16
			waitFor(t, "both subscribers", 15*time.Second, func() bool {
				return d.metric(t, "loxilb_kv_subscriber_connected", map[string]string{"service": strconv.Itoa(service)}) == 2
			})
			time.Sleep(200 * time.Millisecond)
			prefix := tokens(30000+i*1000, 128)
			cold := complete(t, base, append(slices.Clone(prefix), 1))
			if cold.status != 200 {
				t.Fatalf("cold: %d %s", cold.status, cold.body)
			}
			if tc.wantHit {
				x, _ := strconv.Atoi(cold.field("ep"))
				waitFor(t, "the cold prompt's blocks", 10*time.Second, func() bool { return len(d.inventory(t, service, x)) >= 2 })
				warm := complete(t, base, append(slices.Clone(prefix), 2))
				if warm.field("tier") != "1.5" || warm.field("ep") != strconv.Itoa(x) || warm.cached == 0 {
					t.Fatalf("warm: decision %q cached %d, want a tier-1.5 hit on ep %d", warm.decision, warm.cached, x)
				}
				return
			}
			skips := func() float64 {
				return d.metric(t, "kvgate_kv_skip_total", map[string]string{"service": strconv.Itoa(service), "cause": "block_size"})
			}
			waitFor(t, "a request skipped for block_size", 10*time.Second, func() bool {
				r := complete(t, base, append(slices.Clone(prefix), 3))
				if r.status != 200 {
					t.Fatalf("request: %d %s", r.status, r.body)
				}
				if r.field("tier") == "1.5" {
					t.Fatalf("tier-1.5 decision %q on blocks that cannot match", r.decision)
				}
				return skips() > 0
			})
			if n := d.metric(t, "loxilb_pd_kv_tier15_miss_reason_total", map[string]string{"service": strconv.Itoa(service), "reason": "hashes"}); n == 0 {
				t.Errorf("no tier-1.5 miss counted under reason hashes")
			}
			if !strings.Contains(d.logs.String(), "not a multiple of kvBlockSize") {
				t.Error("the block size mismatch was not logged")
			}
		})
	}
}
