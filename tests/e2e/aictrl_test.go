package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/internal/testnet"
)

// ctrlRegistry is a registry for two engines of different speed and
// capacity; drain0 sets the fast engine's standing state to draining.
func ctrlRegistry(vip string, vport int, hosts [2]string, eport int, drain0 bool) string {
	state := ""
	if drain0 {
		state = "\n    state: draining"
	}
	return fmt.Sprintf(`version: 1
service: {key: "%s:%d:tcp", vip: %q, port: %d}
epoch_period_sec: 1
hosts:
  %s:
    gpu_model: H100
    hbm_gb: 80
    role: prefill
    port: %d
    ep_idx: 0
    expected_num_gpu_blocks: 8192
    serving_throughput_prior: 1.0%s
  %s:
    gpu_model: A100
    hbm_gb: 40
    role: prefill
    port: %d
    ep_idx: 1
    expected_num_gpu_blocks: 4096
    serving_throughput_prior: 0.5
`, vip, vport, vip, vport, hosts[0], eport, state, hosts[1], eport)
}

type proc struct {
	cmd    *exec.Cmd
	logs   *syncbuf.Buffer
	exited chan struct{}
}

func startProc(t *testing.T, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), logs: &syncbuf.Buffer{}, exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr, p.cmd.Stdout = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(p.kill)
	return p
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// TestAIControllerEndToEnd runs the real kvgate-controller, a real enginesim
// with two engines of different speed and capacity, and the real kvgate:
// the weights reach kvgate's metrics, DRAINING moves new traffic off an
// endpoint, killing the controller returns kvgate to static weights after
// the deadline without a failed request, and a restarted controller (a new
// boot_id, epochs from 1 again) is accepted.
func TestAIControllerEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries")
	}
	dir := buildCommands(t, "kvgate", "kvgate-controller", "enginesim")
	block := testnet.Block(t)
	hosts := [2]string{block + "11", block + "12"}
	eport := testnet.Port(t, hosts[0])
	eng := startProc(t, nil, filepath.Join(dir, "enginesim"), "--host", hosts[0], "--port", fmt.Sprint(eport),
		"--replicas", "2", "--replica-gpu-speed", "2,1", "--replica-num-gpu-blocks", "8192,3000",
		"--time-scale", "0.05", "--log-level", "warn")
	waitFor(t, "the engines", 30*time.Second, func() bool {
		for _, h := range hosts {
			resp, err := http.Get(fmt.Sprintf("http://%s:%d/health", h, eport))
			if err != nil {
				return false
			}
			resp.Body.Close()
		}
		return true
	})

	vip, vport := block+"1", testnet.Port(t, block+"1")
	reg := filepath.Join(t.TempDir(), "registry.yaml")
	if err := os.WriteFile(reg, []byte(ctrlRegistry(vip, vport, hosts, eport, false)), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcAddr := fmt.Sprintf("%s3:%d", block, testnet.Port(t, block+"3"))
	ctrlMetrics := fmt.Sprintf("%s3:%d", block, testnet.Port(t, block+"3"))
	startCtrl := func() *proc {
		return startProc(t, nil, filepath.Join(dir, "kvgate-controller"), "--grpc-addr", grpcAddr, "--metrics-addr", ctrlMetrics,
			"--registry", reg, "--epoch-period-sec", "1", "--scrape-interval-sec", "1", "--stale-budget-sec", "3")
	}
	ctrl := startCtrl()

	api := fmt.Sprintf("%s2:%d", block, testnet.Port(t, block+"2"))
	gw := startProc(t, []string{"LOXILB_AI_CTRL_ADDR=" + grpcAddr, "LOXILB_AI_CTRL_GATEWAY_ID=gw-e2e"},
		filepath.Join(dir, "kvgate"), "--api", api, "--state-dir", t.TempDir(), "--tokenizer-dir", stagingDir(t))
	tg := &testGateway{api: "http://" + api}
	waitFor(t, "the management API", 20*time.Second, func() bool {
		resp, err := http.Get(tg.api + "/netlox/v1/config/loadbalancer/all")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	rule := fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"protocol":"tcp","sel":0,"mode":4},
		"endpoints":[{"endpointIP":%q,"targetPort":%d,"weight":1},{"endpointIP":%q,"targetPort":%d,"weight":1}]}`,
		vip, vport, hosts[0], eport, hosts[1], eport)
	tg.createRule(t, []byte(rule))
	svc := fmt.Sprintf("%s:%d:tcp", vip, vport)
	ep := func(i int) map[string]string { return map[string]string{"service": svc, "ep_idx": fmt.Sprint(i)} }
	diag := func() string {
		return "\n--- controller:\n" + ctrl.logs.String() + "\n--- kvgate:\n" + gw.logs.String() + "\n--- enginesim:\n" + eng.logs.String()
	}

	// The weights reach kvgate: the slower engine's prior is half.
	waitFor(t, "controller weights in kvgate's metrics", 30*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_ctrl_effective_weight", ep(1)) == 50 &&
			tg.metric(t, "loxilb_pd_ctrl_effective_weight", ep(0)) == 100 && tg.metric(t, "loxilb_pd_ctrl_mode", nil) == 1
	})
	if v := scrapeSum(t, "http://"+ctrlMetrics+"/metrics", "aictrl_registry_mismatch_total", map[string]string{"source": hosts[1]}); v != 1 {
		t.Fatalf("aictrl_registry_mismatch_total{source=%s} = %v, want 1 (3000 live blocks, 4096 expected)%s", hosts[1], v, diag())
	}
	if v := scrapeSum(t, "http://"+ctrlMetrics+"/metrics", "aictrl_acks_applied_total", map[string]string{"gateway": "gw-e2e"}); v < 1 {
		t.Fatalf("no ack from the gateway%s", diag())
	}

	base := fmt.Sprintf("http://%s:%d", vip, vport)
	send := func() (string, error) {
		body := fmt.Sprintf(`{"model":%q,"prompt":"hello controller","max_tokens":2}`, model)
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("status %d", resp.StatusCode)
		}
		return resp.Header.Get("x-engine-id"), nil
	}
	engineOf := func(i int) string { return fmt.Sprintf("%s:%d", hosts[i], eport) }
	served := func(n int) map[string]int {
		got := map[string]int{}
		for range n {
			id, err := send()
			if err != nil {
				t.Fatalf("request: %v%s", err, diag())
			}
			got[id]++
		}
		return got
	}
	if got := served(8); got[engineOf(0)] == 0 || got[engineOf(1)] == 0 {
		t.Fatalf("before draining both engines should serve: %v", got)
	}

	// DRAINING the fast engine (registry state + SIGHUP) moves new traffic off it.
	if err := os.WriteFile(reg, []byte(ctrlRegistry(vip, vport, hosts, eport, true)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ctrl.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "DRAINING in kvgate", 20*time.Second, func() bool { return tg.metric(t, "loxilb_pd_ctrl_state", ep(0)) == 2 })
	if got := served(8); got[engineOf(0)] != 0 || got[engineOf(1)] != 8 {
		t.Fatalf("with endpoint 0 draining: %v", got)
	}

	// Kill the controller with traffic flowing: kvgate drops the advice
	// after the deadline (3 epochs) and no request fails.
	var failed atomic.Int64
	var sent atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := send(); err != nil {
				failed.Add(1)
			}
			sent.Add(1)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	ctrl.kill()
	waitFor(t, "static weights after the deadline", 20*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_ctrl_mode", nil) == 0 && tg.metric(t, "loxilb_pd_ctrl_effective_weight", ep(1)) == 100 &&
			tg.metric(t, "loxilb_pd_ctrl_state", ep(0)) == 1
	})
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || sent.Load() == 0 {
		t.Fatalf("%d of %d requests failed while the controller was gone%s", failed.Load(), sent.Load(), diag())
	}
	if !strings.Contains(gw.logs.String(), "past its staleness deadline") {
		t.Fatalf("kvgate did not log the fallback%s", diag())
	}
	if got := served(8); got[engineOf(0)] == 0 {
		t.Fatalf("static weights: the formerly draining engine gets nothing: %v", got)
	}

	// A restarted controller has a new boot_id and counts epochs from 1
	// again: kvgate accepts it.
	applied := tg.metric(t, "loxilb_pd_ctrl_snapshots_applied_total", nil)
	// A snapshot that arrived before the rule was posted was NACKed (no
	// such rule); count only what the new controller gets.
	nacks := tg.metric(t, "loxilb_pd_ctrl_nacks_total", nil)
	if err := os.WriteFile(reg, []byte(ctrlRegistry(vip, vport, hosts, eport, false)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctrl = startCtrl()
	waitFor(t, "the restarted controller's snapshots", 40*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_ctrl_snapshots_applied_total", nil) > applied && tg.metric(t, "loxilb_pd_ctrl_mode", nil) == 1
	})
	if e := tg.metric(t, "loxilb_pd_ctrl_applied_epoch", map[string]string{"service": svc}); e > 10 {
		t.Fatalf("applied epoch %v: the new boot's low epochs were not accepted%s", e, diag())
	}
	if n := tg.metric(t, "loxilb_pd_ctrl_nacks_total", nil); n != nacks {
		t.Fatalf("%v NACKs of the restarted controller's snapshots%s", n-nacks, diag())
	}
}
