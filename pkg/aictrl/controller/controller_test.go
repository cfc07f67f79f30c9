package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
	pb "github.com/kvgate/kvgate/pkg/aictrl/aictrlpb"
)

func startEngine(t *testing.T, host string, blocks int) *enginesim.Engine {
	t.Helper()
	e, err := enginesim.New(enginesim.Config{Host: host, Port: 0, KVEventsEndpoint: "none", ReplayEndpoint: "none",
		NumGPUBlocks: blocks, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func port(t *testing.T, url string) int {
	_, p, err := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	fmt.Sscan(p, &n)
	return n
}

// fleet is a registry over two real enginesims: a fast one (prior 1) and a
// slow one (prior 0.5) whose live num_gpu_blocks differs from the registry.
func fleet(t *testing.T) (*Registry, [2]string) {
	b := testnet.Block(t)
	ips := [2]string{b + "11", b + "12"}
	e0 := startEngine(t, ips[0], 8192)
	e1 := startEngine(t, ips[1], 3000)
	doc := fmt.Sprintf(`version: 1
service: {key: "10.10.10.254:8080:tcp", vip: 10.10.10.254, port: 8080}
epoch_period_sec: 1
hosts:
  %s: {gpu_model: H100, hbm_gb: 80, role: prefill, port: %d, ep_idx: 0, expected_num_gpu_blocks: 8192, serving_throughput_prior: 1.0}
  %s:
    gpu_model: A100
    hbm_gb: 40
    role: prefill
    port: %d
    ep_idx: 1
    expected_num_gpu_blocks: 4096
    serving_throughput_prior: 0.5
    calibration:
      throughput_tokens_per_sec: 6000
      throughput_ratio: 0.5
      fingerprint: %s
      fingerprint_fields: {num_gpu_blocks: "4096"}
`, ips[0], port(t, e0.URL()), ips[1], port(t, e1.URL()), Fingerprint(map[string]string{"num_gpu_blocks": "4096"}))
	reg, err := ParseRegistry([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return reg, ips
}

func TestControllerEmits(t *testing.T) {
	reg, ips := fleet(t)
	now := time.Now()
	preg := prometheus.NewRegistry()
	c, err := New(reg, Options{Registry: preg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing scraped yet: every source is stale, nothing is emitted.
	if s := c.Emit(); s != nil {
		t.Fatalf("emitted with a stale fleet: %v", s)
	}
	if v := testutil.ToFloat64(c.m.fleetStale); v != 1 {
		t.Fatalf("aictrl_fleet_stale %v", v)
	}
	c.ScrapeAll(context.Background())
	s := c.Emit()
	if s == nil {
		t.Fatal("nothing emitted")
	}
	if s.Epoch != 1 || s.BootId != c.BootID() || len(s.Services) != 1 || s.Services[0].ServiceKey != "10.10.10.254:8080:tcp" {
		t.Fatalf("%v", s)
	}
	if want := uint64(now.Add(3 * time.Second).UnixMilli()); s.StalenessDeadlineUnixMs != want {
		t.Fatalf("deadline %d want %d (now + 3 epochs)", s.StalenessDeadlineUnixMs, want)
	}
	eps := s.Services[0].Eps
	if len(eps) != 2 || eps[0].Weight != 100 || eps[1].Weight != 50 || eps[1].EpAddr != reg.Addr(ips[1]) ||
		eps[0].State != pb.EpState_EP_STATE_ACTIVE || eps[1].Role != pb.Role_ROLE_PREFILL {
		t.Fatalf("eps %v", eps)
	}
	if v := testutil.ToFloat64(c.m.registryMismatch.WithLabelValues(ips[1])); v != 1 {
		t.Fatalf("aictrl_registry_mismatch_total{%s} %v", ips[1], v)
	}
	if v := testutil.ToFloat64(c.m.registryMismatch.WithLabelValues(ips[0])); v != 0 {
		t.Fatalf("aictrl_registry_mismatch_total{%s} %v", ips[0], v)
	}
	if v := testutil.ToFloat64(c.m.fingerprintMismatch.WithLabelValues(ips[1])); v != 1 {
		t.Fatalf("aictrl_fingerprint_mismatch_total %v", v)
	}
	// Another scrape of the same mismatch is no new transition.
	c.ScrapeAll(context.Background())
	if v := testutil.ToFloat64(c.m.registryMismatch.WithLabelValues(ips[1])); v != 1 {
		t.Fatalf("counted again without a transition: %v", v)
	}
	if v := testutil.ToFloat64(c.m.epWeight.WithLabelValues("10.10.10.254:8080:tcp", "1")); v != 50 {
		t.Fatalf("aictrl_ep_weight %v", v)
	}

	// The fast engine goes stale: it leaves the max, so the slow one is
	// now the best (raw 100), and the stale one drifts toward 100.
	now = now.Add(20 * time.Second)
	c.mu.Lock()
	c.hosts[ips[1]].lastOK = now
	c.mu.Unlock()
	s = c.Emit()
	if s.Epoch != 2 || s.Services[0].Eps[0].Weight != 100 || s.Services[0].Eps[1].Weight != 65 {
		t.Fatalf("after staleness %v", s.Services[0].Eps)
	}
	// Every source stale: nothing.
	now = now.Add(20 * time.Second)
	if s := c.Emit(); s != nil {
		t.Fatal("emitted with every source stale")
	}
}

func TestServerStreamsAndCountsAcks(t *testing.T) {
	reg, _ := fleet(t)
	c, err := New(reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c.ScrapeAll(context.Background())
	first := c.Emit()

	ln, err := net.Listen("tcp", testnet.Host(t)+":0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterAiCtrlServer(gs, NewServer(c))
	go gs.Serve(ln)
	defer gs.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := pb.NewAiCtrlClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if _, err := cl.AckSnapshot(ctx, &pb.Ack{Status: pb.AckStatus_ACK_STATUS_APPLIED}); err == nil {
		t.Fatal("ack without gateway_id accepted")
	}
	st, err := cl.WatchSnapshots(ctx, &pb.WatchRequest{GatewayId: "gw1", ApplierVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.Recv()
	if err != nil || got.Epoch != first.Epoch {
		t.Fatalf("first %v %v", got, err)
	}
	next := c.Emit()
	got, err = st.Recv()
	if err != nil || got.Epoch != next.Epoch {
		t.Fatalf("next %v %v", got, err)
	}
	for _, s := range []pb.AckStatus{pb.AckStatus_ACK_STATUS_APPLIED, pb.AckStatus_ACK_STATUS_REJECTED} {
		if _, err := cl.AckSnapshot(ctx, &pb.Ack{Epoch: got.Epoch, Nonce: got.Nonce, Status: s, GatewayId: "gw1"}); err != nil {
			t.Fatal(err)
		}
	}
	if testutil.ToFloat64(c.m.acksApplied.WithLabelValues("gw1")) != 1 || testutil.ToFloat64(c.m.acksRejected.WithLabelValues("gw1")) != 1 {
		t.Fatal("acks not counted")
	}
	if v := testutil.ToFloat64(c.m.watchers); v != 1 {
		t.Fatalf("aictrl_watchers_connected %v", v)
	}
}

func TestWatcherBound(t *testing.T) {
	reg, err := ParseRegistry([]byte(goodRegistry(t)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxWatchers {
		if c.addWatcher(fmt.Sprint(i)) == nil {
			t.Fatalf("watcher %d refused", i)
		}
	}
	if c.addWatcher("one too many") != nil {
		t.Fatal("watcher beyond the bound accepted")
	}
}
