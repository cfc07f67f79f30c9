package aictrl

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

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
	pb "github.com/kvgate/kvgate/pkg/aictrl/aictrlpb"
	"github.com/kvgate/kvgate/pkg/aictrl/controller"
)

// TestRunReconnects runs the real controller and applier over loopback gRPC:
// snapshots are applied and acked; when the controller goes away and a new
// one (new boot_id, epochs from 1) takes its address, the applier
// reconnects and accepts it.
func TestRunReconnects(t *testing.T) {
	b := testnet.Block(t)
	ips := [2]string{b + "11", b + "12"}
	var ports [2]string
	for i, ip := range ips {
		e, err := enginesim.New(enginesim.Config{Host: ip, Port: 0, KVEventsEndpoint: "none", ReplayEndpoint: "none",
			NumGPUBlocks: 64, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		_, ports[i], _ = net.SplitHostPort(strings.TrimPrefix(e.URL(), "http://"))
	}
	reg, err := controller.ParseRegistry(fmt.Appendf(nil, `version: 1
service: {key: "%s", vip: 10.10.10.254, port: 8080}
epoch_period_sec: 1
hosts:
  %s: {gpu_model: g, role: prefill, port: %s, ep_idx: 0, expected_num_gpu_blocks: 64, serving_throughput_prior: 1}
  %s: {gpu_model: g, role: prefill, port: %s, ep_idx: 1, expected_num_gpu_blocks: 64, serving_throughput_prior: 0.25}
`, svcKey, ips[0], ports[0], ips[1], ports[1]))
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("%s3:%d", b, testnet.Port(t, b+"3"))
	serve := func() (*controller.Controller, *grpc.Server, context.CancelFunc) {
		c, err := controller.New(reg, controller.Options{EpochPeriod: 200 * time.Millisecond, ScrapeInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		var ln net.Listener
		for range 50 { // the old listener's port may take a moment to free
			if ln, err = net.Listen("tcp", addr); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		pb.RegisterAiCtrlServer(gs, controller.NewServer(c))
		go gs.Serve(ln)
		ctx, cancel := context.WithCancel(context.Background())
		go c.Run(ctx)
		return c, gs, cancel
	}
	c1, gs1, stop1 := serve()

	r := newRules()
	r.eps[svcKey] = map[int]string{0: ips[0] + ":" + ports[0], 1: ips[1] + ":" + ports[1]}
	a, err := NewApplier(Config{Addr: addr, GatewayID: "gw"}, r, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait("the first snapshot", func() bool { adv := r.get(); return adv != nil && adv.Weight[1] == 25 })
	wait("epoch 4", func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.epoch >= 4 })
	a.mu.Lock()
	boot1, epoch1 := a.bootID, a.epoch
	a.mu.Unlock()
	if boot1 != c1.BootID() {
		t.Fatalf("boot_id %q, want %q", boot1, c1.BootID())
	}
	stop1()
	gs1.Stop()
	// The replacement starts again from epoch 1, below what was applied.
	c2, gs2, stop2 := serve()
	defer func() { stop2(); gs2.Stop() }()
	wait("the new boot_id", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.bootID == c2.BootID() && a.epoch < epoch1
	})
	if testutil.ToFloat64(a.m.nacks) != 0 {
		t.Fatal("NACKs")
	}
}
