// Command aictrl measures the AI controller's effect on a heterogeneous
// fleet: two engines of different speed behind kvgate's KV-aware rule, the
// same closed-loop shared-prefix workload with static weights and with
// kvgate-controller's advice (docs/controller.md, "Effect"). It runs the real
// binaries, built beforehand:
//
//	go build -o /tmp/kvb/ ./cmd/kvgate ./cmd/kvgate-controller ./cmd/enginesim
//	go run ./bench/aictrl --bin /tmp/kvb
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

const model = "Qwen/Qwen3-0.6B"

type opts struct {
	bin, tokenizer      string
	duration            time.Duration
	concurrency, runs   int
	prefixes, words     int
	timeScale           float64
	speeds              [2]string
	fastPrior, slowPrio float64
}

func main() {
	var o opts
	flag.StringVar(&o.bin, "bin", "", "directory with the kvgate, kvgate-controller and enginesim binaries")
	flag.StringVar(&o.tokenizer, "tokenizer", "pkg/tokenizer/testdata/qwen3", "Qwen3 tokenizer directory")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "measured load per run")
	flag.IntVar(&o.concurrency, "concurrency", 24, "closed-loop clients")
	flag.IntVar(&o.runs, "runs", 3, "runs per arm (medians are reported)")
	flag.IntVar(&o.prefixes, "prefixes", 32, "distinct shared prefixes")
	flag.IntVar(&o.words, "words", 600, "words per prefix")
	flag.Float64Var(&o.timeScale, "time-scale", 0.25, "enginesim --time-scale")
	speeds := flag.String("speeds", "2,1", "the two engines' --replica-gpu-speed")
	flag.Float64Var(&o.fastPrior, "fast-prior", 1.0, "registry serving_throughput_prior of the fast engine")
	flag.Float64Var(&o.slowPrio, "slow-prior", 0.5, "registry serving_throughput_prior of the slow engine")
	flag.Parse()
	sp := strings.Split(*speeds, ",")
	if o.bin == "" || len(sp) != 2 {
		fmt.Fprintln(os.Stderr, "aictrl: --bin is required and --speeds takes two values")
		os.Exit(2)
	}
	o.speeds = [2]string{sp[0], sp[1]}
	res := map[string][]result{}
	for r := range o.runs {
		for _, arm := range []string{"static", "controller"} {
			x, err := run(o, arm, r)
			if err != nil {
				fmt.Fprintln(os.Stderr, "aictrl:", arm, err)
				os.Exit(1)
			}
			fmt.Printf("run %d %-10s %s\n", r, arm, x)
			res[arm] = append(res[arm], x)
		}
	}
	s, c := median(res["static"]), median(res["controller"])
	fmt.Printf("\nmedians over %d runs (latency in model time)\n", o.runs)
	fmt.Printf("| arm | req/s | p50 ms | p90 ms | p99 ms | fast-engine share | errors |\n|---|---|---|---|---|---|---|\n")
	for _, a := range []struct {
		n string
		r result
	}{{"static", s}, {"controller", c}} {
		fmt.Printf("| %s | %.1f | %.0f | %.0f | %.0f | %.2f | %d |\n", a.n, a.r.rps, a.r.p50, a.r.p90, a.r.p99, a.r.fast, a.r.errors)
	}
	fmt.Printf("| controller / static | %.2f | %.2f | %.2f | %.2f | %.2f | |\n", c.rps/s.rps, c.p50/s.p50, c.p90/s.p90, c.p99/s.p99, c.fast/s.fast)
}

type result struct {
	rps, p50, p90, p99, fast float64
	errors                   int
}

func (r result) String() string {
	return fmt.Sprintf("%.1f req/s  p50 %.0f ms  p90 %.0f ms  p99 %.0f ms  fast share %.2f  errors %d", r.rps, r.p50, r.p90, r.p99, r.fast, r.errors)
}

func median(rs []result) result {
	pick := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	out := result{rps: pick(func(r result) float64 { return r.rps }), p50: pick(func(r result) float64 { return r.p50 }),
		p90: pick(func(r result) float64 { return r.p90 }), p99: pick(func(r result) float64 { return r.p99 }),
		fast: pick(func(r result) float64 { return r.fast })}
	for _, r := range rs {
		out.errors += r.errors
	}
	return out
}

func freePort(host string) int {
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

type procs struct{ cmds []*exec.Cmd }

func (p *procs) start(env []string, bin string, args ...string) error {
	c := exec.Command(bin, args...)
	c.Env = append(os.Environ(), env...)
	c.Stdout, c.Stderr = io.Discard, io.Discard
	if err := c.Start(); err != nil {
		return err
	}
	p.cmds = append(p.cmds, c)
	return nil
}

func (p *procs) stop() {
	for _, c := range p.cmds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
}

func waitHTTP(url string, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s did not come up", url)
}

func run(o opts, arm string, r int) (result, error) {
	block := fmt.Sprintf("127.%d.%d.", 60+r, 10+len(arm))
	hosts := [2]string{block + "11", block + "12"}
	eport := freePort(hosts[0])
	tmp, err := os.MkdirTemp("", "aictrl-bench")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(tmp)
	abs, _ := filepath.Abs(o.tokenizer)
	if err := os.Symlink(abs, filepath.Join(tmp, "Qwen__Qwen3-0.6B")); err != nil {
		return result{}, err
	}
	var p procs
	defer p.stop()
	if err := p.start([]string{"PYTHONHASHSEED=0"}, filepath.Join(o.bin, "enginesim"), "--host", hosts[0], "--port", fmt.Sprint(eport),
		"--replicas", "2", "--replica-gpu-speed", o.speeds[0]+","+o.speeds[1], "--tokenizer", abs,
		"--time-scale", fmt.Sprint(o.timeScale), "--log-level", "error"); err != nil {
		return result{}, err
	}
	for _, h := range hosts {
		if err := waitHTTP(fmt.Sprintf("http://%s:%d/health", h, eport), 30*time.Second); err != nil {
			return result{}, err
		}
	}
	vip := block + "1"
	vport := freePort(vip)
	env := []string{"LLB_KV_NONE_HASH_SEED=0", "LOXILB_KV_LB_MODE=hard"}
	if arm == "controller" {
		grpcAddr := fmt.Sprintf("%s3:%d", block, freePort(block+"3"))
		reg := fmt.Sprintf(`version: 1
service: {key: "%s:%d:tcp", vip: %q, port: %d}
epoch_period_sec: 1
hosts:
  %s: {gpu_model: fast, hbm_gb: 80, role: prefill, port: %d, ep_idx: 0, expected_num_gpu_blocks: 27000, serving_throughput_prior: %v}
  %s: {gpu_model: slow, hbm_gb: 80, role: prefill, port: %d, ep_idx: 1, expected_num_gpu_blocks: 27000, serving_throughput_prior: %v}
`, vip, vport, vip, vport, hosts[0], eport, o.fastPrior, hosts[1], eport, o.slowPrio)
		rf := filepath.Join(tmp, "registry.yaml")
		if err := os.WriteFile(rf, []byte(reg), 0o644); err != nil {
			return result{}, err
		}
		if err := p.start(nil, filepath.Join(o.bin, "kvgate-controller"), "--grpc-addr", grpcAddr,
			"--metrics-addr", fmt.Sprintf("%s3:%d", block, freePort(block+"3")), "--registry", rf,
			"--epoch-period-sec", "1", "--scrape-interval-sec", "1"); err != nil {
			return result{}, err
		}
		env = append(env, "LOXILB_AI_CTRL_ADDR="+grpcAddr)
	}
	api := fmt.Sprintf("%s2:%d", block, freePort(block+"2"))
	if err := p.start(env, filepath.Join(o.bin, "kvgate"), "--api", api, "--state-dir", filepath.Join(tmp, "state"),
		"--tokenizer-dir", tmp); err != nil {
		return result{}, err
	}
	if err := waitHTTP("http://"+api+"/netlox/v1/config/loadbalancer/all", 30*time.Second); err != nil {
		return result{}, err
	}
	rule := fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"protocol":"tcp","sel":0,"mode":4,
		"kvExactMode":3,"kvZmqPort":5557,"kvHashAlgo":"sha256_cbor","kvBlockSize":16},
		"endpoints":[{"endpointIP":%q,"targetPort":%d,"weight":1},{"endpointIP":%q,"targetPort":%d,"weight":1}]}`,
		vip, vport, hosts[0], eport, hosts[1], eport)
	resp, err := http.Post("http://"+api+"/netlox/v1/config/loadbalancer", "application/json", strings.NewReader(rule))
	if err != nil {
		return result{}, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return result{}, fmt.Errorf("rule: %d %s", resp.StatusCode, b)
	}
	// Subscriptions, the first scrape and (controller arm) the first
	// snapshot all land within a few seconds.
	time.Sleep(4 * time.Second)
	if arm == "controller" && !strings.Contains(metrics(api), "loxilb_pd_ctrl_mode 1") {
		return result{}, fmt.Errorf("controller advice not applied")
	}
	return load(o, fmt.Sprintf("http://%s:%d", vip, vport), hosts[0]+":"+fmt.Sprint(eport)), nil
}

func metrics(api string) string {
	resp, err := http.Get("http://" + api + "/netlox/v1/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return string(b)
}

func load(o opts, base, fastID string) result {
	prefixes := make([]string, o.prefixes)
	for i := range prefixes {
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		var sb strings.Builder
		fmt.Fprintf(&sb, "System prompt %d.", i)
		for range o.words {
			fmt.Fprintf(&sb, " w%d", rng.IntN(5000))
		}
		prefixes[i] = sb.String()
	}
	client := &http.Client{Timeout: 120 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	defer cancel()
	var mu sync.Mutex
	var lat []float64
	fast, total, errs := 0, 0, 0
	var wg sync.WaitGroup
	start := time.Now()
	for w := range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			for n := 0; ctx.Err() == nil; n++ {
				body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 8,
					"prompt": prefixes[rng.IntN(len(prefixes))] + fmt.Sprintf(" Question %d from %d.", n, w)})
				t0 := time.Now()
				resp, err := client.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				d := time.Since(t0)
				mu.Lock()
				if resp.StatusCode != 200 {
					errs++
				} else {
					total++
					lat = append(lat, float64(d.Milliseconds())/o.timeScale)
					if resp.Header.Get("x-engine-id") == fastID {
						fast++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	sort.Float64s(lat)
	q := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	return result{rps: float64(total) / el * o.timeScale, p50: q(0.5), p90: q(0.9), p99: q(0.99),
		fast: float64(fast) / float64(max(total, 1)), errors: errs}
}
